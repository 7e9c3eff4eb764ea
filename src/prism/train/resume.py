"""Fresh start, resume or refusal: decided once, on rank 0, for every rank of a run (docs/training.md,
"Resuming and changed settings")."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from prism.compat import processed_micro_batches, shift_batch_progress
from prism.errors import cause
from prism.runs.checkpoint import CheckpointError, open_ckpt
from prism.runs.layout import HPC_CHECKPOINT_GLOB, STEP_CHECKPOINT_PREFIX, checkpoints_dir, last_checkpoint
from prism.train.callbacks.checkpoint import step_files, step_of
from prism.train.callbacks.priority import RESTORE
from prism.train.plan import RunExistsError
from prism.train.strategy import join_process_group

DECISION_ENV = "PRISM_RESUME_DECISION"  # rank 0 -> the ranks Lightning starts from this process


@dataclass
class Decision:
    kind: str  # fresh | resume | refuse | invalid (a setting is at fault, e.g. no file locks)
    checkpoint: str | None = None
    step: int | None = None
    message: str = ""
    skipped: list[str] = field(default_factory=list)


def refused(message: str, skipped: list[str] | None = None) -> Decision:
    return Decision("refuse", message=message, skipped=skipped or [])


def _open(path: Path) -> tuple[int, str | None]:
    """(global_step, config_hash) of a checkpoint, through a memory map; raises when it cannot open."""
    state = open_ckpt(path, mmap=True)
    if "global_step" not in state:
        raise CheckpointError(f"checkpoint {path} holds no global_step; it is not a Lightning checkpoint.")
    return int(state["global_step"]), (state.get("hyper_parameters") or {}).get("config_hash")


def newest_checkpoint(out: Path) -> tuple[tuple[Path, int, str | None] | None, list[str]]:
    """The newest checkpoint of a run folder that opens, and why each newer one was skipped."""
    named = sorted(step_files(checkpoints_dir(out)), key=step_of, reverse=True)
    hpc = sorted(out.glob(HPC_CHECKPOINT_GLOB), key=step_of, reverse=True)
    # last.ckpt first (usually the newest); any other file only when it may be newer still
    candidates = [p for p in (last_checkpoint(out),) if p.is_file()] + hpc + named
    best: tuple[Path, int, str | None] | None = None
    skipped: list[str] = []
    for path in candidates:
        if best is not None and path.name.startswith(STEP_CHECKPOINT_PREFIX) and step_of(path) <= best[1]:
            break  # sorted: no older step file can be newer than what we have
        try:
            step, digest = _open(path)
        except Exception as exc:  # a truncated or foreign file: say why, try the next
            # a CheckpointError's sentence without its own "checkpoint PATH"
            why = str(exc).removeprefix(f"checkpoint {path} ").removeprefix("cannot be opened: ").rstrip(".")
            skipped.append(f"{path} ({why if isinstance(exc, CheckpointError) else cause(exc, 120)})")
            continue
        if best is None or step > best[1]:
            best = (path, step, digest)
    return best, skipped


def decide(out: Path, digest: str, overwrite: bool, resume: bool | None) -> Decision:
    """What rank 0 decides from `out`, under the run's lock: fresh, the checkpoint to resume, or refusal."""
    if overwrite:
        return Decision("fresh")
    best, skipped = newest_checkpoint(out)
    if best is None:
        if skipped:
            return refused(
                f"no checkpoint of {out} can be opened ({'; '.join(skipped)}); move the folder "
                f"away or pass --overwrite to start again.",
                skipped,
            )
        if resume:
            return refused(
                f"--resume was given but {out / 'checkpoints'} holds no checkpoint; run without "
                f"--resume to start fresh."
            )
        return Decision("fresh")
    path, step, saved_digest = best
    if resume is False:
        return refused(
            f"{out} holds an unfinished run ({path}); resume it (the default) or pass "
            f"--overwrite to start again."
        )
    if saved_digest != digest:
        return refused(
            f"{path} was written with config hash {saved_digest} but this run's is {digest}; "
            f"resume with the same settings, or pass --overwrite to start again."
        )
    return Decision("resume", str(path), step, skipped=skipped)


def agree(trainer, out: Path, digest: str, make) -> Decision:
    """Rank 0's decision (`make()`), on every rank: broadcast in the process group joined now (srun,
    torchrun), or through the environment the ranks Lightning starts at fit() inherit."""
    inherited = os.environ.get(DECISION_ENV)
    if inherited and trainer.local_rank != 0:  # a rank Lightning started: rank 0 decided for it
        doc = json.loads(inherited)
        if doc.get("run") == str(out) and doc.get("hash") == digest:
            return Decision(**doc["decision"])
    if trainer.world_size == 1:
        return make()
    env = trainer.strategy.cluster_environment
    if env is not None and env.creates_processes_externally:
        join_process_group(trainer.strategy)  # prism.train.strategy: DDP and FSDP alike
        decision = make() if trainer.is_global_zero else None
        return trainer.strategy.broadcast(decision, src=0)
    decision = make()
    os.environ[DECISION_ENV] = json.dumps({"run": str(out), "hash": digest, "decision": asdict(decision)})
    return decision


def confirm_readable(trainer, decision: Decision) -> None:
    """Every rank must read the checkpoint rank 0 chose; otherwise all stop, naming the ranks."""
    ok = decision.checkpoint is None or os.access(decision.checkpoint, os.R_OK)
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        flags = [None] * trainer.world_size
        torch.distributed.all_gather_object(flags, (trainer.global_rank, ok))
        missing = [r for r, good in flags if not good]
    else:
        missing = [] if ok else [trainer.global_rank]
    if missing:
        raise RunExistsError(
            f"rank 0 resumes from {decision.checkpoint} but rank(s) {', '.join(map(str, missing))} "
            f"cannot read it; every node must see the same run folder (runs_dir on a shared "
            f"filesystem)."
        )


class ResumeWithSplit(Callback):
    """Resume a run on another number of devices (same global batch, another split): the loop's
    micro-batch counters, s*a0 at step s, move by s*(a1 - a0) to the new accumulation a1."""

    priority = RESTORE

    def __init__(self, micro_batch: int, accumulation: int, world_size: int) -> None:
        self.micro_batch, self.accumulation, self.world_size = micro_batch, accumulation, world_size

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        from prism.data import data_state

        data = data_state(checkpoint)
        if not data or (data["micro_batch"], data["world_size"]) == (self.micro_batch, self.world_size):
            return
        sequences = self.micro_batch * self.accumulation * self.world_size
        old = sequences // (data["micro_batch"] * data["world_size"])
        steps = int(checkpoint["global_step"])
        fit_loop = checkpoint["loops"]["fit_loop"]
        processed = processed_micro_batches(fit_loop)
        if processed != steps * old:
            raise RunExistsError(
                f"the checkpoint at step {steps} holds {processed} micro-batches, "
                f"not {steps} x {old}: it was not written at a step boundary, so it can only resume "
                f"with micro_batch {data['micro_batch']} on {data['world_size']} device(s)."
            )
        shift_batch_progress(fit_loop, steps * (self.accumulation - old))
