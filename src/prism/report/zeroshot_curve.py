"""Zero-shot scores along training (each run's `zeroshot.json`): per task, mean ± s.d. over seeds
at each token milestone and Δ prism − uniform, of runs that evaluated alike (docs/report.md)."""

from __future__ import annotations

from dataclasses import dataclass

from prism.report import fmt
from prism.report.collect import RunResults, ScaleResults
from prism.report.fmt import Table
from prism.report.paper import PaperTables
from prism.report.prose import prose
from prism.report.recipes import not_averaged, pair_unlike
from prism.report.tables import ACCURACIES, TASK_METRICS, main_schedules, score_digits, shown_score
from prism.runs.layout import plot_name
from prism.runs.records import ZeroShotCurve
from prism.stats import mean, sample_sd

# What makes two runs' scores comparable: the same milestones, the same documents of the same
# tasks from the same data, scored by the same rules.
SETTINGS = ("every_tokens", "limit", "tasks", "data_source", "batch_size", "semantics")


@dataclass(frozen=True)
class Point:
    tokens: int
    step: int | None
    mean: float
    sd: float | None
    seeds: int


@dataclass
class Curves:
    """The comparable in-loop scores of one scale."""

    settings: dict  # the SETTINGS values every shown run shares (tasks in the runs' own order)
    runs: dict[str, dict[int, RunResults]]  # schedule -> seed -> run, only the comparable ones
    left_out: list[str]  # "prism seed 1 (limit 100)" for runs with other settings
    without: list[str]  # "uniform seed 2" for finished runs that have no in-loop scores
    unlike: frozenset[str] = frozenset()  # schedules whose seeds were not trained alike: not averaged
    uncompared: bool = False  # uniform and prism were not trained alike: no Δ

    def each_milestone(self):
        """Every milestone record of every shown run."""
        return (m for by_seed in self.runs.values() for r in by_seed.values() for m in r.zeroshot.milestones)

    def milestones(self) -> list[int]:
        """Token counts any shown run evaluated at."""
        return sorted({int(m.tokens) for m in self.each_milestone()})

    def seconds(self) -> float | None:
        """Mean wall seconds of one milestone's evaluation over the shown runs (None: none recorded)."""
        seconds = [float(m.seconds) for m in self.each_milestone() if m.seconds is not None]
        return mean(seconds) if seconds else None


def _settings(doc: ZeroShotCurve) -> dict:
    """The SETTINGS of a run's zeroshot.json."""
    return {k: getattr(doc, k) for k in SETTINGS}


def _key(doc: ZeroShotCurve) -> tuple:
    return tuple(tuple(sorted(v)) if k == "tasks" else v for k, v in _settings(doc).items())


def _describe(doc: ZeroShotCurve, differing: list[str]) -> str:
    s = _settings(doc)
    return ", ".join(
        f"{k} {','.join(s[k]) if k == 'tasks' else s[k]}" if k != "data_source" else f"data {s[k]}"
        for k in differing
    )


def _runs_of(res: ScaleResults, schedules: list[str], scored: bool) -> list[tuple[str, int, RunResults]]:
    """(schedule, seed, run) of `schedules`' finished runs with in-loop scores (`scored`) or without."""
    return [
        (s, seed, r)
        for s in schedules
        for seed, r in sorted(res.runs.get(s, {}).items())
        if (r.zeroshot is not None) == scored
    ]


def _left_out(with_scores: list, groups: dict[tuple, list], chosen: tuple) -> list[str]:
    """Each run not in the shown group, named with the settings that differ: "prism seed 1 (limit 100)"."""
    differing = [k for i, k in enumerate(SETTINGS) if len({key[i] for key in groups}) > 1]
    return [
        f"{s} seed {seed} ({_describe(r.zeroshot, differing)})"
        for s, seed, r in with_scores  # schedule order, then seed
        if _key(r.zeroshot) != chosen
    ]


def curves(res: ScaleResults, schedules: list[str]) -> Curves | None:
    """The runs of `schedules` with in-loop scores that can be compared with each other (the group
    covering the most schedules, then runs; the others named), or None when no run has any."""
    with_scores = _runs_of(res, schedules, scored=True)
    if not with_scores:
        return None
    groups: dict[tuple, list] = {}
    for item in with_scores:
        groups.setdefault(_key(item[2].zeroshot), []).append(item)
    chosen = min(groups, key=lambda k: (-len({s for s, _, _ in groups[k]}), -len(groups[k]), repr(k)))
    runs: dict[str, dict[int, RunResults]] = {}
    for s, seed, r in groups[chosen]:
        runs.setdefault(s, {})[seed] = r
    return Curves(
        settings=_settings(groups[chosen][0][2].zeroshot),
        runs=runs,
        left_out=_left_out(with_scores, groups, chosen),
        without=[f"{s} seed {seed}" for s, seed, _ in _runs_of(res, schedules, scored=False)],
        unlike=frozenset(s for s in runs if not_averaged(res, s)),
        uncompared=pair_unlike(res, "prism", "uniform"),  # read only where both are shown
    )


def metric_for(task: str, c: Curves) -> str | None:
    """Table 3's metric for its tasks; else acc_norm, acc or word perplexity, the first reported."""
    # the metrics the milestones' scores of `task` name (a null one too)
    reported = {
        name for m in c.each_milestone() if m.tasks.get(task) for name in m.tasks[task].model_fields_set
    }
    if task in TASK_METRICS and TASK_METRICS[task] in reported:
        return TASK_METRICS[task]
    return next((m for m in ("acc_norm", "acc", "word_perplexity") if m in reported), None)


def _scores(run: RunResults, task: str, metric: str) -> dict[int, tuple[int | None, float]]:
    """tokens -> (step, score) of one run, where it scored this task and metric (a number)."""
    got = [(m, getattr(m.tasks.get(task), metric, None)) for m in run.zeroshot.milestones]
    ok = [(m, v) for m, v in got if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {int(m.tokens): (m.step, shown_score(metric, v)) for m, v in ok}


def schedule_points(c: Curves, schedule: str, task: str, metric: str) -> dict[int, Point | int]:
    """tokens -> Point where every seed has a score, else the number of seeds that have one."""
    if schedule in c.unlike:
        return {}
    per_seed = [_scores(r, task, metric) for _, r in sorted(c.runs[schedule].items())]
    out: dict[int, Point | int] = {}
    for t in c.milestones():
        have = [s[t] for s in per_seed if t in s]
        vals, every = [v for _, v in have], len(have) == len(per_seed)
        out[t] = Point(t, have[0][0], mean(vals), sample_sd(vals), len(vals)) if every else len(have)
    return out


# A milestone that not every seed of a schedule has: `1 of 2 seeds`.
zs_seeds_of = fmt.cell(lambda have, seeds: f"{have} of {fmt.seeds_text(seeds)}", "zs_seeds_of")


def unit(metric: str) -> str:
    return "%" if metric in ACCURACIES else "lower is better"


def task_table(c: Curves, task: str, metric: str) -> Table:
    """Rows: milestones; columns: each schedule's mean ± s.d. over seeds, then Δ prism − uniform."""
    scheds = list(c.runs)
    pts = {s: schedule_points(c, s, task, metric) for s in scheds}
    digits = score_digits(metric)
    with_delta = "uniform" in scheds and "prism" in scheds
    headers = ["Tokens seen", "step"]
    headers += [f"{s} ({fmt.seeds_text(len(c.runs[s]))})" for s in scheds]
    headers += ["Δ prism − uniform"] if with_delta else []
    steps = {int(m.tokens): m.step for m in c.each_milestone()}

    def cell(s: str, p: Point | int | None) -> str:
        if s in c.unlike:
            return fmt.NOT_AVERAGED
        return fmt.mean_sd(p.mean, p.sd, digits) if isinstance(p, Point) else zs_seeds_of(p, len(c.runs[s]))

    rows = []
    for t in c.milestones():
        cells = {s: pts[s].get(t) for s in scheds}
        row = [fmt.tokens(t), steps.get(t, "?"), *(cell(s, p) for s, p in cells.items())]
        if with_delta:
            u, q = cells["uniform"], cells["prism"]
            both = isinstance(u, Point) and isinstance(q, Point)
            row.append(
                fmt.NOT_COMPARED if c.uncompared else fmt.signed(q.mean - u.mean, digits) if both else "n/a"
            )
        rows.append(row)
    return Table(headers, rows, right=list(range(1, len(headers))))


def settings_lines(c: Curves) -> list[str]:
    """What the scores are: the shared settings, then which runs are not shown."""
    s, seconds = c.settings, c.seconds()
    shared = {k: s[k] for k in ("limit", "tasks", "data_source", "semantics")}
    seconds = None if seconds is None else fmt.num(seconds, 1)
    lines = [prose("zeroshot_settings", every_tokens=f"{s['every_tokens']:,}", seconds=seconds, **shared)]
    for name, runs in (("zeroshot_left_out", c.left_out), ("zeroshot_without", c.without)):
        lines += ["", prose(name, runs=runs)] if runs else []
    return lines


def zeroshot_plot_name(scale: str, task: str) -> str:
    return plot_name(scale, f"zeroshot-{task}")


def task_title(task: str, tables: PaperTables) -> str:
    return tables.t3["task_names"].get(task, task)


def report_lines(res: ScaleResults, tables: PaperTables, img) -> list[str]:
    """The scale's zero-shot-vs-tokens part of the training-dynamics section: settings, then per
    task its table and plot (`img(name, alt)` links one); nothing without in-loop scores."""
    main = main_schedules(res, tables)
    c = curves(res, main)
    if c is None:
        return []
    out = ["#### Zero-shot scores vs tokens (in-loop evaluation)", "", *settings_lines(c), ""]
    others = sorted(s for s in res.runs if s not in main and any(r.zeroshot for r in res.runs[s].values()))
    if others:
        out += [prose("zeroshot_ablation", schedules=others), ""]
    out += [prose("zeroshot_tables"), ""]
    for task in c.settings["tasks"]:
        metric = metric_for(task, c)
        title = task_title(task, tables)
        if metric is None:
            out += [prose("zeroshot_no_score", title=title), ""]
            continue
        out += [f"**{title}** ({metric}, {unit(metric)})", "", task_table(c, task, metric), ""]
        out += img(zeroshot_plot_name(res.scale, task), f"{res.scale} {title} {metric} vs tokens")
    return out
