"""Loss by position and attention distance per layer of one run's final weights past its
training length, under each RoPE scaling choice (docs/evaluation.md, "Beyond the training
context").

    python reproduce/long_context.py --checkpoint runs/124m/prism/seed0/model.safetensors \\
        --out results/124m/long_context/prism/seed0.json long_context.lengths=[1x,2x,4x,8x]

The settings are the long_context section of the run's config (config.yaml beside the weights)
with the overrides given; the flags below are shorthands for some of them.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prism.cli.exits import run_main
from prism.measure.long_context.job import evaluate_to_file
from prism.runs.resumable import LONG_CONTEXT


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="long_context.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help=".ckpt, .safetensors or an exported run folder")
    p.add_argument("--out", required=True, help="the result JSON to write (atomically)")
    p.add_argument(
        "--scale",
        default=None,
        help="config to use when the checkpoint names no run config (a .ckpt holds one; exported "
        "weights use the config.yaml of their run folder)",
    )
    p.add_argument("--lengths", default=None, help="shorthand for long_context.lengths: 2x,4x or 2048,4096")
    p.add_argument(
        "--rope-scalings", default=None, help="shorthand for long_context.rope_scalings: none,linear,ntk,yarn"
    )
    p.add_argument("--path", default=None, help="shorthand for long_context.path: a jsonl file of documents")
    p.add_argument("--text-field", default=None, help="shorthand for long_context.text_field")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--query-block",
        type=int,
        default=256,
        help="query rows per block of the attention-distance pass (memory: heads x block x length)",
    )
    p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. long_context.documents=8")
    return p.parse_args(argv)


def shorthand_overrides(args: argparse.Namespace) -> list[str]:
    """The flags as the overrides they stand for, before the overrides given as words."""
    out = []
    for flag, key in (("lengths", "lengths"), ("rope_scalings", "rope_scalings")):
        value = getattr(args, flag)
        if value is not None:
            out.append(f"long_context.{key}=[{','.join(w.strip() for w in value.split(','))}]")
    for flag in ("path", "text_field"):
        value = getattr(args, flag)
        if value is not None:
            out.append(f"long_context.{flag}={json.dumps(value)}")
    return out


def table(doc: dict) -> Table:
    t = Table(
        title=f"{doc['schedule']} seed {doc['seed']}: mean loss by length (trained at {doc['seq_len']})"
    )
    t.add_column("length", justify="right")
    choices = list(dict.fromkeys(r["rope_scaling"] for r in doc["results"]))
    for c in choices:
        t.add_column(c, justify="right")
    for length in doc["settings"]["lengths"]:
        by = {r["rope_scaling"]: r for r in doc["results"] if r["length"] == length}
        t.add_row(str(length), *[f"{by[c]['loss']:.4f}" if c in by else "-" for c in choices])
    return t


def main(argv: list[str] | None = None) -> int:
    return run_main(
        argv,
        parse_args,
        _run,
        interrupted=lambda args: LONG_CONTEXT.interrupted(args.out),
        out=lambda args: args.out,  # before the checkpoint or any document is read
        overrides=lambda args: [*shorthand_overrides(args), *args.overrides],
    )


def _run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    overrides = [*shorthand_overrides(args), *args.overrides]
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("long context", total=None)
        doc = evaluate_to_file(
            args.checkpoint,
            args.out,
            overrides,
            scale=args.scale,
            device=args.device,
            query_block=args.query_block,
            progress=lambda name, done, total: bar.update(
                task, description=name, completed=done, total=total
            ),
        )
    console.print(table(doc))
    console.log(f"wrote {args.out}")
    return 0
