"""A trial trained by a group of processes: several GPUs, or nodes, per trial. Rank 0 takes the
trials and tells the other ranks what to train and when to stop; every rank trains the same
trial. How the group talks, stops, fails and handles signals: docs/search.md, "Multi-GPU trials"."""

from __future__ import annotations

import atexit
import os
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import optuna
import torch
import torch.distributed as dist

from prism import cluster
from prism.cluster import Preempted
from prism.config.schema import RunConfig
from prism.errors import cause
from prism.search.budget import Rungs
from prism.search.stops import at_once
from prism.search.trial import LAST_STEP_ATTR, TrialOutcome, crashed, run_trial
from prism.train.strategy import on_gpu, process_group_timeout

# How long a rank waits for rank 0's next message: rank 0 may wait for other workers' trials for
# as long as they train; a dead peer fails the wait at once, whatever this is.
CONTROL_TIMEOUT = timedelta(days=30)


@dataclass(frozen=True)
class RankEnd:
    """How one rank's training of a trial ended: what rank 0 checks every rank agrees on."""

    rank: int
    state: str
    value: float | None
    step: int | None  # the optimizer step its training ended at; None: it did not train

    def agrees(self, other: RankEnd) -> bool:
        return (self.state, self.value, self.step) == (other.state, other.value, other.step)

    def describe(self) -> str:
        at = f" at step {self.step}" if self.step is not None else " without training"
        return f"rank {self.rank} {self.state}{at} (loss {self.value})"


class GroupLost(BaseException):
    """A rank of the group is gone: the trial is left to the next worker (docs/search.md). A
    BaseException, so that no handler of a trial's own failures (`except Exception`) records it."""


class RankGroup:
    """The ranks of one worker, and the channel over which rank 0 tells the others what to do."""

    def __init__(self, launch: cluster.Launch, control) -> None:
        self.rank, self.size, self.control = launch.rank, launch.world_size, control
        self.closed = False

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def broadcast(self, message: Any = None) -> Any:
        """Rank 0's `message` on every rank."""
        box = [message]
        try:
            dist.broadcast_object_list(box, src=0, group=self.control)
        except RuntimeError as exc:  # gloo: a peer closed its connection (it died), or a timeout
            raise self.lost(exc) from exc
        return box[0]

    def gather(self, end: RankEnd) -> list[RankEnd]:
        """Every rank's end on rank 0 (an empty list on the others)."""
        ends = [None] * self.size if self.is_leader else None
        try:
            dist.gather_object(end, ends, dst=0, group=self.control)
        except RuntimeError as exc:
            raise self.lost(exc) from exc
        return list(ends or [])

    def lost(self, exc: BaseException) -> GroupLost:
        return GroupLost(
            f"rank {self.rank} of a trial group of {self.size} lost its peers ({cause(exc, 200)})"
        )

    def release(self) -> None:
        """Rank 0: tell the other ranks there is no more work (once; also at exit), then leave."""
        if self.closed:
            return
        self.closed = True
        with suppress(GroupLost):  # they are gone already
            self.broadcast(None)
            dist.barrier(group=self.control)  # every rank has the message before the sockets close
        self.leave()

    def leave(self) -> None:
        self.closed = True
        if dist.is_initialized():
            dist.destroy_process_group()


def join_group(cfg: RunConfig) -> RankGroup:
    """The rank group of this process, which a launcher (torchrun, srun) started with others, on
    the search config's train.accelerator and train.ddp_timeout_s (every trial's)."""
    launch = cluster.this_launch()
    environment = cluster.lightning_environment()
    os.environ["MASTER_ADDR"] = environment.main_address
    os.environ["MASTER_PORT"] = str(environment.main_port)
    gpu = on_gpu(cfg)
    if gpu:
        torch.cuda.set_device(launch.local_rank)  # the device Lightning gives this rank
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=process_group_timeout(cfg),
    )
    group = RankGroup(launch, dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT))
    if group.is_leader:
        atexit.register(group.release)  # the other ranks wait for its word: they get one
    return group


class RankTrial:
    """The part of optuna.Trial that prism.search.trial uses, on one rank: rank 0 forwards it to the
    study, and its pruner's answer is every rank's; the other ranks write nothing."""

    def __init__(self, group: RankGroup, trial: optuna.Trial | None) -> None:
        self.group, self.trial = group, trial
        self.user_attrs: dict[str, Any] = {}
        self.error: str | None = None  # rank 0's study failed: every rank raises at the next answer

    def report(self, value: float, step: int) -> None:
        if self.trial is not None and self.error is None:
            try:
                self.trial.report(value, step=step)
            except Exception as exc:  # the others are waiting for the answer: they get this instead
                self.error = f"{type(exc).__name__}: {exc}"

    def should_prune(self) -> bool:
        answer: Any = self.error
        if self.trial is not None and self.error is None:
            try:
                answer = bool(self.trial.should_prune())
            except Exception as exc:
                answer = f"{type(exc).__name__}: {exc}"
        answer = self.group.broadcast(answer)
        if isinstance(answer, str):
            raise RuntimeError(f"rank 0 could not ask the study whether to stop: {answer}")
        return answer

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value
        if self.trial is not None:
            self.trial.set_user_attr(key, value)


def _train(
    view: RankTrial, config, rungs: Rungs, protected: bool, earlier: dict
) -> tuple[TrialOutcome, Any, list[RankEnd]]:
    """run_trial on this rank, `config()` its config: (its outcome, the crash behind a failed one,
    every rank's end on rank 0). A Preempted or a second Ctrl-C stops every rank, as on one process."""
    try:
        outcome, error = run_trial(view, config(), rungs, protected, earlier), None
    except Preempted:
        raise
    except Exception as exc:  # a crash, unless it was a peer's death: the ends tell
        if at_once(exc) is not None:
            raise at_once(exc) from exc
        outcome, error = crashed(exc), exc
    step = view.user_attrs.get(LAST_STEP_ATTR)
    end = RankEnd(view.group.rank, outcome.state, outcome.value, step)
    return outcome, error, view.group.gather(end)


def lead_trial(
    group: RankGroup, trial: optuna.Trial, cfg: RunConfig, rungs: Rungs, protected: bool, earlier: dict
) -> TrialOutcome:
    """Rank 0's way to train a trial: prism.search.trial.run_trial's signature, run by every rank."""
    p = trial.params
    group.broadcast((p["schedule"], p["seed"], protected, dict(earlier)))  # what follow() trains
    view = RankTrial(group, trial)
    outcome, error, ends = _train(view, lambda: cfg, rungs, protected, earlier)
    if error is not None:
        raise error
    steps = [e.step for e in ends]
    if any(s is not None for s in steps):
        print(
            f"trial {trial.number}: trained on {group.size} ranks, which ended at steps "
            f"{', '.join(map(str, steps))}",
            flush=True,
        )
    if any(not e.agrees(ends[0]) for e in ends[1:]):
        return TrialOutcome(
            "failed", None, "its ranks ended differently: " + "; ".join(e.describe() for e in ends)
        )
    return outcome


def follow(group: RankGroup, search) -> int:
    """A rank other than 0: train every trial rank 0 sends (`search`: prism.search.plan.Search)
    until it says no more."""
    from prism.search.stops import STOP

    with STOP:  # the signals between trials, as on rank 0 (prism.search.study.work)
        while True:
            message = group.broadcast()  # a trial to train, or None once no trial is left
            if message is None:
                with suppress(RuntimeError):  # rank 0 has gone already: nothing is left to agree on
                    dist.barrier(group=group.control)  # rank 0's release: then every rank leaves
                group.leave()
                return 0
            schedule, seed, protected, earlier = message  # lead_trial's
            config = partial(search.trial_config, schedule, seed)
            _train(RankTrial(group, None), config, search.rungs, protected, earlier)
