"""report.py's work: the folders and scales it is given checked, then the report written and what
changed (or was left out) said."""

from __future__ import annotations

import sys
from pathlib import Path

from prism.config.schema import available_scales
from prism.errors import EXIT_REFUSED, PrismError, UsageError
from prism.io import check_output
from prism.runs.layout import REPORT_NAME

DEFAULT_RUNS_DIR = "runs"  # the config's runs_dir, absent until something trains there


class ProblemsLeftOut(PrismError):
    """The report was written without some result files: it must not pass for a whole one."""

    exit_code = EXIT_REFUSED


def regenerate(
    scales: list[str], runs_dir: str, results_dir: str, out: str | None, allow_problems: bool
) -> None:
    """Write the report of `scales` (comma lists; none: every scale found) and print the files whose
    bytes changed; UsageError before anything is read. A result file left out is a warning, and
    ProblemsLeftOut once the report is written unless `allow_problems`."""
    from prism.report import write_report

    scales = [s for item in scales for s in item.split(",") if s]
    valid = available_scales()
    bad = [s for s in scales if s not in valid]
    if bad:
        raise UsageError(f"unknown scale {bad[0]!r}: valid scales are {', '.join(valid)}.")
    twice = next((s for i, s in enumerate(scales) if s in scales[:i]), None)
    if twice is not None:  # each scale's rows would appear twice in every table
        raise UsageError(f"--scales names {twice!r} more than once; name each scale once.")
    if not Path(results_dir).is_dir():  # a mistyped folder would get a report of nothing
        raise UsageError(
            f"--results-dir {results_dir} is not a folder; give the results_dir the stages "
            f"wrote to (default: results)."
        )
    # the default may be absent (a report of the paper's numbers alone); any other folder named is
    # a typo unless it exists: its report would show no run at all
    if Path(runs_dir) != Path(DEFAULT_RUNS_DIR) and not Path(runs_dir).is_dir():
        raise UsageError(
            f"--runs-dir {runs_dir} is not a folder; give the runs_dir the training runs were "
            f"written to (default: runs)."
        )
    target = Path(out) if out else Path(results_dir) / REPORT_NAME
    problems: list[str] = []
    check_output(target, flag="--out" if out else "the report")  # before anything is read
    written, changed = write_report(scales, runs_dir, results_dir, target, problems=problems)
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
