"""What run_all.py prints: the plan (with --dry-run costs) and the closing summary."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prism.pipeline.estimate import Costs, data_source, human_bytes
from prism.pipeline.plan import Plan
from prism.pipeline.runner import Outcome, StageFailed
from prism.pipeline.stages import STAGES
from prism.runs.layout import (
    BENCH_NAME,
    LAST_CHECKPOINT_NAME,
    STEP_CHECKPOINT_GLOB,
    scale_result,
    scale_results_dir,
    scale_runs_dir,
)
from prism.train.batch import auto_micro_batch
from prism.train.memory import GIB
from prism.train.watchdog import collective_timeout, long_allowance

STATUS_STYLE = {
    "done": "green",
    "run": "cyan",
    "resume": "cyan",
    "rerun": "yellow",
    "conflict": "bold red",
    "blocked": "dim",
    "skipped": "dim",
    "held": "yellow",
}


def _h(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.1f}"


def show_plan(plan: Plan, costs: Costs, console: Console, dry_run: bool) -> None:
    cfg = plan.cfg
    console.rule(f"[bold]Prism reproduction plan: scale {cfg.scale}")
    console.print(
        f"schedules: {', '.join(f'{s} ({cfg.head_schedule(s).text()})' for s in cfg.run_schedules)}"
    )
    console.print(f"seeds: {', '.join(map(str, cfg.seeds))}   stages: {', '.join(plan.stages)}")
    console.print(
        f"model: {cfg.model.n_layer} layers x d_model {cfg.model.d_model}, h_base "
        f"{cfg.model.h_base}, {costs.n_params:,} parameters"
    )
    batch, seq_len = cfg.train.global_batch_tokens, cfg.model.seq_len
    console.print(
        f"per run: {costs.steps:,} steps x {batch:,} tokens ({batch // seq_len:,} sequences of {seq_len:,}) "
        f"= {costs.tokens:,} tokens"
    )
    console.print(f"data: {data_source(cfg)}")
    console.print(
        f"devices: train.devices={cfg.train.devices}, train.num_nodes={cfg.train.num_nodes}, "
        f"train.strategy={cfg.train.strategy}"
        + (f" (from {plan.layout_source})" if plan.layout_source else "")
    )
    console.print(
        f"batch split of every training run: {plan.split.describe()}"
        + (
            " (train.micro_batch=auto: the largest that the memory plan fits)"
            if auto_micro_batch(cfg)
            else f" (train.micro_batch={cfg.train.micro_batch} is the per-device ceiling)"
        )
    )
    if "train" in plan.stages:
        console.print(hang_line(cfg), highlight=False)
    for stage in STAGES.parts():
        line = stage.launcher(cfg)
        if line:
            console.print(f"launcher {stage}: {line}", highlight=False)

    table = Table(title="jobs", show_lines=False)
    for col, kw in (("stage", {}), ("job", {}), ("status", {}), ("note", {"overflow": "fold"})):
        table.add_column(col, **kw)
    for job in plan.selected():
        style = STATUS_STYLE.get(job.status, "")
        table.add_row(job.stage.name, escape(job.label), f"[{style}]{job.status}[/]", escape(job.reason))
    console.print(table)

    if dry_run:
        cost = Table(title="training cost (GPU-hours; runs in parallel across GPUs)")
        for col in ("schedule", "seed", "steps", "tokens", "GPU-h (paper rate)", "GPU-h (measured rate)"):
            cost.add_column(col, justify="right" if col not in ("schedule",) else "left", no_wrap=True)
        rows = [
            (r.schedule, str(r.seed), r.steps, r.tokens, r.gpu_h_paper, r.gpu_h_measured) for r in costs.runs
        ]
        n, total = len(costs.runs), costs.total
        rows.append(
            ("total", "", costs.steps * n, costs.tokens * n, total("gpu_h_paper"), total("gpu_h_measured"))
        )
        for schedule, seed, steps, tokens, paper, measured in rows:
            cost.add_row(schedule, seed, f"{steps:,}", f"{tokens:,}", _h(paper), _h(measured))
        console.print(cost)
        devices, layout = plan_devices(plan)
        if costs.paper_tps_per_gpu:
            gpu_h = costs.tokens / costs.paper_tps_per_gpu / 3600
            console.print(
                f"paper rate: {costs.paper_tps_per_gpu:,.0f} tokens/s per H100 (Table 2 total "
                f"/ 8); one run = {costs.tokens:,} / {costs.paper_tps_per_gpu:,.0f} / 3600 = "
                f"{gpu_h:,.2f} GPU-h; {wall_time(gpu_h, costs.total('gpu_h_paper'), devices, layout)}"
            )
        else:
            line = f"paper rate: n/a (the paper has no {cfg.scale} model)"
            if costs.flops_tps_per_gpu:
                gpu_h = costs.tokens / costs.flops_tps_per_gpu / 3600
                line += f"; {costs.flops_basis}: one run ≈ {gpu_h:,.2f} GPU-h"
            console.print(line)
        if costs.measured:
            rates = ", ".join(f"{s} {v:,.0f}" for s, v in sorted(costs.measured.items()))
            per_run = max((r.gpu_h_measured or 0.0) for r in costs.runs) if costs.runs else None
            console.print(
                f"measured rate: tokens/s per device on {costs.measured_hardware}: {rates} "
                f"(from {scale_result(cfg, BENCH_NAME)}); "
                f"{wall_time(per_run, costs.total('gpu_h_measured'), devices, layout)}"
            )
        else:
            console.print(f"measured rate: n/a until the benchmark has run ({scale_result(cfg, BENCH_NAME)})")
        show_eval_cost(cfg, costs, console)
        for stage in STAGES.parts():
            line = stage.cost(cfg) if stage.name in plan.stages else None
            if line:
                console.print(line, highlight=False)
        show_memory(plan, console)
        console.print(
            f"disk: {human_bytes(costs.ckpt_bytes)} per checkpoint (12 B/parameter: fp32 "
            f"weights + AdamW moments), {human_bytes(costs.export_bytes)} exported weights; "
            f"training writes a checkpoint every {cfg.train.ckpt_every_steps:,} steps and "
            f"keeps the newest {costs.periodic_ckpts} (train.keep_checkpoints="
            f"{cfg.train.keep_checkpoints}) plus {LAST_CHECKPOINT_NAME}, so {len(costs.runs)} runs need "
            f"{human_bytes(costs.disk_max)}; {human_bytes(costs.disk_min)} once the "
            f"{STEP_CHECKPOINT_GLOB} files of finished runs are deleted"
        )


def hang_line(cfg) -> str:
    """How training watches for hung and slow ranks, and checks the nodes before it trains."""
    t = cfg.train
    hang, retries, ddp = float(t.hang_timeout_s), cfg.run_all.train_retries, float(t.ddp_timeout_s)
    parts = [
        (
            f"hangs: a rank that finishes no batch (training, validation or zero-shot) for "
            f"train.hang_timeout_s={hang:g} s ({long_allowance(ddp):g} s in its first steps and while a "
            f"checkpoint is written) is named, every rank's stacks go to the run's diagnostics/, and the "
            f"run is retried (run_all.train_retries={retries}); collectives between checkpoints then time "
            f"out after {min(collective_timeout(hang), ddp):g} s"
            if hang > 0
            else f"hangs: no watchdog (train.hang_timeout_s=0); collectives time out after {ddp:g} s"
        ),
        (
            f"stragglers: every {t.straggler_every_steps} steps, a line for a rank "
            f"{t.straggler_slower_pct:g} % above the median {t.straggler_intervals} times in a row"
            if t.straggler_every_steps
            else "stragglers: off"
        ),
        (
            "pre-flight: a matmul per rank and an all-reduce before training, a table per node "
            "(train.preflight=true; on its own: reproduce/preflight.py)"
            if t.preflight
            else "pre-flight: off (train.preflight=false)"
        ),
    ]
    return "; ".join(parts)


def show_memory(plan: Plan, console: Console) -> None:
    """The training jobs' split, estimated peak per device and whether it fits (every variant and
    seed alike); the long-context job's, when that stage runs."""
    m = plan.memory
    if m is None:
        return
    console.print(f"memory, every training job: {m.line()}", highlight=False)
    for line in m.phase_lines():
        console.print(f"memory, every training job, {line}", highlight=False)
    if "long_context" in m.evaluations:
        peak = m.evaluations["long_context"] / GIB
        verdict = "fits" if peak <= m.usable_gib else "does NOT fit"
        console.print(
            f"memory, every long_context job: peak {peak:,.1f} GiB on one device: {verdict} under the "
            f"{m.margin_text}",
            highlight=False,
        )
    steps = m.steps_text + (" (train.compile)" if m.compiled else " (train.compile off)")
    console.print(
        f"memory plan ({m.precision}, {m.strategy}, per rank): {steps}, flash attention and fused "
        "AdamW as on a GPU (docs/performance.md says what is simulated and what is a formula); "
        "train.gpu_memory_gib sets the device's memory, train.memory_overhead_gib and "
        "train.memory_fraction the margin",
        highlight=False,
    )


def plan_devices(plan: Plan) -> tuple[int, str]:
    """The device count every training run of the plan uses, and its layout in words."""
    nodes, devices = int(plan.cfg.train.num_nodes), plan.split.world_size
    text = f"{devices} device{'s' if devices > 1 else ''}" + (
        f" ({nodes} nodes x {devices // nodes})" if nodes > 1 else ""
    )
    if plan.layout_source is None:  # the config's devices as seen here, say how to plan others
        text += " (train.devices x train.num_nodes here; --nodes and --gpus-per-node plan another layout)"
    return devices, text


def wall_time(per_run: float | None, total: float | None, devices: int, layout: str) -> str:
    """Hours on the plan's own layout (DDP scaling taken as linear): training runs take the whole
    layout one after another, so the total is the sum of the runs'."""
    if per_run is None or total is None:
        return f"wall time on {layout}: n/a"
    return (
        f"wall time on {layout}: {per_run / devices:,.2f} h per run, {total / devices:,.2f} h "
        f"for all runs one after another"
    )


def show_eval_cost(cfg, costs: Costs, console: Console) -> None:
    z, t = costs.zeroshot, cfg.train
    if z is None:
        console.print("zero-shot during training: off (train.eval_every_tokens=0)")
        return
    per = "n/a" if z.seconds is None else f"{z.seconds:,.1f} s"
    total = "n/a" if z.seconds is None else f"{z.seconds * z.milestones:,.0f} s"
    console.print(
        f"zero-shot during training: every {t.eval_every_tokens:,} tokens "
        f"({t.eval_every_tokens // t.global_batch_tokens:,} steps), {z.milestones} milestones per run; "
        f"{', '.join(t.eval_tasks)} x {t.eval_limit} documents = {z.requests:,} requests, "
        f"{z.tokens:,} input tokens ({z.counted}); {per} per milestone, {total} per run "
        f"(rate: {z.rate_source}"
        + (f"; plus {z.host_s:.1f} s reading and tokenising the documents, timed here" if z.host_s else "")
        + ")",
        highlight=False,
    )


def show_summary(plan: Plan, outcomes: list[Outcome], failures: list[StageFailed], console: Console) -> None:
    table = Table(title=f"summary: scale {plan.cfg.scale}")
    for col in ("job", "result", "time", "log"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        style = {"ran": "green", "failed": "bold red"}.get(o.result, "")
        table.add_row(
            escape(o.job.label),
            f"[{style}]{escape(o.result)}[/]" if style else escape(o.result),
            f"{o.seconds:,.0f} s" if o.seconds else "",
            str(o.job.log) if o.result in ("ran", "failed") else "",
        )
    console.print(table)
    console.print(
        f"runs: {scale_runs_dir(plan.cfg)}/   results: "
        f"{scale_results_dir(plan.cfg)}/   logs: {plan.logs_dir}/   "
        f"report: {plan.report_path}"
    )
    for failure in failures:
        if failure.returncode is None:  # held by another process: there is no log of ours
            console.print(f"[bold yellow]{escape(str(failure))}[/]")
            continue
        console.print(f"[bold red]{escape(str(failure))}[/] Last lines of its log:")
        console.print(failure.tail or "(empty)", markup=False, highlight=False)
    if failures:
        console.print(
            "Fix the cause and run the same command again: finished stages are skipped "
            "and training resumes from its last checkpoint."
        )
