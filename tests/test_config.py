import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

from prism.config.schema import ConfigError, available_scales, load_config, to_dict

ROOT = Path(__file__).resolve().parents[1]

# Table 1 of the paper: (layers, d_model, h_base, batch tokens, peak LR, training tokens).
TABLE1 = {
    "124m": (12, 768, 12, 262144, 6.0e-4, 2_883_584_000),
    "354m": (24, 1024, 16, 262144, 3.0e-4, 10_485_760_000),
    "757m": (24, 1536, 16, 524288, 2.5e-4, 20_971_520_000),
}
TABLE4 = {
    "124m": [3, 3, 6, 6, 8, 8] + [12] * 6,
    "354m": [4] * 3 + [8] * 3 + [16] * 18,
    "757m": [6] * 3 + [12] * 3 + [16] * 18,
}


@pytest.mark.parametrize("scale", sorted(TABLE1))
def test_scale_configs_mirror_tables_1_and_4(scale):
    cfg = load_config(scale)
    L, d, h, batch, lr, tokens = TABLE1[scale]
    assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.h_base) == (L, d, h)
    assert (cfg.train.global_batch_tokens, cfg.train.lr, cfg.train.tokens) == (batch, lr, tokens)
    assert list(cfg.head_schedule("prism").heads) == TABLE4[scale]
    assert cfg.train.tokens // cfg.train.global_batch_tokens == {"124m": 11000}.get(scale, 40000)
    t = cfg.train
    assert (t.beta1, t.beta2, t.eps, t.weight_decay, t.grad_clip, t.warmup_frac) == (
        0.9,
        0.95,
        1e-8,
        0.1,
        1.0,
        0.025,
    )
    assert cfg.model.seq_len == 1024 and cfg.model.vocab_size == 50257


def test_tiny_has_a_valid_nontrivial_prism_schedule():
    cfg = load_config("tiny")
    sched = cfg.head_schedule("prism")
    assert len(set(sched.heads)) == 3 and not sched.is_uniform
    assert [d.rule for d in sched.diagnostics()] == []


def test_table5_names_resolve_only_at_small_shape():
    assert load_config("124m").head_schedule("config-7").heads[:2] == (2, 2)
    with pytest.raises(Exception, match="unknown schedule 'config-7'"):
        load_config("354m").head_schedule("config-7")


def test_overrides_merge_and_are_typed():
    cfg = load_config("tiny", ["train.lr=1e-3", "model.norm=rmsnorm", "schedule=2x4,4x4", "seeds=[0,1]"])
    assert cfg.train.lr == 1e-3 and isinstance(cfg.train.lr, float)
    assert cfg.model_config().norm == "rmsnorm"
    assert cfg.head_schedule().heads == (2,) * 4 + (4,) * 4
    assert cfg.seeds == [0, 1]
    assert json.loads(json.dumps(to_dict(cfg)))["train"]["lr"] == 1e-3


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["train.lrr=1"], "config key 'train.lrr' is invalid"),
        (["nonsense=1"], "config key 'nonsense' is invalid"),
        (["train.lr=fast"], "config key 'train.lr' is invalid"),
        (["train.lr=-1"], "train.lr=-1.0 is invalid: it must be positive"),
        (
            ["train.global_batch_tokens=1000"],
            "train.global_batch_tokens=1000 is not a multiple of model.seq_len=256",
        ),
        (["train.tokens=1024"], "train.tokens=1024 is smaller than one optimizer step"),
        (["schedule=3,4x7"], "schedule is invalid: layer 0: 3 heads does not divide d_model=128"),
        (["model.h_base=3"], "h_base=3 does not divide d_model=128"),
        (["model.norm=batch"], "model.norm='batch' is invalid"),
        (["model.heads=[1,2]"], "model.heads is set by the run's schedule"),
        (["train.lr"], "override 'train.lr' is not of the form key=value"),
    ],
)
def test_bad_values_are_one_sentence_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["data.source=ftp"], "data.source='ftp' is invalid: use one of hub, local, shards, offline."),
        (["data.source=local"], "data.source=local needs data.path"),
    ],
)
def test_a_data_section_without_a_usable_source_is_refused_before_any_step(overrides, needle):
    # the config layer checks types and ranges; the data sources' registry checks its own names
    from prism.train.plan import plan_run

    cfg = load_config("tiny", overrides)
    with pytest.raises(ConfigError) as err:
        plan_run(cfg, launch=False, reach_data=False)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_scale():
    # every configs/scale/*.yaml is a scale, whatever its name
    valid = ", ".join(available_scales())
    with pytest.raises(ConfigError) as err:
        load_config("1b")
    assert str(err.value) == f"unknown scale '1b': valid scales are {valid}."
    assert {"124m", "354m", "757m", "tiny"} <= set(available_scales())


def run_describe(*args):
    """describe.py as a user runs it: its own process (interpreter start and imports included)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "reproduce" / "describe.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def describe_in_process(capsys, *args) -> tuple[int, str, str]:
    """describe.py's main() in this process: (exit code, stdout, stderr). The process boundary
    (exit code, stderr of a real interpreter) is test_describe_table_and_bad_schedule's."""
    rc = load_script("describe").main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.slow
def test_describe_json_for_every_paper_scale(capsys):
    for scale in ("124m", "354m", "757m"):
        rc, stdout, stderr = describe_in_process(capsys, "--scale", scale, "--json")
        assert rc == 0, stderr
        rows = [json.loads(line) for line in stdout.splitlines()]
        by_name = {r["schedule_name"]: r for r in rows}
        assert {"uniform", "prism"} <= by_name.keys()
        for r in rows:
            assert {
                "scale",
                "schedule_name",
                "heads",
                "head_dims",
                "n_params",
                "flops_per_token",
                "diagnostics",
            } <= r.keys()
        assert by_name["uniform"]["n_params"] == by_name["prism"]["n_params"]
        assert by_name["uniform"]["flops_per_token"] == by_name["prism"]["flops_per_token"]
        assert by_name["prism"]["head_dims"][0] == 256


@pytest.mark.slow
def test_describe_table_and_bad_schedule(capsys):
    rc, stdout, _ = describe_in_process(capsys, "--scale", "124m", "--schedule", "prism")
    assert rc == 0 and "123,587,328" in stdout and "prism" in stdout
    bad = run_describe("--scale", "124m", "--schedule", "5,12x11")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "error: layer 0: 5 heads does not divide d_model=768 (divisibility, "
        "§2.1); valid head counts are [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, "
        "48, 64, 96, 128, 192, 256, 384, 768]."
    )


# ----- every default in one place ------------------------------------------------------------------
def _leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "schedules":
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


SHAPE_KEYS = ("model.n_layer", "model.d_model", "model.h_base")


def _defaults() -> dict:
    """Every config key with its default, straight from the dataclasses ("???" = none)."""
    from omegaconf import OmegaConf

    from prism.config.schema import RunConfig

    return dict(_leaves(OmegaConf.to_container(OmegaConf.structured(RunConfig))))


def test_the_yaml_recipes_only_override_defaults():
    """Each default is defined once, in the dataclasses: a YAML file that repeated one (and could
    later disagree with it) fails here. configs/ holds only the scale, ladder and schedule recipes."""
    from omegaconf import OmegaConf

    from prism.config.schema import default_config_dir

    root = default_config_dir()
    assert sorted(p.name for p in root.iterdir()) == ["ladder", "scale", "schedules"]
    defaults = _defaults()
    for path in sorted((root / "scale").glob("*.yaml")):
        for key, value in _leaves(OmegaConf.to_container(OmegaConf.load(path))):
            if key == "schedules" or key in SHAPE_KEYS:
                continue  # named head lists are data; a scale always states its shape (Table 1)
            assert key in defaults, f"{path.name}: {key} is not a config key"
            assert defaults[key] != value, (
                f"{path.name} repeats the default {key}={value!r} (defined in prism.config.schema)"
            )


def test_the_defaults_alone_leave_only_what_a_scale_must_give():
    from dataclasses import fields

    from prism.config.schema import RunConfig
    from prism.core.model import ModelConfig

    assert sorted(k for k, v in _defaults().items() if v == "???") == [
        "scale",
        "train.global_batch_tokens",
        "train.lr",
        "train.tokens",
    ]
    # the model section is ModelConfig itself, not a copy of its fields
    assert next(f for f in fields(RunConfig) if f.name == "model").type in (ModelConfig, "ModelConfig")


def test_describe_enumerates_the_valid_schedules_of_a_shape(capsys):
    rc, stdout, stderr = describe_in_process(capsys, "--scale", "tiny", "--enumerate", "--limit", "0")
    assert rc == 0, stderr
    lines = stdout.strip().splitlines()
    from prism.config.schema import load_config
    from prism.core.schedule import HeadSchedule, count_schedules

    shape = load_config("tiny").shape
    assert len(lines) == count_schedules(shape) and f"{len(lines):,} valid schedule(s)" in stderr
    for line in lines:  # every one passes the §2.1 validation
        HeadSchedule.resolve(line.split("\t")[0], shape, {})
    assert lines[0].split("\t")[0] == "4x8"  # uniform first
    _, smooth, _ = describe_in_process(capsys, "--scale", "tiny", "--enumerate", "--smooth", "--limit", "3")
    assert len(smooth.strip().splitlines()) == 3


def test_the_default_tasks_are_the_evaluation_registrys():
    from prism.config.schema import EvalSection
    from prism.eval.tasks import DEFAULT_TASKS, resolve_tasks

    assert load_config("124m").eval.tasks == list(DEFAULT_TASKS) == EvalSection().tasks
    assert resolve_tasks(EvalSection().tasks)[0] == "hellaswag"
