"""Tokenize FineWeb (hub or local files) into uint16 .bin shards for data.source=shards.

  python reproduce/prepare_fineweb.py --scale 124m --source hub --out data/fineweb10B
  python reproduce/prepare_fineweb.py --scale tiny --source local --path /data/fineweb/ --out data/fw

--scale takes the held-out set's settings (--seq-len, --val-tokens) and the hub subset from that
scale's config, so that its runs accept the folder; without it they are 124m's. Re-running with
the same --out resumes after the last finished shard.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields

from prism.cli.exits import run_command
from prism.config.schema import ConfigError, load_config
from prism.data import DataError
from prism.data.prepare import PrepareOptions, prepare

DEFAULTS = {f.name: f.default for f in fields(PrepareOptions)}
SCALE_KEYS = ("hub_name", "subset", "revision", "seq_len", "val_tokens")


def scale_defaults(scale: str) -> dict:
    """The settings of a scale's runs that decide the folder: its held-out windows (seq_len,
    val_tokens) and what is read from the hub. A tiny run refuses 124m's 10M-token held-out set
    cut for 1,024-token windows."""
    cfg = load_config(scale)
    return {
        "hub_name": cfg.data.hub_name,
        "subset": cfg.data.subset,
        "revision": cfg.data.revision,
        "seq_len": cfg.model.seq_len,
        "val_tokens": cfg.data.val_tokens,
    }


def parse_args(argv: list[str] | None) -> PrepareOptions:
    p = argparse.ArgumentParser(prog="prepare_fineweb.py", description=__doc__.splitlines()[0])
    p.add_argument("--source", choices=["hub", "local"], required=True)
    p.add_argument(
        "--scale",
        default=None,
        help="take the defaults of --seq-len, --val-tokens, --subset, --hub-name and --revision from "
        "this scale's config (any configs/scale/<scale>.yaml); without it: 124m's",
    )
    p.add_argument("--path", help="local file(s)/folder (parquet, jsonl, txt) with a text column")
    p.add_argument("--hub-name", default=None, help=f"default: the scale's, {DEFAULTS['hub_name']}")
    p.add_argument(
        "--subset",
        default=None,
        help=f"FineWeb config (default: the scale's data.subset, else {DEFAULTS['subset']}; 354m and "
        "757m read sample-100BT)",
    )
    p.add_argument(
        "--revision",
        default=None,
        help=f"hub commit, branch or tag (default: the scale's data.revision, {DEFAULTS['revision']})",
    )
    p.add_argument("--out", required=True, help="output folder (resumed if it holds a matching manifest)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many training tokens")
    p.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: CPUs - 1)")
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"model.seq_len the val set is cut for (default: the scale's, else {DEFAULTS['seq_len']})",
    )
    p.add_argument(
        "--val-tokens",
        type=int,
        default=None,
        help=f"data.val_tokens, held-out predicted tokens (default: the scale's, else "
        f"{DEFAULTS['val_tokens']})",
    )
    p.add_argument(
        "--shard-tokens", type=int, default=DEFAULTS["shard_tokens"], help="tokens per train shard"
    )
    p.add_argument(
        "--doc-batch", type=int, default=DEFAULTS["doc_batch"], help="documents per tokenizer task"
    )
    args = vars(p.parse_args(argv))
    scale = args.pop("scale")
    try:
        defaults = scale_defaults(scale) if scale else DEFAULTS
    except ConfigError as exc:
        p.error(str(exc))
    for name in SCALE_KEYS:  # a flag given explicitly wins over the scale's value
        if args[name] is None:
            args[name] = defaults[name]
    if args["workers"] is None:
        del args["workers"]  # PrepareOptions' default: CPUs - 1
    try:
        return PrepareOptions(**args)
    except DataError as exc:
        p.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    options = parse_args(sys.argv[1:] if argv is None else argv)
    # shards are renamed into place, then listed in the manifest: finished ones are never lost
    interrupted = (
        f"the finished shards in {options.out} are kept; run the same command again to continue after them"
    )
    return run_command(lambda: _prepare(options), interrupted=interrupted)


def _prepare(options: PrepareOptions) -> int:
    try:
        prepare(options)
    except DataError as exc:  # the library names config keys; on this command line it is --path
        raise DataError(str(exc).replace("data.path", "--path")) from None
    return 0
