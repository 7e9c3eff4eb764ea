"""The pre-flight check on its own, before a long run (docs/commands.md#preflightpy)."""

from __future__ import annotations

from typing import Annotated

from prism.cli.command import command
from prism.config.values import positive


def preflight(
    timeout_s: Annotated[float, positive("use a positive number of seconds, e.g. 120")] = 120.0,
) -> int:
    """Time a matrix multiply per rank and an all-reduce across all ranks; name a slow rank or node.

    Args:
        timeout_s: how long a rank waits for the others
    """
    from prism.train.preflight import run as check

    check(timeout_s)
    return 0


main = command(preflight)
