"""Tokenize FineWeb into uint16 .bin shards (docs/commands.md#prepare_finewebpy)."""

from __future__ import annotations

import logging
from typing import Annotated, Literal, Optional

from prism.cli.command import Key, run
from prism.config.values import POSITIVE
from prism.data import DataError
from prism.data.prepare import PrepareOptions, options_for, prepare


def prepare_fineweb(
    source: Literal["hub", "local"],
    out: str,
    scale: Optional[str] = None,
    path: Annotated[Optional[str], Key("data.path")] = None,
    hub_name: Annotated[Optional[str], Key("data.hub_name")] = None,
    subset: Annotated[Optional[str], Key("data.subset")] = None,
    revision: Annotated[Optional[str], Key("data.revision")] = None,
    max_tokens: Annotated[Optional[int], POSITIVE] = None,
    workers: Annotated[Optional[int], POSITIVE] = None,
    seq_len: Annotated[Optional[int], Key("model.seq_len")] = None,
    val_tokens: Annotated[Optional[int], Key("data.val_tokens")] = None,
    shard_tokens: Annotated[int, POSITIVE] = PrepareOptions.shard_tokens,
    doc_batch: Annotated[Optional[int], Key("data.doc_batch")] = None,
    overrides: list[str] = (),
) -> int:
    """Tokenize FineWeb (hub or local files) into uint16 .bin shards for data.source=shards
    (docs/data.md). The same --out again resumes after the last finished shard.

    Args:
        source: hub or local
        out: output folder (resumed if it holds a matching manifest)
        scale: the config whose data.* and model.seq_len (the flags below that name a key) are
            the defaults, so that its runs accept the folder (any configs/scale/<scale>.yaml);
            without it: 124m's
        path: local file(s)/folder (parquet, jsonl, txt) with a text column
        subset: FineWeb config (354m and 757m read sample-100BT)
        revision: hub commit, branch or tag
        max_tokens: stop after this many training tokens
        workers: tokenizer processes (default: CPUs - 1)
        seq_len: the length the val set is cut for
        val_tokens: held-out predicted tokens
        shard_tokens: tokens per train shard
        doc_batch: documents per tokenizer task
        overrides: config overrides key=value, e.g. data.subset=sample-100BT
    """
    try:
        prepare(options_for(**locals()))
    except DataError as exc:  # the library names config keys; on this command line it is --path
        raise DataError(str(exc).replace("data.path", "--path")) from None
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    # shards are renamed into place, then listed in the manifest: finished ones are never lost
    kept = "the finished shards in {} are kept; run the same command again to continue after them"
    return run(prepare_fineweb, argv, interrupted=lambda a: kept.format(a["out"]))
