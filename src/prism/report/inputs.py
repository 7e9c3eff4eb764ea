"""The one reader of the result files the report uses (docs/outputs.md): every JSON or YAML file
passes here, and only a value this module has checked reaches a section.

A file is checked in two passes. Every number anywhere in it must be finite (JSON has no NaN or
Infinity; Python's reader accepts them, and one NaN would poison a mean or a p-value). Then the
fields the report reads must have their type and range: losses finite and ≥ 0, throughput and
wall clock > 0, sizes and token counts positive integers, accuracies in [0, 1]. A file that fails
either pass is left out whole, and one sentence naming it and the first bad value is appended to
`problems` (the report's problems section, and report.py's console).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from prism.io import read_json


class Unusable(Exception):
    """Why a file cannot be used: a fragment that follows the file's name in a sentence."""


# ----- the checks ---------------------------------------------------------------------------------
def _where(path: str) -> str:
    return f"`{path}`" if path else "the document"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class Number:
    """A finite number ≥ low (> low with `above`), at most `high`; an integer with `integer`."""

    low: float = 0.0
    above: bool = False
    high: float | None = None
    integer: bool = False

    def what(self) -> str:
        kind = "an integer" if self.integer else "a number"
        low = f"> {self.low:g}" if self.above else f"≥ {self.low:g}"
        return f"{kind} {low}" + (f" and ≤ {self.high:g}" if self.high is not None else "")

    def check(self, v, path: str) -> None:
        ok = _is_number(v) and (not self.integer or isinstance(v, int))
        if ok:
            try:
                x = float(v)
            except OverflowError:  # an integer too large for any float the report computes with
                ok = False
            else:
                ok = (x > self.low if self.above else x >= self.low) and (self.high is None or x <= self.high)
        if not ok:
            raise Unusable(f"has {_where(path)} = {_shown(v)}, where {self.what()} belongs")


LOSS = Number()  # nats per token: finite and ≥ 0
POSITIVE = Number(above=True)  # a rate or a duration
COUNT = Number(integer=True)  # ≥ 0
SIZE = Number(above=True, integer=True)  # parameters, tokens, lengths: a positive integer
FRACTION = Number(high=1.0)  # an accuracy or a utilisation


@dataclass(frozen=True)
class Text:
    def check(self, v, path: str) -> None:
        if not isinstance(v, str):
            raise Unusable(f"has {_where(path)} = {_shown(v)}, where text belongs")


@dataclass(frozen=True)
class Is:
    """Exactly this value (a marker such as "finished": true)."""

    value: object

    def check(self, v, path: str) -> None:
        if v is not self.value and not (type(v) is type(self.value) and v == self.value):
            raise Unusable(f"has {_where(path)} = {_shown(v)}, where {_shown(self.value)} belongs")


@dataclass(frozen=True)
class Scalar:
    """Text, a number, true/false or null: a value shown as it is, or compared."""

    def check(self, v, path: str) -> None:
        if v is not None and not isinstance(v, (str, int, float)):
            raise Unusable(f"has {_where(path)} = {_shown(v)}, where text or a number belongs")


@dataclass(frozen=True)
class Anything:
    def check(self, v, path: str) -> None:
        return None


@dataclass(frozen=True)
class Maybe:
    """null, or what `spec` accepts."""

    spec: object

    def check(self, v, path: str) -> None:
        if v is not None:
            self.spec.check(v, path)


@dataclass(frozen=True)
class ListOf:
    item: object
    length: int | None = None  # exactly this many items
    nonempty: bool = False

    def check(self, v, path: str) -> None:
        if not isinstance(v, list):
            raise Unusable(f"has {_where(path)} = {_shown(v)}, where a list belongs")
        if self.length is not None and len(v) != self.length:
            raise Unusable(f"has {_where(path)} with {len(v)} items, where {self.length} belong")
        if self.nonempty and not v:
            raise Unusable(f"has an empty list {_where(path)}")
        for i, x in enumerate(v):
            self.item.check(x, f"{path}[{i}]")


@dataclass(frozen=True)
class MapOf:
    """An object whose keys are any text and whose values `value` accepts."""

    value: object

    def check(self, v, path: str) -> None:
        if not isinstance(v, dict):
            raise Unusable(f"has {_where(path)} = {_shown(v)}, where an object belongs")
        for k, x in v.items():
            self.value.check(x, f"{path}.{k}" if path else str(k))


@dataclass(frozen=True)
class Record:
    """An object with `required` keys and `optional` ones (absent, or what their spec accepts);
    other keys are kept unchecked for their type (their numbers are still finite)."""

    required: dict
    optional: dict

    def check(self, v, path: str) -> None:
        if not isinstance(v, dict):
            raise Unusable(f"has {_where(path)} = {_shown(v)}, where an object belongs")
        missing = [k for k in self.required if k not in v]
        if missing:
            inside = f" in {_where(path)}" if path else ""
            raise Unusable(f"lacks {', '.join(f'`{k}`' for k in missing)}{inside}")
        for k, spec in (*self.required.items(), *self.optional.items()):
            if k in v:
                spec.check(v[k], f"{path}.{k}" if path else k)


def _shown(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _first_not_finite(doc) -> tuple[str, object] | None:
    """The path and value of the first NaN or infinite number anywhere in `doc` (walked without
    recursion: a deeply nested file is no reason for a traceback)."""
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


def check(doc, spec) -> None:
    """Raise Unusable saying what is wrong with `doc`, or return when `spec` accepts it."""
    bad = _first_not_finite(doc)
    if bad is not None:
        raise Unusable(f"has {_where(bad[0])} = {bad[1]!r}, where a finite number belongs")
    spec.check(doc, "")


def problem(shown: str, why: str) -> str:
    """The problems section's sentence for a file left out."""
    return f"`{shown}` {why}; it is left out."


# ----- what each file must hold -------------------------------------------------------------------
HEADS = ListOf(SIZE, nonempty=True)
ENVIRONMENT = MapOf(Scalar())  # versions and devices, compared as they are

# train_summary.json of a finished run (prism.train.callbacks.summary); older kits wrote fewer keys
SUMMARY = Record(
    {"finished": Is(True)},
    {
        "scale": Text(),
        "schedule": Text(),
        "seed": COUNT,
        "heads": Maybe(HEADS),
        "n_params": Maybe(SIZE),
        "flops_per_token": Maybe(SIZE),
        "steps": Maybe(COUNT),
        "tokens_seen": Maybe(SIZE),
        "final_val_loss": Maybe(LOSS),
        "min_val_loss": Maybe(LOSS),
        "min_val_step": Maybe(COUNT),
        "min_val_tokens": Maybe(COUNT),
        "val_curve": Maybe(
            ListOf(Record({"step": COUNT, "tokens": COUNT, "val_loss": Maybe(LOSS)}, {"wall_clock_s": LOSS}))
        ),
        "throughput": Maybe(
            Record(
                {},
                {
                    "tokens_per_s": Maybe(POSITIVE),
                    "tokens_per_s_per_device": Maybe(POSITIVE),
                    "step_time_s": Maybe(POSITIVE),
                    "mfu": Maybe(LOSS),
                    "peak_memory_bytes": Maybe(COUNT),
                    "hardware": Maybe(Text()),
                    "num_devices": Maybe(SIZE),
                },
            )
        ),
        "wall_clock_s": Maybe(POSITIVE),
        "environment": Maybe(ENVIRONMENT),
        "earlier_environments": Maybe(ListOf(ENVIRONMENT)),
        "init_from": Maybe(
            Record(
                {},
                {
                    "run": Maybe(Text()),
                    "scale": Maybe(Text()),
                    "schedule": Maybe(Text()),
                    "seed": Maybe(COUNT),
                    "seq_len": Maybe(SIZE),
                    "tokens_seen": Maybe(SIZE),
                },
            )
        ),
    },
)

# milestones.json (prism.train.callbacks.milestones)
MILESTONES = Record(
    {},
    {
        "thresholds": Maybe(ListOf(LOSS)),
        "milestones": Maybe(
            ListOf(
                Record(
                    {"threshold": LOSS},
                    {"step": Maybe(COUNT), "tokens": Maybe(SIZE), "wall_clock_s": Maybe(LOSS)},
                )
            )
        ),
        "min": Maybe(Record({}, {"val_loss": Maybe(LOSS), "step": Maybe(COUNT), "tokens": Maybe(COUNT)})),
    },
)

# config.yaml: the keys Table 1 and the recipe comparison read (the rest is the kit's own schema)
RUN_CONFIG = Record(
    {
        "model": Record({"n_layer": SIZE, "d_model": SIZE, "h_base": SIZE}, {"seq_len": SIZE}),
        "train": Record({"global_batch_tokens": SIZE, "tokens": SIZE, "lr": POSITIVE}, {}),
    },
    {"data": Maybe(MapOf(Anything())), "schedule": Text(), "schedules": Maybe(MapOf(Scalar()))},
)

# one task's scores, in eval/<schedule>/seed<k>.json and at each milestone of zeroshot.json
SCORES = MapOf(
    Record(
        {},
        {
            "acc": Maybe(FRACTION),
            "acc_norm": Maybe(FRACTION),
            "n": Maybe(COUNT),
            "word_perplexity": Maybe(POSITIVE),
            "byte_perplexity": Maybe(POSITIVE),
            "bits_per_byte": Maybe(LOSS),
        },
    )
)

EVAL = Record({"tasks": SCORES}, {"data_source": Scalar(), "limit": Maybe(POSITIVE), "semantics": Scalar()})

ZEROSHOT = Record(
    {
        "every_tokens": SIZE,
        "tasks": ListOf(Text()),
        "limit": Maybe(POSITIVE),
        "data_source": Text(),
        "batch_size": Scalar(),
        "semantics": Text(),
        "milestones": ListOf(
            Record({"tokens": SIZE, "tasks": SCORES}, {"step": Maybe(COUNT), "seconds": Maybe(LOSS)})
        ),
    },
    {},
)

_BENCH_SCHEDULE = Record(
    {},
    {
        "heads": Maybe(HEADS),
        "train_tokens_per_s": Maybe(POSITIVE),
        "infer_tokens_per_s": Maybe(POSITIVE),
        "step_time_s_median": Maybe(POSITIVE),
        "step_time_s_spread": Maybe(ListOf(POSITIVE, length=2)),
        "mfu": Maybe(LOSS),
        "peak_memory_bytes": Maybe(COUNT),
        "ratio_to_uniform": Maybe(POSITIVE),
        "attention_backends": Maybe(ListOf(Anything())),
        "n_params": Maybe(SIZE),
        "flops_per_token": Maybe(SIZE),
    },
)
BENCH = Record(
    {"schedules": MapOf(_BENCH_SCHEDULE)},
    {"num_devices": Maybe(SIZE), "hardware": Maybe(Text()), "seq_len": Maybe(SIZE), "steps": Maybe(SIZE)},
)

ANALYSIS = Record(
    {
        "checkpoints": ListOf(
            Record({"schedule": Text(), "seed": COUNT, "D": ListOf(LOSS, nonempty=True)}, {})
        )
    },
    {
        "delta": Maybe(
            MapOf(
                Record(
                    {},
                    {
                        "mean": Maybe(ListOf(Number(low=-math.inf))),  # ΔD_l: either sign
                        "std": Maybe(ListOf(LOSS)),
                        "seeds": Maybe(ListOf(COUNT)),
                    },
                )
            )
        ),
        "sequences": Maybe(SIZE),
        "seq_len": Maybe(SIZE),
    },
)

# results/<scale>/long_context/<schedule>/seed<k>.json (prism.measure.long_context)
_LONG_CONTEXT_UNIT = Record(
    {
        "length": SIZE,
        "rope_scaling": Text(),
        "loss": LOSS,
        "bucket_loss": ListOf(LOSS, nonempty=True),
        "bucket_edges": ListOf(COUNT, nonempty=True),
        "D": ListOf(LOSS),
        "documents": Record({"sha256": Text(), "count": SIZE, "where": Text()}, {"origin": Scalar()}),
    },
    {},
)
LONG_CONTEXT = Record(
    {"complete": Is(True), "seq_len": SIZE, "results": ListOf(_LONG_CONTEXT_UNIT, nonempty=True)}, {}
)


def _long_context_consistent(doc: dict) -> None:
    """What the types cannot say: each unit's buckets span its window, one loss per bucket."""
    for i, r in enumerate(doc["results"]):
        edges = r["bucket_edges"]
        if edges[0] != 0 or edges[-1] != r["length"] or any(a >= b for a, b in zip(edges, edges[1:])):
            raise Unusable(
                f"has `results[{i}].bucket_edges` = {_shown(edges)}, not rising from 0 to its length"
            )
        if len(r["bucket_loss"]) != len(edges) - 1:
            n = len(r["bucket_loss"])
            raise Unusable(f"has `results[{i}].bucket_loss` with {n} values for {len(edges) - 1} buckets")


# ----- reading ------------------------------------------------------------------------------------
def validated(doc: dict, spec, problems: list[str], shown: str, after=None) -> dict | None:
    """`doc` when `spec` (and `after`, a further check) accepts it; else None, with the reason
    appended to `problems` naming the file as `shown`."""
    try:
        check(doc, spec)
        if after is not None:
            after(doc)
    except Unusable as exc:
        problems.append(problem(shown, str(exc)))
        return None
    return doc


def read_object(path: str | Path, problems: list[str], shown: str | None = None) -> dict | None:
    """The JSON object in `path`, unchecked (for a caller that looks at one marker first, such as
    a summary's "finished", before validated()); None, named in `problems`, when unreadable."""
    shown = shown or str(path)
    try:
        return read_json(path, problems, shown)
    except RecursionError:  # nested deeper than Python's reader goes
        problems.append(problem(shown, "could not be read (nested too deeply)"))
        return None


def read_checked(
    path: str | Path, spec, problems: list[str], shown: str | None = None, after=None
) -> dict | None:
    """The JSON object in `path` when `spec` (and `after`) accepts it; else None, with the reason
    appended to `problems` naming the file as `shown`."""
    shown = shown or str(path)
    doc = read_object(path, problems, shown)
    return None if doc is None else validated(doc, spec, problems, shown, after)


def read_long_context(path: str | Path, problems: list[str], shown: str | None = None) -> dict | None:
    return read_checked(path, LONG_CONTEXT, problems, shown, _long_context_consistent)


def read_yaml_checked(path: Path, spec, problems: list[str], shown: str) -> dict | None:
    """A YAML file's mapping when `spec` accepts it (a run's config.yaml); None, named in
    `problems`, when it cannot be read or is not what it should be."""
    from omegaconf import OmegaConf

    try:
        doc = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as exc:  # a YAML or interpolation error of any kind: say so and carry on
        problems.append(problem(shown, f"could not be read ({type(exc).__name__})"))
        return None
    if not isinstance(doc, dict):
        problems.append(problem(shown, "does not hold a mapping"))
        return None
    return validated(doc, spec, problems, shown)
