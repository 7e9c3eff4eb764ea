"""End-to-end training on the offline data: outputs, resume, DDP, fair comparison, bad configs,
NaN guard. All runs use a shrunken tiny config (32-token windows, 128-token steps, 12 steps): the
50k-row vocabulary projection dominates the cost of every token on a CPU."""

import hashlib
import json
import shutil
from importlib import metadata

import pytest
import torch
from conftest import load_script
from lightning.pytorch.callbacks import Callback

from prism.config.schema import load_config
from prism.runs.checkpoint import load_model
from prism.train.callbacks import NonFiniteLossError, StepProgressBar
from prism.train.trainer import RunExistsError, train

main = load_script("train").main  # reproduce/train.py's

# 12 optimizer steps of 4 sequences x 32 tokens, split as micro_batch 2 x accumulation 2;
# validation on 8 fixed windows at steps 0, 6 and 12; checkpoints every 3 steps.
SMALL = [
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=1536",
    "train.lr=3e-3",
    "train.val_every_steps=6",
    "train.ckpt_every_steps=3",
    "train.log_every_steps=2",
    "data.val_tokens=256",
    "train.milestones=[10.0,9.0,8.0]",
]
SUMMARY_KEYS = {
    "batch_split",
    "data",
    "ddp",
    "scale",
    "schedule",
    "heads",
    "seed",
    "n_params",
    "flops_per_token",
    "steps",
    "tokens_seen",
    "final_val_loss",
    "min_val_loss",
    "min_val_step",
    "min_val_tokens",
    "val_curve",
    "throughput",
    "wall_clock_s",
    "environment",
    "earlier_environments",
    "finished",
    "config_hash",
}
THROUGHPUT_KEYS = {
    "tokens_per_s",
    "tokens_per_s_per_device",
    "step_time_s",
    "mfu",
    "peak_memory_bytes",
    "hardware",
    "num_devices",
}


def small(runs_dir, *extra):
    return load_config("tiny", [*SMALL, f"runs_dir={runs_dir}", *extra])


class Recorder(Callback):
    """What the run saw: a digest of every training micro-batch and the weights at the start, and
    what its progress bar showed at the end (label, count, total)."""

    def __init__(self):
        self.batches, self.init, self.bar = [], None, None

    def on_train_start(self, trainer, pl_module):
        self.init = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_train_end(self, trainer, pl_module):
        task = next(c for c in trainer.callbacks if isinstance(c, StepProgressBar)).train_progress_bar
        self.bar = (task.description, task.completed, task.total)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        x, y = batch
        digest = hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()[:16]
        self.batches.append((trainer.global_step, digest))


class CrashAt(Callback):
    """A hard failure after `step` optimizer steps (nothing of that step is saved)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            raise RuntimeError(f"simulated crash at step {self.step}")


class PoisonAt(Callback):
    """Corrupt one weight with NaN before step `step` + 1 runs."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.blocks[0].mlp.down.weight[0, 0] = float("nan")


# `reference` (this file's run, uninterrupted, one process) is a session fixture of conftest.py,
# shared with test_checkpoints.py and test_torchrun.py; `ddp_reference` is its two-process DDP run.


@pytest.mark.slow
def test_tiny_trains_and_writes_every_output(reference):
    out, s = reference["out"], reference["summary"]
    assert set(s) == SUMMARY_KEYS and set(s["throughput"]) == THROUGHPUT_KEYS
    curve = s["val_curve"]
    assert [p["step"] for p in curve] == [0, 6, 12]
    start, final = curve[0]["val_loss"], s["final_val_loss"]
    # ln(50257) = 10.8 at init; 12 steps of 128 tokens reach ~9.2 (the full tiny run reaches ~6)
    assert start > 10.0 and final < start - 1.2, (start, final)
    assert s["finished"] is True and s["steps"] == 12 and s["tokens_seen"] == 1536
    assert s["heads"] == [1, 1, 2, 2, 4, 4, 4, 4] and s["schedule"] == "prism"
    t = s["throughput"]
    assert t["tokens_per_s"] > 0 and t["tokens_per_s"] == t["tokens_per_s_per_device"]
    assert t["step_time_s"] > 0 and t["peak_memory_bytes"] > 0 and t["num_devices"] == 1
    assert t["mfu"] is None and t["hardware"].startswith("CPU")  # no known peak for a CPU
    env = s["environment"]  # what this process ran with, from the installed distributions
    assert env["torch"] == metadata.version("torch") and env["lightning"] == metadata.version("lightning")
    assert env["datasets"] == metadata.version("datasets") and env["tiktoken"] == metadata.version("tiktoken")
    assert env["cuda"] == torch.version.cuda and env["hardware"] == t["hardware"] and env["num_devices"] == 1
    assert env["git_commit"] and env["kit_version"] and s["earlier_environments"] == []
    m = json.loads((out / "milestones.json").read_text())
    assert m["thresholds"] == [10.0, 9.0, 8.0]
    assert m["min"] == {
        "val_loss": s["min_val_loss"],
        "step": s["min_val_step"],
        "tokens": s["min_val_tokens"],
    }
    hit = m["milestones"][0]  # 10.0 is crossed by step 6
    assert hit["threshold"] == 10.0 and hit["step"] == 6 and hit["tokens"] == 768
    assert hit["wall_clock_s"] > 0
    # TensorBoard: scalars and the config as hyperparameters
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(out / "tb"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {
        "train/loss",
        "val/loss",
        "lr-AdamW/pg1",
        "train/device/items_per_sec",
        "milestones/tokens_at_10",
    } <= tags
    assert "schedule: prism" in (out / "tb" / "hparams.yaml").read_text()
    assert (out / "config.yaml").is_file()
    assert {p.name for p in (out / "checkpoints").iterdir()} == {
        "last.ckpt",
        "step-000009.ckpt",
        "step-000012.ckpt",
    }  # train.keep_checkpoints=2 (default)


@pytest.mark.slow
def test_every_metric_of_a_step_shares_that_step_in_tensorboard_and_csv(reference):
    """x = the optimizer steps done when a metric is logged (docs/tracking.md): a validation's
    metrics at the step it followed (0 for the one before the first step), a training step's loss
    and tokens/s at its own number. The CSV's rows never go back."""
    import csv

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, s = reference["out"], reference["summary"]
    acc = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tb = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    with (out / "csv" / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps) and steps[0] == 0, steps
    in_csv = {k: [(int(r["step"]), float(r[k])) for r in rows if r[k] != ""] for k in rows[0] if k != "step"}
    validations, losses = [p["step"] for p in s["val_curve"]], [p["val_loss"] for p in s["val_curve"]]
    assert validations == [0, 6, 12]
    for logged in (tb, in_csv):
        for key in ("val/loss", "val/loss_min", "val/tokens_seen"):
            assert [x for x, _ in logged[key]] == validations, (key, logged[key])
        # the values are the curve's, the one before the first step included (float32 in both)
        assert [v for _, v in logged["val/loss"]] == pytest.approx(losses, rel=1e-6)
        assert logged["milestones/tokens_at_10"] == [(6, 768)]  # with the validation that crossed it
        logging_steps = [2, 4, 6, 8, 10, 12]  # train.log_every_steps=2, and the last step
        assert [x for x, _ in logged["train/loss"]] == logging_steps
        rates = [x for x, _ in logged["train/device/items_per_sec"]]  # once the meter has a window
        assert rates and set(rates) <= set(logging_steps) and rates[-1] == 12, rates
        # the learning rate is logged before the step that uses it: at the steps done then
        assert [x for x, _ in logged["lr-AdamW/pg1"]] == [x - 1 for x in logging_steps]
    # one CSV row holds every metric of one validation
    assert [r["val/loss_min"] != "" for r in rows] == [r["val/loss"] != "" for r in rows]


@pytest.mark.slow
def test_library_notices_that_do_not_apply_are_silenced_and_no_others(reference):
    """prism.train.trainer.quiet_library_notices: the lines that would mislead a user of the kit are
    gone from a real run's console, Lightning's other lines still show."""
    said, warned = reference["log"], reference["warnings"]
    assert any(line.startswith("GPU available: ") for line in said), said  # the rest still shows
    assert any(line.startswith("`Trainer.fit` stopped: `max_steps=12` reached") for line in said), said
    for misleading in ("`weights_only` was not set", "💡 Tip: For seamless cloud logging"):
        assert not any(misleading in line for line in said), (misleading, said)
    for misleading in ("`isinstance(treespec, LeafSpec)` is deprecated", "`IterableDataset` has `__len__`"):
        assert not any(misleading in w for w in warned), (misleading, warned)


@pytest.mark.slow
def test_checkpoint_and_export_load_without_pickle(reference):
    out = reference["out"]
    from_ckpt, meta = load_model(out / "checkpoints" / "last.ckpt")  # torch.load(weights_only=True)
    from_st, st_meta = load_model(out)
    assert meta["step"] == 12 and meta["schedule"] == "prism" and meta["seed"] == 0
    assert st_meta["config_hash"] == reference["summary"]["config_hash"]
    assert st_meta["scale"] == "tiny" and st_meta["heads"] == [1, 1, 2, 2, 4, 4, 4, 4]
    for (k, a), b in zip(from_ckpt.state_dict().items(), from_st.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.slow
def test_a_finished_run_is_done_on_every_path(reference, capsys):
    # the library call and the command decide alike (prism.train.plan.run_status): nothing is
    # trained or rewritten, the folder is returned, and both say so in the same sentence
    cfg = small(reference["runs"], "schedule=prism")
    before = (reference["out"] / "train_summary.json").read_text()
    done = f"{reference['out']} already holds this finished run; nothing to do (--overwrite trains it again)."
    assert train(cfg) == reference["out"]
    assert capsys.readouterr().out.strip() == done
    args = ["--scale", "tiny", "--schedule", "prism", "--seed", "0", *SMALL, f"runs_dir={reference['runs']}"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == done
    assert (reference["out"] / "train_summary.json").read_text() == before


@pytest.mark.slow
def test_another_config_in_a_finished_runs_folder_is_refused_on_every_path(reference, capsys):
    other = "train.beta2=0.9"  # part of the identity: the same folder, another run
    refused = f"{reference['out']} already holds a finished run (of a different config, hash "
    with pytest.raises(RunExistsError) as err:
        train(small(reference["runs"], "schedule=prism", other))
    assert str(err.value).startswith(refused), err.value
    args = ["--scale", "tiny", "--schedule", "prism", "--seed", "0", *SMALL, other]
    before = (reference["out"] / "train_summary.json").read_text()
    assert main([*args, f"runs_dir={reference['runs']}"]) == 1
    assert capsys.readouterr().err.strip().startswith(f"error: {refused}")
    assert (reference["out"] / "train_summary.json").read_text() == before


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """The reference's command dying at step 8, 2 steps after the step-6 checkpoint: its runs_dir
    and what it saw. The resume tests below each resume a copy of that folder."""
    runs, first = tmp_path_factory.mktemp("crashed"), Recorder()
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(small(runs, "schedule=prism"), extra_callbacks=[first, CrashAt(8)])
    return runs, first


def copy_of(crashed, tmp_path):
    shutil.copytree(crashed[0], tmp_path, dirs_exist_ok=True)
    return tmp_path


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(reference, crashed, tmp_path):
    cfg = small(copy_of(crashed, tmp_path), "schedule=prism")
    first = crashed[1]
    out = tmp_path / "tiny" / "prism" / "seed0"
    assert not (out / "train_summary.json").exists()
    with pytest.raises(RunExistsError, match="config hash"):  # a different recipe never resumes
        train(small(tmp_path, "schedule=prism", "train.lr=1e-3"))
    second = Recorder()
    train(cfg, resume=True, extra_callbacks=[second])
    # the bar counts the run's steps from where it resumed, not this session's micro-batches
    assert second.bar == ("Training steps", 12, 12) == reference["rec"].bar
    resumed = json.loads((out / "train_summary.json").read_text())
    ref = reference["summary"]
    assert resumed["earlier_environments"] == []  # resumed in the process's own environment
    assert abs(resumed["final_val_loss"] - ref["final_val_loss"]) < 1e-4
    assert [p["val_loss"] for p in resumed["val_curve"]] == pytest.approx(
        [p["val_loss"] for p in ref["val_curve"]], abs=1e-4
    )
    assert [p["step"] for p in resumed["val_curve"]] == [0, 6, 12]
    seen = [b for b in first.batches if b[0] < 6] + second.batches
    assert seen == reference["rec"].batches  # the same micro-batches, in the same order
    milestones = json.loads((out / "milestones.json").read_text())
    assert [m["step"] for m in milestones["milestones"]] == [
        m["step"] for m in json.loads((reference["out"] / "milestones.json").read_text())["milestones"]
    ]


@pytest.mark.slow
def test_resume_with_another_batch_split_continues_the_same_run(reference, crashed, tmp_path):
    # as on another number of GPUs: the checkpoint of step 6 was written with micro_batch 2 x
    # accumulation 2, the rest of the run goes on with micro_batch 4 x accumulation 1
    copy_of(crashed, tmp_path)
    # and with another torch: the summary names the environment of the attempt before the resume
    ckpt_path = tmp_path / "tiny" / "prism" / "seed0" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    [key] = [k for k in ckpt["callbacks"] if "TrainSummary" in k]
    ckpt["callbacks"][key]["environments"][-1]["torch"] = "2.6.0+earlier"
    torch.save(ckpt, ckpt_path)
    rec = Recorder()
    out = train(small(tmp_path, "schedule=prism", "train.micro_batch=4"), resume=True, extra_callbacks=[rec])
    resumed = json.loads((out / "train_summary.json").read_text())
    assert [e["torch"] for e in resumed["earlier_environments"]] == ["2.6.0+earlier"]
    assert resumed["environment"]["torch"] == metadata.version("torch")
    assert resumed["batch_split"] == {"micro_batch": 4, "accumulation": 1, "world_size": 1}
    assert [p["step"] for p in resumed["val_curve"]] == [0, 6, 12]  # validations where they were
    assert [step for step, _ in rec.batches] == list(range(6, 12))  # one micro-batch per step now
    # the same windows per step in another float32 summation order (as test_ddp_... below)
    for a, b in zip(resumed["val_curve"], reference["summary"]["val_curve"]):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4, (a, b)


@pytest.mark.slow
def test_auto_micro_batch_trains_the_same_run_in_the_micro_batches_that_fit(reference, tmp_path):
    # train.micro_batch=auto on the CPU plans for 80 GiB: the whole step of 4 sequences fits, so the
    # run takes micro_batch 4 x accumulation 1 where the reference took 2 x 2; the identity, the
    # global batch and so the optimisation are the reference's
    out = train(small(tmp_path, "schedule=prism", "train.micro_batch=auto"))
    s = json.loads((out / "train_summary.json").read_text())
    ref = reference["summary"]
    assert s["config_hash"] == ref["config_hash"]
    assert s["batch_split"] == {"micro_batch": 4, "accumulation": 1, "world_size": 1}
    assert s["memory"]["auto"] is True and s["memory"]["fits"] is True
    assert (s["memory"]["micro_batch"], s["memory"]["accumulation"]) == (4, 1)
    # the same sequences per step summed in another float32 order (1e-4 as the DDP comparison)
    assert abs(s["final_val_loss"] - ref["final_val_loss"]) < 1e-4
    assert [p["val_loss"] for p in s["val_curve"]] == pytest.approx(
        [p["val_loss"] for p in ref["val_curve"]], abs=1e-4
    )


@pytest.mark.slow
def test_resume_where_auto_chooses_another_micro_batch_continues_the_same_run(reference, crashed, tmp_path):
    # the step-6 checkpoint was written at micro_batch 2 x accumulation 2; the resume on "other
    # hardware" lets the memory plan choose, and it takes 4 x 1
    copy_of(crashed, tmp_path)
    rec = Recorder()
    cfg = small(tmp_path, "schedule=prism", "train.micro_batch=auto", "train.gpu_memory_gib=40")
    out = train(cfg, resume=True, extra_callbacks=[rec])
    resumed = json.loads((out / "train_summary.json").read_text())
    assert resumed["batch_split"] == {"micro_batch": 4, "accumulation": 1, "world_size": 1}
    assert resumed["memory"]["device_gib"] == 40
    assert [step for step, _ in rec.batches] == list(range(6, 12))  # one micro-batch per step now
    assert [p["step"] for p in resumed["val_curve"]] == [0, 6, 12]
    for a, b in zip(resumed["val_curve"], reference["summary"]["val_curve"]):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4, (a, b)


@pytest.mark.slow
def test_uniform_and_prism_start_identical(reference, tmp_path):
    rec = Recorder()
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(small(tmp_path, "schedule=uniform"), extra_callbacks=[rec, CrashAt(2)])
    prism = reference["rec"]
    assert rec.init.keys() == prism.init.keys()
    for k in prism.init:
        assert torch.equal(rec.init[k], prism.init[k]), k
    assert rec.batches == prism.batches[: len(rec.batches)] and len(rec.batches) == 4


@pytest.mark.slow
def test_ddp_two_processes_matches_single_process(reference, ddp_reference):
    # same global batch: 2 ranks x micro_batch 2 x accumulation 1 vs 1 x 2 x 2 (conftest.py runs
    # reproduce/train.py with train.devices=2 train.strategy=ddp and two non-default DDP settings)
    s = ddp_reference
    assert s["throughput"]["num_devices"] == 2 and s["steps"] == 12
    # the DDP settings reach the wrapper (these change bucketing, never the summed gradients)
    assert s["ddp"] == {"bucket_cap_mb": 1.0, "static_graph": True, "gradient_as_bucket_view": True}
    assert s["config_hash"] == reference["summary"]["config_hash"]
    # Identical math in a different float32 summation order (gradient all-reduce vs
    # accumulation). The noise floor of such a reordering, measured with this config as one
    # process at micro_batch 4 x 1 against 2 x 2, is ~1e-6 at steps 6 and 12; 1e-4 leaves 100x
    # margin, while a rank reading the wrong windows or a wrongly averaged gradient moves the
    # validation loss by orders of magnitude more.
    assert len(s["val_curve"]) == len(reference["summary"]["val_curve"]) == 3
    for a, b in zip(s["val_curve"], reference["summary"]["val_curve"]):
        assert a["step"] == b["step"] and abs(a["val_loss"] - b["val_loss"]) < 1e-4, (a, b)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.devices=3", "cannot share evenly"),
        ("schedule=fancy", "unknown schedule 'fancy'"),
        ("train.tokens=100", "smaller than one optimizer step"),
        ("data.source=local", "needs data.path"),
    ],
)
def test_bad_config_fails_before_training(tmp_path, capsys, override, message):
    small = [o for o in SMALL if o.split("=")[0] != override.split("=")[0]]  # a key given twice warns
    args = ["--scale", "tiny", *small, f"runs_dir={tmp_path}", override]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())  # nothing written


def test_micro_batch_is_a_ceiling_and_the_split_is_recorded(tmp_path):
    # 4 sequences per step on one device with a ceiling of 3: the largest divisor is 2, so
    # 2 x accumulation 2 (the reference's split), and the run says so in its summary (a run of
    # two such steps: its length does not enter the split)
    out = train(small(tmp_path, "train.micro_batch=3", "train.tokens=256"))
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["batch_split"] == {"micro_batch": 2, "accumulation": 2, "world_size": 1}


def test_hub_source_with_the_hub_switched_off_fails_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["--scale", "tiny", *SMALL, f"runs_dir={tmp_path}", "data.source=hub"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "HF_HUB_OFFLINE=1 switches the hub off" in err and len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())


def test_missing_data_fails_before_training(tmp_path, capsys):
    args = [
        "--scale",
        "tiny",
        *SMALL,
        f"runs_dir={tmp_path / 'runs'}",
        "data.source=local",
        f"data.path={tmp_path / 'no-such-folder'}",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "no-such-folder" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_nan_loss_stops_with_last_good_checkpoint(tmp_path):
    cfg = small(tmp_path, "schedule=uniform")
    with pytest.raises(NonFiniteLossError) as info:
        train(cfg, extra_callbacks=[PoisonAt(4)])
    msg = str(info.value)
    last = tmp_path / "tiny" / "uniform" / "seed0" / "checkpoints" / "last.ckpt"
    assert "step 5" in msg and str(last) in msg
    model, meta = load_model(last)
    assert meta["step"] == 3
    assert all(torch.isfinite(p).all() for p in model.parameters())


class SigtermAtSanityCheck(Callback):
    """SIGTERM to this process while the fresh run validates before step 0, when Lightning's own
    SIGTERM handler is in place and prism's Preemption is not yet."""

    def on_sanity_check_start(self, trainer, pl_module) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_before_the_first_step_is_a_stop_not_a_success(tmp_path, capsys):
    """Lightning answers it with SIGTERMException, a SystemExit that would end train.py with 0
    and no checkpoint; train.py says it stopped and exits 75, so run_all.py and the scheduler see a
    stop to resume from."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from prism.cli.exits import run_command

    with pytest.raises(SIGTERMException) as stopped:
        train(small(tmp_path, "schedule=uniform"), extra_callbacks=[SigtermAtSanityCheck()])

    def again() -> int:
        raise stopped.value

    # train.py's ending (prism.cli.train runs its work so)
    assert run_command(again, interrupted="-", crashes=True) == 75
    assert capsys.readouterr().err.startswith("preempted: stopped by SIGTERM before the first step")
