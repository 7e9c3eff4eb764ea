"""Zero-shot evaluation of one checkpoint (paper Table 3; docs/commands.md#evaluatepy)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Annotated, Optional

from prism.cli.command import parse, run
from prism.config.values import positive
from prism.eval.job import EvalJob, result_table, resume_key, run_eval_job  # noqa: F401 (resume_key: tests)
from prism.eval.tasks import DEFAULT_TASKS
from prism.runs.resumable import ZERO_SHOT


def _limit(text: str) -> float | int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; use a whole number of documents (>= 1) or a fraction between 0 and 1."
        ) from None
    return int(value) if value.is_integer() else value


def evaluate(
    checkpoint: str,
    out: str,
    tasks: str = ",".join(DEFAULT_TASKS),
    data_dir: Optional[str] = None,
    limit: Optional[_limit] = None,
    batch_size: Annotated[int, positive("use a positive number")] = 32,
    device: Optional[str] = None,
    no_progress: bool = False,
) -> int:
    """Zero-shot evaluation of one checkpoint (paper Table 3). Several GPUs: `torchrun
    --nproc_per_node 8 reproduce/evaluate.py ...` shards the batches; rank 0 writes the file.

    Args:
        out: where to write the metrics JSON
        tasks: comma-separated task names
        data_dir: local copies laid out like ../shared/data/eval (default: the Hugging Face hub)
        limit: first N documents of each task (of each BLiMP paradigm); below 1: that fraction of
            each task, as lm_eval's --limit
        batch_size: documents per forward pass
        device: default: cuda when available, else cpu
        no_progress: no progress bar
    """
    import torch
    from rich.console import Console

    record = run_eval_job(job_of(locals()))
    if record is not None:
        Console().print(result_table(record, checkpoint))
        print(f"wrote {out}")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


def job_of(args: dict) -> EvalJob:
    """The job the command's arguments stand for."""
    given = {f.name: args[f.name] for f in fields(EvalJob) if f.name in args}
    return EvalJob(**given, progress=not args["no_progress"])


def parse_args(argv=None) -> EvalJob:
    return job_of(parse(evaluate, argv))


def main(argv=None) -> int:
    # each finished task was saved (atomically) as it finished: a Ctrl-C keeps them
    return run(evaluate, argv, interrupted=lambda a: ZERO_SHOT.interrupted(a["out"]), out="out")
