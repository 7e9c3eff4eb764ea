"""One evaluation job: a checkpoint scored on tasks, written to a JSON file (reproduce/evaluate.py;
sharding, resuming and the checks first: docs/evaluation.md, "Zero-shot evaluation")."""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from prism.errors import ConfigError
from prism.eval.data import load_docs
from prism.eval.evaluator import evaluate, overlong_task
from prism.eval.tasks import DEFAULT_TASKS, SEMANTICS, TASKS, EvalInputError, resolve_tasks
from prism.runs.checkpoint import load_model, weights_path
from prism.runs.records import EvalResult
from prism.runs.resumable import ZERO_SHOT


@dataclass
class EvalJob:
    checkpoint: str  # .ckpt, .safetensors or an exported run folder
    out: str  # the metrics JSON to write
    tasks: str = ",".join(DEFAULT_TASKS)  # comma-separated task names
    data_dir: str | None = None  # local copies in the hub schemas; None = the hub
    limit: float | int | None = None  # first N documents per task; below 1: that fraction
    batch_size: int = 32
    device: str | None = None  # None = cuda when available, else cpu
    progress: bool = True

    @classmethod
    def of_overrides(
        cls, checkpoint: str, out: str, overrides: list[str], device: str | None = None, progress: bool = True
    ) -> EvalJob:
        """evaluate.py's job: its eval.* overrides over the schema's eval section (no paper scale sets
        one; tiny's eval.limit=10 is for its pipeline). The checkpoint holds its run's other settings."""
        from prism.config.schema import load_config

        if others := [w for w in overrides if not w.startswith("eval.")]:
            raise ConfigError(
                f"{others[0]} is not an eval.* key; evaluate.py reads only those (the checkpoint holds its "
                "run's other settings)."
            )
        e = load_config("124m", list(overrides)).eval
        options = dict(tasks=",".join(e.tasks), data_dir=e.data_dir, limit=e.limit, batch_size=e.batch_size)
        return cls(checkpoint, out, **options, device=device, progress=progress)


def task_data_identity(data_dir: str | Path | None, names: list[str]) -> str:
    """Which data was scored, independent of where it sat: "hub", or the local task files' own
    content hash (sha256 over their names relative to the folder, and their bytes)."""
    if not data_dir:
        return "hub"
    digest = hashlib.sha256()
    for rel in sorted({TASKS[n].local_file for n in names}):
        digest.update(str(rel).encode() + b"\0")
        digest.update((Path(data_dir) / rel).read_bytes())
    return f"local files, sha256 {digest.hexdigest()[:16]}"


def setup_distributed(device_arg: str | None) -> tuple[torch.device, int]:
    """Under torchrun or an `srun` step of several tasks, join the process group (NCCL on GPUs, gloo
    on CPUs; an srun step meets at its first node, on Lightning's port for the job)."""
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
    if device_arg:
        device = torch.device(device_arg)
    else:
        device = torch.device("cuda", launch.local_rank) if use_cuda else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, launch.rank


def check_inputs(job: EvalJob) -> dict:
    """Everything that can be wrong with the request (names, folders, every row of every task),
    found before a model is loaded or a GPU is touched. Returns the documents per task."""
    names = resolve_tasks(job.tasks)  # the batch size is a config key's, checked by its rule
    if job.data_dir is not None and not Path(job.data_dir).is_dir():
        raise EvalInputError(
            f"--data-dir {job.data_dir} is not a folder; it should hold "
            f"hellaswag/, piqa/, arc_easy/, winogrande/, blimp/, wikitext/."
        )
    return {n: load_docs(TASKS[n], job.data_dir, job.limit) for n in names}


def check_fits(job: EvalJob, docs: dict, seq_len: int) -> None:
    """Every continuation must fit the model's context, or the engine stops at it with no task
    named, after the tasks before it were scored: checked before any scoring."""
    found = overlong_task(docs, seq_len)
    if found is None:
        return
    name, longest, _ = found
    unit = next(u for u in task_units(job.tasks) if name in u)
    asked = "blimp" if len(unit) > 1 else name  # a paradigm of the whole BLiMP group
    raise EvalInputError(
        f"task {name} has a continuation of {longest} tokens, longer than the seq_len={seq_len} of "
        f"{job.checkpoint}, so that model cannot score it; leave {asked} out of --tasks or evaluate a model "
        f"with a longer model.seq_len."
    )


def task_units(tasks: str) -> list[list[str]]:
    """What is scored (and saved for resuming) together: a task, or a whole group."""
    units = [resolve_tasks([name]) for name in tasks.split(",") if name.strip()]
    return [unit for i, unit in enumerate(units) if unit not in units[:i]]  # each once, in order


def resume_key(job: EvalJob) -> dict:
    """Saved partial results are reused only for the same weights, data, limit and semantics."""
    weights = weights_path(job.checkpoint)
    st = weights.stat()
    return {
        "checkpoint": str(weights.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "data_source": task_data_identity(job.data_dir, resolve_tasks(job.tasks)),
        "limit": job.limit,
        "semantics": SEMANTICS,
    }


def run_eval_job(job: EvalJob) -> dict | None:
    """Score, write job.out (rank 0) and return the record; None on the other ranks."""
    docs = check_inputs(job)
    device, rank = setup_distributed(job.device)
    if rank == 0 and torch.distributed.is_initialized():
        print(
            f"requests sharded over {torch.distributed.get_world_size()} ranks, in whole batches",
            file=sys.stderr,
        )
    model, meta = load_model(job.checkpoint)
    check_fits(job, docs, model.cfg.seq_len)
    model.to(device)
    key = resume_key(job)
    saved = ZERO_SHOT.earlier(job.out, warn=rank == 0)
    done = saved[0]["tasks"] if saved and saved[0].get("key") == key else {}
    for unit in task_units(job.tasks):
        name = "blimp" if unit[0].startswith("blimp_") and len(unit) > 1 else unit[0]
        if name in done:
            continue
        res = evaluate(
            model,
            unit,
            docs={n: docs[n] for n in unit},  # read and checked before the model was loaded
            batch_size=job.batch_size,
            device=device,
            show_progress=rank == 0 and job.progress,
        )
        done.update(res["tasks"])
        if rank == 0:
            ZERO_SHOT.keep(job.out, {"key": key, "tasks": done})
    if rank != 0:
        return None
    record = EvalResult(
        checkpoint=str(job.checkpoint),
        scale=meta.get("scale"),
        schedule=meta.get("schedule") or model.cfg.schedule_name,
        seed=meta.get("seed"),
        semantics=SEMANTICS,
        data_source=key["data_source"],
        limit=job.limit,
        batch_size=job.batch_size,
        tasks=done,
    )
    ZERO_SHOT.finish(job.out, record)
    return record.as_json()


def result_table(record: dict, checkpoint: str):
    """The metrics of an evaluation record with their standard errors, as a rich table."""
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
    return table
