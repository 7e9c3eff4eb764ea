"""What the full-budget stage of a search records and reads back: the final set's key on the
study, the full-budget config, and the losses of its finished runs (used by the final stage and
by SEARCH.md alike)."""

from __future__ import annotations

from prism.config.schema import RunConfig, load_config, to_dict
from prism.runs.identity import stable_hash, summary_if_finished_with_hash, training_identity
from prism.runs.layout import run_dir

FINAL_ATTR = "final"  # the study's user attr holding the final set (schedules, top_k)


def full_config(definition: dict) -> RunConfig:
    """The config of the full-budget runs: the scale with the search's overrides (its trials add
    their proxy budget, validation interval and folder to these)."""
    return load_config(definition["scale"], definition["overrides"])


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
