"""Attention distance over checkpoints and ΔD_l against the uniform baseline (paper Figure 4).

Every checkpoint is measured on the very same token windows (drawn once from the held-out
validation set, fingerprinted in the output); ΔD_l = D_l(schedule) − D_l(uniform) is formed per
seed between checkpoints of the same scale and seed, then averaged over seeds (sample s.d.).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from pathlib import Path

import torch

from prism.analysis.attention_distance import attention_distance
from prism.checkpoint import weights_path


class AnalysisError(ValueError):
    """Input that cannot be analysed; the message names it."""


def fingerprint(windows: torch.Tensor) -> str:
    """sha256 of the token ids, so every entry of analysis.json proves which sequences it saw."""
    data = windows.to(torch.int64).contiguous().cpu().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def read_meta(path: str | Path) -> dict:
    """A checkpoint's metadata without its weights; unreadable files are left to load_model."""
    from prism.checkpoint import read_meta as checkpoint_meta

    try:
        return checkpoint_meta(path)
    except Exception:
        return {}


def run_config_from(meta: dict, scale: str | None, overrides: list[str]):
    """The RunConfig a checkpoint was trained with (`meta["run"]`), or the --scale config."""
    from prism.config import config_from_dict, load_config

    run = meta.get("run") if isinstance(meta, dict) else None
    if not isinstance(run, dict):
        return load_config(scale, overrides) if scale else None
    return config_from_dict(run, overrides)


def describe(path: str, model, meta: dict, run) -> dict:
    """Scale, schedule and seed of a checkpoint, from its metadata where it has them."""
    cfg = model.cfg
    seed = meta.get("seed")
    if seed is None and run is not None and isinstance(meta.get("run"), dict):
        seed = run.train.seed
    return {
        "path": str(path),
        "scale": meta.get("scale")
        or (run.scale if run is not None and isinstance(meta.get("run"), dict) else None),
        "schedule": "uniform" if cfg.schedule.is_uniform else (meta.get("schedule") or cfg.schedule_name),
        "heads": list(cfg.heads),
        "seed": seed,
        "shape": [cfg.n_layer, cfg.d_model, cfg.h_base],
    }


def deltas(entries: list[dict]) -> dict:
    """ΔD_l per non-uniform schedule: per seed against the uniform checkpoint of the same seed,
    then mean and sample s.d. over seeds (s.d. is null for a single seed)."""
    uniform: dict = {}
    for e in entries:
        if e["schedule"] == "uniform":
            if e["seed"] in uniform:
                raise AnalysisError(
                    f"two uniform checkpoints of seed {e['seed']} were given "
                    f"({uniform[e['seed']]['path']}, {e['path']}); pass one per seed."
                )
            uniform[e["seed"]] = e
    out: dict[str, dict] = {}
    for e in entries:
        if e["schedule"] == "uniform":
            continue
        ref = uniform.get(e["seed"])
        if ref is None:
            continue
        if ref["sequences_sha256"] != e["sequences_sha256"]:
            raise AnalysisError(f"{e['path']} and {ref['path']} were measured on different sequences.")
        d = out.setdefault(e["schedule"], {"per_seed": {}, "seeds": []})
        if str(e["seed"]) in d["per_seed"]:
            raise AnalysisError(
                f"two checkpoints of schedule {e['schedule']!r} and seed {e['seed']} "
                f"were given ({e['path']} is the second); pass one per seed."
            )
        d["per_seed"][str(e["seed"])] = [a - b for a, b in zip(e["D"], ref["D"])]
        d["seeds"].append(e["seed"])
    for d in out.values():
        rows = list(d["per_seed"].values())
        n = len(rows)
        d["mean"] = [sum(col) / n for col in zip(*rows)]
        d["std"] = (
            [math.sqrt(sum((x - m) ** 2 for x in col) / (n - 1)) for col, m in zip(zip(*rows), d["mean"])]
            if n > 1
            else None
        )
    return out


def analyze(
    checkpoints: list[str],
    windows: torch.Tensor,
    device: str = "cpu",
    batch_size: int = 4,
    runs: list | None = None,
    previous: dict | None = None,
    progress=None,
    on_entry=None,
) -> dict:
    """Measure D for each checkpoint on `windows` and form the deltas. `previous` (an earlier
    analysis.json, or the partial file of an interrupted run) lets entries for unchanged
    checkpoints on the same sequences be reused; `on_entry(sha, entries)` is called after each
    checkpoint so an interrupted run can resume."""
    from prism.checkpoint import load_model

    sha = fingerprint(windows)
    reuse = {}
    if previous and previous.get("sequences_sha256") == sha:
        reuse = {e["path"]: e for e in previous.get("checkpoints", [])}
    entries, shapes = [], set()
    for i, path in enumerate(checkpoints):
        stat = weights_path(path).stat()
        key = [stat.st_size, stat.st_mtime_ns]
        if path in reuse and reuse[path].get("file_stat") == key:
            entries.append(reuse[path])
            shapes.add(tuple(reuse[path]["shape"]))
            continue
        model, meta = load_model(path)
        entry = describe(path, model, meta, runs[i] if runs else None)
        shapes.add(tuple(entry["shape"]))
        if len(shapes) > 1:
            raise AnalysisError(
                f"{path} has shape {entry['shape']} but earlier checkpoints have "
                f"{sorted(shapes - {tuple(entry['shape'])})}; analyse one scale at a time."
            )
        if windows.size(1) != model.cfg.seq_len + 1:
            raise AnalysisError(
                f"{path} has seq_len {model.cfg.seq_len} but the sequences are "
                f"windows of {windows.size(1)} tokens; expected seq_len + 1."
            )
        model.to(device)
        cb = (lambda done, total, name=Path(path).name: progress(name, done, total)) if progress else None
        entry.update(attention_distance(model, windows, batch_size=batch_size, device=device, progress=cb))
        entry.update(sequences_sha256=sha, file_stat=key)
        entries.append(entry)
        if on_entry is not None:
            on_entry(sha, entries)
        del model
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    scales = {e["scale"] for e in entries if e["scale"]}
    T = int(windows.size(1)) - 1
    return {
        "scale": scales.pop() if len(scales) == 1 else None,
        "sequences": int(windows.size(0)),
        "seq_len": T,
        "sequences_sha256": sha,
        # Eq. 1's Q = {floor(T/2)+1..T} in 1-based positions = rows floor(T/2)..T-1 0-based.
        "query_positions_1based": [T // 2 + 1, T],
        "units": "tokens",
        "checkpoints": entries,
        "delta": deltas(entries),
    }


# ----- command line ----------------------------------------------------------------------------
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
        "--scale", default=None, help="config to use when a checkpoint carries no run config in its metadata"
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


def load_windows(args: argparse.Namespace, run, n: int) -> torch.Tensor:
    if args.windows:
        try:
            windows = torch.load(args.windows, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise AnalysisError(
                f"--windows {args.windows} could not be read as a saved tensor ({exc})."
            ) from None
        if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.dtype.is_floating_point:
            raise AnalysisError(
                f"--windows {args.windows} must hold an integer tensor of shape (N, seq_len+1)."
            )
        if windows.size(0) < n:
            raise AnalysisError(
                f"--windows {args.windows} holds {windows.size(0)} windows but "
                f"--sequences {n} were asked for."
            )
        return windows[:n].long()
    if run is None:
        raise AnalysisError(
            "the checkpoints carry no run config, so the validation data is unknown; "
            "pass --scale S (plus data overrides) or --windows FILE."
        )
    try:
        from prism.data import heldout_windows
    except ImportError:
        raise AnalysisError(
            "prism.data.heldout_windows is not available in this checkout; "
            "pass --windows FILE with pre-tokenized windows instead."
        ) from None
    return heldout_windows(run, n)


def main(argv: list[str] | None = None) -> int:
    import json

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from prism.checkpoint import CheckpointError
    from prism.config import ConfigError
    from prism.data import DataError
    from prism.io import atomic_write_json

    args = parse_args(argv)
    console = Console(stderr=True)
    overrides = list(args.overrides) + ([f"data.path={args.data_dir}"] if args.data_dir else [])
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        from prism.cluster import require_single_process

        require_single_process("analyze.py")
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise AnalysisError(
                f"--device {device} was asked for but no CUDA device is visible; use --device cpu."
            )
        if args.batch_size < 1 or (args.sequences is not None and args.sequences < 1):
            raise AnalysisError("--batch-size and --sequences must be positive integers.")
        missing = [p for p in args.checkpoints if not Path(p).exists()]
        if missing:
            raise AnalysisError(f"checkpoint {missing[0]} does not exist.")
        runs = []
        for path in args.checkpoints:  # metadata only: weights are loaded one at a time later
            meta = read_meta(path)
            runs.append(run_config_from(meta, args.scale, overrides))
        data_run = next((r for r in runs if r is not None), None)
        n = args.sequences or (data_run.analysis.sequences if data_run else 64)
        windows = load_windows(args, data_run, n)
        previous = {"checkpoints": []}
        partial = Path(args.out).with_name(Path(args.out).name + ".partial")
        for earlier in (Path(args.out), partial):  # resume: reuse finished checkpoints
            try:
                doc = json.loads(earlier.read_text()) if earlier.is_file() else None
            except json.JSONDecodeError:
                doc = None
            if doc and doc.get("sequences_sha256"):
                if previous.get("sequences_sha256") not in (None, doc["sequences_sha256"]):
                    continue
                previous["sequences_sha256"] = doc["sequences_sha256"]
                previous["checkpoints"] += doc.get("checkpoints", [])

        def save_partial(sha, entries):
            atomic_write_json(partial, {"sequences_sha256": sha, "checkpoints": entries})

        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("attention distance", total=None)

            def progress(name, done, total):
                bar.update(task, description=f"{name}", completed=done, total=total)

            result = analyze(
                args.checkpoints,
                windows,
                device,
                args.batch_size,
                runs,
                previous,
                progress,
                on_entry=save_partial,
            )
    except (AnalysisError, CheckpointError, ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["scale"] = result["scale"] or args.scale or (data_run.scale if data_run else None)
    atomic_write_json(args.out, result)
    partial.unlink(missing_ok=True)
    table = Table(
        title=f"Attention distance D_l (tokens), {result['sequences']} sequences x {result['seq_len']}"
    )
    table.add_column("layer", justify="right")
    for e in result["checkpoints"]:
        table.add_column(f"{e['schedule']} s{e['seed']}", justify="right")
    for name in result["delta"]:
        table.add_column(f"Δ {name}", justify="right")
    for layer in range(len(result["checkpoints"][0]["D"])):
        row = [str(layer)] + [f"{e['D'][layer]:.1f}" for e in result["checkpoints"]]
        for d in result["delta"].values():
            row.append(f"{d['mean'][layer]:+.1f}" + (f" ± {d['std'][layer]:.1f}" if d["std"] else ""))
        table.add_row(*row)
    console.print(table)
    console.log(f"wrote {args.out}")
    return 0
