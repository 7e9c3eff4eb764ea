"""Export one checkpoint as a Hugging Face transformers model folder with a model card.

    python reproduce/export_hf.py --checkpoint runs/124m/prism/seed0 --out hf/prism-124m-seed0 \\
        [--eval results/124m/eval/prism/seed0.json] [--overwrite]

--checkpoint takes a finished run folder, a .ckpt or a .safetensors file. The folder loads with
`AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)` and `AutoTokenizer`, and
runs under `lm_eval --model hf --model_args pretrained=OUT,trust_remote_code=True`. The
run's zero-shot results are put in the card: --eval, or results/<scale>/eval/<schedule>/seed<k>.json
found from the run's own config. Needs the hf extra: pip install -e ".[hf]".
"""

from __future__ import annotations

import argparse
import shlex
import sys

from prism.cli.exits import run_main
from prism.export import export_hf


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a finished run folder (runs/<scale>/<schedule>/seed<k>), a .ckpt or a .safetensors file",
    )
    p.add_argument("--out", required=True, help="the folder to write (must not exist, or be empty)")
    p.add_argument(
        "--eval",
        default=None,
        help="evaluation JSON written by reproduce/evaluate.py "
        "(default: the run's standard results file, if any)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    return p.parse_args(argv)


def main(argv=None) -> int:
    # Recorded in the model card: the command line as typed (or its equivalent when called in-process).
    typed = sys.argv if argv is None else ["reproduce/export_hf.py", *argv]
    command = shlex.join(["python", *typed])
    # nothing is left at --out by a failed or stopped export (prism.export.hf writes it last, and
    # checks the folder first)
    return run_main(
        argv,
        parse_args,
        lambda args: _export(args, command),
        interrupted=lambda args: f"nothing was written to {args.out}; run the same command again",
    )


def _export(args: argparse.Namespace, command: str) -> int:
    out = export_hf(args.checkpoint, args.out, eval_path=args.eval, overwrite=args.overwrite, command=command)
    print(f"wrote {out}")
    return 0
