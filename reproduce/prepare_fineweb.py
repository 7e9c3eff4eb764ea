#!/usr/bin/env python
"""Tokenize FineWeb (hub or local files) into uint16 .bin shards for data.source=shards.

  python reproduce/prepare_fineweb.py --source hub --subset sample-10BT --out data/fineweb10B
  python reproduce/prepare_fineweb.py --source local --path /data/fineweb/ --out data/fw --max-tokens 1e8

Re-running with the same --out resumes after the last finished shard.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields

from prism.data import DataError
from prism.data.prepare import PrepareOptions, prepare
from prism.io import os_error_message

DEFAULTS = {f.name: f.default for f in fields(PrepareOptions)}


def parse_args(argv: list[str] | None) -> PrepareOptions:
    p = argparse.ArgumentParser(prog="prepare_fineweb.py", description=__doc__.splitlines()[0])
    p.add_argument("--source", choices=["hub", "local"], required=True)
    p.add_argument("--path", help="local file(s)/folder (parquet, jsonl, txt) with a text column")
    p.add_argument("--hub-name", default=DEFAULTS["hub_name"])
    p.add_argument(
        "--subset", default=DEFAULTS["subset"], help="FineWeb config, e.g. sample-10BT, sample-100BT"
    )
    p.add_argument(
        "--revision",
        default=DEFAULTS["revision"],
        help=f"hub commit, branch or tag (default {DEFAULTS['revision']}, as data.revision)",
    )
    p.add_argument("--out", required=True, help="output folder (resumed if it holds a matching manifest)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many training tokens")
    p.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: CPUs - 1)")
    p.add_argument(
        "--seq-len", type=int, default=DEFAULTS["seq_len"], help="model.seq_len the val set is cut for"
    )
    p.add_argument(
        "--val-tokens",
        type=int,
        default=DEFAULTS["val_tokens"],
        help=f"data.val_tokens: held-out predicted tokens (default {DEFAULTS['val_tokens']})",
    )
    p.add_argument(
        "--shard-tokens", type=int, default=DEFAULTS["shard_tokens"], help="tokens per train shard"
    )
    p.add_argument(
        "--doc-batch", type=int, default=DEFAULTS["doc_batch"], help="documents per tokenizer task"
    )
    args = vars(p.parse_args(argv))
    if args["workers"] is None:
        del args["workers"]  # PrepareOptions' default: CPUs - 1
    try:
        return PrepareOptions(**args)
    except DataError as exc:
        p.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    options = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        prepare(options)
    except KeyboardInterrupt:  # shards are renamed into place, then listed in the manifest
        print(
            f"interrupted: the finished shards in {options.out} are kept; run the same command "
            f"again to continue after them.",
            file=sys.stderr,
        )
        return 130
    except DataError as exc:  # the library names config keys; on this command line it is --path
        print(f"error: {str(exc).replace('data.path', '--path')}", file=sys.stderr)
        return 2
    except OSError as exc:  # full disk, read-only or misplaced --out: finished shards stay listed
        print(f"error: {os_error_message(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
