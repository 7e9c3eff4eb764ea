"""PrismLM pieces that need no training run: LR schedule, AdamW groups, batch arithmetic,
precision plugin with a fused AdamW, config hash."""

import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from prism.config.schema import ConfigError, load_config
from prism.core.model import PrismDecoder, param_groups
from prism.runs.identity import config_hash
from prism.runs.layout import run_dir
from prism.train.batch import batch_plan
from prism.train.optim import lr_factor, warmup_steps
from prism.train.plan import max_steps
from prism.train.strategy import BF16MixedPrecision, precision_args
from prism.train.trainer import warmup_line


def test_lr_schedule_warmup_then_cosine_to_floor():
    steps, floor = 11000, 0.1
    warm = warmup_steps(steps, 0.025)
    assert warm == 275  # 2.5 % of the 124M run's 11,000 steps
    f = [lr_factor(s, steps, warm, floor) for s in range(steps)]
    assert f[0] == pytest.approx(1 / 275)
    assert all(a < b for a, b in zip(f[: warm - 1], f[1:warm]))  # linear rise
    assert f[warm - 1] == pytest.approx(1.0) and f[warm] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[warm:], f[warm + 1 :]))  # then never rises
    assert f[-1] == pytest.approx(floor)
    mid = warm + (steps - 1 - warm) // 2
    assert f[mid] == pytest.approx(floor + (1 - floor) / 2, abs=1e-3)  # cosine midpoint


def test_lr_schedule_without_warmup_starts_at_peak():
    assert warmup_steps(16, 0.025) == 0
    assert lr_factor(0, 16, 0, 0.1) == 1.0 and lr_factor(15, 16, 0, 0.1) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "steps, warmup",
    [(19, 0), (20, 0), (21, 1), (59, 1), (60, 2), (11000, 275)],  # 0.5 and 1.5 round half to even
)
def test_warmup_rounds_to_whole_steps_and_the_start_line_says_when_there_is_none(steps, warmup):
    assert warmup_steps(steps, 0.025) == warmup
    line = warmup_line(steps, 0.025)
    if warmup:
        assert line == f"LR warmup over the first {warmup} of them"
    else:
        assert line.startswith(f"no LR warmup: train.warmup_frac=0.025 of {steps} steps rounds to 0 steps")


def test_weight_decay_only_on_matrices():
    cfg = load_config("tiny")
    model = PrismDecoder(cfg.model_config())
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert any(p is model.wte.weight for p in decay["params"])  # tied embedding: decayed, once
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == model.num_params()


def test_batch_plan_splits_global_batch_and_names_valid_micro_batches():
    cfg = load_config("124m")  # 256 sequences per step
    assert max_steps(cfg) == 11000
    plan = batch_plan(cfg, world_size=8)
    assert (plan.micro_batch, plan.accumulation) == (32, 1)
    assert batch_plan(cfg, world_size=1).accumulation == 8
    assert batch_plan(cfg, world_size=1).global_batch_tokens == 262144
    ceiling = load_config("124m", ["train.micro_batch=24"])  # a ceiling, not a divisor
    assert (
        batch_plan(ceiling, world_size=8).micro_batch,
        batch_plan(ceiling, world_size=8).accumulation,
    ) == (16, 2)
    with pytest.raises(
        ConfigError, match=r"256 sequences of 1024 tokens, which 24 device\(s\) cannot share evenly"
    ):
        batch_plan(cfg, world_size=24)


def test_config_hash_ignores_execution_details_only():
    base = config_hash(load_config("tiny"))
    assert base == config_hash(load_config("tiny"))
    for how in (
        "train.devices=2",
        "train.micro_batch=4",
        "train.compile=true",
        "data.num_workers=3",
        "runs_dir=/elsewhere",
    ):
        assert config_hash(load_config("tiny", [how])) == base, how
    for what in ("train.lr=1e-3", "train.seed=1", "schedule=uniform", "data.seed=7"):
        assert config_hash(load_config("tiny", [what])) != base, what


def test_run_dir_layout():
    cfg = load_config("tiny", ["schedule=1x2,2x2,4x4", "train.seed=3", "runs_dir=/r"])
    assert str(run_dir(cfg)) == "/r/tiny/1x2-2x2-4x4/seed3"
    assert str(run_dir(load_config("tiny", ["runs_dir=/r"]))) == "/r/tiny/prism/seed0"


def test_precision_auto_is_fp32_on_cpu_and_bf16_plugin_on_request():
    cfg = load_config("tiny", ["train.accelerator=cpu"])
    assert precision_args(cfg) == {"precision": "32-true"}
    plug = precision_args(load_config("tiny", ["train.accelerator=cpu", "train.precision=bf16-mixed"]))
    assert isinstance(plug["plugins"][0], BF16MixedPrecision)


def _clip_and_step(plugin):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)  # fused runs on CPU too
    (model(torch.randn(4, 8)) * 100).sum().backward()
    plugin.clip_gradients(opt, clip_val=1.0)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    opt.step()
    return norm


def test_bf16_plugin_clips_fused_adamw_where_lightning_refuses():
    # the GPU recipe (bf16-mixed + fused AdamW + clipping 1.0), exercised on the CPU
    with pytest.raises(RuntimeError, match="fused"):
        _clip_and_step(MixedPrecision("bf16-mixed", "cpu"))
    assert _clip_and_step(BF16MixedPrecision("cpu")) == pytest.approx(1.0, rel=1e-4)
