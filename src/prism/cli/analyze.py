"""Attention distance per layer (paper §4.1, Eq. 1, Figure 4) of trained checkpoints.

    python reproduce/analyze.py --checkpoints runs/124m/uniform/seed0/model.safetensors \\
        runs/124m/prism/seed0/model.safetensors --sequences 64 --out results/124m/analysis.json
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prism.cli.exits import run_main
from prism.measure.analysis.compare import analyze_to_file
from prism.runs.resumable import ATTENTION


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="analyze.py",
        description=(
            "Mean attention distance per layer and head (paper Eq. 1) of checkpoints, and ΔD_l of "
            "each schedule against the uniform checkpoint of the same scale and seed."
        ),
    )
    p.add_argument(
        "--checkpoints",
        nargs="+",
        required=True,
        help=".ckpt, .safetensors or exported folders, all of one scale",
    )
    p.add_argument(
        "--sequences",
        type=int,
        default=None,
        help="held-out validation windows to average over (default: analysis.sequences)",
    )
    p.add_argument(
        "--scale",
        default=None,
        help="config to use when no checkpoint names its run config (a .ckpt holds one; exported "
        "weights use the config.yaml of their run folder)",
    )
    p.add_argument("--data-dir", default=None, help="shorthand for the override data.path=DIR")
    p.add_argument(
        "--windows",
        default=None,
        help="a torch.save'd LongTensor (N, seq_len+1) of token windows to use instead "
        "of the held-out validation set",
    )
    p.add_argument("--batch-size", type=int, default=4, help="sequences per forward pass")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--out", required=True, help="analysis.json to write (atomically)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. data.path=/data")
    return p.parse_args(argv)


def table(result: dict) -> Table:
    t = Table(title=f"Attention distance D_l (tokens), {result['sequences']} sequences x {result['seq_len']}")
    t.add_column("layer", justify="right")
    for e in result["checkpoints"]:
        t.add_column(f"{e['schedule']} s{e['seed']}", justify="right")
    for name in result["delta"]:
        t.add_column(f"Δ {name}", justify="right")
    for layer in range(len(result["checkpoints"][0]["D"])):
        row = [str(layer)] + [f"{e['D'][layer]:.1f}" for e in result["checkpoints"]]
        for d in result["delta"].values():
            row.append(f"{d['mean'][layer]:+.1f}" + (f" ± {d['std'][layer]:.1f}" if d["std"] else ""))
        t.add_row(*row)
    return t


def main(argv: list[str] | None = None) -> int:
    return run_main(
        argv,
        parse_args,
        _analyze,
        interrupted=lambda args: ATTENTION.interrupted(args.out),
        out=lambda args: args.out,  # before any checkpoint or data is read
        overrides=lambda args: args.overrides,
    )


def _analyze(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    overrides = list(args.overrides) + ([f"data.path={args.data_dir}"] if args.data_dir else [])
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("attention distance", total=None)
        result = analyze_to_file(
            args.checkpoints,
            args.out,
            sequences=args.sequences,
            scale=args.scale,
            overrides=overrides,
            windows_path=args.windows,
            batch_size=args.batch_size,
            device=args.device,
            progress=lambda name, done, total: bar.update(
                task, description=name, completed=done, total=total
            ),
        )
    console.print(table(result))
    console.log(f"wrote {args.out}")
    return 0
