"""Export one checkpoint as a Hugging Face transformers model folder (docs/export.md)."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Optional

from prism.cli.command import run
from prism.config.values import NON_EMPTY


def export(
    checkpoint: str, out: Annotated[str, NON_EMPTY], eval: Optional[str] = None, overwrite: bool = False
) -> int:
    """Export one checkpoint as a Hugging Face transformers model folder with a model card (needs
    the hf extra: pip install -e ".[hf]").

    Args:
        checkpoint: a finished run folder (runs/<scale>/<schedule>/seed<k>), a .ckpt or a .safetensors file
        out: the folder to write (must not exist, or be empty)
        eval: evaluation JSON written by reproduce/evaluate.py (default: the run's standard results
            file, if any)
        overwrite: replace an existing --out folder
    """
    from prism.export import export_hf

    print(f"wrote {export_hf(checkpoint, out, eval_path=eval, overwrite=overwrite, command=COMMAND[0])}")
    return 0


COMMAND = [""]  # the command line as typed, recorded in the model card


def main(argv=None) -> int:
    typed = sys.argv if argv is None else ["reproduce/export_hf.py", *argv]
    COMMAND[0] = shlex.join(["python", *typed])
    # a failed or stopped export leaves nothing at --out (prism.export.hf checks it first, writes it last)
    return run(
        export, argv, interrupted=lambda a: f"nothing was written to {a['out']}; run the same command again"
    )
