"""SEARCH.md and search.json (docs/search.md, "The report"): the last-rung ranking, the full-budget
one once --final ran, rank stability across rungs with two plots, and the trials stopped, failed
or started again; the statistics are prism.search.ranking's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import optuna
from optuna.trial import TrialState

from prism.config.schema import load_config
from prism.io import write_if_changed
from prism.runs.layout import SEARCH_JSON_NAME as JSON_NAME
from prism.runs.layout import SEARCH_LOSS_PLOT, SEARCH_RANK_PLOT, scale_runs_dir
from prism.runs.layout import SEARCH_REPORT as REPORT_NAME
from prism.search import stability
from prism.search.final import FINAL_ATTR, full_budget_losses
from prism.search.ranking import legend, rank, ranking_table
from prism.search.study import fail_reason_key

__all__ = ["JSON_NAME", "REPORT_NAME", "collect", "full_budget", "render", "write_study_report"]

STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "stopped"}


def collect(study: optuna.Study, candidates: list[dict], alpha: float) -> dict:
    """The study's ended trials: the last-rung ranking, the trials stopped at a rung, the failed
    ones, the attempts started again, and each slot's last attempt."""
    trials = [
        {
            "number": t.number,
            "slot": t.user_attrs.get("slot"),
            "attempt": t.user_attrs.get("attempt", 1),
            "retry_of": t.user_attrs.get("retry_of"),
            "schedule": t.params.get("schedule"),
            "seed": t.params.get("seed"),
            "state": STATES.get(t.state, "failed"),
            "value": t.value,
            "rungs": {str(k): v for k, v in sorted(t.intermediate_values.items())},
            "reason": t.user_attrs.get("fail_reason") or study.user_attrs.get(fail_reason_key(t.number)),
            "resumed_from_step": t.user_attrs.get("resumed_from_step"),  # None: a fresh start
        }
        for t in study.get_trials(deepcopy=False)
        if t.state not in (TrialState.WAITING, TrialState.RUNNING)
    ]
    groups: dict[str, list[float]] = {}
    for t in trials:
        if t["state"] == "complete":
            groups.setdefault(t["schedule"], []).append(t["value"])
    # a failed attempt that a later attempt of the same slot replaced is history, not a result
    last = {t["slot"]: t for t in sorted(trials, key=lambda t: t["number"])}
    # the seeds each schedule was trained with: its slots, whatever became of them
    expected = Counter(t["schedule"] for t in last.values())
    ranking = rank(groups, candidates[0]["key"], {c["key"]: c for c in candidates}, alpha, expected)
    stopped = sorted(
        (t for t in trials if t["state"] == "stopped"),
        key=lambda t: (-max(map(int, t["rungs"]), default=0), t["value"] if t["value"] is not None else 1e9),
    )
    restarted = [t for t in trials if last[t["slot"]] is not t]
    next_attempt = {t["retry_of"]: t for t in trials if t["retry_of"] is not None}
    for t in restarted:
        after = next_attempt.get(t["number"], {})
        t["next_trial"], t["next_resumed_from_step"] = after.get("number"), after.get("resumed_from_step")
    results = [t for t in trials if last[t["slot"]] is t]
    failed = [t for t in results if t["state"] == "failed"]
    return {
        "ranking": ranking,
        "stopped": stopped,
        "failed": failed,
        "restarted": restarted,
        "trials": results,
    }


def full_budget(study: optuna.Study, definition: dict, ranking: list[dict], alpha: float) -> dict | None:
    """The full-budget ranking of the final set the study records, or None before --final ran."""
    final = study.user_attrs.get(FINAL_ATTR)
    if not final:
        return None
    cfg = load_config(definition["scale"], definition["overrides"])  # the full-budget runs' config
    losses = full_budget_losses(cfg, final["schedules"])
    rows = rank(
        {s: [v for _, v in sorted(by.items())] for s, by in losses.items()},
        final["schedules"][0],
        {c["key"]: c for c in definition["candidates"]},
        alpha,
        {s: len(cfg.seeds) for s in final["schedules"]},  # a schedule with seeds still to run: untested
    )
    at_rung = {r["schedule"]: i for i, r in enumerate(ranking, 1)}
    for r in rows:
        r["rung_rank"] = at_rung.get(r["schedule"])
        r["seeds"] = sorted(losses[r["schedule"]])
    missing = [
        f"{s} seed {seed}" for s in final["schedules"] for seed in cfg.seeds if seed not in losses.get(s, {})
    ]
    return {
        "top_k": final["top_k"],
        "schedules": final["schedules"],
        "tokens": cfg.train.tokens,
        "seeds": list(cfg.seeds),
        "runs_dir": str(scale_runs_dir(cfg)),
        "ranking": rows,
        "missing": missing,
    }


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _who(t: dict) -> list:
    return [t["number"], t["schedule"], t["seed"], t["attempt"]]


def _clean(text: str | None) -> str:
    return (text or "no reason recorded").replace("|", "/").replace("\n", " ")


def _full_budget_lines(doc: dict) -> list[str]:
    fb = doc["full_budget"]
    lines = ["## Full budget", ""]
    if fb is None:
        return lines + [
            "Not run yet. The same command with `--final` (and `--top-k K`, default "
            f"{doc['settings']['top_k']}) trains the best K schedules of the last rung besides uniform, and "
            "uniform, at the scale's full budget with its seeds, through the reproduction pipeline (as "
            "`run_all.py --schedules`), and ranks them here.",
            "",
        ]
    lines += [
        f"The best {fb['top_k']} of the last rung besides uniform, and uniform, trained at the full budget "
        f"(train.tokens = {fb['tokens']:,}) with seeds {', '.join(map(str, fb['seeds']))} through the "
        f"reproduction pipeline; runs in `{fb['runs_dir']}`, also in RESULTS.md. Rung rank: the "
        "schedule's rank at the last rung. This is the ranking to quote: the last rung chose these "
        "schedules on its own losses, and its seed is among these seeds.",
        "",
    ]
    if fb["ranking"]:
        table = ranking_table(fb["ranking"], ("rung rank", "rung_rank"))
        lines += [*table, "", legend(doc["settings"]["alpha"]), ""]
    if fb["missing"]:
        lines += [f"Not finished yet: {', '.join(fb['missing'])}; the same command continues them.", ""]
    return lines


def _stability_lines(doc: dict, plots: dict[str, str]) -> list[str]:
    st = doc["rank_stability"]
    lines = ["## Rank stability across rungs", ""]
    lines += [f"![{alt}]({name})" for name, alt in plots.items()]
    lines += [
        "",
        "Spearman's ρ between the losses at consecutive rungs (over the trials that reached both) and "
        "between the last rung and the full budget (over the schedules run there, means over seeds); "
        "n/a with fewer than three. Descriptive, not a test: the trials that reach a rung are the "
        "best of the one before, a narrow range, and n is small.",
        "",
        "| from (tokens) | to (tokens) | over | n | Spearman ρ |",
        "|---:|---:|---|---:|---:|",
    ]
    for c in st["correlations"]:
        to = "full budget" if c["to"] == stability.FULL else f"{c['to']:,}"
        rho = "n/a" if c["rho"] is None else f"{c['rho']:+.2f}"
        lines.append(_row([f"{c['from']:,}", to, c["over"], c["n"], rho]))
    columns = [*map(str, doc["definition"]["rungs"]), *([stability.FULL] if doc["full_budget"] else [])]
    if st["ranks"]:
        lines += ["", "Rank at each rung of the schedules that reached the last one:", ""]
        titles = [f"{int(c):,}" if c != stability.FULL else "full budget" for c in columns]
        lines += [_row(["schedule", *titles]), "|---|" + "---:|" * len(columns)]
        for s, ranks in st["ranks"].items():
            lines.append(_row([s, *[ranks.get(c, "") for c in columns]]))
    return [*lines, ""]


def render(doc: dict, plots: dict[str, str] | None = None) -> str:
    """SEARCH.md; `plots`: file name -> alt text of the plots written beside it."""
    d = doc["definition"]
    rungs = ", ".join(f"{t:,}" for t in d["rungs"])
    lines = [
        f"# Schedule search: scale {d['scale']}",
        "",
        f"{len(d['space'])} candidate schedules x seeds {', '.join(map(str, d['seeds']))}; "
        f"{d['trials']} trials in the order of study seed {d['study_seed']}; rungs at {rungs} tokens "
        f"(each trial's LR schedule spans the last); successive halving keeps 1/{d['factor']} at each rung; "
        f"uniform is never stopped.",
        "",
        "## Ranking at the last rung (validation loss)",
        "",
        *ranking_table(doc["ranking"]),
        "",
        legend(doc["settings"]["alpha"]),
        "",
        *_full_budget_lines(doc),
        *_stability_lines(doc, plots or {}),
    ]
    stopped = []
    for t in doc["stopped"]:
        losses = ", ".join(f"{int(k):,}: {v:.4f}" for k, v in t["rungs"].items())
        stopped.append([t["number"], t["schedule"], t["seed"], losses])
    head = "| trial | schedule | seed | losses by rung (tokens: loss) |"
    lines += _section("Stopped at a rung", head, "|---:|---|---:|---|", stopped)
    failed = [[*_who(t), _clean(t["reason"])] for t in doc["failed"]]
    lines += _section(
        "Failed", "| trial | schedule | seed | attempt | reason |", "|---:|---|---:|---:|---|", failed
    )
    restarted = []
    for t in doc["restarted"]:
        step, after = t["next_resumed_from_step"], t["next_trial"]
        resumed = "—" if after is None else ("0 (started afresh)" if step is None else f"{step:,}")
        restarted.append([*_who(t), _clean(t["reason"]), "—" if after is None else after, resumed])
    head = "| trial | schedule | seed | attempt | why | next attempt | it resumed from step |"
    lines += _section("Attempts started again", head, "|---:|---|---:|---:|---|---:|---:|", restarted)
    return "\n".join(lines)


def _section(title: str, head: str, align: str, rows: list[list]) -> list[str]:
    """A titled table of trials, or nothing without rows."""
    return [f"## {title}", "", head, align, *map(_row, rows), ""] if rows else []


def write_study_report(study: optuna.Study, study_dir: Path, definition: dict) -> Path:
    """search.json, SEARCH.md and its plots in `study_dir`; files whose bytes are unchanged are
    not rewritten, so a report of the same study is left as it was."""
    # this invocation's search.* overrides included
    settings = load_config(definition["scale"], definition["overrides"]).search
    doc = {"definition": definition, "settings": {"alpha": settings.alpha, "top_k": settings.top_k}}
    doc.update(collect(study, definition["candidates"], settings.alpha))
    doc["full_budget"] = full_budget(study, definition, doc["ranking"], settings.alpha)
    rungs = definition["rungs"]
    trials = [t for t in doc["trials"] if t["state"] in ("complete", "stopped")]  # with losses at rungs
    full = {r["schedule"]: r["mean"] for r in (doc["full_budget"] or {}).get("ranking", [])}
    last = {r["schedule"]: r["mean"] for r in doc["ranking"]}
    table = stability.rank_table(trials, rungs, full)
    doc["rank_stability"] = {
        "correlations": stability.correlations(trials, rungs, last, full),
        # the schedules that reached the last rung, in its order: the ones a reader compares
        "ranks": {s: {str(c): r for c, r in table[s].items()} for s in last},
    }
    base, scale = definition["candidates"][0]["key"], definition["scale"]
    order = [r["schedule"] for r in doc["ranking"]]
    loss_png = stability.loss_plot(trials, order, base, scale)
    rank_png = stability.rank_plot(table, [*rungs, *([stability.FULL] if full else [])], order, base, scale)
    plots = {}
    for name, alt, png in (
        (SEARCH_LOSS_PLOT, "validation loss per rung", loss_png),
        (SEARCH_RANK_PLOT, "rank per rung", rank_png),
    ):
        if png is None:
            (study_dir / name).unlink(missing_ok=True)
            continue
        write_if_changed(study_dir / name, png)
        plots[name] = alt
    write_if_changed(study_dir / JSON_NAME, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    path = study_dir / REPORT_NAME
    write_if_changed(path, (render(doc, plots) + "\n").encode())
    return path
