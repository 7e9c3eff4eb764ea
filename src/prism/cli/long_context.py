"""Loss and attention distance past the training length (docs/evaluation.md, long-context evaluation)."""

from __future__ import annotations

from typing import Annotated, Optional

from prism.cli.command import Key, command, with_bar
from prism.config.values import AT_LEAST_1
from prism.runs.resumable import LONG_CONTEXT


def long_context(
    checkpoint: str,
    out: str,
    scale: Optional[str] = None,
    lengths: Annotated[Optional[str], Key("long_context.lengths", listed=True)] = None,
    rope_scalings: Annotated[Optional[str], Key("long_context.rope_scalings", listed=True)] = None,
    path: Annotated[Optional[str], Key("long_context.path")] = None,
    text_field: Annotated[Optional[str], Key("long_context.text_field")] = None,
    device: str = "auto",
    query_block: Annotated[int, AT_LEAST_1] = 256,
    overrides: list[str] = (),
) -> int:
    """Loss by position and attention distance per layer past the training length, under each
    RoPE scaling choice.

    Args:
        out: the result JSON to write (atomically)
        scale: config to use when the checkpoint names no run config (a .ckpt holds one; exported
            weights use the config.yaml of their run folder)
        lengths: 2x,4x or 2048,4096
        rope_scalings: none,linear,ntk,yarn
        path: a jsonl file of documents
        query_block: query rows per block of the attention-distance pass (memory: heads x block x length)
        overrides: config overrides key=value, e.g. long_context.documents=8
    """
    from prism.measure.long_context.job import evaluate_to_file, result_table

    return with_bar(
        "long context",
        result_table,
        evaluate_to_file,
        checkpoint,
        out,
        overrides=list(overrides),
        scale=scale,
        device=device,
        query_block=query_block,
    )


main = command(long_context, interrupted=lambda a: LONG_CONTEXT.interrupted(a["out"]), out="out")
