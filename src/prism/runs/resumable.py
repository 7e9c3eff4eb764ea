"""A result file built one unit at a time, so that a killed job resumes where it stopped: finished
units are kept in the partial file beside the result (docs/outputs.md), rewritten atomically after
each; the whole result is written at the end. Which kept units are still valid is the job's call."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from prism.errors import cause
from prism.io import atomic_write_json
from prism.runs.layout import ANALYSIS_PARTIAL_SUFFIX, EVAL_PARTIAL_SUFFIX
from prism.runs.records import Record


@dataclass(frozen=True)
class Resumable:
    """One kind of resumable result: where it keeps its units and how the sentences name them."""

    suffix: str  # the partial file is <out><suffix>
    units: str  # the key of the partial file's JSON object that holds the kept units
    holder: type  # what that key holds: a list of entries, or a dict by name
    kept: str  # what the partial file holds, as a sentence names it
    rest: str  # what the same command does again with the units not kept

    def partial(self, out: str | Path) -> Path:
        return Path(f"{out}{self.suffix}")

    def interrupted(self, out: str | Path) -> str:
        """What a stopped job leaves, for its `interrupted: ...` line."""
        return f"{self.kept} are kept in {self.partial(out)}; run the same command again to {self.rest}"

    def earlier(self, out: str | Path, *, result_too: bool = False, warn: bool = True) -> list[dict]:
        """What earlier attempts left to reuse: the finished result (with `result_too`; a rerun
        with more units reuses its entries), then the partial file. A file that cannot be read
        back is set aside with one warning sentence (`warn`): its units are measured again."""
        found = []
        for path in (Path(out), self.partial(out)) if result_too else (self.partial(out),):
            if not path.is_file():
                continue
            what = "list" if self.holder is list else "object"
            doc, problem = None, f"not a JSON object whose {self.units!r} is a {what}"
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError) as exc:  # a UnicodeDecodeError is a ValueError
                problem = cause(exc) if str(exc) else f"{type(exc).__name__}: empty"
            if isinstance(doc, dict) and isinstance(doc.get(self.units), self.holder):
                found.append(doc)
            elif warn:
                sys.stderr.write(
                    f"warning: {path} cannot be read back ({problem}); what it held is not reused "
                    f"but computed again.\n"
                )
        return found

    def keep(self, out: str | Path, doc: dict) -> None:
        """Keep the units finished so far (doc[self.units]) in the partial file, atomically."""
        atomic_write_json(self.partial(out), doc)

    def finish(self, out: str | Path, result: Record) -> None:
        """Write the whole result atomically, then drop the partial file it replaces."""
        result.write(out)
        self.partial(out).unlink(missing_ok=True)


# The three jobs that resume from a partial file.
ZERO_SHOT = Resumable(EVAL_PARTIAL_SUFFIX, "tasks", dict, "the tasks finished so far", "score the rest")
LONG_CONTEXT = Resumable(
    EVAL_PARTIAL_SUFFIX, "results", list, "the lengths and RoPE choices measured so far", "measure the rest"
)
ATTENTION = Resumable(
    ANALYSIS_PARTIAL_SUFFIX, "checkpoints", list, "the checkpoints measured so far", "measure the rest"
)
