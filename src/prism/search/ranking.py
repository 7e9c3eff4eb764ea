"""Schedules ranked by validation loss (the last rung's and the full budget's), with statistics
that do not overclaim: mean ± s.d., Δ and Welch's p against uniform, and the `~`/`?` marks against
the row above (docs/search.md, "The report")."""

from __future__ import annotations

from prism.stats import mean, sample_sd, welch_test


def rank(
    groups: dict[str, list[float]],
    base: str,
    candidates: dict[str, dict],
    alpha: float,
    expected: dict[str, int] | None = None,
) -> list[dict]:
    """Rows of `groups` (schedule -> losses over seeds) by mean loss, best first, tested against
    `base` (uniform) and the row above at level `alpha`. `candidates`: key -> candidate dict;
    `expected`: schedule -> seeds trained (one with seeds missing is not tested)."""
    reference = groups.get(base)
    rows = []
    for key, values in sorted(groups.items(), key=lambda kv: (mean(kv[1]), kv[0])):
        of = (expected or {}).get(key, len(values))
        partial = len(values) < of
        w = welch_test(reference, values) if reference and not partial else None
        rows.append(
            {
                "schedule": key,
                "heads": candidates.get(key, {}).get("text"),
                "marks": candidates.get(key, {}).get("marks", []),
                "n": len(values),
                "of": of,  # seeds trained; n < of: partial, untested
                "partial": partial,
                "values": values,
                "mean": mean(values),
                "sd": sample_sd(values),
                "baseline": key == base,
                "delta_vs_uniform": mean(values) - mean(reference) if reference else None,
                "p_vs_uniform": w.p if w and key != base else None,
            }
        )
    for above, row in zip(rows, rows[1:]):
        w = None if above["partial"] or row["partial"] else welch_test(above["values"], row["values"])
        row["p_vs_above"] = w.p if w else None
        row["distinct_from_above"] = None if w is None else w.p < alpha
    return rows


def _f(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def ranking_table(rows: list[dict], extra: tuple[str, str] | None = None) -> list[str]:
    """The markdown table of `rank`'s rows. `extra`: (column title, row key) of one more column
    after the paper marks (the full-budget table shows each schedule's rank at the last rung)."""
    head = "| rank | schedule | heads | paper |" + (f" {extra[0]} |" if extra else "")
    head += " n | mean ± s.d. | Δ vs uniform | p vs uniform | vs above |"
    lines = [head, "|---:|---|---|---|" + ("---:|" if extra else "") + "---:|---|---:|---:|---|"]
    for i, r in enumerate(rows, 1):
        sd = f" ± {r['sd']:.4f}" if r["sd"] is not None else ""
        distinct = r.get("distinct_from_above")
        mark = "" if i == 1 else ("?" if distinct is None else ("~" if not distinct else "distinct"))
        more = f" {r.get(extra[1]) if r.get(extra[1]) is not None else 'n/a'} |" if extra else ""
        delta = "baseline" if r.get("baseline") else _f(r["delta_vs_uniform"], "+.4f")
        p = "baseline" if r.get("baseline") else _f(r["p_vs_uniform"], ".3g")
        n = f"{r['n']} of {r['of']}" if r.get("partial") else str(r["n"])
        lines.append(
            f"| {i} | {r['schedule']} | {r['heads']} | {', '.join(r['marks'])} |{more} {n} | "
            f"{r['mean']:.4f}{sd} | {delta} | {p} | {mark} |"
        )
    return lines


def legend(alpha: float) -> str:
    return (
        f"`~`: not distinguishable from the schedule above (Welch p >= {alpha:g}); `?`: no test is "
        "possible (a single seed, or no spread, on either side; or a schedule some of whose seeds were "
        "stopped at an earlier rung, `n of m`, whose mean is over the survivors of a selection on these "
        "same losses), so the order is not a finding. Δ and p: against uniform's mean over its seeds (p "
        "needs two seeds on each side); each p is of one pair, uncorrected for the many pairs compared."
    )
