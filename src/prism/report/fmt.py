"""Number formatting and markdown tables for the report: fixed rules, so output is stable."""

from __future__ import annotations

from functools import wraps
from typing import Callable, Sequence

from prism.runs.layout import PLOTS_DIR

NOT_RUN = "not run"
NO_PAPER = "—"  # the paper has no number for this cell
# runs not trained alike (prism.report.recipes): the sentence above the table says how they differ
NOT_AVERAGED = "not averaged (see above)"
NOT_COMPARED = "not compared (see above)"


# ----- cells: the numbers of a table and the text that shows them -------------------------------
FORMATS: dict[str, Callable[..., str]] = {}


class Cell(str):
    """A table cell whose text is `FORMATS[format](*values)`: report.json and RESULTS.md agree."""

    format: str
    values: tuple

    def __new__(cls, format: str, *values) -> Cell:
        cell = super().__new__(cls, FORMATS[format](*values))
        cell.format, cell.values = format, values
        return cell

    def as_json(self) -> dict:
        return {"format": self.format, "values": list(self.values)}


def cell(fn: Callable[..., str], name: str | None = None) -> Callable[..., Cell]:
    """Register `fn` as the cell format `name` (default: its own): the result gives Cells."""
    name = name or fn.__name__
    FORMATS[name] = fn
    return wraps(fn)(lambda *values: Cell(name, *values))


def render(value) -> str:
    """A cell's text from what report.json holds for it."""
    if isinstance(value, dict) and "format" in value:
        return FORMATS[value["format"]](*value["values"])
    return str(value)


def _json(value):
    if isinstance(value, Cell):
        return value.as_json()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return str(value)


class Table(str):
    """A GitHub markdown table (the text), with its cells' values for report.json (`as_json`)."""

    headers: list[str]
    rows: list[list]

    def __new__(cls, headers: Sequence[str], rows: Sequence[Sequence], right: Sequence[int] = ()) -> Table:
        align = ["---:" if i in right else "---" for i in range(len(headers))]
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
        # one cell on one line: a `|` or a line break from a file's text would split the row
        cells = ([" ".join(str(c).replace("|", "\\|").splitlines()) for c in row] for row in rows)
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        table = super().__new__(cls, "\n".join(lines))
        table.headers, table.rows = list(headers), [list(r) for r in rows]
        return table

    def as_json(self) -> dict:
        # a header may show a number too (a confidence level): a cell like any other
        return {
            "headers": [_json(h) for h in self.headers],
            "rows": [[_json(c) for c in row] for row in self.rows],
        }


def image(plots: dict[str, bytes], name: str, alt: str) -> list[str]:
    """The lines that show plot `name` (under plots/); none when it was not drawn."""
    return [f"![{alt}]({PLOTS_DIR}/{name})", ""] if name in plots else []


def drawn(plots: dict[str, bytes], name: str, png: bytes | None, alt: str) -> list[str]:
    """`png` (None: not drawn) added to `plots` as `name`, and the lines that show it."""
    if png is not None:
        plots[name] = png
    return image(plots, name, alt)


def recorded(value, unknown="?"):
    """`value`, or what stands for it where the file did not record it (absent or null)."""
    return unknown if value is None else value


def on_devices(count: int | None, hardware: str | None) -> str:
    """Where something ran: `2× NVIDIA H200` (one device, `?` hardware where not recorded)."""
    return f"{recorded(count, 1)}× {recorded(hardware)}"


def paragraph(sentences: list[str]) -> list[str]:
    """Sentences as one block of lines with a blank line after it; nothing without any."""
    return [*sentences, ""] if sentences else []


def blocks(*items: str | list[str]) -> list[str]:
    """Markdown lines: each text item followed by a blank line; a list (lines already) as it is."""
    return [line for item in items for line in (item if isinstance(item, list) else [item, ""])]


def seeds_text(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def level_text(level: float) -> str:
    """A confidence level as a percentage: 0.95 -> `95 %`."""
    return f"{100 * level:g} %"


num = cell(lambda x, digits=4: NOT_RUN if x is None else f"{x:.{digits}f}", "num")


@cell
def signed(x: float | None, digits: int = 4) -> str:
    if x is None:
        return NOT_RUN
    s = f"{x:+.{digits}f}"
    return s.replace("-", "−") if s.strip("+-0.") else f"{0:.{digits}f}"


@cell
def mean_sd(m: float | None, sd: float | None, digits: int = 4, n: int | None = None) -> str:
    """A mean ± its s.d. (if any) and, where given, over how many seeds: `3.1234 ± 0.0200 (3)`."""
    if m is None:
        return NOT_RUN
    text = f"{m:.{digits}f}" if sd is None else f"{m:.{digits}f} ± {sd:.{digits}f}"
    return text if n is None else f"{text} ({n})"


@cell
def signed_sd(m: float, sd: float | None, n: int, digits: int = 4) -> str:
    """A Δ over `n` seeds, with its s.d. where there is one: `−20.0 ± 2.8 (2)`."""
    spread = "" if sd is None else f" ± {sd:.{digits}f}"
    return f"{signed(m, digits)}{spread} ({n})"


# A ratio of two numbers (to uniform's FLOPs per token, tokens/s, tokens): `0.987`.
ratio = cell(lambda x: "n/a" if x is None else f"{x:.3f}", "ratio")
# A fraction in %: 0.412 -> `41.2 %`.
percent = cell(lambda fraction: "n/a" if fraction is None else f"{100 * fraction:.1f} %", "percent")
# A count with thousands separators: 2,883,584,000.
count = cell(lambda n: f"{n:,}", "count")


@cell
def p_value(p: float | None) -> str:
    if p is None:
        return "n/a"
    if p < 1e-4:
        return f"{p:.1e}"
    return f"{p:.4f}" if p < 0.01 else f"{p:.3f}"


@cell
def tokens_per_s(x: float | None) -> str:
    return NOT_RUN if x is None else f"{x / 1000:,.0f}K" if x >= 10_000 else f"{x:,.0f}"


@cell
def tokens(x: float | None) -> str:
    """2,883,584,000 -> 2.88B; small counts stay exact."""
    if x is None:
        return NOT_RUN
    for div, unit in ((1e9, "B"), (1e6, "M")):
        if x >= div:
            return f"{x / div:.3g}{unit}" if x / div < 100 else f"{x / div:,.0f}{unit}"
    return f"{x:,.0f}"


@cell
def hours(h: float | None) -> str:
    return NOT_RUN if h is None else f"{h:.2f}" if h >= 0.1 else f"{h:.3f}"


def _bound(x: float | None, spec: str, side: int = 0) -> str:
    """One number of an interval; an unbounded side (null, or not finite) as ∓∞."""
    if x is None or x != x or x in (float("inf"), float("-inf")):
        return "∞" if side > 0 else "−∞" if side < 0 else "n/a"
    s = f"{x:{spec}}"
    return s.replace("-", "−") if s.strip("+-0.") else s.lstrip("+-")  # zero unsigned, as signed()


@cell
def interval(iv: dict | None, spec: str = "+.4f") -> str:
    """{"value", "lo", "hi"} as `value [lo, hi]`; a degenerate one as its value; n/a without one."""
    if not iv or iv.get("value") is None:
        return "n/a"
    v, lo, hi = iv["value"], iv.get("lo"), iv.get("hi")
    if lo == v and hi == v:
        return _bound(v, spec)
    return f"{_bound(v, spec)} [{_bound(lo, spec, -1)}, {_bound(hi, spec, 1)}]"


@cell
def params(n: float | None) -> str:
    """A model size as the paper names them: 123,587,328 -> 124M, 1.5e9 -> 1.5B."""
    if n is None:
        return NOT_RUN
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:,.0f}"


# Seeds on each side of a comparison: `3 / 3`.
seed_pair = cell(lambda base, other: f"{base} / {other}", "seed_pair")
# Training FLOPs: 2.46e18.
flops = cell(lambda c: NOT_RUN if c is None else f"{c:.2e}".replace("e+", "e"), "flops")
