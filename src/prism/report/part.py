"""What a section of RESULTS.md (or a part of one) gives back: its markdown lines, its plots and,
for one whose numbers are also a JSON file beside the report, that document."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Part:
    """`lines`: the markdown below the section's `## title`, one element per line or block (a
    prism.report.fmt.Table stays one element, so report.json finds its cells); `plots`: {file name
    under plots/: png bytes}, only those drawn; `json`: the part's JSON document, or None."""

    lines: list[str]
    plots: dict[str, bytes] = field(default_factory=dict)
    json: dict | None = None
    json_file: str | None = None  # the file beside RESULTS.md that holds `json`
