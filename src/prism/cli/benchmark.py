"""Throughput benchmark of head schedules (paper Table 2, Table 5's tok/s column;
docs/commands.md#benchmarkpy). The measurement is prism.measure.bench.run_benchmark; this is its
command line. Tools that measure the kit itself are in dev/.
"""

from __future__ import annotations

import sys
from typing import Annotated, Literal, Optional

from prism.cli.command import Key, run
from prism.config.values import at_least_zero, number, positive
from prism.core.schedule import split_schedules
from prism.errors import UsageError
from prism.measure.bench import BenchSettings, run_benchmark

AT_LEAST_1 = positive("it must be at least 1")


def compact(items: list[str]) -> str:
    """["flash"]*12 -> "flash x12"; mixed lists keep their order of runs."""
    runs: list[list] = []
    for it in items:
        if runs and runs[-1][0] == it:
            runs[-1][1] += 1
        else:
            runs.append([it, 1])
    return ", ".join(f"{n} x{c}" if c > 1 else n for n, c in runs)


def render(result: dict, title: str):
    from rich.table import Table

    table = Table(title=title)
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


def benchmark(
    scale: str,
    schedules: Optional[str] = None,
    steps: Annotated[Optional[int], Key("bench.steps"), AT_LEAST_1] = None,
    round_steps: Annotated[int, AT_LEAST_1] = BenchSettings.round_steps,
    warmup: Annotated[Optional[int], Key("bench.warmup"), at_least_zero("it must be at least 0")] = None,
    infer_steps: Annotated[Optional[int], at_least_zero("it must be at least 0")] = None,
    micro_batch: Annotated[Optional[int], Key("bench.micro_batch"), AT_LEAST_1] = None,
    seq_len: Annotated[Optional[int], AT_LEAST_1] = None,
    device: str = "auto",
    compile: Optional[bool] = None,
    fullgraph: bool = True,
    compile_mode: Literal["full", "regional"] = "full",
    precision: Literal["bf16", "fp32"] = "bf16",
    seed: Annotated[int, number("it must be a whole number from 0 to 2**63-1", ge=0, lt=2**63)] = 0,
    peak_tflops: Annotated[Optional[float], positive("it must be a positive number")] = None,
    out: Optional[str] = None,
    overrides: list[str] = (),
) -> int:
    """Time full training steps (and forward-only steps) of head schedules of one scale,
    interleaved in one process.

    Args:
        scale: any configs/scale/<scale>.yaml, e.g. tiny or 124m
        schedules: comma list of schedule names or head lists (default: run_schedules); uniform is
            always included as the reference
        steps: the config key bench.steps: timed rounds
        round_steps: back-to-back steps per schedule per round, timed together
        warmup: the config key bench.warmup: untimed steps per schedule
        infer_steps: timed forward-only rounds (default: --steps; 0 skips)
        micro_batch: the config key bench.micro_batch: sequences per step (default: train.micro_batch)
        seq_len: tokens per sequence (default: model.seq_len)
        device: auto, cpu, cuda or cuda:N
        compile: torch.compile the models (default: on for CUDA, off on CPU)
        fullgraph: compile with fullgraph=True (default) so a graph break is reported
        compile_mode: full: the whole model as one graph, as training compiles it (default);
            regional: each block alone (much shorter compile for deep models)
        precision: bf16 autocast on CUDA (default; CPU always runs fp32) or fp32
        seed: the models' initialisation seed
        peak_tflops: dense peak TFLOP/s for MFU when the device is not in prism.hardware's table
        out: write the JSON result here (atomically)
        overrides: config overrides key=value, e.g. model.seq_len=512
    """
    import torch
    from rich.console import Console

    from prism.cluster import require_single_process
    from prism.config.schema import load_config, to_dict
    from prism.runs.records import Bench

    require_single_process("benchmark.py")
    run = load_config(scale, overrides)
    dev_name = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(dev_name)
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device} was asked for but no CUDA device is visible; use --device cpu.")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r} is not supported; use auto, cpu, cuda or cuda:N.")
    steps, warmup = run.bench.steps, run.bench.warmup
    infer_steps = infer_steps if infer_steps is not None else steps
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
    cfgs = {}
    for n in names:
        cfg = run.model_config(n)
        cfgs[cfg.schedule_name] = cfg
    if compile is None:
        compile = dev.type == "cuda" if run.train.compile is None else run.train.compile
    settings = BenchSettings(
        steps=steps,
        warmup=warmup,
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
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    result = run_benchmark(cfgs, settings, progress=lambda m: console.log(m))
    result["scale"] = run.scale
    console.print(
        render(
            result,
            f"{run.scale} on {result['hardware']} - micro-batch {micro_batch} x "
            f"{seq_len} tokens, {result['dtype']}, compile={compile}, {steps} rounds",
        )
    )
    if out:
        Bench(**result).write(out)  # a full disk or read-only folder: any earlier result stays
        console.log(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    # the result is written at the end, atomically: any earlier one stays as it was
    return run(
        benchmark,
        argv,
        "benchmark.py",
        interrupted="nothing was written; run the same command again",
        out="out",
    )
