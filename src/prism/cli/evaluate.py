"""Zero-shot evaluation of one checkpoint (paper Table 3; docs/commands.md#evaluatepy)."""

from __future__ import annotations

from typing import Annotated, Optional

from prism.cli.command import Key, command
from prism.config.overrides import scalar
from prism.eval.job import EvalJob, result_table, run_eval_job
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

    record = run_eval_job(EvalJob.of_overrides(checkpoint, out, overrides, device, not no_progress))
    if record is not None:
        Console().print(result_table(record, checkpoint))
        print(f"wrote {out}")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


# each finished task was saved (atomically) as it finished: a Ctrl-C keeps them
main = command(evaluate, interrupted=lambda a: ZERO_SHOT.interrupted(a["out"]), out="out")
