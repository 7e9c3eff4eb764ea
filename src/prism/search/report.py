"""SEARCH.md and search.json: the schedules ranked by final-rung validation loss.

Per schedule: mean +- sample s.d. over the seeds that reached the last rung, the difference to
uniform's mean, and Welch's p-value against uniform (prism.report.stats; it needs two seeds on
each side). A schedule is marked "~" when it cannot be told apart from the one ranked above it at
the seeds run (Welch p >= ALPHA), and "?" when either has a single seed, where no test is
possible; a single-seed ranking is an ordering of numbers, not a finding. Trials stopped at a
rung follow, by the highest rung they reached; failed trials are listed with their reason."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.trial import TrialState

from prism.io import atomic_write_text
from prism.report.stats import mean, sample_sd, welch_test
from prism.search.study import fail_reason_key

ALPHA = 0.05
REPORT_NAME = "SEARCH.md"
STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "stopped"}
JSON_NAME = "search.json"


def collect(study: optuna.Study, candidates: list[dict]) -> dict:
    reasons = study.user_attrs
    trials = []
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.WAITING, TrialState.RUNNING):
            continue
        trials.append(
            {
                "number": t.number,
                "slot": t.user_attrs.get("slot"),
                "attempt": t.user_attrs.get("attempt", 1),
                "schedule": t.params.get("schedule"),
                "seed": t.params.get("seed"),
                "state": STATES.get(t.state, "failed"),
                "value": t.value,
                "rungs": {str(k): v for k, v in sorted(t.intermediate_values.items())},
                "reason": t.user_attrs.get("fail_reason") or reasons.get(fail_reason_key(t.number)),
            }
        )
    by_key = {c["key"]: c for c in candidates}
    done = [t for t in trials if t["state"] == "complete"]
    groups: dict[str, list[float]] = {}
    for t in done:
        groups.setdefault(t["schedule"], []).append(t["value"])
    base = groups.get(candidates[0]["key"])
    ranking = []
    for key, values in sorted(groups.items(), key=lambda kv: mean(kv[1])):
        w = welch_test(base, values) if base else None
        ranking.append(
            {
                "schedule": key,
                "heads": by_key.get(key, {}).get("text"),
                "marks": by_key.get(key, {}).get("marks", []),
                "n": len(values),
                "values": values,
                "mean": mean(values),
                "sd": sample_sd(values),
                "delta_vs_uniform": mean(values) - mean(base) if base else None,
                "p_vs_uniform": w.p if w else None,
            }
        )
    for above, row in zip(ranking, ranking[1:]):
        w = welch_test(above["values"], row["values"])
        row["p_vs_above"] = w.p if w else None
        row["distinct_from_above"] = None if w is None else w.p < ALPHA
    stopped = sorted(
        (t for t in trials if t["state"] == "stopped"),
        key=lambda t: (-max(map(int, t["rungs"]), default=0), t["value"] if t["value"] is not None else 1e9),
    )
    # a failed attempt that a later attempt of the same slot replaced is history, not a result
    last = {t["slot"]: t["number"] for t in sorted(trials, key=lambda t: t["number"])}
    failed = [t for t in trials if t["state"] == "failed" and last[t["slot"]] == t["number"]]
    restarted = [t for t in trials if last[t["slot"]] != t["number"]]
    results = [t for t in trials if last[t["slot"]] == t["number"]]
    return {
        "ranking": ranking,
        "stopped": stopped,
        "failed": failed,
        "restarted": restarted,
        "trials": results,
    }


def _f(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def render(doc: dict) -> str:
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
        "| rank | schedule | heads | paper | n | mean ± s.d. | Δ vs uniform | p vs uniform | vs above |",
        "|---:|---|---|---|---:|---|---:|---:|---|",
    ]
    for i, r in enumerate(doc["ranking"], 1):
        sd = f" ± {r['sd']:.4f}" if r["sd"] is not None else ""
        distinct = r.get("distinct_from_above")
        mark = "" if i == 1 else ("?" if distinct is None else ("~" if not distinct else "distinct"))
        lines.append(
            f"| {i} | {r['schedule']} | {r['heads']} | {', '.join(r['marks'])} | {r['n']} | "
            f"{r['mean']:.4f}{sd} | {_f(r['delta_vs_uniform'], '+.4f')} | "
            f"{_f(r['p_vs_uniform'], '.3g')} | {mark} |"
        )
    lines += [
        "",
        f"`~`: not distinguishable from the schedule above (Welch p >= {ALPHA}); `?`: a single seed on "
        "either side, so no test is possible and the order is not a finding. Δ and p: against uniform's "
        "mean over its seeds (p needs two seeds on each side).",
        "",
    ]
    if doc["stopped"]:
        lines += ["## Stopped at a rung", "", "| trial | schedule | seed | losses by rung (tokens: loss) |"]
        lines.append("|---:|---|---:|---|")
        for t in doc["stopped"]:
            losses = ", ".join(f"{int(k):,}: {v:.4f}" for k, v in t["rungs"].items())
            lines.append(f"| {t['number']} | {t['schedule']} | {t['seed']} | {losses} |")
        lines.append("")
    if doc["failed"]:
        lines += [
            "## Failed",
            "",
            "| trial | schedule | seed | attempt | reason |",
            "|---:|---|---:|---:|---|",
        ]
        for t in doc["failed"]:
            reason = (t["reason"] or "no reason recorded").replace("|", "/").replace("\n", " ")
            lines.append(f"| {t['number']} | {t['schedule']} | {t['seed']} | {t['attempt']} | {reason} |")
        lines.append("")
    if doc["restarted"]:
        lines += ["## Attempts started again", "", "| trial | schedule | seed | attempt | why |"]
        lines.append("|---:|---|---:|---:|---|")
        for t in doc["restarted"]:
            reason = (t["reason"] or "no reason recorded").replace("|", "/").replace("\n", " ")
            lines.append(f"| {t['number']} | {t['schedule']} | {t['seed']} | {t['attempt']} | {reason} |")
        lines.append("")
    return "\n".join(lines)


def write_report(study: optuna.Study, study_dir: Path, definition: dict) -> Path:
    doc = {"definition": definition, **collect(study, definition["candidates"])}
    atomic_write_text(study_dir / JSON_NAME, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    path = study_dir / REPORT_NAME
    atomic_write_text(path, render(doc) + "\n")
    return path
