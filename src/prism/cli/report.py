"""Regenerate results/RESULTS.md (and results/plots/*.png) from the result files
(docs/report.md; docs/commands.md#reportpy).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Optional

from prism.cli.command import run
from prism.config.schema import available_scales
from prism.config.values import names
from prism.errors import EXIT_REFUSED, PrismError, UsageError
from prism.io import check_output
from prism.runs.layout import REPORT_NAME

DEFAULT_RUNS_DIR = "runs"  # the config's runs_dir, absent until something trains there


class ProblemsLeftOut(PrismError):
    """The report was written without some result files: it must not pass for a whole one."""

    exit_code = EXIT_REFUSED


def report(
    scales: Annotated[Optional[list[str]], names("give one or more scales", "[tiny]", min_length=1)] = None,
    runs_dir: str = DEFAULT_RUNS_DIR,
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
    from prism.report import write_report

    args = SimpleNamespace(**locals())
    return _report(args, write_report)


def main(argv: list[str] | None = None) -> int:
    # every file is written atomically, and only where its bytes change
    return run(report, argv, "report.py", interrupted="every file not yet rewritten keeps its old bytes")


def _report(args: SimpleNamespace, write_report) -> int:
    scales = [s for item in args.scales or [] for s in item.split(",") if s]
    valid = available_scales()
    bad = [s for s in scales if s not in valid]
    if bad:
        raise UsageError(f"unknown scale {bad[0]!r}: valid scales are {', '.join(valid)}.")
    twice = next((s for i, s in enumerate(scales) if s in scales[:i]), None)
    if twice is not None:  # each scale's rows would appear twice in every table
        raise UsageError(f"--scales names {twice!r} more than once; name each scale once.")
    if not Path(args.results_dir).is_dir():  # a mistyped folder would get a report of nothing
        raise UsageError(
            f"--results-dir {args.results_dir} is not a folder; give the results_dir the stages "
            f"wrote to (default: results)."
        )
    # the default may be absent (a report of the paper's numbers alone); any other folder named is
    # a typo unless it exists: its report would show no run at all
    if Path(args.runs_dir) != Path(DEFAULT_RUNS_DIR) and not Path(args.runs_dir).is_dir():
        raise UsageError(
            f"--runs-dir {args.runs_dir} is not a folder; give the runs_dir the training runs were "
            f"written to (default: runs)."
        )
    target = Path(args.out) if args.out else Path(args.results_dir) / REPORT_NAME
    problems: list[str] = []
    check_output(target, flag="--out" if args.out else "the report")  # before anything is read
    out, changed = write_report(scales, args.runs_dir, args.results_dir, target, problems=problems)
    print(f"{out}: {'updated ' + str(len(changed)) + ' file(s)' if changed else 'unchanged'}")
    for path in changed:
        print(f"  wrote {path}")
    for problem in problems:  # the report's own sentences, whose paths are code spans there
        print(f"warning: {problem.replace('`', '')}", file=sys.stderr)
    if problems and not args.allow_problems:  # run_all.py's report stage then fails
        raise ProblemsLeftOut(
            f"{out} leaves out the {len(problems)} file(s) named above; fix or move them and "
            f"run again, or pass --allow-problems to accept the report without them."
        )
    return 0
