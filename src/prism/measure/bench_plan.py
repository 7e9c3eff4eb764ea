"""benchmark.py's work: what it measures, from its settings (the device, the schedules, uniform first
as the reference of every round, and the BenchSettings of one scale's config), the measurement
(prism.measure.bench.run_benchmark), the table it prints and the file it writes."""

from __future__ import annotations

import sys
from itertools import groupby

from prism.core.schedule import split_schedules
from prism.errors import UsageError
from prism.measure.bench import BenchSettings, run_benchmark


def plan_benchmark(
    run,
    schedules: str | None,
    infer_steps: int | None,
    seq_len: int | None,
    device: str,
    compile: bool | None,
    fullgraph: bool,
    compile_mode: str,
    round_steps: int,
    precision: str,
    seed: int,
    peak_tflops: float | None,
) -> tuple[dict, BenchSettings]:
    """The model configs by schedule name and the BenchSettings of `run` (a RunConfig) under the
    command's flags; UsageError for a device that is not there or a --seq-len past model.seq_len."""
    import torch

    from prism.config.schema import to_dict
    from prism.hardware import pick_device

    try:
        dev_name = pick_device(device, UsageError)
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N.") from None
    dev = torch.device(dev_name)
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r} is not supported; use auto, cpu, cuda or cuda:N.")
    infer_steps = infer_steps if infer_steps is not None else run.bench.steps
    micro_batch = run.bench.micro_batch or run.train.micro_batch
    seq_len = seq_len if seq_len is not None else run.model.seq_len
    if micro_batch == "auto":  # train.micro_batch=auto: the largest that the memory plan fits on one device
        from prism.train.memory import fit_micro_batch

        micro_batch = fit_micro_batch(run, 1).micro_batch
    if seq_len > run.model.seq_len:
        raise UsageError(
            f"--seq-len {seq_len} exceeds model.seq_len={run.model.seq_len}; "
            f"raise it with the override model.seq_len={seq_len}."
        )
    names = split_schedules(schedules) if schedules else list(run.run_schedules)
    if not any(n.lower() == "uniform" for n in names):
        names.insert(0, "uniform")
    names.sort(key=lambda n: n.lower() != "uniform")  # the reference runs first in every round
    cfgs = {cfg.schedule_name: cfg for cfg in map(run.model_config, names)}
    if compile is None:
        compile = dev.type == "cuda" if run.train.compile is None else run.train.compile
    return cfgs, BenchSettings(
        steps=run.bench.steps,
        warmup=run.bench.warmup,
        infer_steps=infer_steps,
        micro_batch=micro_batch,
        seq_len=seq_len,
        device=dev_name,
        compile=compile,
        fullgraph=fullgraph,
        compile_mode=compile_mode,
        round_steps=round_steps,
        loss_chunk=int(run.train.loss_chunk_tokens),
        train=to_dict(run)["train"],
        amp=precision == "bf16",
        seed=seed,
        peak_tflops=peak_tflops,
    )


def benchmark_to_file(
    scale: str, overrides: list[str], schedules: str | None, options: tuple, out: str | None
) -> None:
    """Measure the schedules of `scale` under the command's `options` (plan_benchmark's, in its order)
    in this one process, progress and the table on stderr; write `out` (atomically) if given."""
    from rich.console import Console

    from prism.cluster import require_single_process
    from prism.config.schema import load_config
    from prism.runs.records import Bench

    require_single_process("benchmark.py")
    run = load_config(scale, overrides)
    cfgs, settings = plan_benchmark(run, schedules, *options)
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    result = run_benchmark(cfgs, settings, progress=lambda m: console.log(m))
    result["scale"] = run.scale
    console.print(render(result, settings))
    if out:
        Bench(**result).write(out)  # a full disk or read-only folder: any earlier result stays
        console.log(f"wrote {out}")


def compact(items: list[str]) -> str:
    """["flash"]*12 -> "flash x12"; mixed lists keep their order of runs."""
    runs = [(n, len(list(group))) for n, group in groupby(items)]
    return ", ".join(f"{n} x{c}" if c > 1 else n for n, c in runs)


def render(result: dict, settings: BenchSettings):
    """The benchmark's table: each schedule's throughput, step time, MFU and memory, and its ratios
    to uniform, under a title that says what was measured where."""
    from rich.table import Table

    table = Table(
        title=f"{result['scale']} on {result['hardware']} - micro-batch {settings.micro_batch} x "
        f"{settings.seq_len} tokens, {result['dtype']}, compile={settings.compile}, {settings.steps} rounds"
    )
    for col in (
        "schedule",
        "heads",
        "train tok/s",
        "step ms (median, p25-p75)",
        "MFU",
        "peak mem GiB",
        "infer tok/s",
        "vs uniform: median (p25-p75); best-of; cpu-time",
        "SDPA backend per layer",
    ):
        table.add_column(
            col, justify="left" if col in ("schedule", "heads", "SDPA backend per layer") else "right"
        )
    for name, r in result["schedules"].items():
        lo, hi = r["step_time_s_spread"]
        rlo, rhi = r["ratio_to_uniform_spread"]
        table.add_row(
            name,
            compact([str(h) for h in r["heads"]]),
            f"{r['train_tokens_per_s']:,.0f}",
            f"{1e3 * r['step_time_s_median']:.1f} ({1e3 * lo:.1f}-{1e3 * hi:.1f})",
            f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "-",
            f"{r['peak_memory_bytes'] / 2**30:.2f}" if r["peak_memory_bytes"] else "-",
            f"{r['infer_tokens_per_s']:,.0f}" if r["infer_tokens_per_s"] else "-",
            f"{r['ratio_to_uniform']:.3f} ({rlo:.3f}-{rhi:.3f}); best {r['ratio_to_uniform_min']:.3f}"
            + (f"; cpu-s {r['ratio_to_uniform_cpu_time']:.3f}" if "ratio_to_uniform_cpu_time" in r else ""),
            compact(r["attention_backends"]) + (" [compile failed]" if r["compile_error"] else ""),
        )
    return table
