"""The full-budget stage of a search (`search.py ... --final`; docs/search.md, "The full budget"):
the best k schedules of the last rung besides uniform, and uniform, trained with the scale's seeds
through the reproduction pipeline (prism.pipeline.run_all); the final set is recorded on the study."""

from __future__ import annotations

from prism.config.schema import RunConfig, to_dict
from prism.runs.identity import stable_hash, summary_if_finished_with_hash, training_identity
from prism.runs.layout import run_dir

FINAL_ATTR = "final"  # the study's user attr holding the final set (schedules, top_k)


def full_budget_losses(cfg: RunConfig, schedules: list[str]) -> dict[str, dict[int, float]]:
    """schedule -> seed -> final validation loss of the finished full-budget runs of `cfg`'s
    seeds; a run of other settings in the same folder (its config hash differs) is not one."""
    full = to_dict(cfg)
    out: dict[str, dict[int, float]] = {}
    for s in schedules:
        for seed in cfg.seeds:
            digest = stable_hash(training_identity(full, s, seed))
            summary = summary_if_finished_with_hash(run_dir(cfg, s, seed), digest)
            loss = summary.final_val_loss if summary is not None else None
            if loss is not None:
                out.setdefault(s, {})[int(seed)] = float(loss)
    return out


def final_set(ranking: list[dict], base: str, k: int) -> list[str]:
    """Uniform, then the best `k` others of the last-rung ranking (best first)."""
    return [base, *[r["schedule"] for r in ranking if r["schedule"] != base][:k]]


def pending(scale: str, overrides: list[str], schedules: list[str]) -> list[str]:
    """Labels of the selected jobs of the full-budget plan that would run (the report stage, which
    keeps no record, only while its RESULTS.md does not exist). Raises ConfigError like run_all."""
    from prism.pipeline import SCRIPTS_DIR, assign_statuses, build_plan, load_run_config
    from prism.pipeline.plan import default_scripts
    from prism.pipeline.runner import python_executable

    cfg = load_run_config(scale, overrides, None, schedules)
    plan = build_plan(
        cfg, overrides, list(cfg.run_all.stages), default_scripts(SCRIPTS_DIR), python_executable()
    )
    assign_statuses(plan)
    live = ("run", "resume", "rerun", "conflict")
    return [
        j.label for j in plan.selected() if (j.status in live if j.stage.recorded else not j.output.exists())
    ]


def final_hint(study) -> str:
    if study.user_attrs.get(FINAL_ATTR):
        return ""
    return (
        "next: the same command with --final trains the best --top-k schedules and uniform at the "
        "full budget with the scale's seeds."
    )
