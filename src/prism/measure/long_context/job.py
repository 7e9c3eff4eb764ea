"""One run's long-context evaluation, checkpoint in, result file out: every (length, RoPE choice)
unit in turn, each kept in <out>.partial.json as it finishes so that a rerun resumes, then the
whole file written atomically. Every refusal comes before anything is written."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import torch

from prism.core.model import PrismDecoder
from prism.hardware import pick_device
from prism.measure.analysis.attention_distance import DistanceAccumulator
from prism.measure.analysis.compare import describe, read_meta, run_config_from
from prism.measure.long_context.buckets import bucket_edges, bucket_means
from prism.measure.long_context.documents import Documents, Picked
from prism.measure.long_context.settings import LongContextError, Settings, head_widths, settings_for
from prism.measure.long_context.window import measure_window
from prism.runs import records
from prism.runs.checkpoint import weights_path
from prism.runs.identity import stable_hash
from prism.runs.resumable import LONG_CONTEXT


def with_rope(model: PrismDecoder, scaling: str, factor: float) -> PrismDecoder:
    """The same weights in a decoder built with another model.rope_scaling and model.rope_factor, so
    that its tables are the ones training would build for that choice."""
    cfg = replace(model.cfg, rope_scaling=scaling, rope_factor=factor)
    other = PrismDecoder(cfg)
    other.load_state_dict(model.state_dict())
    return other.to(next(model.parameters()).device).eval()


# The config sections the evaluation reads: its own, and the data that holds the run's validation
# documents; the model is the checkpoint's, and training settings are history
READ_SECTIONS = ("long_context", "data")


def measure_unit(
    model: PrismDecoder,
    picked: Picked,
    settings: Settings,
    query_block: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Loss by position bucket and attention distance per layer of `model` on the picked windows,
    a batch of one document at a time."""
    acc = DistanceAccumulator()
    total = 0  # loss by position, summed over the windows
    for i, window in enumerate(picked.windows):
        total = total + measure_window(model, torch.from_numpy(window), acc, query_block)
        if progress is not None:
            progress(i + 1, len(picked.windows))
    position_loss = (total / len(picked.windows)).numpy()
    length = int(picked.windows.shape[1]) - 1
    edges = bucket_edges(length, settings.buckets)
    return {
        "loss": float(position_loss.mean()),
        "bucket_edges": edges,
        "bucket_loss": bucket_means(position_loss, edges),
        # Eq. 1's Q = {floor(T/2)+1..T}, 1-based
        "query_positions_1based": [length // 2 + 1, length],
        "D": acc.per_layer(),
        "D_per_head": acc.per_head(),
    }


def evaluate_to_file(
    checkpoint: str,
    out: str | Path,
    overrides: list[str] | None = None,
    scale: str | None = None,
    device: str = "auto",
    query_block: int = 256,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Measure one checkpoint at every unit of its run's long_context section (with `overrides`)
    and write `out`. Bad input raises a one-sentence error before anything is written."""
    from prism.cluster import require_single_process
    from prism.runs.checkpoint import load_model

    require_single_process("long_context.py")
    device = pick_device(device, LongContextError)
    overrides = list(overrides or [])
    for item in overrides:  # refuse an override the evaluation would not read (e.g. model.seq_len)
        if item.split("=", 1)[0].strip().split(".", 1)[0] not in READ_SECTIONS:
            raise LongContextError(
                f"{item} is not read by the long-context evaluation: the model and its RoPE are the "
                f"checkpoint's (long_context.rope_scalings and long_context.rope_factor choose the "
                f"reads); give {' or '.join(s + '.*' for s in READ_SECTIONS)} keys only."
            )
    if not Path(checkpoint).exists():
        raise LongContextError(f"checkpoint {checkpoint} does not exist.")
    run = run_config_from(read_meta(checkpoint), scale, overrides)
    if run is None:
        raise LongContextError(
            f"{checkpoint} names no run config (a .ckpt holds it; exported weights find it in the "
            f"config.yaml of their run folder); pass --scale S with the run's settings."
        )
    model, meta = load_model(checkpoint)
    if model.cfg.rope_scaling != "none" and model.cfg.rope_factor != 1:
        # each unit sets its own scaling and factor: weights trained under one would be misread
        raise LongContextError(
            f"{checkpoint} was trained with model.rope_scaling={model.cfg.rope_scaling} at factor "
            f"{model.cfg.rope_factor:g}; the long-context evaluation reads weights trained with plain "
            f"RoPE (model.rope_scaling=none, or factor 1) only."
        )
    settings = settings_for(
        run.long_context, model.cfg.seq_len, run.data.val_tokens, tuple(head_widths(model.cfg))
    )
    documents = Documents(settings, run)
    picked = {length: documents.pick(length) for length in settings.lengths}  # refusals first

    stat = weights_path(checkpoint).stat()
    reuse = {  # units an earlier attempt finished, by fingerprint (the result file, then the partial)
        entry["fingerprint"]: entry
        for doc in LONG_CONTEXT.earlier(Path(out), result_too=True)
        for entry in doc["results"]
        if isinstance(entry, dict) and entry.get("fingerprint")
    }
    model = model.to(device).eval()
    header = {
        **describe(checkpoint, model, meta, run),
        "seq_len": model.cfg.seq_len,
        "settings": asdict(settings),
        "file_stat": [stat.st_size, stat.st_mtime_ns],
    }
    results: list[dict] = []
    done: dict[tuple, dict] = {}  # (length, effective choice) -> its measurement, shared
    measured = {"weights": header["file_stat"], "buckets": settings.buckets}
    for unit in settings.units():
        p = picked[unit.length]
        fingerprint = stable_hash({**measured, "documents": p.sha256, "rope": unit.effective})
        key = (unit.length, unit.effective)
        if fingerprint in reuse:
            entry = dict(reuse[fingerprint])
        elif key in done:
            entry = dict(done[key])
        else:
            name = f"{unit.length} tokens, {unit.scaling}"
            bar = (lambda i, n, name=name: progress(name, i, n)) if progress else None
            entry = measure_unit(with_rope(model, *unit.effective), p, settings, query_block, bar)
        entry.update(
            length=unit.length,
            rope_scaling=unit.scaling,
            rope_factor=unit.factor,
            documents=p.describe(),
            fingerprint=fingerprint,
        )
        done[key] = entry
        results.append(entry)
        LONG_CONTEXT.keep(out, {**header, "results": results})
    doc = {**header, "results": results, "complete": True}
    LONG_CONTEXT.finish(out, records.LongContext(**doc))
    return doc


def result_table(doc: dict):
    """The mean loss by length under each RoPE scaling choice, as a rich table."""
    from rich.table import Table

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
