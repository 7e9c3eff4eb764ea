"""Attention distance over checkpoints on the same fingerprinted windows, and ΔD_l against the
uniform checkpoint of the same seed, mean ± s.d. over seeds (paper Figure 4; docs/evaluation.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from prism.errors import PrismError, cause
from prism.hardware import pick_device
from prism.measure.analysis.attention_distance import attention_distance
from prism.runs import records
from prism.runs.checkpoint import weights_path
from prism.runs.layout import run_config_path_beside
from prism.runs.resumable import ATTENTION
from prism.stats import mean, sample_sd


class AnalysisError(PrismError, ValueError):
    """Input that cannot be analysed; the message names it."""


def fingerprint(windows: torch.Tensor) -> str:
    """sha256 of the token ids, so every entry of analysis.json proves which sequences it saw."""
    return hashlib.sha256(windows.to(torch.int64).contiguous().cpu().numpy().tobytes()).hexdigest()


def read_meta(path: str | Path) -> dict:
    """A checkpoint's metadata without its weights. Exported weights hold no run config: theirs is
    the config.yaml beside them in the run folder, when it is that run's (the same config_hash)."""
    from omegaconf import OmegaConf

    from prism.runs.checkpoint import read_meta as checkpoint_meta
    from prism.runs.identity import stable_hash, training_identity

    meta = checkpoint_meta(path)
    if isinstance(meta.get("run"), dict):
        return meta
    weights = weights_path(path)
    saved = run_config_path_beside(weights)
    if not saved.is_file():
        return meta
    try:
        run = OmegaConf.to_container(OmegaConf.load(saved), resolve=True)  # as identity.saved_identity
        digest = stable_hash(training_identity(run))
    except Exception as exc:  # unreadable YAML, or a config this kit cannot resolve
        raise AnalysisError(
            f"{saved}, the run config beside {weights.name}, cannot be read ({cause(exc)})."
        ) from None
    config_hash = meta.get("config_hash")
    if config_hash is not None and digest != config_hash:
        raise AnalysisError(
            f"{saved} is not the config of {weights} (config_hash {digest}, the weights record "
            f"{config_hash}); restore the run's own config.yaml or pass --scale S (plus data overrides)."
        )
    return {**meta, "run": run}


def run_config_from(meta: dict, scale: str | None, overrides: list[str]):
    """The RunConfig a checkpoint was trained with (`meta["run"]`), or the --scale config."""
    from prism.config.schema import config_from_dict, load_config

    run = meta.get("run")
    if not isinstance(run, dict):
        return load_config(scale, overrides) if scale else None
    return config_from_dict(run, overrides)


def describe(path: str, model, meta: dict, run) -> dict:
    """Scale, schedule and seed of a checkpoint, from its metadata where it has them."""
    cfg = model.cfg
    own = run is not None and isinstance(meta.get("run"), dict)  # the checkpoint names its run
    seed = meta.get("seed")
    return {
        "path": str(path),
        "scale": meta.get("scale") or (run.scale if own else None),
        "schedule": "uniform" if cfg.schedule.is_uniform else (meta.get("schedule") or cfg.schedule_name),
        "heads": list(cfg.heads),
        "seed": run.train.seed if seed is None and own else seed,
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
        ref = uniform.get(e["seed"])
        if e["schedule"] == "uniform" or ref is None:
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
        cols = list(zip(*d["per_seed"].values()))
        d["mean"] = [mean(col) for col in cols]
        d["std"] = [sample_sd(col) for col in cols] if len(d["per_seed"]) > 1 else None
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
    """Measure D for each checkpoint on `windows` and form the deltas, reusing the entries of
    `previous` for unchanged checkpoints; `on_entry(sha, entries)` follows each checkpoint."""
    from prism.runs.checkpoint import load_model

    sha = fingerprint(windows)
    same = previous and previous.get("sequences_sha256") == sha
    reuse = {e["path"]: e for e in previous.get("checkpoints", [])} if same else {}
    entries, shapes = [], set()
    for i, path in enumerate(checkpoints):
        stat = weights_path(path).stat()
        key = [stat.st_size, stat.st_mtime_ns]
        if reuse.get(path, {}).get("file_stat") == key:
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


# ----- one call: checkpoints in, analysis.json out ------------------------------------------------
def load_windows(windows_path: str | None, run, n: int) -> torch.Tensor:
    """n token windows: from a torch.save'd (N, seq_len+1) tensor, else the run's held-out set."""
    if windows_path:
        try:
            windows = torch.load(windows_path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise AnalysisError(
                f"--windows {windows_path} could not be read as a saved tensor ({exc})."
            ) from None
        if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.dtype.is_floating_point:
            raise AnalysisError(
                f"--windows {windows_path} must hold an integer tensor of shape (N, seq_len+1)."
            )
        if windows.size(0) < n:
            raise AnalysisError(
                f"--windows {windows_path} holds {windows.size(0)} windows but --sequences {n} "
                "were asked for."
            )
        return windows[:n].long()
    if run is None:
        raise AnalysisError(
            "no checkpoint names its run config (a .ckpt holds it; exported weights find it in "
            "the config.yaml of their run folder), so the validation data is unknown; pass "
            "--scale S (plus data overrides) or --windows FILE."
        )
    from prism.data import heldout_windows

    return heldout_windows(run, n)


def _previous(out: Path) -> dict:
    """Entries of an earlier (possibly interrupted) analysis of the same windows, to reuse."""
    previous: dict = {"checkpoints": []}
    for doc in ATTENTION.earlier(out, result_too=True):
        if doc.get("sequences_sha256"):
            if previous.get("sequences_sha256") not in (None, doc["sequences_sha256"]):
                continue
            previous["sequences_sha256"] = doc["sequences_sha256"]
            previous["checkpoints"] += doc["checkpoints"]
    return previous


def analyze_to_file(
    checkpoints: list[str],
    out: str | Path,
    *,
    sequences: int | None = None,
    scale: str | None = None,
    overrides: list[str] | None = None,
    windows_path: str | None = None,
    batch_size: int = 4,
    device: str = "auto",
    progress=None,
) -> dict:
    """Measure every checkpoint and write `out` atomically, each finished one kept in `out`.partial
    for a resume; bad input raises AnalysisError (or the checkpoint/config/data error)."""
    from prism.cluster import require_single_process

    require_single_process("analyze.py")
    device = pick_device(device, AnalysisError)
    missing = [c for c in checkpoints if not Path(c).exists()]
    if missing:
        raise AnalysisError(f"checkpoint {missing[0]} does not exist.")
    runs = [run_config_from(read_meta(c), scale, list(overrides or [])) for c in checkpoints]  # metadata only
    data_run = next((r for r in runs if r is not None), None)
    n = sequences or (data_run.analysis.sequences if data_run else 64)
    windows = load_windows(windows_path, data_run, n)
    result = analyze(
        checkpoints,
        windows,
        device,
        batch_size,
        runs,
        _previous(Path(out)),
        progress or (lambda *_: None),
        on_entry=lambda sha, entries: ATTENTION.keep(out, {"sequences_sha256": sha, "checkpoints": entries}),
    )
    result["scale"] = result["scale"] or scale or (data_run.scale if data_run else None)
    ATTENTION.finish(out, records.Analysis(**result))
    return result


def result_table(result: dict):
    """The per-layer distances and their deltas, as a rich table."""
    from rich.table import Table

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
