"""Stop cleanly (a checkpoint, exit, a requeue) when the scheduler or the user says so, agreed with a
NaN/inf loss or stalled stream, one all-reduce a step (docs/training.md, "Stopping at a step boundary")."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Callable

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from prism.cluster import Interrupted, InterruptedAtOnce, Preempted
from prism.compat import step_boundary_state
from prism.train.callbacks.checkpoint import StepCheckpoint, step_files, step_of
from prism.train.callbacks.guards import nonfinite_loss_error
from prism.train.callbacks.priority import STOP

REQUEUE_SIGNAL = signal.SIGUSR1
# the agreed signal is the largest number any rank received: SIGTERM and SIGUSR1 outrank a Ctrl-C
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class StreamStopped(Preempted):
    """Training stopped because a data stream stalled, with the last step boundary checkpointed."""

    label = "stalled"


_requeued: dict[str, str] = {}  # job -> the requeue this process asked Slurm for


def requeue_job() -> str:
    """Ask Slurm to requeue this job (same id), once per job and process (a search worker asks again
    before it exits); what happened, in words."""
    job = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if not job:
        return "not under Slurm, so nothing was requeued"
    if job in _requeued:
        return _requeued[job]
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"requeueing Slurm job {job} failed ({exc})"
    if done.returncode:  # a failure may pass: the next ask tries again
        return f"requeueing Slurm job {job} failed ({done.stderr.strip() or done.returncode})"
    _requeued[job] = f"Slurm job {job} was requeued"
    return _requeued[job]


class Preemption(Callback):
    priority = STOP

    def __init__(self, val_every_steps: int) -> None:
        self.val_every_steps = int(val_every_steps)
        self.received = 0  # the stop signal this process got during training (0: none yet)
        self._interrupts = 0  # Ctrl-Cs seen by this process during training
        self._trainer: L.Trainer | None = None
        self._start_step = 0  # the step this session started from (that of the checkpoint it resumed)
        self._agreed = 0  # max over ranks, as of the last optimizer step
        self._stop_step = -1
        self._previous: dict[int, object] = {}
        self._boundary: tuple[int, dict] | None = None  # (global step, fit-loop state) at its start
        self._saving_boundary = False
        # called with each signal this handler gets, before it acts (a search worker records them)
        self.listeners: list[Callable[[int], None]] = []

    def _handler(self, signum, _frame) -> None:
        for listener in self.listeners:
            listener(signum)
        self.receive(signum)

    def receive(self, signum: int) -> None:
        """Act on `signum` as on one this process got during training (also one that came before)."""
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                raise InterruptedAtOnce(self._abort_message())
            if self._trainer is not None and self._trainer.is_global_zero:
                # os.write: the handler may run in the middle of a write to sys.stderr
                os.write(
                    2,
                    b"\nCtrl-C: stopping at the next step boundary with a checkpoint "
                    b"(Ctrl-C again stops at once, losing the steps since the last checkpoint)\n",
                )
        self.received = max(self.received, int(signum))

    def _abort_message(self) -> str:
        """The second Ctrl-C's sentence, naming the newest checkpoint on disk (by name: no file is read)."""
        trainer = self._trainer
        found = [(self._start_step, str(trainer.ckpt_path))] if trainer.ckpt_path else []
        ckpt = StepCheckpoint.of(trainer)
        if ckpt is not None:
            if ckpt.saved_step >= 0:
                found.append((ckpt.saved_step, str(ckpt.last_path)))
            steps = ((step_of(p), str(p)) for p in step_files(ckpt.dirpath))
            found += [(step, path) for step, path in steps if step <= trainer.global_step]
        newest = max(found) if found else None
        kept = f"the newest is {newest[1]}, step {newest[0]}" if newest else "none was written yet"
        return (
            f"a second Ctrl-C stopped training at once at step {trainer.global_step} of "
            f"{trainer.max_steps}; no checkpoint was written for the steps since the last one "
            f"({kept}); run the same command again to {'resume from it' if newest else 'start again'}."
        )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after Lightning registered its own handlers (fit does that just before training)
        self._trainer, self._interrupts, self._start_step = trainer, 0, trainer.global_step
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # only where ours is still in place: a stale one put back would catch SIGTERM in later forks
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self._previous.items():
                if signal.getsignal(sig) == self._handler:
                    signal.signal(sig, handler)
        self._previous = {}
        self._trainer = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # the loop's counters before an optimizer step's first micro-batch: a boundary checkpoint's
        if self._boundary is None or self._boundary[0] != trainer.global_step:
            self._boundary = (trainer.global_step, step_boundary_state(trainer))

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        stalled = getattr(trainer.datamodule, "stalled", None)
        nonfinite = pl_module.pop_nonfinite()  # on the device: counted without a host sync
        signals = torch.tensor([float(self.received), 1.0 if stalled else 0.0], device=nonfinite.device)
        flags = torch.cat([nonfinite.to(torch.float32).reshape(1), signals])
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            # straight to the process group: strategy.reduce would add a barrier before it
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        bad, signum, any_stalled = (int(v) for v in flags.tolist())  # the step's one host read
        if bad:
            raise nonfinite_loss_error(trainer)
        if any_stalled:
            self._stop_stalled(trainer, stalled)
        self._agreed = signum
        if self._agreed:
            self._stop_step = trainer.global_step + 1  # the step this optimizer call completes

    def stops_at(self, step: int) -> bool:
        """Whether every rank agreed to stop at `step` (work planned for it is left to the resumed run)."""
        return bool(self._agreed) and step == self._stop_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        # at the last step the run finishes normally; at a validation's, it stops after it
        if self.stops_at(step) and not step >= trainer.max_steps > 0 and step % self.val_every_steps:
            self._stop(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if self.stops_at(step) and not trainer.sanity_checking and step < trainer.max_steps:
            self._stop(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self._saving_boundary:
            checkpoint["loops"]["fit_loop"] = self._boundary[1]

    def _stop_stalled(self, trainer: L.Trainer, stalled: str | None) -> None:
        """Drop this step (before its update) and checkpoint the boundary before it, on every rank."""
        trainer.datamodule.drop_step(trainer.accumulate_grad_batches)
        ckpt, step, path = StepCheckpoint.of(trainer), trainer.global_step, ""
        if ckpt is not None:
            self._saving_boundary = True
            try:
                path = str(ckpt.save_last(trainer))
            finally:
                self._saving_boundary = False
        causes = [stalled]
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            causes = [None] * trainer.world_size
            torch.distributed.all_gather_object(causes, stalled)  # every rank names the same reader
        cause = next(c for c in causes if c)
        raise StreamStopped(
            f"{cause}: training stopped before step {step + 1} of {trainer.max_steps} and kept "
            f"checkpoint {path or '(none)'}; run the same command again once the source delivers "
            f"(or raise data.stall_timeout_s)."
        )

    def _stop(self, trainer: L.Trainer) -> None:
        ckpt = StepCheckpoint.of(trainer)
        path = str(ckpt.save_stop(trainer)) if ckpt is not None else ""
        name = signal.Signals(self._agreed).name
        outcome = (
            "a requeued job, or the same command, resumes from it"
            if os.environ.get("SLURM_JOB_ID") and self._agreed != signal.SIGINT
            else "run the same command again to resume"
        )
        said = f"{name}: stopped at step {trainer.global_step} with checkpoint {path}"
        if self._agreed == REQUEUE_SIGNAL:
            # said before the request: the requeue ends the job's steps, and a line printed after
            # it may never reach the log
            rank_zero_info(f"{said}; requeueing the Slurm job.")
            outcome = requeue_job() if trainer.is_global_zero else "rank 0 requeues the job"
            trainer.strategy.barrier("prism-preempted")
        else:
            rank_zero_info(f"{said}; {outcome}.")
        error, by = (Interrupted, "") if self._agreed == signal.SIGINT else (Preempted, f"by {name} ")
        raise error(
            f"stopped {by}at step {trainer.global_step} of {trainer.max_steps} with checkpoint "
            f"{path or '(none)'}; {outcome}."
        )
