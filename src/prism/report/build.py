"""Assemble results/RESULTS.md and its plots from the result files and the paper's tables:
deterministic (no timestamps or absolute paths), each file written only when its bytes change."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from prism.config.describe import by_size
from prism.config.schema import available_scales
from prism.io import write_if_changed
from prism.report import across_scales, dynamics, long_context
from prism.report import tables as T
from prism.report.collect import ScaleResults, collect, schedule_order
from prism.report.fmt import NOT_RUN, Table, blocks, image, paragraph
from prism.report.paper import PAPER_SCALES, PaperTables, load_paper_tables
from prism.report.part import Part
from prism.report.plots import all_plots
from prism.report.prose import prose
from prism.report.software import software_lines
from prism.report.zeroshot_curve import report_lines as zeroshot_lines
from prism.runs.layout import (
    PLOTS_DIR,
    REPORT_JSON_NAME,
    REPORT_NAME,
    SEARCH_DIR,
    SEARCH_REPORT,
    plot_name,
    scale_folder,
)


# ----- the sections, in the order of RESULTS.md ----------------------------------------------------
@dataclass
class Report:
    """What the sections are made from, and what they leave beside the text."""

    scales: list[str]
    res: list[ScaleResults]
    paper: PaperTables
    results_dir: Path
    config_dir: object = None
    plots: dict[str, bytes] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)  # JSON files beside the report
    tables: list[dict] = field(default_factory=list)  # report.json: each section's tables, in order

    def img(self, name: str, alt: str) -> list[str]:
        return image(self.plots, name, alt)


def _part(rep: Report, title: str, section: Callable[[Report], Part | None]) -> str | None:
    """The `## title` text of one section (None: left out); its plots, JSON and tables join the report's."""
    part = section(rep)
    if part is None:
        return None
    rep.plots.update(part.plots)
    if part.json is not None:
        rep.data[part.json_file] = across_scales.json_bytes(part.json)
    rep.tables.append({"title": title, "tables": _tables(part.lines)})
    return "\n".join([f"## {title}", "", *part.lines]).rstrip() + "\n"


def _tables(lines: list[str]) -> list[dict]:
    """The section's tables as report.json holds them, each under the `###` heading above it."""
    out, heading = [], None
    for line in lines:
        if line.startswith("### "):
            heading = line[4:]
        elif isinstance(line, Table):
            out.append({"heading": heading, **line.as_json()})
    return out


def _per_scale(rep: Report, intro: str, lines: Callable[[ScaleResults], list[str]]) -> Part:
    return Part([prose(intro), "", *[line for r in rep.res for line in [f"### {r.scale}", "", *lines(r)]]])


def _table2(rep: Report) -> Part:
    unlike = T.unlike_runs(
        rep.res, lambda r: T.main_schedules(r, rep.paper), lambda r: [("prism", "uniform")]
    )
    delta = prose("table2_delta", paper_seeds=rep.paper.t2["seeds"])
    table2 = T.table2(rep.res, rep.paper)
    return Part(blocks(prose("table2"), paragraph(unlike), table2, delta, T.table2_delta(rep.res, rep.paper)))


def _table3(rep: Report) -> Part:
    unlike = paragraph(T.unlike_runs(rep.res, lambda r: T.main_schedules(r, rep.paper)))
    table3, other = T.table3(rep.res, rep.paper), T.table3_other(rep.res, rep.paper)
    return Part(blocks(prose("table3"), unlike, table3, T.eval_conditions(rep.res), other))


def _table5(rep: Report) -> Part | None:
    small = next((r for r in rep.res if r.scale == rep.paper.t5["scale"]), None)  # Table 5's scale
    if small is None:
        return None
    kits = [row["kit"] for row in rep.paper.ablation()]
    pairs = [(k, "uniform") for k in kits if k != "uniform"]
    unlike = T.unlike_runs([small], lambda r: kits, lambda r: pairs)
    ran = any(small.runs.get(k) for k in kits if k not in ("uniform", "prism"))
    return Part(blocks(prose("table5", ran=ran), paragraph(unlike), T.table5(small, rep.paper)))


def _bench(rep: Report) -> Part:
    def lines(r: ScaleResults) -> list[str]:
        t = T.bench_table(r)
        return [T.bench_setup(r), "", t, ""] if t else [f"{NOT_RUN.capitalize()}.", ""]

    return _per_scale(rep, "bench", lines)


def _dynamics(rep: Report) -> Part:
    def lines(r: ScaleResults) -> list[str]:
        t, d = dynamics.milestone_table(r), dynamics.delta_table(r, rep.paper)
        main = [s for s in ("uniform", "prism") if s in r.runs]
        return [
            *paragraph(T.unlike_runs([r], lambda _: main, lambda _: [("prism", "uniform")])),
            *([t, ""] if t else ["Milestones: not run.", ""]),
            *([d, ""] if d else []),
            *rep.img(plot_name(r.scale, "val-loss"), f"{r.scale} validation loss"),
            *rep.img(plot_name(r.scale, "delta-loss"), f"{r.scale} delta validation loss"),
            *zeroshot_lines(r, rep.paper, rep.img),
        ]

    return _per_scale(rep, "dynamics", lines)


def _distance(rep: Report) -> Part:
    def lines(r: ScaleResults) -> list[str]:
        t = dynamics.distance_table(r, rep.paper)
        if t:
            analysed = dynamics.distance_by_schedule(r.analysis)
            pairs = [(s, "uniform") for s in (r.analysis.delta or {})]
            unlike = T.unlike_runs([r], lambda _: sorted(analysed, key=schedule_order), lambda _: pairs)
            out = [*paragraph(unlike), dynamics.distance_note(r, rep.paper), "", t, ""]
        else:
            line = dynamics.distance_paper_line(r.scale, rep.paper)
            out = [f"{NOT_RUN.capitalize()}." + (f" {line}" if line else ""), ""]
        return out + rep.img(plot_name(r.scale, "delta-distance"), f"{r.scale} delta attention distance")

    return _per_scale(rep, "distance", lines)


def _searches(rep: Report) -> Part | None:
    """A search's report is its own document: linked, relative to RESULTS.md."""
    found = [f"{s}/{SEARCH_DIR}/{SEARCH_REPORT}" for s in rep.scales]
    found = [f for f in found if (rep.results_dir / f).is_file()]
    return Part([prose("searches"), "", *[f"- [{f}]({f})" for f in found], ""]) if found else None


def _problems(rep: Report) -> Part | None:
    found = [f"- {p}" for r in rep.res for p in r.problems]
    return Part(found) if found else None


SECTIONS = (
    (
        "Table 1: configurations",
        lambda rep: Part(blocks(prose("table1"), T.table1(rep.res, rep.paper, rep.config_dir))),
    ),
    ("Table 2: validation loss and throughput", _table2),
    ("Table 3: zero-shot evaluation", _table3),
    ("Table 5: schedule ablation (124m)", _table5),
    ("Throughput benchmark", _bench),
    (
        "Across scales: scaling fits and comparisons at equal compute",
        lambda rep: across_scales.section(rep.res, rep.paper, rep.config_dir),
    ),
    ("Training dynamics: milestones and Δ loss vs tokens (§3.4, Figure 3a)", _dynamics),
    ("Attention distance per layer (§4.1, Eq. 1, Figure 4)", _distance),
    ("Schedule searches", _searches),
    # its unusable files join res' problems
    (long_context.TITLE, lambda rep: long_context.section(rep.res, rep.results_dir)),
    ("Software and hardware", lambda rep: Part([prose("software"), "", *software_lines(rep.res), ""])),
    ("Problems found while reading results", _problems),  # last: earlier sections add to them
)


def build_report(
    scales: list[str],
    runs_dir: str | Path,
    results_dir: str | Path,
    paper: PaperTables | None = None,
    config_dir=None,
    problems: list[str] | None = None,
    data: dict[str, bytes] | None = None,
) -> tuple[str, dict[str, bytes]]:
    """(markdown, {plot name: png}); `problems` gets the sentences on files left out, `data` the JSON."""
    paper = paper or load_paper_tables()
    res = [collect(s, runs_dir, results_dir) for s in scales]
    rep = Report(list(scales), res, paper, Path(results_dir), config_dir)
    for r in res:
        rep.plots.update(all_plots(r, paper))
    texts = [prose("header") + "\n", *(t for t in (_part(rep, *s) for s in SECTIONS) if t is not None)]
    report_json = json.dumps({"sections": rep.tables}, indent=1, ensure_ascii=False) + "\n"
    rep.data[REPORT_JSON_NAME] = report_json.encode()
    if problems is not None:
        problems.extend(p for r in res for p in r.problems)
    if data is not None:
        data.update(rep.data)
    return "\n".join(texts), rep.plots


def default_scales(runs_dir: str | Path, results_dir: str | Path, config_dir=None) -> list[str]:
    """The scales when none are named, small to large: the paper's three (their rows hold the paper's
    numbers before any run) and every other that ran."""
    roots = (runs_dir, results_dir)
    ran = [s for s in available_scales(config_dir) if any(scale_folder(r, s).is_dir() for r in roots)]
    return by_size(list(dict.fromkeys([*PAPER_SCALES, *ran])), config_dir)


def write_report(
    scales: list[str] | None = None,
    runs_dir: str | Path = "runs",
    results_dir: str | Path = "results",
    out: str | Path | None = None,
    paper_dir=None,
    config_dir=None,
    problems: list[str] | None = None,
) -> tuple[Path, list[Path]]:
    """Write RESULTS.md (default `<results_dir>/RESULTS.md`) and plots/: (its path, files changed)."""
    scales = list(scales or default_scales(runs_dir, results_dir, config_dir))
    out = Path(out) if out else Path(results_dir) / REPORT_NAME
    paper = load_paper_tables(paper_dir) if paper_dir else None
    data: dict[str, bytes] = {}
    text, plots = build_report(scales, runs_dir, results_dir, paper, config_dir, problems, data)
    files = [(out.parent / PLOTS_DIR / n, png) for n, png in sorted(plots.items())]
    files += [(out.parent / n, doc) for n, doc in sorted(data.items())] + [(out, text.encode())]
    return out, [f for f, content in files if write_if_changed(f, content)]
