"""Zero-shot evaluation of one checkpoint (paper Table 3), with lm-evaluation-harness semantics.

    python reproduce/evaluate.py --checkpoint runs/124m/prism/seed0/model.safetensors \\
        --tasks hellaswag,piqa,arc_easy,winogrande,blimp,wikitext [--data-dir ../shared/data/eval] \\
        [--limit N] [--batch-size B] --out results/124m/eval/prism/seed0.json

Several GPUs: `torchrun --nproc_per_node 8 reproduce/evaluate.py ...` shards the requests over
the ranks; rank 0 writes the file. Writes the JSON described in docs/outputs.md, atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from prism.checkpoint import CheckpointError, load_model, weights_path
from prism.eval import SEMANTICS, TASKS, EvalInputError, evaluate, resolve_tasks
from prism.eval.data import check_limit, data_source, load_docs
from prism.eval.tasks import DEFAULT_TASKS
from prism.io import atomic_write_json


def _limit(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() else value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    return p.parse_args(argv)


def setup_distributed(device_arg: str | None) -> tuple[torch.device, int]:
    """Under torchrun or an `srun` step of several tasks, join the process group (NCCL on GPUs,
    gloo on CPUs); the requests are then sharded over the ranks. An srun step's rendezvous is its
    first node, on the port Lightning derives from the job id (MASTER_PORT when set)."""
    from prism import cluster

    launch = cluster.this_launch()
    use_cuda = torch.cuda.is_available() and (device_arg is None or device_arg.startswith("cuda"))
    if launch.world_size > 1 and not torch.distributed.is_initialized():
        if launch.kind == "srun":
            from lightning.fabric.plugins.environments import SLURMEnvironment

            slurm = SLURMEnvironment(auto_requeue=False)
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = slurm.main_address, str(slurm.main_port)
        torch.distributed.init_process_group(
            "nccl" if use_cuda else "gloo", rank=launch.rank, world_size=launch.world_size
        )
    rank = launch.rank
    if device_arg:
        device = torch.device(device_arg)
    elif use_cuda:
        device = torch.device("cuda", launch.local_rank)
    else:
        device = torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, rank


def check_inputs(args) -> dict:
    """Everything that can be wrong with the request (names, folders, every row of every task),
    found before a model is loaded or a GPU is touched. Returns the documents per task."""
    names = resolve_tasks(args.tasks)
    check_limit(args.limit)
    if args.batch_size < 1:
        raise EvalInputError(f"--batch-size {args.batch_size} is invalid; use a positive number.")
    if args.data_dir is not None:
        if not Path(args.data_dir).is_dir():
            raise EvalInputError(
                f"--data-dir {args.data_dir} is not a folder; it should hold "
                f"hellaswag/, piqa/, arc_easy/, winogrande/, blimp/, wikitext/."
            )
    return {n: load_docs(TASKS[n], args.data_dir, args.limit) for n in names}


def task_units(tasks: str) -> list[list[str]]:
    """What is scored (and saved for resuming) together: a task, or a whole group."""
    units: list[list[str]] = []
    for name in [n.strip() for n in tasks.split(",") if n.strip()]:
        members = resolve_tasks([name])
        if members not in units:
            units.append(members)
    return units


def resume_key(args) -> dict:
    """Saved partial results are reused only for the same weights, data, limit and semantics."""
    weights = weights_path(args.checkpoint)
    st = weights.stat()
    return {
        "checkpoint": str(weights.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "data_source": data_source(args.data_dir),
        "limit": args.limit,
        "semantics": SEMANTICS,
    }


def run(args) -> dict | None:
    docs = check_inputs(args)
    device, rank = setup_distributed(args.device)
    if rank == 0 and torch.distributed.is_initialized():
        print(f"requests sharded over {torch.distributed.get_world_size()} ranks", file=sys.stderr)
    model, meta = load_model(args.checkpoint)
    model.to(device)
    # Finished tasks are kept in <out>.partial.json, so a killed run resumes where it stopped.
    partial = Path(f"{args.out}.partial.json")
    key, done = resume_key(args), {}
    if partial.is_file():
        saved = json.loads(partial.read_text())
        if saved.get("key") == key:
            done = saved["tasks"]
    for unit in task_units(args.tasks):
        name = "blimp" if unit[0].startswith("blimp_") and len(unit) > 1 else unit[0]
        if name in done:
            continue
        res = evaluate(
            model,
            unit,
            data_dir=args.data_dir,
            limit=args.limit,
            docs={n: docs[n] for n in unit},
            batch_size=args.batch_size,
            device=device,
            show_progress=rank == 0 and not args.no_progress,
        )
        done.update(res["tasks"])
        if rank == 0:
            atomic_write_json(partial, {"key": key, "tasks": done})
    if rank != 0:
        return None
    record = {
        "checkpoint": str(args.checkpoint),
        "scale": meta.get("scale"),
        "schedule": meta.get("schedule") or model.cfg.schedule_name,
        "seed": meta.get("seed"),
        "semantics": SEMANTICS,
        "data_source": data_source(args.data_dir),
        "limit": args.limit,
        "tasks": done,
    }
    atomic_write_json(args.out, record)
    partial.unlink(missing_ok=True)
    return record


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        record = run(args)
    except (EvalInputError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if record is not None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{record['schedule']} ({args.checkpoint})")
        table.add_column("task")
        table.add_column("metric")
        table.add_column("value", justify="right")
        table.add_column("stderr", justify="right")
        for task, metrics in record["tasks"].items():
            for k, v in metrics.items():
                if k == "n" or k.endswith("_stderr") or not isinstance(v, float):
                    continue
                err = metrics.get(f"{k}_stderr")
                table.add_row(
                    f"{task} (n={metrics['n']})", k, f"{v:.4f}", "-" if err is None else f"{err:.4f}"
                )
        Console().print(table)
        print(f"wrote {args.out}")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
