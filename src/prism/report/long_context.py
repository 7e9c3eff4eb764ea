"""The "Beyond the training context" section of RESULTS.md, from
results/<scale>/long_context/<schedule>/seed<k>.json (docs/evaluation.md, "Beyond the training context")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prism.report import fmt
from prism.report.collect import Extension, ScaleResults, schedule_order
from prism.report.fmt import NOT_AVERAGED, NOT_COMPARED, NOT_RUN, Table, blocks, drawn, paragraph
from prism.report.part import Part
from prism.report.plots import lc_distance_plot, lc_loss_plot
from prism.report.prose import prose
from prism.report.recipes import not_averaged, pair_unlike
from prism.report.tables import TASK_METRICS, shown_score, unlike_runs
from prism.runs import records as R
from prism.runs.layout import (
    EVAL_PARTIAL_SUFFIX,
    LONG_CONTEXT_DIR,
    extension_of,
    plot_name,
    scale_folder,
    seed_of_eval_result,
)
from prism.runs.resumable import LONG_CONTEXT
from prism.stats import mean, mean_and_sd, sample_sd, welch_test

BASE, OTHER = "uniform", "prism"
TITLE = "Beyond the training context: loss by position and attention distance past the training length"


# ----- Δ over seeds -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delta:
    """other − base over the seeds both have: mean and s.d. of the differences, Welch's two-sided p
    of other's values against base's; sd and p are None with fewer than 2 seeds a side."""

    mean: float
    sd: float | None
    n: int
    p: float | None


def delta(base: dict[int, float], other: dict[int, float]) -> Delta | None:
    seeds = sorted(set(base) & set(other))
    if not seeds:
        return None
    diffs = [other[s] - base[s] for s in seeds]
    w = welch_test([base[s] for s in seeds], [other[s] for s in seeds])
    return Delta(mean(diffs), sample_sd(diffs), len(seeds), w.p if w else None)


# A Δ over seeds: `−0.0123 ± 0.0040 (3), p 0.031`; one seed: no s.d. and p n/a.
lc_delta = fmt.cell(
    lambda m, sd, n, p, digits=4: f"{fmt.signed_sd(m, sd, n, digits)}, p {fmt.p_value(p)}", "lc_delta"
)


def delta_cell(d: Delta | None, digits: int = 4) -> str:
    """The cell of a Δ (lc_delta), `not run` without one."""
    return NOT_RUN if d is None else lc_delta(d.mean, d.sd, d.n, d.p, digits)


# ----- reading ------------------------------------------------------------------------------------
@dataclass
class LongContextResults:
    """One scale's long-context result files: schedule -> seed -> record."""

    scale: str
    runs: dict[str, dict[int, R.LongContext]] = field(default_factory=dict)
    # prism.report.recipes on the runs evaluated: schedules whose seeds were trained differently
    # (not averaged), and whether uniform and Prism were (no Δ); set by `section`
    unlike: frozenset[str] = frozenset()
    uncompared: bool = False

    def docs(self) -> list[R.LongContext]:
        return [d for s in sorted(self.runs, key=schedule_order) for _, d in sorted(self.runs[s].items())]

    def units(self, length: int | None = None) -> list[R.LongContextUnit]:
        """Every measurement of every file, in the order of docs(); only those at `length` when given."""
        return [r for d in self.docs() for r in d.results if length is None or r.length == length]

    def lengths(self) -> list[int]:
        return sorted({r.length for r in self.units()})

    def choices(self) -> list[str]:
        return list(dict.fromkeys(r.rope_scaling for r in self.units()))

    def seq_lens(self) -> list[int]:
        return sorted({d.seq_len for d in self.docs()})

    def values(self, schedule: str, length: int, choice: str, get) -> dict[int, float]:
        """seed -> get(entry) for the runs of `schedule` that measured (length, choice), where not None."""
        found = [
            (seed, next((r for r in doc.results if r.length == length and r.rope_scaling == choice), None))
            for seed, doc in sorted(self.runs.get(schedule, {}).items())
        ]
        return {seed: get(e) for seed, e in found if e is not None and get(e) is not None}

    def same_documents(self, length: int) -> bool:
        """Whether every run read the same documents at `length` (else no Δ is formed)."""
        return len({r.documents.sha256 for r in self.units(length)}) <= 1


def _partial_target(f: Path) -> Path | None:
    """The result file that `f` is the unfinished part of (<out>.partial.json), or None."""
    if not f.name.endswith(EVAL_PARTIAL_SUFFIX):
        return None
    target = f.with_name(f.name[: -len(EVAL_PARTIAL_SUFFIX)])
    ok = LONG_CONTEXT.partial(target) == f and seed_of_eval_result(target.name) is not None
    return target if ok else None


def read_results(results_dir: str | Path, scale: str, problems: list[str]) -> LongContextResults:
    """Every valid result file of the scale; a damaged or unfinished one is named in `problems`."""
    out = LongContextResults(scale)
    root = scale_folder(results_dir, scale) / LONG_CONTEXT_DIR
    for sched_dir in sorted(root.glob("*")) if root.is_dir() else []:
        for f in sorted(sched_dir.glob("*")):
            target = _partial_target(f)
            if target is not None and not target.is_file():
                rerun = "rerun its long_context.py command to finish it"
                why = f"is an unfinished long-context evaluation (no {target.name} yet; {rerun})"
                problems.append(R.problem(str(f), why))
                continue
            seed = seed_of_eval_result(f.name)
            if seed is None:
                continue
            doc = R.LongContext.read(f, problems)
            if doc is not None:
                out.runs.setdefault(sched_dir.name, {})[seed] = doc
    return out


# ----- tables -------------------------------------------------------------------------------------
# A bucket of 0-based positions, `end` excluded: `384–511`.
lc_positions = fmt.cell(lambda first, end: f"{first}–{end - 1}", "lc_positions")


@fmt.cell
def lc_extension(folder: str, source: str, trained_at: list[int]) -> str:
    """A context extension's row: `prism-ctx256 (extension of prism, trained at 256 tokens)`."""
    return f"{folder} (extension of {source}, trained at {', '.join(map(str, trained_at))} tokens)"


OTHER_DOCUMENTS = "n/a (other documents)"


def _row_name(lc: LongContextResults, folder: str) -> str:
    """A schedule's name; a context extension's folder with what it is (prism.runs.layout)."""
    ext = extension_of(folder)
    if ext is None:
        return folder
    return lc_extension(folder, ext[0], sorted({d.seq_len for d in lc.runs[folder].values()}))


def loss_table(lc: LongContextResults) -> Table:
    """Whole-window loss per schedule and RoPE choice; seeds that read other documents not averaged."""
    lengths = lc.lengths()

    def cell(s: str, c: str, n: int) -> str:
        if s in lc.unlike:
            return NOT_AVERAGED
        if len(set(lc.values(s, n, c, lambda e: e.documents.sha256).values())) > 1:
            return OTHER_DOCUMENTS
        vals = lc.values(s, n, c, lambda e: e.loss)
        m, sd = mean_and_sd(list(vals.values()))
        return NOT_RUN if m is None else fmt.mean_sd(m, sd, 4, len(vals))

    runs = [(s, c) for s in sorted(lc.runs, key=schedule_order) for c in lc.choices()]
    rows = [[_row_name(lc, s), c, *[cell(s, c, n) for n in lengths]] for s, c in runs]
    headers = ["Schedule", "RoPE", *[f"{n} tokens" for n in lengths]]
    return Table(headers, rows, right=list(range(2, len(headers))))


def bucket_delta_table(lc: LongContextResults, length: int) -> Table:
    """Rows: the position buckets of `length`; columns: the RoPE choices; cells: Δ loss."""
    choices = lc.choices()
    edges = lc.units(length)[0].bucket_edges
    # no Δ where uniform and Prism were not trained alike, or read other documents
    missing = NOT_COMPARED if lc.uncompared else None if lc.same_documents(length) else OTHER_DOCUMENTS
    rows = []
    for b, (a, z) in enumerate(zip(edges, edges[1:])):
        get = lambda e, b=b: e.bucket_loss[b] if e.bucket_edges == edges else None
        pairs = [(lc.values(BASE, length, c, get), lc.values(OTHER, length, c, get)) for c in choices]
        rows.append([lc_positions(a, z), *[missing or delta_cell(delta(*p)) for p in pairs]])
    return Table(["Positions", *choices], rows, right=list(range(1, len(choices) + 1)))


def distance_table(lc: LongContextResults, choice: str) -> Table:
    """Rows: layers; per length, D_l of uniform and Prism (mean over seeds) and ΔD_l."""
    lengths = lc.lengths()
    n_layer = max(len(r.D) for r in lc.units())
    headers = ["Layer"]
    for n in lengths:
        headers += [f"{n}: D_l {BASE}", f"{n}: D_l {OTHER}", f"{n}: ΔD_l"]
    rows = []
    for layer in range(n_layer):
        row: list = [layer]
        get = lambda e, layer=layer: e.D[layer] if layer < len(e.D) else None
        for n in lengths:
            vals = {s: lc.values(s, n, choice, get) for s in (BASE, OTHER)}
            row += [
                NOT_AVERAGED if s in lc.unlike else fmt.num(mean(list(v.values())), 1) if v else NOT_RUN
                for s, v in vals.items()
            ]
            delta_d = delta_cell(delta(vals[BASE], vals[OTHER]), 1) if lc.same_documents(n) else "n/a"
            row.append(NOT_COMPARED if lc.uncompared else delta_d)
        rows.append(row)
    return Table(headers, rows, right=list(range(1, len(headers))))


def _runs_line(lc: LongContextResults) -> str:
    """The scale's paragraph above its tables: contexts, runs and the documents read."""
    documents = [
        (n, sorted({(_where(r.documents), r.documents.count) for r in lc.units(n)})) for n in lc.lengths()
    ]
    return prose(
        "long_context_runs",
        trained=lc.seq_lens(),
        lengths=lc.lengths(),
        runs=[(s, len(lc.runs[s])) for s in sorted(lc.runs, key=schedule_order)],
        documents=documents,
    )


def _where(documents: R.Documents) -> str:
    """A document file by its folder and name: the report holds no machine's absolute path."""
    if documents.origin != "path":
        return documents.where
    path = Path(documents.where)
    return f"`{path.parent.name}/{path.name}`" if path.parent.name else f"`{path.name}`"


def _extension_line(e: Extension) -> str:
    """A context-extension run, its final loss and its zero-shot scores in Table 3's metrics."""
    doc = e.zero_shot
    tasks = doc.tasks if doc else {}
    scores = [
        (task, metric, fmt.num(shown_score(metric, v), 1))
        for task, metric in TASK_METRICS.items()
        if (v := getattr(tasks.get(task), metric, None)) is not None
    ]
    loss = e.run.summary.final_val_loss
    return prose(
        "long_context_extension",
        label=e.label(),
        loss=None if loss is None else fmt.num(loss, 4),
        seq_len=e.seq_len,
        scores=scores,
        limit=doc.limit if doc else None,
    )


def extension_lines(results: list[ScaleResults]) -> list[str]:
    """The finished context-extension runs of each scale: runs of their own, never a schedule's."""
    lines = []
    for res in results:
        ordered = sorted(res.extensions, key=lambda e: (schedule_order(e.folder), e.seed))
        if ordered:
            lines += blocks(
                prose("long_context_extensions", scale=res.scale), [*map(_extension_line, ordered), ""]
            )
    return lines


# ----- the section --------------------------------------------------------------------------------
def _found(
    results: list[ScaleResults], results_dir: str | Path
) -> list[tuple[LongContextResults, list[str]]]:
    """Each scale's long-context results with the sentences on its runs trained differently."""
    found = []
    for res in results:
        lc = read_results(results_dir, res.scale, res.problems)
        if lc.runs:
            lc.unlike = frozenset(s for s in lc.runs if not_averaged(res, s))
            lc.uncompared = bool(lc.unlike & {BASE, OTHER}) or pair_unlike(res, OTHER, BASE)
            unlike = unlike_runs(
                [res], lambda _, lc=lc: sorted(lc.runs, key=schedule_order), lambda _: [(OTHER, BASE)]
            )
            found.append((lc, unlike))
    return found


def _scale_lines(lc: LongContextResults, unlike: list[str], plots: dict[str, bytes]) -> list[str]:
    """One scale's tables and plots (drawn into `plots`)."""
    averaged = tuple(s for s in (BASE, OTHER) if s not in lc.unlike)  # the plots' lines
    lines = [f"### {lc.scale}", "", _runs_line(lc), "", *paragraph(unlike)]
    lines += [prose("long_context_loss"), "", loss_table(lc), ""]
    for n in lc.lengths():
        lines += blocks(
            prose("long_context_delta", length=n, other=OTHER, base=BASE), bucket_delta_table(lc, n)
        )
        name, png = plot_name(lc.scale, f"long-context-loss-{n}"), lc_loss_plot(lc, n, averaged)
        lines += drawn(plots, name, png, f"{lc.scale} loss by position at {n} tokens")
    for c in lc.choices():
        lines += [prose("long_context_distance", choice=c), "", distance_table(lc, c), ""]
        name, png = plot_name(lc.scale, f"long-context-distance-{c}"), lc_distance_plot(lc, c, averaged)
        lines += drawn(plots, name, png, f"{lc.scale} attention distance per layer, RoPE {c}")
    return lines


def section(results: list[ScaleResults], results_dir: str | Path) -> Part:
    """The section's markdown and plots; unusable files join their scale's `problems`."""
    found = _found(results, results_dir)
    extended = extension_lines(results)
    if not found:
        return Part([prose("long_context_how_to_run"), "", *extended], {})  # and any extension
    plots: dict[str, bytes] = {}
    lines = [prose("long_context"), "", *extended]
    for lc, unlike in found:
        lines += _scale_lines(lc, unlike, plots)
    missing = [r.scale for r in results if r.scale not in {lc.scale for lc, _ in found}]
    return Part(lines + ([f"{', '.join(missing)}: not run.", ""] if missing else []), plots)
