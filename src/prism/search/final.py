"""The full-budget stage of a search (`search.py ... --final`): the best k schedules of the last
rung besides uniform, and uniform, trained at the scale's full budget (train.tokens) with the
scale's seeds through the reproduction pipeline, prism.pipeline.run_all: the same plan, stage
records, resuming and report as `run_all.py --scale S --schedules uniform,... OVERRIDES`, into
the normal runs_dir/<scale>/ and results/<scale>/, so RESULTS.md covers them.

k is not part of the study's definition: it changes what is trained after the study, not the
study. The final set is recorded on the study (user attr FINAL_ATTR), so every report written
later shows it and the same command without --top-k keeps it; another k trains the schedules
it adds, and the ones already trained are done. The command's part (what it says, how it ends) is
prism.cli.search."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prism.config.schema import ConfigError
from prism.search.full_budget import FINAL_ATTR

if TYPE_CHECKING:
    from rich.console import Console


def top_k(given: int | None, recorded: dict | None, default: int) -> int:
    """search.top_k given (--top-k), else the k of the last final stage, else `default` (the
    config's search.top_k); the config's rule holds it to 1 or more."""
    return given if given is not None else (recorded or {}).get("top_k", default)


def final_stages(stages: list[str]) -> list[str]:
    """run_all.stages (--final-stages) of the full-budget stage, checked before the study runs."""
    from prism.pipeline.stages import STAGES

    unknown = [t for t in stages if t not in STAGES]
    if unknown:
        raise ConfigError(f"run_all.stages {unknown[0]!r} is invalid: give some of {','.join(STAGES)}.")
    return stages


def final_set(ranking: list[dict], base: str, k: int) -> list[str]:
    """Uniform, then the best `k` others of the last-rung ranking (best first)."""
    return [base, *[r["schedule"] for r in ranking if r["schedule"] != base][:k]]


def pending(
    cfg_scale: str, overrides: list[str], schedules: list[str], stages: list[str] | None
) -> list[str]:
    """Labels of the selected jobs of the full-budget plan that would run (the report stage, which
    keeps no record, only while its RESULTS.md does not exist). Raises ConfigError like run_all."""
    from prism.pipeline import SCRIPTS_DIR, assign_statuses, build_plan, load_run_config
    from prism.pipeline.plan import default_scripts
    from prism.pipeline.runner import python_executable

    cfg = load_run_config(cfg_scale, overrides, None, schedules)
    stages = stages or list(cfg.run_all.stages)
    plan = build_plan(cfg, overrides, stages, default_scripts(SCRIPTS_DIR), python_executable())
    assign_statuses(plan)
    out = []
    for job in plan.selected():
        if job.stage.recorded:
            if job.status in ("run", "resume", "rerun", "conflict"):
                out.append(job.label)
        elif not job.output.exists():
            out.append(job.label)
    return out


def run_final(
    scale: str, overrides: list[str], schedules: list[str], stages: list[str] | None, console: Console
) -> int:
    """Plan, show (on `console`) and run the full-budget runs with the pipeline; its exit code
    (run_all.py's)."""
    from prism.pipeline import run_all
    from prism.pipeline.runner import sigterm_stops_stages

    with sigterm_stops_stages():
        return run_all(scale, overrides, schedules=schedules, stages=stages, console=console)


def final_hint(study) -> str:
    if study.user_attrs.get(FINAL_ATTR):
        return ""
    return (
        "next: the same command with --final trains the best --top-k schedules and uniform at the "
        "full budget with the scale's seeds."
    )
