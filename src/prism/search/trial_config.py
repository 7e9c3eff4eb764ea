"""The config of a trial: the search's overrides, then the trial's schedule, seed and proxy budget
(train.tokens = the last rung), validation and a checkpoint at every first-rung interval, and a
run folder under the study's runs/. Light on purpose (no Lightning): every invocation checks it
before anything is written."""

from __future__ import annotations

from pathlib import Path

from prism.config import ConfigError, RunConfig, load_config
from prism.search.budget import Rungs

# set for every trial unless the search's own overrides name them
TRIAL_DEFAULTS = {
    "train.keep_checkpoints": "0",  # last.ckpt only: a trial never needs older ones
    "train.devices": "1",  # one device per trial; a worker per GPU makes the parallelism
}


def trial_overrides(overrides: list[str], rungs: Rungs, runs_dir: Path, key: str, seed: int) -> list[str]:
    given = {o.split("=", 1)[0] for o in overrides}
    val_every = rungs.steps[0]  # every rung is a multiple of the first (a geometric series)
    out = list(overrides)
    out += [f"{k}={v}" for k, v in TRIAL_DEFAULTS.items() if k not in given]
    for k in ("train.val_every_steps", "train.ckpt_every_steps"):
        if k not in given:
            out.append(f"{k}={val_every}")
    out += [f"schedule={key}", f"train.seed={seed}", f"train.tokens={rungs.budget}"]
    return [*out, f"runs_dir={runs_dir}"]


def trial_config(
    scale: str, overrides: list[str], rungs: Rungs, runs_dir: Path, key: str, seed: int
) -> RunConfig:
    cfg = load_config(scale, trial_overrides(overrides, rungs, runs_dir, key, seed))
    bad = [t for t in rungs.steps if t % cfg.train.val_every_steps]
    if bad:
        raise ConfigError(
            f"train.val_every_steps={cfg.train.val_every_steps} does not divide rung step {bad[0]}; "
            f"the search validates at every rung, so leave it unset or make it divide {rungs.steps[0]}."
        )
    return cfg
