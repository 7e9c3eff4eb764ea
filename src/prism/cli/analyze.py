"""Attention distance per layer (paper Eq. 1, Figure 4) of checkpoints (docs/commands.md#analyzepy)."""

from __future__ import annotations

from typing import Annotated, Optional

from prism.cli.command import Key, command, with_bar
from prism.config.overrides import override_value
from prism.config.values import AT_LEAST_1
from prism.runs.resumable import ATTENTION


def analyze(
    checkpoints: list[str],
    out: str,
    sequences: Annotated[Optional[int], Key("analysis.sequences"), AT_LEAST_1] = None,
    scale: Optional[str] = None,
    data_dir: Annotated[Optional[str], Key("data.path")] = None,
    windows: Optional[str] = None,
    batch_size: Annotated[int, AT_LEAST_1] = 4,
    device: str = "auto",
    overrides: list[str] = (),
) -> int:
    """Mean attention distance per layer and head (paper Eq. 1) of checkpoints, and ΔD_l of each
    schedule against the uniform checkpoint of the same scale and seed.

    Args:
        checkpoints: .ckpt, .safetensors or exported folders, all of one scale
        out: analysis.json to write (atomically)
        sequences: held-out validation windows to average over
        scale: config to use when no checkpoint names its run config (a .ckpt holds one; exported
            weights use the config.yaml of their run folder)
        windows: a torch.save'd LongTensor (N, seq_len+1) of token windows to use instead of the
            held-out validation set
        batch_size: sequences per forward pass
        overrides: config overrides key=value, e.g. data.path=/data
    """
    from prism.measure.analysis.compare import analyze_to_file, result_table

    return with_bar(
        "attention distance",
        result_table,
        analyze_to_file,
        checkpoints,
        out,
        sequences=override_value(overrides, "analysis.sequences"),  # weights without a config too
        scale=scale,
        overrides=list(overrides),
        windows_path=windows,
        batch_size=batch_size,
        device=device,
    )


main = command(analyze, interrupted=lambda a: ATTENTION.interrupted(a["out"]), out="out")
