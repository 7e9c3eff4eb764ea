"""The stage registry (prism.pipeline.stages): each stage is one object that the plan and the
runner ask for its jobs, their identity, the check of their output and their launcher, so a new
stage is one class and one registry line."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from pydantic import StrictBool
from rich.console import Console

from prism.config.schema import RunAllSection, load_config
from prism.io import read_json
from prism.pipeline.plan import assign_statuses, build_plan, default_scripts
from prism.pipeline.runner import execute
from prism.pipeline.stages import STAGES, Job, Phase, Placement, PlanContext, PlannedRun, Stage
from prism.pipeline.stages.train import run_weights
from prism.runs.records import Record

ROOT = Path(__file__).resolve().parents[1]

# A stage program: writes {"ok": true, "argv": [...]} to the path after --out.
PROBE_SCRIPT = """import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
open(out, "w").write(json.dumps({"ok": True, "argv": sys.argv[1:]}))
"""


class ProbeOutput(Record):
    """What the probe writes: its record, through which the pipeline reads the output."""

    ok: StrictBool


class Probe(Stage):
    """Once per scale after the runs, reading nothing: runs for real in the test below."""

    name = "probe"
    script = "probe.py"
    phase = Phase.after_runs
    placement = Placement.here  # no launcher to configure
    output_record = ProbeOutput

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        out = ctx.results / "probe.json"
        config = {"schedules": list(ctx.cfg.run_schedules)}
        return [
            Job(
                self,
                "probe",
                out,
                config,
                ctx.logs / "probe.log",
                lambda: [*ctx.command(self), "--out", str(out)],
            )
        ]

    def complete(self, output: ProbeOutput) -> bool:
        return output.ok


class PerRunProbe(Probe):
    """One job per run, needing that run's training."""

    name = "per_run_probe"
    phase = Phase.per_run

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        train = ctx.job("train", run)
        out = ctx.results / "probe" / f"{run.schedule}-seed{run.seed}.json"
        return [
            Job(
                self,
                f"probe {run.schedule} seed{run.seed}",
                out,
                {"of": train.hash},
                ctx.logs / "p.log",
                list,
                deps=[train],
            )
        ]


def test_the_registry_is_the_one_list_of_stages():
    assert STAGES.names() == ["train", "eval", "bench", "analyze", "long_context", "report"]
    # run_all's default selection is every stage but those off by default (long_context)
    assert RunAllSection().stages == [s.name for s in STAGES.parts() if s.selected_by_default]
    assert [s.name for s in STAGES.parts() if not s.selected_by_default] == ["long_context"]
    for stage in STAGES.parts():
        assert (ROOT / "reproduce" / stage.script).is_file(), stage
    cfg = load_config("tiny", ["run_all.launcher.train=srun -N2", "run_all.launcher.analyze=srun -n1"])
    assert {s.name: s.launcher(cfg) for s in STAGES.parts()} == {
        "train": "srun -N2",
        "eval": "",
        "bench": "",
        "analyze": "srun -n1",
        "long_context": "",
        "report": "",
    }
    assert run_weights(Path("/nowhere/seed0")) == Path("/nowhere/seed0/model.safetensors")


@pytest.fixture
def probe_stages():
    """The two stages above, registered as a new stage is (one line each), for one test."""
    STAGES.add(PerRunProbe.name, PerRunProbe())
    STAGES.add(Probe.name, Probe())
    yield
    STAGES.remove(PerRunProbe.name)
    STAGES.remove(Probe.name)


def test_a_new_stage_is_one_class_and_one_registry_line(tmp_path, probe_stages):
    script = tmp_path / "probe.py"
    script.write_text(PROBE_SCRIPT)
    scripts = {**default_scripts(ROOT / "reproduce"), "probe": str(script), "per_run_probe": str(script)}
    cfg = load_config(
        "tiny", [f"runs_dir={tmp_path / 'runs'}", f"results_dir={tmp_path / 'results'}", "seeds=[0,1]"]
    )

    plan = build_plan(cfg, [], ["probe", "per_run_probe"], scripts, sys.executable)
    # in run order: a seed's per-run stages one after another, then the stages after the runs
    assert [j.label for j in plan.jobs] == [
        "bench",
        *("train uniform seed0", "train prism seed0", "eval uniform seed0", "eval prism seed0"),
        *("long_context uniform seed0", "long_context prism seed0"),
        *("probe uniform seed0", "probe prism seed0"),
        *("train uniform seed1", "train prism seed1", "eval uniform seed1", "eval prism seed1"),
        *("long_context uniform seed1", "long_context prism seed1"),
        *("probe uniform seed1", "probe prism seed1"),
        "analyze",
        "report",
        "probe",
    ]
    assign_statuses(plan)
    by_label = {j.label: j for j in plan.jobs}
    assert (by_label["probe uniform seed1"].status, by_label["probe uniform seed1"].reason) == (
        "blocked",
        "waits for train uniform seed1 (unselected)",
    )
    assert by_label["probe"].status == "run" and by_label["train prism seed0"].status == "unselected"

    plan = build_plan(cfg, [], ["probe"], scripts, sys.executable)
    outcomes, failures = execute(assign_statuses(plan), Console(file=io.StringIO()))
    assert failures == [] and [(o.job.label, o.result) for o in outcomes] == [("probe", "ran")]
    out = tmp_path / "results" / "tiny" / "probe.json"
    assert read_json(out)["argv"] == ["--out", str(out)]
    record = json.loads(out.with_name("probe.stage.json").read_text())
    assert (record["stage"], record["status"], record["config"]) == (
        "probe",
        "done",
        {"schedules": ["uniform", "prism"]},
    )

    # its record and output check decide its state, as for the kit's own stages
    again = assign_statuses(build_plan(cfg, [], ["probe"], scripts, sys.executable))
    assert [(j.status, j.reason) for j in again.jobs if j.label == "probe"] == [("done", "up to date")]
    changed = load_config(
        "tiny",
        [f"runs_dir={tmp_path / 'runs'}", f"results_dir={tmp_path / 'results'}", "run_schedules=[uniform]"],
    )
    again = assign_statuses(build_plan(changed, [], ["probe"], scripts, sys.executable))
    assert [j.status for j in again.jobs if j.label == "probe"] == ["rerun"]
    for refused in ('{"ok": false}', '{"ok": "yes"}', "{}", '{"ok": '):  # incomplete, mistyped, cut short
        out.write_text(refused)  # an output its check refuses is not up to date
        again = assign_statuses(build_plan(cfg, [], ["probe"], scripts, sys.executable))
        assert [(j.status, j.reason) for j in again.jobs if j.label == "probe"] == [
            ("run", "last attempt did not finish (done)")
        ]


def test_read_json_says_why_a_file_is_left_out(tmp_path):
    problems: list[str] = []
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "cut.json").write_text('{"a": ')
    assert read_json(tmp_path / "missing.json", problems, "missing.json") is None
    assert read_json(tmp_path / "cut.json", problems, "cut.json") is None
    assert read_json(tmp_path / "list.json", problems, "list.json") is None
    assert read_json(tmp_path / "list.json") is None  # without a problems list: only None
    assert problems == [
        "`missing.json` could not be read (FileNotFoundError); it is left out.",
        "`cut.json` could not be read (JSONDecodeError); it is left out.",
        "`list.json` does not hold a JSON object; it is left out.",
    ]
