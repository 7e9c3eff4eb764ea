"""One trial: a candidate schedule and seed trained as a normal kit run for the proxy budget under
<study-dir>/runs/, reporting its validation loss to Optuna at every rung and stopping where the
pruner says so; its run folder is its memory (docs/search.md, "Workers, faults and resuming")."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import optuna
from lightning.pytorch.callbacks import Callback

from prism.config.schema import ConfigError, RunConfig
from prism.errors import cause
from prism.runs.layout import checkpoints_dir
from prism.search.budget import Rungs


@dataclass(frozen=True)
class TrialOutcome:
    state: str  # complete | pruned | failed
    value: float | None  # final-rung validation loss (complete), or the last rung's (pruned)
    reason: str | None = None  # why it failed, one sentence


def crashed(exc: BaseException) -> TrialOutcome:
    """A trial that raised `exc`: failed, with its first line as the reason."""
    return TrialOutcome("failed", None, f"crashed: {cause(exc, 300)}")


LAST_STEP_ATTR = "last_step"  # the step a trial's training ended at (RungReporter), on every rank


class RungReporter(Callback):
    """At each rung's validation: report the loss to the trial and ask the pruner whether to go on;
    the baseline (`protected`) reports but is never stopped. `trial`: an optuna.Trial, or a rank's
    prism.search.group.RankTrial, whose answer is rank 0's on every rank."""

    def __init__(self, trial: optuna.Trial, rungs: Rungs, protected: bool, reported: set[int]) -> None:
        self.trial, self.rungs, self.protected = trial, rungs, protected
        self.reported = set(reported)
        self.pruned_loss: float | None = None  # the loss at the rung where the pruner stopped it

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        tokens = trainer.global_step * self.rungs.global_batch_tokens
        if tokens not in self.rungs.tokens[:-1] or tokens in self.reported:
            return
        loss = trainer.callback_metrics.get("val/loss")
        if loss is None:
            return
        self.reported.add(tokens)
        if judge(self.trial, float(loss), tokens, self.protected):
            self.pruned_loss = float(loss)
            trainer.should_stop = True

    def on_train_start(self, trainer, pl_module) -> None:
        # the step a resumed run went on from (absent on a fresh start), once Lightning restored it
        if trainer.ckpt_path is not None and trainer.is_global_zero:
            self.trial.set_user_attr("resumed_from_step", int(trainer.global_step))

    def on_train_end(self, trainer, pl_module) -> None:
        # where this process's training ended: every rank of a group (prism.search.group) must
        # end a stopped trial at the same rung
        self.trial.set_user_attr(LAST_STEP_ATTR, trainer.global_step)


def judge(trial: optuna.Trial, loss: float, tokens: int, protected: bool) -> bool:
    """Report `loss` at `tokens`; whether the trial stops here."""
    trial.report(loss, step=tokens)
    prune = trial.should_prune()  # also records the rung for the pruner, baseline included
    return prune and not protected


def run_trial(
    trial: optuna.Trial,
    cfg: RunConfig,
    rungs: Rungs,
    protected: bool,
    earlier: dict[int, float],
) -> TrialOutcome:
    """Train the trial's run to the proxy budget or until pruned. `earlier`: rung losses an
    earlier attempt of this trial reported (its run resumes after them), judged again first."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from prism.cluster import Preempted
    from prism.data import DataError
    from prism.runs.identity import read_summary, summary_if_finished_with_hash
    from prism.runs.layout import run_dir
    from prism.search.study import full_disk
    from prism.train.callbacks.guards import NonFiniteLossError
    from prism.train.plan import plan_run
    from prism.train.resume import RunExistsError
    from prism.train.trainer import run

    def failed(exc: Exception) -> TrialOutcome:
        if full_disk(exc) is not None:  # the run's lock could not be written: no fault of the trial's
            raise exc
        return TrialOutcome("failed", None, f"{type(exc).__name__}: {exc}")

    plan, refused = None, None
    try:  # the trial's run is planned once, as train.py plans it
        plan = plan_run(cfg)
    except (ConfigError, DataError, RunExistsError) as exc:
        refused = exc  # said after the replay below, which may prune the trial first
    out = run_dir(cfg) if plan is None else plan.out
    # first: an earlier attempt whose worker died after training finished (during the export or
    # before it told the study) has a finished run, which the replay below must not prune
    summary = read_summary(out) if plan is not None and plan.finished else None  # decided by the plan
    reported: set[int] = set()
    for tokens in sorted(t for t in earlier if t in rungs.tokens[:-1]):
        reported.add(tokens)
        if judge(trial, earlier[tokens], tokens, protected) and summary is None:
            return _pruned(out, earlier[tokens])
    if refused is not None:
        return failed(refused)
    reporter = RungReporter(trial, rungs, protected, reported)
    if summary is None:
        try:
            run(plan, extra_callbacks=[reporter, SignalRelay()])
        except (ConfigError, DataError, NonFiniteLossError, RunExistsError) as exc:
            return failed(exc)
        except RuntimeError as exc:
            if reporter.pruned_loss is None:
                raise
            del exc  # training stopped where the pruner said so
        except SIGTERMException:
            # a SIGTERM between Lightning's handlers and prism's Preemption (sanity validation, the
            # first micro-batch): Lightning raises this SystemExit; a stop, not a success (exit 0)
            raise Preempted("stopped by SIGTERM while the trial was starting") from None
        if reporter.pruned_loss is not None:
            return _pruned(out, reporter.pruned_loss)
        summary = summary_if_finished_with_hash(out, plan.config_hash)
    value = summary.final_val_loss if summary is not None else None  # the record's are finite
    if value is None:
        return TrialOutcome("failed", None, f"the run in {out} finished without a finite final val loss")
    trial.report(float(value), step=rungs.budget)
    return TrialOutcome("complete", float(value))


def _pruned(out: Path, value: float) -> TrialOutcome:
    shutil.rmtree(checkpoints_dir(out), ignore_errors=True)
    return TrialOutcome("pruned", value)


class SignalRelay(Callback):
    """Joins the worker's stop signals (prism.search.stops.WorkerStop) to prism.train.callbacks.Preemption
    while the trial trains, so a signal it lets pass still stops the worker before its next trial
    (docs/search.md, "How the study works")."""

    def __init__(self) -> None:
        self.preemption = None
        self.joined = False

    def on_train_start(self, trainer, pl_module) -> None:
        from prism.search.stops import STOP
        from prism.train.callbacks.preemption import Preemption

        self.preemption = next(c for c in trainer.callbacks if isinstance(c, Preemption))
        if STOP.heard not in self.preemption.listeners:
            self.preemption.listeners.append(STOP.heard)
        self.joined = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        from prism.search.stops import STOP

        if self.joined:
            return
        self.joined = True
        # recorded by the worker's handler before Preemption's was in place, and not heard since
        if STOP.received and not self.preemption.received:
            self.preemption.receive(STOP.received)
