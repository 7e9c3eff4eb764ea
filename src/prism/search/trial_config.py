"""The config of a trial: the search's overrides, then its schedule, seed, proxy budget, devices,
validation and checkpoints at every first-rung interval, and a run folder under the study's runs/.
Light on purpose (no Lightning): every invocation checks it before anything is written."""

from __future__ import annotations

from pathlib import Path

from prism.cluster import this_launch
from prism.config.schema import ConfigError, RunConfig, load_config
from prism.search.budget import Rungs


def trial_devices(cfg: RunConfig, args) -> int:
    """train.devices of every trial of search.py's arguments `args` (prism.search.plan.SearchArgs):
    1, or the processes of one rank group per node, which are --devices-per-trial N (search.py then
    starts each group with torchrun) or the launch that started this process (torchrun or srun: its
    world size). Raises ConfigError, one sentence, for a count that cannot be that."""
    n, launch, workers = args.devices_per_trial, this_launch(), args.workers
    if any(o.split("=", 1)[0] == "train.devices" for o in args.overrides):
        raise ConfigError(
            "train.devices is set by the search, not by an override: every trial trains on "
            "--devices-per-trial devices (default 1, or the processes of the launch); give that instead."
        )
    if launch.world_size > 1:
        if args.final:
            raise ConfigError(
                f"--final is invalid under a launcher ({launch.describe()}): it runs the pipeline, which "
                f"starts the processes of each training itself; run it as one process."
            )
        if n is not None and n != launch.world_size:
            raise ConfigError(
                f"--devices-per-trial {n} differs from this launch, which started {launch.describe()}; "
                f"each trial trains on the launch's processes: leave --devices-per-trial out or make it "
                f"{launch.world_size}."
            )
        if workers > 1 and not args.worker:  # a --worker is one of the groups --workers started
            raise ConfigError(
                f"--workers {workers} is invalid under a launcher ({launch.describe()}): the launch is "
                f"one worker whose ranks train each trial together; start more launches (or Slurm array "
                f"tasks) for more workers, or drop the launcher and give --devices-per-trial."
            )
        n = launch.world_size
    n = n or 1
    nodes = int(cfg.train.num_nodes)
    if nodes > 1 and launch.world_size == 1:
        raise ConfigError(
            f"train.num_nodes={nodes} needs a launch on every node (srun, or torchrun on each); the local "
            f"workers of --workers and --devices-per-trial run on this node only."
        )
    if n % nodes:
        raise ConfigError(
            f"a trial group of {n} process(es) cannot spread over train.num_nodes={nodes} nodes evenly; "
            f"make the processes a multiple of the nodes."
        )
    return n // nodes


def trial_overrides(
    overrides: list[str], rungs: Rungs, runs_dir: Path, key: str, seed: int, devices: int = 1
) -> list[str]:
    given = {o.split("=", 1)[0] for o in overrides}
    every = rungs.steps[0]  # every rung is a multiple of the first (a geometric series)
    # what a trial is, not a default a user tunes (so not in SearchSection), unless the search's own
    # overrides name it; last.ckpt only: a trial never needs older checkpoints
    own = {"train.keep_checkpoints": 0, "train.val_every_steps": every, "train.ckpt_every_steps": every}
    # one device per trial unless it trains on a rank group: a worker per GPU makes the parallelism
    out = [*overrides, *(f"{k}={v}" for k, v in own.items() if k not in given), f"train.devices={devices}"]
    out += [f"schedule={key}", f"train.seed={seed}", f"train.tokens={rungs.budget}"]
    return [*out, f"runs_dir={runs_dir}"]


def trial_config(
    scale: str, overrides: list[str], rungs: Rungs, runs_dir: Path, key: str, seed: int, devices: int = 1
) -> RunConfig:
    cfg = load_config(scale, trial_overrides(overrides, rungs, runs_dir, key, seed, devices))
    bad = [t for t in rungs.steps if t % cfg.train.val_every_steps]
    if bad:
        raise ConfigError(
            f"train.val_every_steps={cfg.train.val_every_steps} does not divide rung step {bad[0]}; "
            f"the search validates at every rung, so leave it unset or make it divide {rungs.steps[0]}."
        )
    world = devices * int(cfg.train.num_nodes)
    if world > 1:  # the batch split of a rank group (prism.train.batch imports torch: only then)
        from prism.train.batch import batch_plan

        batch_plan(cfg, world)
    return cfg
