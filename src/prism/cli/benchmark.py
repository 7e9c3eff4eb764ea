"""Throughput benchmark of head schedules (paper Table 2, Table 5's tok/s column).

    python reproduce/benchmark.py --scale 124m --schedules uniform,prism --out results/124m/bench.json
    python reproduce/benchmark.py --scale tiny --steps 6 model.seq_len=128

The measurement is prism.measure.bench.run_benchmark; this is its command line. Tools that measure the
kit itself (framework overhead, data-pipeline and evaluation speed, the GPU check) are in dev/.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from prism.cli.exits import run_main
from prism.core.schedule import split_schedules
from prism.errors import UsageError
from prism.measure.bench import BenchSettings, run_benchmark


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmark.py",
        description=(
            "Time full training steps (and forward-only steps) of head schedules of one scale, "
            "interleaved in one process."
        ),
    )
    p.add_argument("--scale", required=True, help="any configs/scale/<scale>.yaml, e.g. tiny or 124m")
    p.add_argument(
        "--schedules",
        default=None,
        help="comma list of schedule names or head lists (default: run_schedules); "
        "uniform is always included as the reference",
    )
    p.add_argument("--steps", type=int, default=None, help="timed rounds (default: bench.steps)")
    p.add_argument(
        "--round-steps",
        type=int,
        default=BenchSettings.round_steps,
        help=f"back-to-back steps per schedule per round, timed together "
        f"(default {BenchSettings.round_steps})",
    )
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps per schedule (default: bench.warmup)"
    )
    p.add_argument(
        "--infer-steps", type=int, default=None, help="timed forward-only rounds (default: --steps; 0 skips)"
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="sequences per step (default: bench.micro_batch or train.micro_batch)",
    )
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: model.seq_len)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the models (default: on for CUDA, off on CPU)",
    )
    p.add_argument(
        "--fullgraph",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compile with fullgraph=True (default) so a graph break is reported",
    )
    p.add_argument(
        "--compile-mode",
        choices=("full", "regional"),
        default="full",
        help="full: the whole model as one graph, as training compiles it (default); "
        "regional: each block alone (much shorter compile for deep models)",
    )
    p.add_argument(
        "--precision",
        choices=("bf16", "fp32"),
        default="bf16",
        help="bf16 autocast on CUDA (default; CPU always runs fp32) or fp32",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="dense peak TFLOP/s for MFU when the device is not in prism.hardware's table",
    )
    p.add_argument("--out", default=None, help="write the JSON result here (atomically)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. model.seq_len=512")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    # the result is written at the end, atomically: any earlier one stays as it was
    return run_main(
        argv,
        parse_args,
        _benchmark,
        interrupted="nothing was written; run the same command again",
        out=lambda args: args.out,  # before a model is built or a step timed
        overrides=lambda args: args.overrides,
    )


def _benchmark(args: argparse.Namespace) -> int:
    from rich.console import Console

    from prism.cluster import require_single_process
    from prism.config.schema import load_config, to_dict
    from prism.runs.records import Bench

    require_single_process("benchmark.py")
    run = load_config(args.scale, args.overrides)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(
            f"--device {args.device!r} is not a device; use auto, cpu, cuda or cuda:N."
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device {args.device} was asked for but no CUDA device is visible; use --device cpu."
        )
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {args.device!r} is not supported; use auto, cpu, cuda or cuda:N.")
    steps = args.steps if args.steps is not None else run.bench.steps
    warmup = args.warmup if args.warmup is not None else run.bench.warmup
    infer_steps = args.infer_steps if args.infer_steps is not None else steps
    micro_batch = (
        args.micro_batch if args.micro_batch is not None else run.bench.micro_batch or run.train.micro_batch
    )
    seq_len = args.seq_len if args.seq_len is not None else run.model.seq_len
    if micro_batch == "auto":  # train.micro_batch=auto: the largest that the memory plan fits on one device
        from prism.train.memory import fit_micro_batch

        micro_batch = fit_micro_batch(run, 1).micro_batch
    if args.peak_tflops is not None and not (math.isfinite(args.peak_tflops) and args.peak_tflops > 0):
        raise UsageError(f"--peak-tflops={args.peak_tflops} is invalid: it must be a positive number.")
    if not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed={args.seed} is invalid: it must be a whole number from 0 to 2**63-1.")
    for flag, value, low in (
        ("--steps", steps, 1),
        ("--round-steps", args.round_steps, 1),
        ("--warmup", warmup, 0),
        ("--infer-steps", infer_steps, 0),
        ("--micro-batch", micro_batch, 1),
        ("--seq-len", seq_len, 1),
    ):
        if value < low:
            raise UsageError(f"{flag}={value} is invalid: it must be at least {low}.")
    if seq_len > run.model.seq_len:
        raise UsageError(
            f"--seq-len {seq_len} exceeds model.seq_len={run.model.seq_len}; "
            f"raise it with the override model.seq_len={seq_len}."
        )
    names = split_schedules(args.schedules) if args.schedules else list(run.run_schedules)
    if not any(n.lower() == "uniform" for n in names):
        names.insert(0, "uniform")
    names.sort(key=lambda n: n.lower() != "uniform")  # the reference runs first in every round
    cfgs = {}
    for n in names:
        cfg = run.model_config(n)
        cfgs[cfg.schedule_name] = cfg
    compile_ = args.compile
    if compile_ is None:
        compile_ = dev.type == "cuda" if run.train.compile is None else run.train.compile
    settings = BenchSettings(
        steps=steps,
        warmup=warmup,
        infer_steps=infer_steps,
        micro_batch=micro_batch,
        seq_len=seq_len,
        device=device,
        compile=compile_,
        fullgraph=args.fullgraph,
        compile_mode=args.compile_mode,
        round_steps=args.round_steps,
        loss_chunk=int(run.train.loss_chunk_tokens),
        train=to_dict(run)["train"],
        amp=args.precision == "bf16",
        seed=args.seed,
        peak_tflops=args.peak_tflops,
    )
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    result = run_benchmark(cfgs, settings, progress=lambda m: console.log(m))
    result["scale"] = run.scale
    console.print(
        render(
            result,
            f"{run.scale} on {result['hardware']} - micro-batch {micro_batch} x "
            f"{seq_len} tokens, {result['dtype']}, compile={compile_}, {steps} rounds",
        )
    )
    if args.out:
        Bench(**result).write(args.out)  # a full disk or read-only folder: any earlier result stays
        console.log(f"wrote {args.out}")
    return 0
