"""The orchestrator (prism.pipeline, reproduce/run_all.py) driven for real: planning, stage
records, skipping, resuming after a kill, config-change detection and the dry-run cost plan.

The stage programs are stand-ins with the real command lines (tests/fixtures/report/fake_stages),
because training even the tiny model in every scenario would take minutes; the report stage is the
real reproduce/report.py."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script
from rich.console import Console

from prism.config.schema import ConfigError, expand_schedule_groups, load_config
from prism.pipeline import run_all
from prism.pipeline.records import diff_configs
from prism.pipeline.stages import launch_prefix
from prism.runs.identity import stable_hash, training_identity

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fixtures" / "report" / "fake_stages"
FAKE_SCRIPTS = {
    s: str(FAKE / f)
    for s, f in (
        ("train", "train.py"),
        ("eval", "evaluate.py"),
        ("bench", "benchmark.py"),
        ("analyze", "analyze.py"),
    )
}


NO_REPORT = ["train", "eval", "bench", "analyze"]
TINY_EVAL_LIMIT = load_config("tiny").eval.limit  # what configs/scale/tiny.yaml asks the eval for


class Kit:
    """One sandbox: runs/ and results/ under tmp, a calls log, and a run_all() wrapper."""

    def __init__(self, tmp: Path, monkeypatch):
        self.tmp = tmp
        self.calls = tmp / "calls.jsonl"
        monkeypatch.setenv("FAKE_STAGE_CALLS", str(self.calls))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.delenv("FAKE_TRAIN_CRASH_AT", raising=False)
        self.monkeypatch = monkeypatch
        self.data = tmp / "evaldata"
        self.data.mkdir()
        # 100 tiny steps, whatever tiny.yaml's budget is: the scenarios below crash and hang
        # the stand-in training at fixed steps (50).
        self.base = [
            f"runs_dir={tmp / 'runs'}",
            f"results_dir={tmp / 'results'}",
            f"eval.data_dir={self.data}",
            "train.tokens=204800",
            "train.global_batch_tokens=2048",
        ]

    def run(self, *overrides, **kw) -> tuple[int, str]:
        out = io.StringIO()
        kw.setdefault("seeds", [0, 1])
        kw.setdefault("stages", NO_REPORT)  # the real report stage costs seconds; tested once
        rc = run_all(
            "tiny", [*self.base, *overrides], scripts=FAKE_SCRIPTS, console=Console(file=out, width=200), **kw
        )
        return rc, out.getvalue()

    def call_log(self) -> list[dict]:
        return (
            [json.loads(line) for line in self.calls.read_text().splitlines()] if self.calls.is_file() else []
        )

    @property
    def report(self) -> Path:
        return self.tmp / "results" / "RESULTS.md"


@pytest.fixture
def kit(tmp_path, monkeypatch):
    return Kit(tmp_path, monkeypatch)


@pytest.mark.slow
def test_fresh_run_then_second_run_does_nothing(kit):
    rc, out = kit.run(stages=None)
    assert rc == 0, out
    calls = kit.call_log()
    assert sorted((c["stage"], c.get("schedule"), c.get("seed")) for c in calls if c["stage"] == "train") == [
        ("train", "prism", 0),
        ("train", "prism", 1),
        ("train", "uniform", 0),
        ("train", "uniform", 1),
    ]
    assert sum(c["stage"] == "eval" for c in calls) == 4
    assert [c["stage"] for c in calls].count("bench") == 1
    analyze = [c for c in calls if c["stage"] == "analyze"][0]
    assert analyze["checkpoints"] == 4 and f"runs_dir={kit.tmp / 'runs'}" in analyze["overrides"]
    # eval got the config's settings on its command line and ran after its own training
    ev = [c for c in calls if c["stage"] == "eval"][0]
    assert "--data-dir" in ev["argv"] and "--limit" in ev["argv"] and ev["limit"] == TINY_EVAL_LIMIT
    stages = [c["stage"] for c in calls]
    assert stages.index("eval") > stages.index("train")
    # one log per job, records beside the outputs
    logs = sorted(p.name for p in (kit.tmp / "results" / "tiny" / "logs").iterdir())
    assert logs == [
        "analyze.log",
        "bench.log",
        "eval-prism-seed0.log",
        "eval-prism-seed1.log",
        "eval-uniform-seed0.log",
        "eval-uniform-seed1.log",
        "report.log",
        "train-prism-seed0.log",
        "train-prism-seed1.log",
        "train-uniform-seed0.log",
        "train-uniform-seed1.log",
    ]
    rec = json.loads((kit.tmp / "runs" / "tiny" / "prism" / "seed1.stage.json").read_text())
    assert rec["status"] == "done" and rec["config"]["train"]["seed"] == 1
    text = kit.report.read_text()
    assert "| tiny | prism | — | 5.9550 ± 0.0071 | 2 |" in text  # the fake losses: 5.95, 5.96
    before = {
        p: p.read_bytes() for p in kit.report.parent.rglob("*") if p.is_file() and p.suffix in (".md", ".png")
    }
    mtimes = {p: p.stat().st_mtime_ns for p in before}

    rc, out = kit.run(stages=None)
    assert rc == 0, out
    assert len(kit.call_log()) == len(calls)  # no stage program ran again
    assert "up to date" in out
    after = {p: p.read_bytes() for p in before}
    assert after == before
    assert {p: p.stat().st_mtime_ns for p in before} == mtimes  # not even rewritten


def test_killed_training_resumes_and_finished_stages_are_skipped(kit):
    kit.monkeypatch.setenv("FAKE_TRAIN_CRASH_AT", "50")
    rc, out = kit.run(seeds=[0])
    assert rc == 1  # every training was "killed"
    assert "failed" in out and "killed at step 50" in out
    assert not [c for c in kit.call_log() if c["stage"] in ("eval", "analyze")]
    assert [c["stage"] for c in kit.call_log()].count("bench") == 1  # independent work went on
    rec = json.loads((kit.tmp / "runs" / "tiny" / "uniform" / "seed0.stage.json").read_text())
    assert rec["status"] == "failed" and rec["returncode"] == 1

    kit.monkeypatch.delenv("FAKE_TRAIN_CRASH_AT")
    rc, out = kit.run(seeds=[0], dry_run=True)
    assert rc == 0 and out.count("resume") >= 2
    n_before = len(kit.call_log())
    rc, out = kit.run(seeds=[0])
    assert rc == 0, out
    new = kit.call_log()[n_before:]
    trains = [c for c in new if c["stage"] == "train"]
    assert [c["start"] for c in trains] == [50, 50]  # resumed from the checkpoint, not step 0
    assert "bench" not in [c["stage"] for c in new]  # finished before the kill: skipped
    assert sum(c["stage"] == "eval" for c in new) == 2


DRIVER = """
import runpy, sys
import prism.pipeline as pipeline
fake, real = {fake!r}, pipeline.run_all
pipeline.run_all = lambda *a, **k: real(*a, scripts=fake, **k)
sys.argv = ["run_all.py", "--scale", "tiny", "--seeds", "0", "--stages", "train,eval", *{overrides!r}]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.slow
def test_sigterm_stops_the_running_stage_and_the_rerun_resumes_it(kit, tmp_path):
    """reproduce/run_all.py itself (with the stand-in stages) killed as a scheduler would."""
    import os
    import signal
    import time

    hang = tmp_path / "train.pid"
    env = {**os.environ, "FAKE_TRAIN_HANG_FILE": str(hang), "PYTHONPATH": str(ROOT / "src")}
    code = DRIVER.format(fake=FAKE_SCRIPTS, overrides=kit.base, script=str(ROOT / "reproduce" / "run_all.py"))
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not hang.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hang.is_file(), proc.communicate(timeout=30)[0]
    train_pid = int(hang.read_text())
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, out
    assert "run the same command again to resume" in out
    with pytest.raises(ProcessLookupError):  # the stage did not outlive the orchestrator
        os.kill(train_pid, 0)
    rec = json.loads((kit.tmp / "runs" / "tiny" / "uniform" / "seed0.stage.json").read_text())
    assert (rec["status"], rec["returncode"]) == ("interrupted", 130)  # how it ended, as for a crash

    rc, out = kit.run(seeds=[0], stages=["train", "eval"])
    assert rc == 0, out
    trains = [c for c in kit.call_log() if c["stage"] == "train"]
    assert [(c["schedule"], c["start"]) for c in trains] == [("uniform", 0), ("uniform", 50), ("prism", 0)]


@pytest.mark.slow
def test_changed_training_config_is_reported_not_mixed(kit):
    assert kit.run(seeds=[0])[0] == 0
    n = len(kit.call_log())
    rc, out = kit.run("train.lr=0.001", seeds=[0])
    assert rc == 2
    assert "conflict" in out and "train.lr 0.003 -> 0.001" in out
    assert len(kit.call_log()) == n  # nothing ran

    # settings that do not change what a run computes are no conflict (the benchmark, which
    # measures at the micro-batch, is redone)
    rc, out = kit.run("train.micro_batch=4", "train.devices=1", "data.num_workers=1", seeds=[0])
    assert rc == 0 and [c["stage"] for c in kit.call_log()[n:]] == ["bench"], out
    n += 1

    rc, out = kit.run("train.lr=0.001", seeds=[0], redo_changed=True)
    assert rc == 0, out
    old = sorted(p.name for p in (kit.tmp / "runs" / "tiny" / "prism").iterdir() if ".old-" in p.name)
    assert len(old) == 1 and (kit.tmp / "runs" / "tiny" / "prism" / old[0] / "train_summary.json").is_file()
    new = kit.call_log()[n:]
    assert sorted(c["stage"] for c in new) == ["analyze", "bench", "eval", "eval", "train", "train"]
    assert all(c["start"] == 0 for c in new if c["stage"] == "train")  # fresh, not resumed


def test_changed_eval_config_reruns_only_eval(kit):
    assert kit.run(seeds=[0])[0] == 0
    n = len(kit.call_log())
    rc, out = kit.run("eval.limit=5", seeds=[0])
    assert rc == 0, out
    new = kit.call_log()[n:]
    assert [c["stage"] for c in new] == ["eval", "eval"] and {c["limit"] for c in new} == {5}
    assert f"eval.limit {TINY_EVAL_LIMIT} -> 5" in out


@pytest.mark.slow
def test_run_folder_without_record_is_checked_against_its_saved_config(kit):
    from omegaconf import OmegaConf

    from prism.config.schema import load_config, to_dict

    assert kit.run(seeds=[0])[0] == 0
    for rec in (kit.tmp / "runs" / "tiny").rglob("*.stage.json"):
        rec.unlink()  # as if train.py had been run by hand
    for sched in ("uniform", "prism"):  # ...which saves its resolved config
        cfg = load_config("tiny", [*kit.base, f"schedule={sched}", "train.seed=0"])
        OmegaConf.save(
            OmegaConf.create(to_dict(cfg)), kit.tmp / "runs" / "tiny" / sched / "seed0" / "config.yaml"
        )
    n = len(kit.call_log())
    rc, out = kit.run(seeds=[0], stages=["train"])
    assert rc == 0 and len(kit.call_log()) == n and "adopted" in out
    rc, out = kit.run("model.norm=rmsnorm", seeds=[0], stages=["train"], dry_run=True)
    assert "conflict" in out and "model.norm layernorm -> rmsnorm" in out


def test_eval_without_data_is_skipped_when_the_hub_is_off(kit):
    kit.base.remove(f"eval.data_dir={kit.data}")
    rc, out = kit.run(seeds=[0])
    assert rc == 0, out
    assert "HF_HUB_OFFLINE" in out
    assert not [c for c in kit.call_log() if c["stage"] == "eval"]
    assert "eval uniform seed0" in out and "skipped" in out


def test_bad_inputs_fail_before_any_work(kit):
    with pytest.raises(ConfigError, match="eval.data_dir='/nonexistent'"):
        kit.run("eval.data_dir=/nonexistent")
    with pytest.raises(ConfigError, match="unknown stage 'evaluate'"):
        kit.run(stages=["evaluate"])
    with pytest.raises(ConfigError, match="unknown schedule 'nope'"):
        kit.run(schedules=["uniform", "nope"])
    with pytest.raises(ConfigError, match="schedule group 'table5' is defined for n_layer=12"):
        kit.run(schedules=["table5"])
    assert kit.call_log() == []


@pytest.mark.slow
def test_locks_are_per_run_so_other_runs_go_ahead_and_a_held_one_names_its_holder(kit):
    import fcntl

    # another job is training uniform seed0 (a lock file in the run's folder, naming its holder)
    lock = kit.tmp / "runs" / "tiny" / "uniform" / ".seed0.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write('{"host": "node7", "pid": 4242, "slurm_job": "991"}\n')
        held.flush()
        rc, out = kit.run(seeds=[0, 1])
    assert rc == 1
    assert "train uniform seed0 is being run by another process" in out and "node7" in out
    ran = {(c["stage"], c.get("schedule"), c.get("seed")) for c in kit.call_log()}
    assert ("train", "uniform", 0) not in ran  # never started twice
    assert {("train", "prism", 0), ("train", "uniform", 1), ("train", "prism", 1)} <= ran
    assert ("eval", "uniform", 0) not in ran  # waits for its training
    # the lock is released with its holder: the next invocation does the rest
    rc, out = kit.run(seeds=[0, 1])
    assert rc == 0, out


def test_schedule_groups_and_launchers():
    table5 = [f"config-{i}" for i in range(1, 8)]
    assert expand_schedule_groups(["table5"], "124m") == ["uniform", "prism", *table5]
    assert expand_schedule_groups(["uniform", "config-6"], "124m") == ["uniform", "config-6"]
    assert launch_prefix("", "/py") == ["/py"]
    assert launch_prefix("torchrun --nproc-per-node=8", "/py") == ["torchrun", "--nproc-per-node=8"]
    assert launch_prefix("srun --ntasks-per-node=8", "/py") == ["srun", "--ntasks-per-node=8", "/py"]


def test_training_identity_ignores_execution_settings_only():
    from prism.config.schema import load_config, to_dict

    a = training_identity(to_dict(load_config("124m")), "prism", 0)
    b = training_identity(
        to_dict(
            load_config(
                "124m", ["train.devices=8", "train.num_nodes=4", "train.micro_batch=8", "eval.limit=10"]
            )
        ),
        "prism",
        0,
    )
    c = training_identity(to_dict(load_config("124m")), "prism", 1)
    d = training_identity(to_dict(load_config("124m", ["schedules.prism=3x2,6x4,12x6"])), "prism", 0)
    assert stable_hash(a) == stable_hash(b)
    assert stable_hash(a) != stable_hash(c) and stable_hash(a) != stable_hash(d)
    assert a["heads"] == [3, 3, 6, 6, 8, 8] + [12] * 6
    assert (
        diff_configs(a, d)
        == "heads [3, 3, 6, 6, 8, 8, 12, 12, 12, 12, 12, 12] -> [3, 3, 6, 6, 6, 6, 12, 12, 12, 12, 12, 12]"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "scale,steps,batch,tokens,gpu_h",
    [
        ("124m", "11,000", "262,144", "2,883,584,000", "2.23 GPU-h"),
        ("354m", "40,000", "262,144", "10,485,760,000", "22.73 GPU-h"),
        ("757m", "40,000", "524,288", "20,971,520,000", "71.04 GPU-h"),
    ],
)
def test_dry_run_prints_the_papers_budget(scale, steps, batch, tokens, gpu_h, tmp_path, monkeypatch, capsys):
    # reproduce/run_all.py's main in this process (its command line, output and exit code; no
    # interpreter and torch start-up per scale). The real scales read the hub, which CI switches
    # off: plan with shards instead
    monkeypatch.chdir(tmp_path)
    rc = load_script("run_all").main(
        [
            "--scale",
            scale,
            "--dry-run",
            f"results_dir={tmp_path}",
            f"runs_dir={tmp_path}",
            "data.source=shards",
            f"data.path={tmp_path}/shards",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = captured.out
    assert f"{steps} steps x {batch} tokens (" in out and f"sequences of 1,024) = {tokens} tokens" in out
    assert gpu_h in out and "seeds: 0, 1, 2" in out
    assert not (tmp_path / scale).exists()  # a dry run writes nothing


@pytest.mark.slow
def test_dry_run_gives_the_wall_time_of_the_layout_asked_for(tmp_path, monkeypatch):
    # 354m at the paper's rate: 22.73 GPU-h per run, 6 runs (uniform + prism x 3 seeds) one after
    # another, each on the whole layout; shards instead of the hub, which CI switches off
    monkeypatch.chdir(tmp_path)
    base = [f"results_dir={tmp_path}", f"runs_dir={tmp_path}", "data.source=shards"]
    base.append(f"data.path={tmp_path}/shards")

    def plan(**layout) -> str:
        out = io.StringIO()
        assert run_all("354m", base, dry_run=True, console=Console(file=out, width=1000), **layout) == 0
        return out.getvalue()

    assert "wall time on 32 devices (4 nodes x 8): 0.71 h per run, 4.26 h for all runs" in plan(nodes=4)
    assert "wall time on 8 devices: 2.84 h per run, 17.05 h for all runs" in plan(nodes=1)
    assert "wall time on 8 devices (2 nodes x 4): 2.84 h per run" in plan(nodes=2, gpus_per_node=4)
    # this machine's measured rate (bench.json, per device) on the same layout: 10,485,760,000
    # tokens / 100,000 tokens/s / 3600 = 29.13 device-hours per run, / 32 = 0.91 h
    bench = {"num_devices": 1, "hardware": "X", "schedules": {"uniform": {"train_tokens_per_s": 1e5}}}
    (tmp_path / "354m").mkdir()
    (tmp_path / "354m" / "bench.json").write_text(json.dumps(bench))
    out = plan(nodes=4)
    assert "uniform 100,000 (from" in out and "wall time on 32 devices (4 nodes x 8): 0.91 h per run" in out
