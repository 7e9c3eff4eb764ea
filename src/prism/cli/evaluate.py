"""Zero-shot evaluation of one checkpoint (paper Table 3; docs/commands.md#evaluatepy)."""

from __future__ import annotations

from typing import Annotated, Optional

from prism.cli.command import Key, command, parse
from prism.config.overrides import scalar
from prism.config.schema import load_config
from prism.errors import ConfigError
from prism.eval.job import EvalJob, result_table, resume_key, run_eval_job  # noqa: F401 (resume_key: tests)
from prism.runs.resumable import ZERO_SHOT


def evaluate(
    checkpoint: str,
    out: str,
    tasks: Annotated[Optional[str], Key("eval.tasks", listed=True)] = None,
    data_dir: Annotated[Optional[str], Key("eval.data_dir")] = None,
    limit: Annotated[Optional[scalar], Key("eval.limit")] = None,
    batch_size: Annotated[Optional[int], Key("eval.batch_size")] = None,
    device: Optional[str] = None,
    no_progress: bool = False,
    overrides: list[str] = (),
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
        overrides: eval.* config overrides key=value, e.g. eval.limit=0.1
    """
    import torch
    from rich.console import Console

    record = run_eval_job(job_of(**locals()))
    if record is not None:
        Console().print(result_table(record, checkpoint))
        print(f"wrote {out}")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


def job_of(checkpoint, out, device, no_progress, overrides, **_) -> EvalJob:
    """The job of evaluate()'s arguments."""
    if others := [w for w in overrides if not w.startswith("eval.")]:
        raise ConfigError(
            f"{others[0]} is not an eval.* key; evaluate.py reads only those (the checkpoint holds its "
            "run's other settings)."
        )
    # the schema's eval section, as no paper scale sets one (tiny's eval.limit=10 is for its pipeline)
    e = load_config("124m", list(overrides)).eval
    options = dict(tasks=",".join(e.tasks), data_dir=e.data_dir, limit=e.limit, batch_size=e.batch_size)
    return EvalJob(checkpoint, out, **options, device=device, progress=not no_progress)


def parse_args(argv=None) -> EvalJob:
    return job_of(**parse(evaluate, argv))


# each finished task was saved (atomically) as it finished: a Ctrl-C keeps them
main = command(evaluate, interrupted=lambda a: ZERO_SHOT.interrupted(a["out"]), out="out")
