"""Tables 1, 2, 3 and 5 and the throughput benchmark: paper and reproduction side by side."""

from __future__ import annotations

from prism.config.describe import count_params
from prism.config.schema import load_config
from prism.core.schedule import compact_text, parse_heads
from prism.report import fmt
from prism.report.collect import ScaleResults, schedule_order
from prism.report.fmt import NO_PAPER, NOT_AVERAGED, NOT_COMPARED, NOT_RUN, Table, recorded
from prism.report.paper import PaperTables
from prism.report.prose import prose
from prism.report.recipes import not_averaged, not_compared
from prism.runs.records import Bench
from prism.stats import mean, mean_and_sd, welch_from_summary, welch_test

# Which harness metric stands for each Table 3 column: the paper does not say (PAPER.md), so the
# harness's customary headline ones; the other metric is in a second table (docs/report.md).
TASK_METRICS = {
    "hellaswag": "acc_norm",
    "piqa": "acc",
    "winogrande": "acc",
    "blimp": "acc",
    "arc_easy": "acc",
    "wikitext": "word_perplexity",
}
ACCURACIES = ("acc", "acc_norm")  # in %; the other metrics as the harness gives them
OTHER_METRICS = (
    ("hellaswag", "acc"),
    ("piqa", "acc_norm"),
    ("arc_easy", "acc_norm"),
    ("wikitext", "byte_perplexity"),
    ("wikitext", "bits_per_byte"),
)


def main_schedules(res: ScaleResults, tables: PaperTables) -> list[str]:
    """uniform, prism and any custom schedule that is not part of the Table 5 ablation."""
    ablation = {r["kit"] for r in tables.ablation()} - {"uniform", "prism"}
    return list(dict.fromkeys(s for s in ["uniform", "prism", *res.schedules()] if s not in ablation))


def unlike_runs(scale_results: list[ScaleResults], schedules_of, pairs_of=lambda res: ()) -> list[str]:
    """The sentences above a table, one per scale and schedule whose runs are not averaged
    (`schedules_of(res)`), and one per (schedule, base) pair of `pairs_of(res)` not compared."""
    out = []
    for res in scale_results:
        alone = {s: w for s in schedules_of(res) if (w := not_averaged(res, s))}
        out += alone.values()
        # a schedule whose own runs differ already says why its Δ is missing
        pairs = [(s, b) for s, b in pairs_of(res) if s not in alone and b not in alone]
        out += [w for w in (not_compared(res, s, b) for s, b in pairs) if w]
    return out


# ----- Table 1 ----------------------------------------------------------------------------------
# A number as the paper prints it, rounded (124M); `value` is the number it stands for.
t1_printed = fmt.cell(lambda printed, value: printed, "t1_printed")
# A number as the paper prints it, rounded, and the exact count it stands for: 0.25M (262,144).
t1_printed_exact = fmt.cell(lambda printed, value: f"{printed} ({value:,})", "t1_printed_exact")
# The kit's parameter count; `source` "run" where finished runs measured it, "config" where it was counted
# from the model the config builds.
t1_n_params = fmt.cell(lambda n, source: f"{n:,}" + (" (measured)" if source == "run" else ""), "t1_n_params")
# A learning rate: 6.0e-04.
t1_lr = fmt.cell(lambda lr: f"{lr:.1e}", "t1_lr")


T1_HEADERS = (
    "Scale",
    "Source",
    "n_params",
    "layers",
    "d_model",
    "h_base",
    "batch (tokens)",
    "peak LR",
    "steps",
    "training tokens",
    "Prism heads per layer",
)


def _t1_paper_row(scale: str, tables: PaperTables) -> list:
    """The paper's configuration of `scale` as Table 1 prints it (NO_PAPER where it has none)."""
    p = tables.config(scale)
    if not p:
        return [scale, "paper", *[NO_PAPER] * 9]
    n, shape = t1_printed(p["n_params_text"], p["n_params"]), [p["layers"], p["d_model"], p["h_base"]]
    batch, tokens = (t1_printed_exact(p[f"{k}_text"], p[k]) for k in ("batch_tokens", "tokens"))
    heads = _compact(parse_heads(tables.t4["schedules"][scale]["heads"]))
    return [scale, "paper", n, *shape, batch, t1_lr(p["peak_lr"]), fmt.count(p["steps"]), tokens, heads]


def _t1_kit_row(res: ScaleResults, config_dir=None) -> list:
    """The kit's configuration of the scale: as a finished run saved it, else its config file."""
    runs = [r for by_seed in res.runs.values() for _, r in sorted(by_seed.items())]
    saved = [r.config for r in runs if r.config]
    cfg = load_config(res.scale, config_dir=config_dir)
    m, t = (saved[0].model, saved[0].train) if saved else (cfg.model, cfg.train)
    measured = sorted({r.summary.n_params for r in runs if r.summary.n_params})
    prism_runs = [r.summary.heads for r in res.runs.get("prism", {}).values() if r.summary.heads]
    heads = NOT_RUN if "prism" not in cfg.schedules else cfg.head_schedule("prism").text()
    heads = compact_text(prism_runs[0]) if prism_runs else heads
    n, source = (measured[0], "run") if len(measured) == 1 else (count_params(cfg), "config")
    budget = [t1_lr(t.lr), fmt.count(t.tokens // t.global_batch_tokens), fmt.count(t.tokens)]
    shape = [m.n_layer, m.d_model, m.h_base, fmt.count(t.global_batch_tokens)]
    return [res.scale, "kit", t1_n_params(n, source), *shape, *budget, heads]


def table1(scale_results: list[ScaleResults], tables: PaperTables, config_dir=None) -> str:
    rows = [
        r for res in scale_results for r in (_t1_paper_row(res.scale, tables), _t1_kit_row(res, config_dir))
    ]
    return Table(T1_HEADERS, rows, right=[2, 3, 4, 5, 6, 7, 8, 9])


# ----- Table 2 ----------------------------------------------------------------------------------
def _throughput(res: ScaleResults, schedule: str) -> tuple[float | None, float | None, str]:
    runs = list(res.runs.get(schedule, {}).values())
    # an empty throughput object recorded nothing: no hardware to name
    recorded = [t for r in runs if (t := r.summary.throughput) is not None and t.model_fields_set]
    tps = [t.tokens_per_s for t in recorded if t.tokens_per_s is not None]
    wall = [r.summary.wall_clock_s / 3600 for r in runs if r.summary.wall_clock_s is not None]
    hw = sorted({fmt.on_devices(t.num_devices, t.hardware) for t in recorded})
    return (mean(tps) if tps else None, mean(wall) if wall else None, "; ".join(hw) or NOT_RUN)


def table2(scale_results: list[ScaleResults], tables: PaperTables) -> str:
    headers = [
        "Scale",
        "Model",
        "Val loss (paper)",
        "Val loss (reproduced)",
        "seeds",
        "Tokens/s (paper, 8 GPUs)",
        "Tokens/s (reproduced)",
        "Wall-clock h (paper)",
        "Wall-clock h (reproduced)",
        "Hardware (reproduced)",
    ]
    rows = []
    for res in scale_results:
        for sched in main_schedules(res, tables):
            p = tables.val_loss(res.scale, sched)
            m, sd = mean_and_sd(res.final_losses(sched))
            tps, wall, hw = _throughput(res, sched)
            ps = [NO_PAPER] * 3
            if p:
                ps = [fmt.mean_sd(p["val_loss"], p["val_loss_sd"]), fmt.tokens_per_s(p["tokens_per_s"])]
                ps.append(fmt.hours(p["wall_clock_h"]))
            ours = [fmt.mean_sd(m, sd), fmt.tokens_per_s(tps), fmt.hours(wall)]
            ours = [NOT_AVERAGED] * 3 if not_averaged(res, sched) else ours
            n = len(res.final_losses(sched))
            rows.append([res.scale, sched, ps[0], ours[0], n, ps[1], ours[1], ps[2], ours[2], hw])
    return Table(headers, rows, right=[2, 3, 4, 5, 6, 7, 8])


def table2_delta(scale_results: list[ScaleResults], tables: PaperTables) -> str:
    headers = ["Scale", "Δ paper", "p (paper)", "Δ reproduced", "seeds (uniform / prism)", "p (reproduced)"]
    rows = []
    for res in scale_results:
        pu, pp = tables.val_loss(res.scale, "uniform"), tables.val_loss(res.scale, "prism")
        if pu and pp:
            n = tables.t2["seeds"]
            w = welch_from_summary(pu["val_loss"], pu["val_loss_sd"], n, pp["val_loss"], pp["val_loss_sd"], n)
            paper_d, paper_p = fmt.signed(pp["val_loss"] - pu["val_loss"]), fmt.p_value(w.p if w else None)
        else:
            paper_d = paper_p = NO_PAPER
        u, q = res.final_losses("uniform"), res.final_losses("prism")
        if u and q and not_compared(res, "prism", "uniform"):
            d = p = NOT_COMPARED
        elif u and q:
            w = welch_test(u, q)
            d, p = fmt.signed(mean(q) - mean(u)), fmt.p_value(w.p if w else None)
        else:
            d, p = NOT_RUN, NOT_RUN
        rows.append([res.scale, paper_d, paper_p, d, fmt.seed_pair(len(u), len(q)), p])
    return Table(headers, rows, right=[1, 2, 3, 5])


# ----- Table 3 ----------------------------------------------------------------------------------
def shown_score(metric: str, value: float) -> float:
    """A harness score as the report shows it: accuracies in %, the other metrics as they are."""
    return 100.0 * value if metric in ACCURACIES else float(value)


def score_digits(metric: str) -> int:
    """The decimals a harness score is shown with: 1 for %s and word perplexity."""
    return 1 if metric in ACCURACIES or metric == "word_perplexity" else 3 if metric == "bits_per_byte" else 4


def _eval_cell(res: ScaleResults, sched: str, task: str, metric: str) -> str:
    """The mean ± s.d. of one harness score over the schedule's evaluated seeds."""
    vals = [getattr(doc.tasks.get(task), metric, None) for _, doc in sorted(res.evals.get(sched, {}).items())]
    shown = [shown_score(metric, v) for v in vals if v is not None]
    return fmt.mean_sd(*mean_and_sd(shown), score_digits(metric))


def _scores(res: ScaleResults, sched: str, columns: list[tuple[str, str]]) -> list:
    """The schedule's evaluated seeds, then each (task, metric) column's cell."""
    mixed = not_averaged(res, sched) is not None
    cells = [NOT_AVERAGED if mixed else _eval_cell(res, sched, t, m) for t, m in columns]
    return [len(res.evals.get(sched, {})), *cells]


def _score_headers(tables: PaperTables, columns: list[tuple[str, str]]) -> list[str]:
    return [f"{tables.t3['task_names'][t]} ({m})" for t, m in columns]


def table3(scale_results: list[ScaleResults], tables: PaperTables) -> str:
    tasks = tables.t3["tasks"]
    columns = [(t, TASK_METRICS[t]) for t in tasks]
    rows = []
    for res in scale_results:
        for sched in main_schedules(res, tables):
            p = tables.zero_shot(res.scale, sched)
            paper = [tables.t2["seeds"], *[fmt.num(p[t], 1) for t in tasks]] if p else []
            rows.append([res.scale, sched, "paper", *(paper or [NO_PAPER] * (1 + len(tasks)))])
            rows.append([res.scale, sched, "reproduced", *_scores(res, sched, columns)])
    headers = ["Scale", "Model", "Source", "seeds", *_score_headers(tables, columns)]
    return Table(headers, rows, right=list(range(3, 4 + len(tasks))))


def table3_other(scale_results: list[ScaleResults], tables: PaperTables) -> str:
    rows = [
        [res.scale, sched, *_scores(res, sched, OTHER_METRICS)]
        for res in scale_results
        for sched in main_schedules(res, tables)
    ]
    headers = ["Scale", "Model", "seeds", *_score_headers(tables, OTHER_METRICS)]
    return Table(headers, rows, right=list(range(2, 3 + len(OTHER_METRICS))))


def eval_conditions(scale_results: list[ScaleResults]) -> str:
    """How the reproduced zero-shot numbers were obtained: a line per scale with evaluations."""
    scales = []
    for res in scale_results:
        docs = [d for by_seed in res.evals.values() for d in by_seed.values()]
        if docs:
            limits = sorted({str(d.limit) for d in docs})
            scales.append(
                {
                    "scale": res.scale,
                    "sources": sorted({str(recorded(d.data_source)) for d in docs}),
                    "full": limits == ["None"],
                    "limits": limits,
                    "semantics": sorted({str(recorded(d.semantics)) for d in docs}),
                }
            )
    return prose("tables_eval_conditions", scales=scales)


# ----- Table 5 ----------------------------------------------------------------------------------
# The kit's name of an ablation schedule and the heads per layer the paper prints for it.
t5_schedule = fmt.cell(lambda kit, schedule: f"`{kit}` {schedule}", "t5_schedule")
# The paper's tokens/s change in %, signed; no change as 0.0 %.
t5_change_pct = fmt.cell(
    lambda pct: f"{pct:+.1f} %".replace("-", "−").replace("+0.0", "0.0"), "t5_change_pct"
)
# A benchmark's tokens/s ratio to uniform as a signed change in %: 0.995 -> −0.5 %.
t5_ratio_change = fmt.cell(lambda ratio: f"{100 * (ratio - 1):+.1f} %".replace("-", "−"), "t5_ratio_change")


T5_HEADERS = (
    "Config",
    "Schedule",
    "Shape",
    "Val loss (paper)",
    "Δ vs baseline (paper)",
    "Val loss (reproduced)",
    "Δ vs baseline (reproduced)",
    "seeds",
    "tok/s change (paper)",
    "tok/s change (reproduced)",
)


def _t5_reproduced(res: ScaleResults, kit: str) -> list:
    """Table 5's reproduced loss and its Δ vs uniform (uniform − config, as the paper prints it)."""
    vals, base = res.final_losses(kit), res.final_losses("uniform")
    m, sd = mean_and_sd(vals)
    mixed = not_averaged(res, kit) is not None
    if kit == "uniform":
        delta = "–"
    elif not (vals and base):
        delta = NOT_RUN
    else:
        delta = NOT_COMPARED if mixed or not_compared(res, kit, "uniform") else fmt.num(mean(base) - m)
    return [NOT_AVERAGED if mixed else fmt.mean_sd(m, sd), delta, len(vals)]


def table5(res: ScaleResults, tables: PaperTables) -> str:
    bench = res.bench.schedules if res.bench else {}
    rows = []
    for r in tables.ablation():
        b = bench.get(r["kit"])
        ratio = None if b is None else b.ratio_to_uniform
        change = "–" if r["kit"] == "uniform" else t5_ratio_change(ratio) if ratio is not None else NOT_RUN
        paper = [fmt.num(r["val_loss"]), "–" if r["delta"] is None else fmt.num(r["delta"])]
        pct = "–" if r["tok_s_change_pct"] is None else t5_change_pct(r["tok_s_change_pct"])
        names = [r["config"], t5_schedule(r["kit"], r["schedule"]), r["shape"]]
        rows.append([*names, *paper, *_t5_reproduced(res, r["kit"]), pct, change])
    return Table(T5_HEADERS, rows, right=[3, 4, 5, 6, 7])


# ----- benchmark --------------------------------------------------------------------------------
@fmt.cell
def bench_step_time(median: float | None, spread: list[float] | None = None) -> str:
    """The median step time in s and, where recorded as [low, high], its spread in brackets."""
    if median is not None and spread is not None and len(spread) == 2:
        return f"{median:.4f} ({spread[0]:.4f}–{spread[1]:.4f})"
    return fmt.NOT_RUN if median is None else f"{median:.4f}"


# A memory size in bytes as GiB.
bench_gib = fmt.cell(lambda n_bytes: "n/a" if n_bytes is None else f"{n_bytes / 2**30:.2f}", "bench_gib")


def bench_table(res: ScaleResults) -> str | None:
    b = res.bench
    if not b or not b.schedules:
        return None
    headers = [
        "Schedule",
        "Heads per layer",
        "Train tokens/s",
        "Step time s (median, spread)",
        "MFU",
        "Inference tokens/s",
        "Peak memory GiB",
        "Ratio to uniform",
        "Attention backends",
    ]
    rows = []
    for name in sorted(b.schedules, key=schedule_order):
        s = b.schedules[name]
        spread = None if s.step_time_s_spread is None else list(s.step_time_s_spread)
        backends = ", ".join(sorted({str(b) for b in s.attention_backends or []})) or "n/a"
        train = [fmt.tokens_per_s(s.train_tokens_per_s), bench_step_time(s.step_time_s_median, spread)]
        other = [fmt.percent(s.mfu), fmt.tokens_per_s(s.infer_tokens_per_s), bench_gib(s.peak_memory_bytes)]
        rows.append([name, _compact(s.heads), *train, *other, fmt.num(s.ratio_to_uniform, 3), backends])
    return Table(headers, rows, right=[2, 3, 4, 5, 6, 7])


def bench_setup(res: ScaleResults) -> str:
    b = res.bench or Bench(schedules={})
    return prose(
        "tables_bench_setup",
        devices=recorded(b.num_devices),
        **{k: recorded(getattr(b, k)) for k in ("hardware", "seq_len", "steps")},
        # keys bench.json's record does not name (prism.measure.bench)
        **{k: getattr(b, k, "?") for k in ("dtype", "compile", "micro_batch")},
    )


def _compact(heads) -> str:
    return compact_text([int(h) for h in heads]) if heads else "?"
