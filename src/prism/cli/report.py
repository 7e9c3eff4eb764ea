"""Regenerate results/RESULTS.md and its plots from the result files (docs/report.md)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

from prism.cli.command import command
from prism.config.values import names
from prism.errors import EXIT_REFUSED, PrismError


class ProblemsLeftOut(PrismError):
    """The report was written without some result files: it must not pass for a whole one."""

    exit_code = EXIT_REFUSED


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

    written, changed, problems = regenerate(scales or [], runs_dir, results_dir, out)
    print(f"{written}: {'updated ' + str(len(changed)) + ' file(s)' if changed else 'unchanged'}")
    for path in changed:
        print(f"  wrote {path}")
    for problem in problems:  # the report's own sentences, whose paths are code spans there
        print(f"warning: {problem.replace('`', '')}", file=sys.stderr)
    if problems and not allow_problems:  # run_all.py's report stage then fails
        raise ProblemsLeftOut(
            f"{written} leaves out the {len(problems)} file(s) named above; fix or move them and "
            f"run again, or pass --allow-problems to accept the report without them."
        )
    return 0


# every file is written atomically, and only where its bytes change
main = command(report, interrupted="every file not yet rewritten keeps its old bytes")
