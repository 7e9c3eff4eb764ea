"""The files that runs and stages write (docs/outputs.md), one typed record each, shared by the writer
(`write`) and every reader (`read`, `check`); a bad file is refused in one sentence (docs/report.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from prism.io import atomic_write_json, problem, read_json


class Unusable(Exception):
    """Why a document cannot be used: a fragment that follows the file's name in a sentence."""


def shown(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# ----- value types: each refuses with what belongs ------------------------------------------------
def _value_type(what: str, ok) -> PlainValidator:
    def check(v):
        if not ok(v):
            raise PydanticCustomError("value", "{what}", {"what": what})
        return v

    return PlainValidator(check)


def _number(low: float = 0.0, above: bool = False, high: float | None = None, integer: bool = False):
    """A finite number ≥ low (> low with `above`), at most `high`; an integer with `integer`."""
    kind = "an integer" if integer else "a number"
    what = f"{kind} {'>' if above else '≥'} {low:g}" + (f" and ≤ {high:g}" if high is not None else "")

    def ok(v) -> bool:
        if not isinstance(v, int if integer else (int, float)) or isinstance(v, bool):
            return False
        try:
            x = float(v)
        except OverflowError:  # an integer too large for any float the report computes with
            return False
        return (x > low if above else x >= low) and (high is None or x <= high)

    return _value_type(what, ok)


# int | float: a number is written back as it was read (an int stays an int)
Loss = Annotated[int | float, _number()]  # nats per token: finite and ≥ 0
Positive = Annotated[int | float, _number(above=True)]  # a rate or a duration
Count = Annotated[int, _number(integer=True)]  # ≥ 0
Size = Annotated[int, _number(above=True, integer=True)]  # parameters, tokens, lengths
Fraction = Annotated[int | float, _number(high=1.0)]  # an accuracy or a utilisation
Signed = Annotated[int | float, _number(low=-math.inf)]  # a difference: either sign
Text = Annotated[str, _value_type("text", lambda v: isinstance(v, str))]
# text, a number, true/false or null: a value shown as it is, or compared
Scalar = Annotated[
    Any, _value_type("text or a number", lambda v: v is None or isinstance(v, (str, int, float)))
]
Finished = Annotated[bool, _value_type("True", lambda v: v is True)]


def _at_most(field: str, values: list, bound: float) -> None:
    bad = next((x for x in values if x > bound), None)
    if bad is not None:
        raise _inconsistent(field, f"with {bad!r}, more than the {bound}-token window it was measured in")


def _inconsistent(field: str, text: str, **extra) -> PydanticCustomError:
    """`field` of this record holds a value that contradicts the rest of it: `has field <text>`."""
    return PydanticCustomError("inconsistent", "{text}", {"field": field, "text": text, **extra})


# ----- the base: reading, checking, writing -------------------------------------------------------
class Record(BaseModel):
    """A JSON object with typed fields; other keys are kept unchecked for their type."""

    model_config = ConfigDict(extra="allow")
    # list fields refused empty (None) or of another length than the number, before any other check
    list_lengths: ClassVar[dict[str, int | None]] = {}

    @model_validator(mode="after")
    def _list_lengths(self) -> Self:
        for field, length in self.list_lengths.items():
            values = getattr(self, field)
            if values is not None and length is None and not values:
                raise _inconsistent(field, "", empty=True)
            if values is not None and length is not None and len(values) != length:
                raise _inconsistent(field, f"with {len(values)} items, where {length} belong")
        return self

    @classmethod
    def check(cls, doc: Any) -> Self:
        """The record `doc` holds; Unusable saying what is wrong, in one fragment, otherwise."""
        bad = _first_not_finite(doc)
        if bad is not None:
            raise Unusable(f"has {_where(bad[0])} = {bad[1]!r}, where a finite number belongs")
        if not isinstance(doc, dict):
            raise Unusable("does not hold a JSON object")
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            raise Unusable(_fragment(exc)) from None

    @classmethod
    def read(cls, path: str | Path, problems: list[str], where: str | None = None) -> Self | None:
        """The record in `path`; None, with a sentence naming it as `where` in `problems`, if unusable."""
        doc = read_object(path, problems, where)
        return None if doc is None else cls.validated(doc, problems, where or str(path))

    @classmethod
    def validated(cls, doc: Any, problems: list[str], where: str) -> Self | None:
        try:
            return cls.check(doc)
        except Unusable as exc:
            problems.append(problem(where, str(exc)))
            return None

    def as_json(self) -> dict:
        """The document: the fields the writer set, and any keys the record does not name."""
        return self.model_dump(mode="json", exclude_unset=True)

    def write(self, path: str | Path) -> None:
        atomic_write_json(path, self.as_json())


def read_object(path: str | Path, problems: list[str], where: str | None = None) -> dict | None:
    """The JSON object in `path`, unchecked; None, named in `problems`, when unreadable."""
    where = where or str(path)
    if Path(path).is_dir():
        problems.append(problem(where, "is a folder, not a file"))
        return None
    try:
        return read_json(path, problems, where)
    except RecursionError:  # nested deeper than Python's reader goes
        problems.append(problem(where, "could not be read (nested too deeply)"))
        return None


def _where(path: str) -> str:
    return f"`{path}`" if path else "the document"


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TYPES = {
    **dict.fromkeys(("model_type", "model_attributes_type", "dict_type"), "an object"),
    "list_type": "a list",
}


def _fragment(exc: ValidationError) -> str:
    """pydantic's first error as the fragment after a file's name (one object's missing keys together)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    if first["type"] == "missing":
        parent = loc[:-1]
        keys = [e["loc"][-1] for e in errors if e["type"] == "missing" and tuple(e["loc"][:-1]) == parent]
        inside = f" in {_where(_path(parent))}" if parent else ""
        return f"lacks {', '.join(f'`{k}`' for k in keys)}{inside}"
    if first["type"] == "inconsistent":
        ctx = first["ctx"]
        where = _path((*loc, ctx["field"]))
        return f"has an empty list `{where}`" if ctx.get("empty") else f"has `{where}` {ctx['text']}"
    what = first["ctx"]["what"] if first["type"] == "value" else _TYPES.get(first["type"])
    if what is None:  # a rule of pydantic's own: its message
        return f"has {_where(_path(loc))} = {shown(first['input'])}: {first['msg']}"
    return f"has {_where(_path(loc))} = {shown(first['input'])}, where {what} belongs"


def _first_not_finite(doc) -> tuple[str, object] | None:
    """The path and value of the first NaN or infinite number anywhere in `doc` (no recursion: a
    deeply nested file is no reason for a traceback)."""
    stack: list[tuple[str, object]] = [("", doc)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return path, v
        if isinstance(v, dict):
            stack += [(f"{path}.{k}" if path else str(k), x) for k, x in reversed(list(v.items()))]
        elif isinstance(v, list):
            stack += [(f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v)))]
    return None


# ----- a training run's folder --------------------------------------------------------------------
Heads = list[Size]
Environment = dict[str, Scalar]  # versions and devices, compared as they are


class ValPoint(Record):
    step: Count
    tokens: Count
    val_loss: Loss | None
    wall_clock_s: Loss = None


class Throughput(Record):
    tokens_per_s: Positive | None = None
    tokens_per_s_per_device: Positive | None = None
    step_time_s: Positive | None = None
    mfu: Loss | None = None
    peak_memory_bytes: Count | None = None
    hardware: Text | None = None
    num_devices: Size | None = None


class RankTimes(Record):
    """One rank's mean seconds per optimizer step (prism.train.stragglers)."""

    rank: Count
    node: Text | None = None
    own_s: Loss | None = None  # data wait + forward pass
    data_s: Loss | None = None
    step_s: Loss | None = None


class InitFrom(Record):
    """A context extension's source run (prism.train.extension)."""

    run: Text | None = None
    scale: Text | None = None
    schedule: Text | None = None
    seed: Count | None = None
    seq_len: Size | None = None
    tokens_seen: Size | None = None


class TrainSummary(Record):
    """train_summary.json, the finished run's marker (prism.train.callbacks.summary; older: fewer keys)."""

    finished: Finished
    scale: Text = None
    schedule: Text = None
    seed: Count = None
    heads: Heads | None = None
    n_params: Size | None = None
    flops_per_token: Size | None = None
    steps: Count | None = None
    tokens_seen: Size | None = None
    final_val_loss: Loss | None = None
    min_val_loss: Loss | None = None
    min_val_step: Count | None = None
    min_val_tokens: Count | None = None
    val_curve: list[ValPoint] | None = None
    throughput: Throughput | None = None
    wall_clock_s: Positive | None = None
    environment: Environment | None = None
    earlier_environments: list[Environment] | None = None
    init_from: InitFrom | None = None
    config_hash: Text | None = None
    # how the run was fed and split, shown as they are (prism.train.plan)
    data: dict[str, Any] | None = None
    batch_split: dict[str, Any] | None = None
    ddp: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    per_rank: list[RankTimes] | None = None  # the straggler line's means (train.straggler_every_steps)
    list_lengths = {"heads": None}

    @model_validator(mode="after")
    def _heads_and_curve(self) -> Self:
        """What a summary can check against itself: its numbers come from its own curve, and its
        tokens from a time no longer than the run took."""
        losses = [p.val_loss for p in self.val_curve or [] if p.val_loss is not None]
        if losses and self.final_val_loss is not None and self.final_val_loss != self.val_curve[-1].val_loss:
            raise _inconsistent(
                "final_val_loss", f"= {self.final_val_loss!r}, where its curve ends at {losses[-1]!r}"
            )
        if losses and self.min_val_loss is not None and self.min_val_loss != min(losses):
            raise _inconsistent(
                "min_val_loss", f"= {self.min_val_loss!r}, where its curve's lowest is {min(losses)!r}"
            )
        last = self.val_curve[-1].wall_clock_s if self.val_curve else None
        wall = self.wall_clock_s
        # written after the final validation; the export between them takes far less than the run
        if wall is not None and last is not None and not last - 0.001 <= wall <= 2 * last + 3600:
            text = (
                f"= {wall!r}, where its curve's last validation ran at {last!r} s (and the export after it)"
            )
            raise _inconsistent("wall_clock_s", text)
        rate = self.throughput.tokens_per_s if self.throughput else None
        # the steps alone, at the measured rate, cannot take a thousand times the whole run (a
        # resumed run's rate is its last session's: a slower card may have finished it)
        if rate and wall and self.tokens_seen and self.tokens_seen / rate > 1000 * wall:
            tokens = f"{self.tokens_seen:,} tokens"
            text = f"= {rate!r}, at which its {tokens} would take over a thousand times its {wall:g} s"
            raise _inconsistent("throughput.tokens_per_s", text)
        return self


class Milestone(Record):
    threshold: Loss
    step: Count | None = None
    tokens: Count | None = None  # 0: reached by the validation before the first step
    wall_clock_s: Loss | None = None


class Minimum(Record):
    val_loss: Loss | None = None
    step: Count | None = None
    tokens: Count | None = None


class Milestones(Record):
    """milestones.json (prism.train.callbacks.milestones)."""

    thresholds: list[Loss] | None = None
    milestones: list[Milestone] | None = None
    min: Minimum | None = None


class ModelShape(Record):
    n_layer: Size
    d_model: Size
    h_base: Size
    seq_len: Size = None


class Recipe(Record):
    global_batch_tokens: Size
    tokens: Size
    lr: Positive


class RunConfig(Record):
    """config.yaml: the keys Table 1 and the recipe comparison read (the rest: prism.config.schema)."""

    model: ModelShape
    train: Recipe
    data: dict[str, Any] | None = None
    schedule: Text = None
    schedules: dict[str, Scalar] | None = None

    @classmethod
    def read_yaml(cls, path: Path, problems: list[str], where: str) -> Self | None:
        from omegaconf import OmegaConf

        try:
            doc = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception as exc:  # a YAML or interpolation error of any kind: say so and carry on
            problems.append(problem(where, f"could not be read ({type(exc).__name__})"))
            return None
        if not isinstance(doc, dict):
            problems.append(problem(where, "does not hold a mapping"))
            return None
        return cls.validated(doc, problems, where)


# ----- zero-shot scores ---------------------------------------------------------------------------
class TaskScore(Record):
    acc: Fraction | None = None
    acc_norm: Fraction | None = None
    n: Count | None = None
    word_perplexity: Positive | None = None
    byte_perplexity: Positive | None = None
    bits_per_byte: Loss | None = None


Scores = dict[str, TaskScore]


class EvalResult(Record):
    """results/<scale>/eval/<schedule>/seed<k>.json (prism.eval.job)."""

    tasks: Scores
    data_source: Scalar = None
    limit: Positive | None = None
    semantics: Scalar = None
    batch_size: Size | None = None  # requests per forward pass: the speed, never the scores
    checkpoint: Text | None = None  # the weights scored, and whose they are (older kits: absent)
    scale: Text | None = None
    schedule: Text | None = None
    seed: Count | None = None


class CurvePoint(Record):
    tokens: Size
    tasks: Scores
    step: Count | None = None
    seconds: Loss | None = None


class ZeroShotCurve(Record):
    """zeroshot.json: scores at token milestones during training (prism.train.callbacks.zeroshot)."""

    every_tokens: Size
    tasks: list[Text]
    limit: Positive | None
    data_source: Text
    batch_size: Scalar
    semantics: Text
    milestones: list[CurvePoint]


# ----- the measuring stages -----------------------------------------------------------------------
class BenchSchedule(Record):
    heads: Heads | None = None
    train_tokens_per_s: Positive | None = None
    infer_tokens_per_s: Positive | None = None
    step_time_s_median: Positive | None = None
    step_time_s_spread: list[Positive] | None = None
    mfu: Loss | None = None
    peak_memory_bytes: Count | None = None
    ratio_to_uniform: Positive | None = None
    attention_backends: list[Any] | None = None
    n_params: Size | None = None
    flops_per_token: Size | None = None
    list_lengths = {"heads": None, "step_time_s_spread": 2}


class Bench(Record):
    """bench.json (prism.measure.bench)."""

    schedules: dict[str, BenchSchedule]
    num_devices: Size | None = None
    hardware: Text | None = None
    seq_len: Size | None = None
    steps: Size | None = None


class AnalysedCheckpoint(Record):
    schedule: Text
    seed: Count
    D: list[Loss]
    list_lengths = {"D": None}


class DistanceDelta(Record):
    mean: list[Signed] | None = None
    std: list[Loss] | None = None
    seeds: list[Count] | None = None


class Analysis(Record):
    """analysis.json (prism.measure.analysis)."""

    checkpoints: list[AnalysedCheckpoint]
    delta: dict[str, DistanceDelta] | None = None
    sequences: Size | None = None
    seq_len: Size | None = None

    @model_validator(mode="after")
    def _within_the_window(self) -> Self:
        """Distances, their changes and spreads are at most the window they were measured in."""
        if self.seq_len is None:
            return self
        for i, c in enumerate(self.checkpoints):
            _at_most(f"checkpoints[{i}].D", c.D, self.seq_len)
        for name, d in (self.delta or {}).items():
            _at_most(f"delta.{name}.mean", [abs(x) for x in d.mean or []], self.seq_len)
            _at_most(f"delta.{name}.std", d.std or [], self.seq_len)
        return self


class Documents(Record):
    sha256: Text
    count: Size
    where: Text
    origin: Scalar = None


class LongContextUnit(Record):
    length: Size
    rope_scaling: Text
    loss: Loss
    bucket_loss: list[Loss]
    bucket_edges: list[Count]
    D: list[Loss]
    documents: Documents
    list_lengths = {"bucket_loss": None, "bucket_edges": None}

    @model_validator(mode="after")
    def _buckets(self) -> Self:
        """What the types cannot say: the buckets span the window, one loss per bucket."""
        edges = self.bucket_edges
        if edges[0] != 0 or edges[-1] != self.length or any(a >= b for a, b in zip(edges, edges[1:])):
            raise _inconsistent("bucket_edges", f"= {shown(edges)}, not rising from 0 to its length")
        if len(self.bucket_loss) != len(edges) - 1:
            n = len(self.bucket_loss)
            raise _inconsistent("bucket_loss", f"with {n} values for {len(edges) - 1} buckets")
        return self


class LongContext(Record):
    """results/<scale>/long_context/<schedule>/seed<k>.json (prism.measure.long_context)."""

    complete: Finished
    seq_len: Size
    results: list[LongContextUnit]
    list_lengths = {"results": None}

    @model_validator(mode="after")
    def _some(self) -> Self:
        """Every unit measured the same model: one distance per layer, as many layers each."""
        for i, r in enumerate(self.results):
            _at_most(f"results[{i}].D", r.D, r.length)
        layers = {len(r.D) for r in self.results if r.D}
        if len(layers) > 1:
            raise _inconsistent("results", f"with {sorted(layers)} layers' distances in one model's units")
        return self


# ----- the report's scaling analysis --------------------------------------------------------------
# A number of the analysis: null where there is none (too many failed refits) or where an
# interval's side is unbounded (prism.report.scaling._num)
Number = Signed | None


class IntervalDoc(Record):
    """A fitted or measured number with its interval: `value` [`lo`, `hi`]."""

    value: Number
    lo: Number
    hi: Number


class ScalingRow(Record):
    """One scale: its size, training compute, and each schedule's seeds, mean and s.d. of the
    final loss; Δ (schedule − base) with its Welch interval, None with fewer than two seeds a side."""

    scale: Text
    n_params: Positive | None
    compute: Positive | None
    seeds: dict[str, Count]
    mean: dict[str, Number]
    sd: dict[str, Loss | None]
    delta: IntervalDoc | None
    withheld: Text | None = None  # why Δ is not shown: the scale's runs differ in recipe
    not_averaged: list[Text] | None = None  # schedules whose runs were not trained alike


class FitDoc(Record):
    """One law L = E + A·x^(−α) with intervals, and its rms residual at the measured scales."""

    E: IntervalDoc
    A: IntervalDoc
    alpha: IntervalDoc
    rms_residual: Loss | None


class LawsDoc(Record):
    """A schedule's loss against parameters (x = N / 10^9) and against compute (x = C / 10^18)."""

    vs_params: FitDoc
    vs_compute: FitDoc


class AtScale(Record):
    """Δ(N) from the fits (or, with `compute`, the compute multiplier) at a measured scale."""

    scale: Text
    n_params: Positive | None
    compute: Positive | None = None
    value: Number
    lo: Number
    hi: Number


class Prediction(Record):
    n_params: Positive | None
    delta: IntervalDoc
    extrapolation: Positive | None  # N over the largest measured N


class Curve(Record):
    """An interval along the band's grid of N."""

    value: list[Number]
    lo: list[Number]
    hi: list[Number]


class Band(Record):
    """The plots' curves: Δ(N), the multiplier and (under each schedule's name) its L(N)."""

    __pydantic_extra__: dict[str, Curve]
    n_params: list[Positive | None]
    delta: Curve
    multiplier: Curve


class ScheduleNames(Record):
    schedule: Text
    base: Text


class ScalingDoc(Record):
    """One scaling analysis of results/scaling.json (`reproduced` or `paper`; prism.report.scaling):
    Δ per scale always; with `status` "fit", the laws, Δ(N), the multiplier, the predictions and the
    band. One that never ran (no runs, or unlike ones) has only its source, status, reason and scales."""

    source: Text
    method: Text | None = None
    level: Fraction = 0.95
    n_boot: Size | None = None
    status: Literal["fit", "per_scale_only"]
    reason: Text | None
    schedules: ScheduleNames | None = None
    scales: list[ScalingRow]
    fits: dict[str, LawsDoc] | None = None
    delta_fit: list[AtScale] | None = None
    multiplier: list[AtScale] | None = None
    predictions: list[Prediction] | None = None
    band: Band | None = None

    @property
    def fitted(self) -> bool:
        return self.status == "fit"


class GpuHoursPoint(Record):
    gpu_hours: Number
    val_loss: Number


class GpuHoursCurve(Record):
    """One schedule's mean validation loss against GPU-hours at a scale, and the tokens/s figure
    (and where it comes from) that turned its tokens into GPU-hours; null without one."""

    scale: Text
    schedule: Text
    tokens_per_s_per_device: Positive | None
    figure: Text | None
    gpu_hours_per_run: Number
    seeds: Count
    curve: list[GpuHoursPoint]


class EqualComputeRow(Record):
    """Δ (schedule − uniform) of one row of the paper's Table 2 or 5, paper or reproduced, at equal
    tokens, at equal FLOPs and at equal wall-clock (prism.report.equal_compute)."""

    table: Text
    scale: Text
    schedule: Text
    source: Text
    delta_equal_tokens: Number
    flops_per_token_ratio: Number
    delta_equal_flops: IntervalDoc | None
    tokens_per_s_ratio: Number
    tokens_per_s_ratio_from: Text
    delta_equal_wall_clock: IntervalDoc | None
    fit: Text | None  # whose loss-vs-compute fit gave the shifts
    compute_beyond_fit: Number  # C ÷ the nearest end of that fit's compute range (1: inside it)


class EqualComputeDoc(Record):
    """results/scaling.json's comparisons at equal compute: each scale's GPU-hours curves, the rows of Δ."""

    gpu_hours: dict[str, list[GpuHoursCurve]]
    rows: list[EqualComputeRow]
