"""What a section of RESULTS.md (or a part of one) gives back."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Part:
    """`lines`: the markdown below the section's `## title` (a fmt.Table one element, so report.json
    finds its cells); `plots`: {file name under plots/: png bytes}; `json`: its document, or None."""

    lines: list[str]
    plots: dict[str, bytes] = field(default_factory=dict)
    json: dict | None = None
    json_file: str | None = None  # the file beside RESULTS.md that holds `json`
