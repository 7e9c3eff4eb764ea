"""train.strategy=fsdp: FSDP2 (fully_shard) on two CPU processes over gloo, against DDP.

The runs use test_train's shrunken tiny config (12 optimizer steps of 4 x 32 tokens, 2 ranks x
micro_batch 2, validation at steps 0, 6 and 12, checkpoints every 3 steps)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import FLOAT32_EPS, side_by_side
from test_train import SMALL as TRAIN_SMALL

from prism.config.schema import ConfigError, load_config
from prism.core.model import ModelConfig, PrismDecoder
from prism.runs.checkpoint import load_model
from prism.train.strategy import check_strategy

ROOT = Path(__file__).resolve().parents[1]
SMALL = [*TRAIN_SMALL, "train.accelerator=cpu", "train.devices=2"]  # test_train's run on two processes
# Lightning starts rank 1 by running this script again, so the crash is a callback of a script.
CRASHING_DRIVER = """
import sys
from lightning.pytorch.callbacks import Callback
from prism.config.schema import load_config
from prism.train.trainer import train

class CrashAt(Callback):
    def on_train_start(self, trainer, *args):
        print(f"rank {trainer.global_rank} starts at step {trainer.global_step}", flush=True)

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= int(sys.argv[1]):
            raise RuntimeError("simulated crash")

train(load_config("tiny", sys.argv[2:]), extra_callbacks=[CrashAt()])
"""


def run_dir(runs: Path) -> Path:
    return runs / "tiny" / "prism" / "seed0"


def start_two_ranks(runs: Path, *overrides: str, script: list[str] | None = None) -> subprocess.Popen:
    runs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    argv = script or [str(ROOT / "reproduce" / "train.py"), "--scale", "tiny", "--schedule", "prism"]
    cmd = [sys.executable, *argv, *SMALL, f"runs_dir={runs}", "schedule=prism", *overrides]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=runs)


def summary_of(runs: Path, proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((run_dir(runs) / "train_summary.json").read_text())


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_model(path)[0].state_dict()


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
TRAIN = [str(ROOT / "reproduce" / "train.py"), "--scale", "tiny", "--schedule", "prism"]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> dict:
    """One uninterrupted FSDP run with the paper's clipping (global norm 1.0), and beside it the
    same command dying at step 8 (two steps after the step-6 checkpoint)."""
    runs, crashing = tmp_path_factory.mktemp("fsdp"), tmp_path_factory.mktemp("fsdp-crash")
    driver = crashing / "crash.py"
    driver.write_text(CRASHING_DRIVER)
    done, crashed = side_by_side(
        start_two_ranks(runs, "train.strategy=fsdp"),
        start_two_ranks(crashing, "train.strategy=fsdp", script=[str(driver), "8"]),
        timeout=1200,
    )
    summary = summary_of(runs, done)
    assert summary["steps"] == 12 and summary["throughput"]["num_devices"] == 2
    assert summary["batch_split"] == {"micro_batch": 2, "accumulation": 1, "world_size": 2}
    after_crash = {"proc": crashed, "finished": (run_dir(crashing) / "train_summary.json").exists()}
    return {"runs": runs, "crashing": crashing, "driver": driver, "after_crash": after_crash}


@pytest.fixture(scope="module")
def resumed_and_torchrun(fsdp_run, tmp_path_factory) -> dict:
    """Side by side: the crashed run's command again (no crash this time), and the uninterrupted
    run's command under torchrun."""
    torchrun = tmp_path_factory.mktemp("fsdp-torchrun")
    resumed, launched = side_by_side(
        start_two_ranks(fsdp_run["crashing"], "train.strategy=fsdp", script=[str(fsdp_run["driver"]), "99"]),
        start_two_ranks(torchrun, "train.strategy=fsdp", script=[*TORCHRUN, *TRAIN]),
        timeout=1200,
    )
    return {"resumed": resumed, "torchrun": (torchrun, launched)}


@pytest.mark.slow
def test_fsdp_without_clipping_is_ddp_bit_for_bit(tmp_path):
    # FSDP and DDP do the same float32 arithmetic once clipping (the one global reduction that
    # FSDP orders differently) is off: each rank runs the same forward and backward on the same
    # weights and micro-batches, the gradient mean of two ranks is (a + b) / 2 under both (a sum
    # of two floats has one rounding whatever the order, halving is exact), and AdamW is
    # elementwise, so a shard updates exactly like the same elements of the whole tensor. The
    # tolerance is therefore zero: any sharding mistake (a shard updated twice or never, a
    # gradient summed instead of averaged, a rank's micro-batch dropped) breaks the equality.
    procs = side_by_side(
        start_two_ranks(tmp_path / "fsdp", "train.strategy=fsdp", "train.grad_clip=0"),
        start_two_ranks(tmp_path / "ddp", "train.strategy=ddp", "train.grad_clip=0"),
        timeout=1200,
    )
    fsdp, ddp = (summary_of(tmp_path / name, proc) for name, proc in zip(("fsdp", "ddp"), procs))
    assert fsdp["ddp"] is None and ddp["ddp"] is not None  # the runs really differ in strategy
    assert [p["step"] for p in fsdp["val_curve"]] == [0, 6, 12]
    assert [p["val_loss"] for p in fsdp["val_curve"]] == [p["val_loss"] for p in ddp["val_curve"]]
    assert fsdp["val_curve"][-1]["val_loss"] < fsdp["val_curve"][0]["val_loss"] - 1.0  # it learned
    assert max_abs_diff(weights(run_dir(tmp_path / "fsdp")), weights(run_dir(tmp_path / "ddp"))) == 0.0


@pytest.mark.slow
def test_fsdp_with_clipping_tracks_ddp(fsdp_run, ddp_reference):
    # With clipping, the only difference from DDP is the global gradient norm: FSDP sums each
    # rank's shard norms and then the ranks, DDP sums whole tensors, so the clip factor differs
    # in its last bits (bounded in test_sharded_clipping_is_global_norm) at every clipped step.
    # Training amplifies such a last-bit difference like any other float32 reordering; the
    # DDP-vs-one-process test bounds that class of difference by 1e-4 in validation loss (its
    # reordering perturbs every gradient element by ~eps; this one only a scalar factor). A
    # clip applied per shard instead (a local norm, as plain clipping of FSDP1's flat shards
    # would be) scales each rank's gradients differently and moves the loss far more.
    # (conftest.py's DDP run of the same command; its bucketing settings leave the sums alone)
    fsdp = json.loads((run_dir(fsdp_run["runs"]) / "train_summary.json").read_text())
    ddp = ddp_reference
    for a, b in zip(fsdp["val_curve"], ddp["val_curve"], strict=True):
        assert a["step"] == b["step"] and abs(a["val_loss"] - b["val_loss"]) < 1e-4, (a, b)
    assert fsdp["val_curve"][0]["val_loss"] == ddp["val_curve"][0]["val_loss"]  # same init


@pytest.mark.slow
def test_fsdp_checkpoint_resumes_and_the_export_holds_the_full_weights(fsdp_run, resumed_and_torchrun):
    out = run_dir(fsdp_run["runs"])
    exported, last = weights(out), weights(out / "checkpoints" / "last.ckpt")
    # the export gathers every shard: whole tensors of the model's shapes, equal to the
    # checkpoint's (gathered the same way) and not the initial weights
    model = PrismDecoder(ModelConfig(**json.loads((out / "model_config.json").read_text())["model"]))
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert max_abs_diff(exported, last) == 0.0
    # one checkpoint file (not a sharded folder), which resume opens for its step and hash
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)["global_step"] == 12

    # died at step 8, two steps after the step-6 checkpoint, then the same command again: it
    # resumes there and must end where the uninterrupted run ended, bit for bit (the same
    # arithmetic on the same batches, from the gathered weights and AdamW state re-sharded)
    crashed = fsdp_run["after_crash"]["proc"]
    assert crashed.returncode != 0 and "simulated crash" in crashed.stderr
    assert not fsdp_run["after_crash"]["finished"]
    proc = resumed_and_torchrun["resumed"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):  # both ranks resumed from step 6's checkpoint, none restarted
        assert f"rank {rank} starts at step 6" in proc.stdout, proc.stdout[-2000:]
    resumed = json.loads((run_dir(fsdp_run["crashing"]) / "train_summary.json").read_text())
    ref = json.loads((out / "train_summary.json").read_text())
    assert [p["val_loss"] for p in resumed["val_curve"]] == [p["val_loss"] for p in ref["val_curve"]]
    assert max_abs_diff(weights(run_dir(fsdp_run["crashing"])), exported) == 0.0


@pytest.mark.slow
def test_fsdp_under_torchrun_matches_lightnings_own_processes(fsdp_run, resumed_and_torchrun):
    # Under torchrun (or srun) every rank runs from the start and the ranks join the process
    # group before fit, to agree on resuming (prism.train.resume.agree), before the LightningModule
    # that FSDP's device mesh is handed to exists. The same run, the same arithmetic: bit for bit.
    runs, proc = resumed_and_torchrun["torchrun"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads((run_dir(fsdp_run["runs"]) / "train_summary.json").read_text())
    got = json.loads((run_dir(runs) / "train_summary.json").read_text())
    assert got["throughput"]["num_devices"] == 2
    assert [p["val_loss"] for p in got["val_curve"]] == [p["val_loss"] for p in ref["val_curve"]]


# ----- clipping over shards ----------------------------------------------------------------------
def _clip_worker(rank: int, world: int, init_file: str, result: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from prism.train.strategy import shard_decoder

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cfg = ModelConfig(n_layer=2, d_model=32, h_base=2, heads=[1, 2], seq_len=16, vocab_size=256)
    torch.manual_seed(0)
    whole = PrismDecoder(cfg)
    sharded = PrismDecoder(cfg)
    sharded.load_state_dict(whole.state_dict())
    shard_decoder(sharded, init_device_mesh("cpu", (world,)))
    x = torch.randint(0, cfg.vocab_size, (2 * world, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    # the whole model sees the global batch as the mean of the ranks' losses, as FSDP averages
    sum(whole(x[r::world], x[r::world]) for r in range(world)).div(world).backward()
    sharded(x[rank::world], x[rank::world]).backward()
    max_norm = 1e-3  # far below the gradient's norm: the clip is active
    norm_whole = torch.nn.utils.clip_grad_norm_(whole.parameters(), max_norm)
    norm_sharded = torch.nn.utils.clip_grad_norm_(sharded.parameters(), max_norm).full_tensor()
    grads = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}
    if rank == 0:
        worst = max(
            ((grads[n] - p.grad).abs().max() / p.grad.abs().max()).item() for n, p in whole.named_parameters()
        )
        numel = sum(p.numel() for p in whole.parameters())
        json.dump(
            {"whole": norm_whole.item(), "sharded": norm_sharded.item(), "worst": worst, "numel": numel},
            open(result, "w"),
        )
    dist.destroy_process_group()


@pytest.mark.slow
def test_sharded_clipping_is_global_norm(tmp_path):
    result = tmp_path / "clip.json"
    mp.spawn(_clip_worker, args=(2, str(tmp_path / "store"), str(result)), nprocs=2, join=True)
    r = json.loads(result.read_text())
    # Both norms are the square root of a float32 sum of the same numel squares in different
    # orders; torch reduces in blocks (cascade), so each order's relative error is below
    # log2(numel) roundings; the two rank-mean gradients themselves are equal (see above). The
    # square root halves a relative error, the clip factor max_norm / (norm + 1e-6) and the
    # product add one rounding each. A local (per-shard) norm would be ~1/sqrt(2) of the global.
    bound = (math.log2(r["numel"]) + 2) * FLOAT32_EPS
    assert abs(r["sharded"] - r["whole"]) <= bound * r["whole"], r
    assert r["worst"] <= bound + 2 * FLOAT32_EPS, r


# ----- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.strategy=fsdp_cpu_offload",
            "train.strategy='fsdp_cpu_offload' is Lightning's FSDP1 strategy, which refuses the kit's "
            "precision plugin and norm clipping; use train.strategy=fsdp (FSDP2), auto or ddp.",
        ),
        (
            "train.precision=16-mixed",
            "train.precision=16-mixed is invalid with train.strategy=fsdp: its loss scaler looks for "
            "inf only in each rank's own gradient shard, so ranks could skip different steps; use "
            "bf16-mixed (the paper's recipe) or 32-true.",
        ),
    ],
)
def test_unsupported_fsdp_settings_are_refused_in_one_sentence(override, message):
    cfg = load_config("tiny", ["train.strategy=fsdp", override])
    with pytest.raises(ConfigError) as err:
        check_strategy(cfg)
    assert str(err.value) == message


def test_supported_settings_pass():
    for extra in ([], ["train.precision=bf16-mixed"], ["train.precision=32-true"]):
        check_strategy(load_config("tiny", ["train.strategy=fsdp", *extra]))
    check_strategy(load_config("tiny", ["train.strategy=ddp", "train.precision=16-mixed"]))


def test_fsdp_on_a_torch_without_the_public_fully_shard_is_refused(monkeypatch):
    """torch 2.4 and 2.5 (inside pyproject's range) have FSDP2 only under a private name."""
    import prism.train.strategy

    monkeypatch.setattr(prism.train.strategy, "fsdp2_available", lambda: False)
    with pytest.raises(ConfigError) as err:
        check_strategy(load_config("tiny", ["train.strategy=fsdp"]))
    assert str(err.value) == (
        f"train.strategy=fsdp needs torch>=2.6, whose torch.distributed.fsdp has the public "
        f"fully_shard; this is torch {torch.__version__}: upgrade torch or use ddp."
    )
    check_strategy(load_config("tiny", ["train.strategy=ddp"]))  # DDP needs no FSDP2
