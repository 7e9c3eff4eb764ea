"""What an export reads: the weights a `--checkpoint` argument names, the finished run they belong
to and that run's zero-shot results (docs/export.md, "What `--checkpoint` may be")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from prism.errors import PrismError
from prism.runs.checkpoint import CheckpointError, read_meta, weights_path
from prism.runs.identity import final_weights, read_summary
from prism.runs.layout import (
    CHECKPOINTS_DIR,
    RUN_CONFIG_NAME,
    SUMMARY_NAME,
    WEIGHTS_NAME,
    eval_result,
    last_checkpoint,
    scale_folder,
    seed_of,
)
from prism.runs.records import EvalResult, TrainSummary


class ExportError(PrismError, ValueError):
    """A bad export request; the message is one sentence naming the bad value and what is valid."""


@dataclass
class Source:
    weights: Path  # the .safetensors or .ckpt file the weights are read from
    meta: dict  # read_meta(weights): scale, schedule, seed, step, ...
    run_dir: Path | None  # the finished run folder these weights are the final weights of
    summary: TrainSummary | None  # that run's train_summary.json
    run_config: dict | None  # that run's config.yaml


def _run_config(run_dir: Path) -> dict | None:
    try:
        doc = yaml.safe_load((run_dir / RUN_CONFIG_NAME).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return doc if isinstance(doc, dict) else None


def _owning_run(weights: Path) -> Path | None:
    """The run folder a weights file sits in by the kit's layout, if any."""
    if weights.name == WEIGHTS_NAME:
        return weights.parent
    if weights.parent.name == CHECKPOINTS_DIR:
        return weights.parent.parent
    return None


def resolve(checkpoint: str | Path) -> Source:
    """Check the argument and find everything the export reads, before any weights are loaded."""
    path = Path(checkpoint)
    if not path.exists():
        raise ExportError(
            f"checkpoint {path} does not exist; pass a run folder "
            f"(runs/<scale>/<schedule>/seed<k>) or a .ckpt or .safetensors file."
        )
    if path.is_dir() and any(
        (path / name).exists() for name in (SUMMARY_NAME, RUN_CONFIG_NAME, CHECKPOINTS_DIR)
    ):
        summary = read_summary(path)  # whatever config it was trained with: an export takes it as it is
        if summary is None:
            raise ExportError(
                f'run {path} is not finished: it has no {SUMMARY_NAME} with "finished": true '
                f"(training writes it last); finish the run with reproduce/train.py, or pass one "
                f"of its checkpoint files to export that checkpoint."
            )
        weights = final_weights(path)
        if weights is None:
            raise ExportError(
                f"run {path} is finished but holds neither {WEIGHTS_NAME} nor "
                f"{last_checkpoint(Path())}; there are no final weights to export."
            )
        return Source(weights, _meta(weights), path, summary, _run_config(path))
    try:
        weights = weights_path(path)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    meta = _meta(weights)
    run_dir = _owning_run(weights)
    summary = read_summary(run_dir) if run_dir is not None else None
    # The run's summary describes its final weights only: a step checkpoint gets no final loss.
    if summary is not None and meta.get("step") == summary.steps:
        return Source(weights, meta, run_dir, summary, _run_config(run_dir))
    return Source(weights, meta, None, None, None)


def _meta(weights: Path) -> dict:
    try:
        return read_meta(weights)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    except Exception as exc:  # a cut-short or foreign file: torch/safetensors say why
        raise ExportError(f"checkpoint {weights} could not be read ({exc}).".replace("\n", " ")) from None


# ----- the run's zero-shot results -----------------------------------------------------------
def standard_eval_path(source: Source) -> Path | None:
    """results/<scale>/eval/<schedule>/seed<k>.json for a run at runs/<scale>/<schedule>/seed<k>,
    with runs_dir and results_dir taken from the run's own config (relative paths are relative
    to the folder training ran in, found by stripping runs_dir/<scale>/<schedule>/seed<k>)."""
    if source.run_dir is None or not source.run_config:
        return None
    runs_dir = Path(str(source.run_config.get("runs_dir", "runs")))
    results_dir = Path(str(source.run_config.get("results_dir", "results")))
    run = source.run_dir.resolve()
    tail = (*runs_dir.parts, run.parents[1].name, run.parent.name, run.name)
    if results_dir.is_absolute():
        root = Path("/")
    elif not runs_dir.is_absolute() and run.parts[-len(tail) :] == tail:
        root = Path(*run.parts[: -len(tail)])
    else:
        return None
    scale, schedule, seed = run.parents[1].name, run.parent.name, seed_of(run.name)
    if seed is None:
        return None
    path = eval_result(scale_folder(root / results_dir, scale), schedule, seed)
    return path if path.is_file() else None


def read_eval(path: Path, source: Source, explicit: bool) -> EvalResult | None:
    """An evaluation record of these weights, or None (an automatically found file that belongs
    to another checkpoint is ignored; an explicit --eval that does is an error)."""
    result = EvalResult.read(path, [])
    if result is None or not result.tasks:
        if explicit:
            raise ExportError(
                f"evaluation file {path} is not an evaluation record (a JSON object "
                f'with a non-empty "tasks" map, as reproduce/evaluate.py writes).'
            )
        return None
    who = checkpoint_identity(source)
    for key in ("scale", "schedule", "seed"):
        said = getattr(result, key, None)  # the weights' metadata evaluate.py copies in
        if who.get(key) is not None and said is not None and said != who[key]:
            if explicit:
                raise ExportError(
                    f"evaluation file {path} is for {key} {said!r}, but the "
                    f"checkpoint is {key} {who[key]!r}; pass the evaluation of this "
                    f"checkpoint."
                )
            return None
    return result


def checkpoint_identity(source: Source) -> dict:
    """scale / schedule / seed of the checkpoint, from the run summary or the weights' metadata."""
    said = {k: getattr(source.summary, k, None) for k in ("scale", "schedule", "seed")}
    return {k: source.meta.get(k) if v is None else v for k, v in said.items()}
