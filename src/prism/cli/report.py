"""Regenerate results/RESULTS.md and its plots from the result files (docs/report.md)."""

from __future__ import annotations

from typing import Annotated, Optional

from prism.cli.command import command
from prism.config.values import names


def report(
    scales: Annotated[Optional[list[str]], names("give one or more scales", "[tiny]", min_length=1)] = None,
    runs_dir: str = "runs",  # prism.report.regenerate.DEFAULT_RUNS_DIR, which may be absent
    results_dir: str = "results",
    out: Optional[str] = None,
    allow_problems: bool = False,
) -> int:
    """Regenerate results/RESULTS.md (and results/plots/*.png) from the result files.

    Args:
        scales: scales to include, each a configs/scale/<name>.yaml (default: 124m, 354m, 757m and
            every other scale with a folder under --runs-dir or --results-dir, small to large)
        runs_dir: where training runs live
        results_dir: where result JSON lives
        out: report path (default: <results-dir>/RESULTS.md)
        allow_problems: exit 0 even when a result file could not be used and is left out of the report
    """
    from prism.report.regenerate import regenerate  # matplotlib's import: once the words are read

    regenerate(scales or [], runs_dir, results_dir, out, allow_problems)
    return 0


# every file is written atomically, and only where its bytes change
main = command(report, interrupted="every file not yet rewritten keeps its old bytes")
