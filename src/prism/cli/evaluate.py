"""Zero-shot evaluation of one checkpoint (paper Table 3), with lm-evaluation-harness semantics.

    python reproduce/evaluate.py --checkpoint runs/124m/prism/seed0/model.safetensors \\
        --tasks hellaswag,piqa,arc_easy,winogrande,blimp,wikitext [--data-dir ../shared/data/eval] \\
        [--limit N] [--batch-size B] --out results/124m/eval/prism/seed0.json

Several GPUs: `torchrun --nproc_per_node 8 reproduce/evaluate.py ...` shards the batches over
the ranks (the scores equal one process's bit for bit); rank 0 writes the file. Writes the JSON
described in docs/outputs.md, atomically. The job itself is prism.eval.job.
"""

from __future__ import annotations

import argparse

import torch

from prism.cli.exits import run_main
from prism.eval.job import EvalJob, resume_key, run_eval_job  # noqa: F401 (resume_key: tests)
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


def parse_args(argv=None) -> EvalJob:
    p = argparse.ArgumentParser(
        prog="evaluate.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", required=True, help=".ckpt, .safetensors or an exported run folder")
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated task names")
    p.add_argument(
        "--data-dir",
        default=None,
        help="local copies laid out like ../shared/data/eval (default: the Hugging Face hub)",
    )
    p.add_argument(
        "--limit",
        type=_limit,
        default=None,
        help="first N documents of each task (of each BLiMP paradigm); below 1: that "
        "fraction of each task, as lm_eval's --limit",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--out", required=True, help="where to write the metrics JSON")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    return EvalJob(
        checkpoint=a.checkpoint,
        out=a.out,
        tasks=a.tasks,
        data_dir=a.data_dir,
        limit=a.limit,
        batch_size=a.batch_size,
        device=a.device,
        progress=not a.no_progress,
    )


def print_table(record: dict, checkpoint: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{record['schedule']} ({checkpoint})")
    for name, justify in (("task", "left"), ("metric", "left"), ("value", "right"), ("stderr", "right")):
        table.add_column(name, justify=justify)
    for task, metrics in record["tasks"].items():
        for k, v in metrics.items():
            if k == "n" or k.endswith("_stderr") or not isinstance(v, float):
                continue
            err = metrics.get(f"{k}_stderr")
            table.add_row(f"{task} (n={metrics['n']})", k, f"{v:.4f}", "-" if err is None else f"{err:.4f}")
    Console().print(table)


def main(argv=None) -> int:
    # each finished task was saved (atomically) as it finished: a Ctrl-C keeps them
    return run_main(
        argv,
        parse_args,
        _evaluate,
        interrupted=lambda job: ZERO_SHOT.interrupted(job.out),
        out=lambda job: job.out,  # before any task is read or the model loaded
    )


def _evaluate(job: EvalJob) -> int:
    record = run_eval_job(job)
    if record is not None:
        print_table(record, job.checkpoint)
        print(f"wrote {job.out}")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0
