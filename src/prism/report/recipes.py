"""Which finished runs may be averaged or compared (docs/report.md, "Runs that differ ...")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from prism.errors import PrismError
from prism.report.collect import RunResults, ScaleResults
from prism.report.prose import prose
from prism.runs.identity import recipe_differences, recipe_of, training_identity

# What may differ between runs that are averaged or compared at one scale: the schedule, the seed,
# and the micro-batch, which splits a step into pieces without changing it.
RUN_KEYS = frozenset(
    {"schedule", "heads", "model.heads", "model.schedule_name", "train.seed", "train.micro_batch"}
)

_ABSENT = object()  # a key one identity lacks


def _at(d: dict, key: str):
    """The value under a dotted key, or _ABSENT."""
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return _ABSENT
        d = d[part]
    return d


def _shown(v) -> str:
    return "absent" if v is _ABSENT else json.dumps(v, sort_keys=True, default=str)


def identity_of(run: RunResults) -> dict | None:
    """The training identity of a run's saved config; None when it saved none the kit can read."""
    try:
        # the config as the file held it (values unconverted), a dict that training_identity edits
        return training_identity(run.config.model_dump(exclude_unset=True)) if run.config else None
    except (PrismError, KeyError, TypeError, ValueError, AttributeError):  # a config of another kit
        return None


@dataclass(frozen=True)
class Difference:
    """The first key in which one run differs from another, and its two values."""

    key: str
    first: str  # where: scale/schedule/seedK
    first_value: object
    other: str
    other_value: object

    def text(self) -> str:
        values = {"first_value": _shown(self.first_value), "other_value": _shown(self.other_value)}
        return prose("recipes_difference", key=self.key, first=self.first, other=self.other, **values)


def _difference(a: tuple[str, dict], b: tuple[str, dict], ignore=frozenset()) -> Difference | None:
    keys = [k for k in recipe_differences(a[1], b[1]) if k not in ignore]
    return Difference(keys[0], a[0], _at(a[1], keys[0]), b[0], _at(b[1], keys[0])) if keys else None


def _identities(res: ScaleResults, schedules) -> list[tuple[str, dict]]:
    named = [(name, identity_of(run)) for name, run in res.named_runs(schedules)]
    return [(name, identity) for name, identity in named if identity is not None]


def runs_differ(res: ScaleResults, schedules) -> Difference | None:
    """The first difference of the runs of `schedules` in anything but schedule and seed, or None. A
    run without a readable config cannot be compared and is not held against the others."""
    runs = _identities(res, schedules)
    return next((d for d in (_difference(runs[0], r, RUN_KEYS) for r in runs[1:]) if d), None)


def not_averaged(res: ScaleResults, schedule: str) -> str | None:
    """One sentence when the runs of `schedule` at this scale are not averaged, else None."""
    d = runs_differ(res, (schedule,))
    return d and prose("recipes_not_averaged", scale=res.scale, schedule=schedule, difference=d.text())


def pair_unlike(res: ScaleResults, schedule: str, base: str) -> bool:
    """Whether both have finished runs at this scale and a Δ between them reads *not compared* (with
    one side missing, the Δ is not run: False)."""
    return all(res.runs.get(s) for s in (schedule, base)) and runs_differ(res, (base, schedule)) is not None


def not_compared(res: ScaleResults, schedule: str, base: str) -> str | None:
    """One sentence when `schedule` and `base` at this scale are not compared (no Δ), else None."""
    d = runs_differ(res, (base, schedule))
    return d and prose(
        "recipes_not_compared", scale=res.scale, schedule=schedule, base=base, difference=d.text()
    )


@dataclass
class Recipes:
    """Whether the runs of a fit across scales were trained with one recipe (recipe_of)."""

    mismatch: str | None = None  # the sentence naming the first key that differs, and its values
    unknown: list[str] = field(default_factory=list)  # runs that saved no readable config
    mixed_scales: set[str] = field(default_factory=set)  # scales whose own runs are not compared
    subsets: dict[str, set] = field(default_factory=dict)  # data.subset -> the scales trained on it


def check_recipes(results: list[ScaleResults], schedules) -> Recipes:
    """Compare every run's recipe with the first one's; a run without a saved config is listed
    (unknown, not assumed equal); a scale whose own runs differ is no point of a law either."""
    out = Recipes()
    for res in results:
        for name, run in res.named_runs(schedules):  # no readable config: unknown; else its data subset
            if identity_of(run) is None:
                out.unknown.append(name)
            else:
                out.subsets.setdefault(str((run.config.data or {}).get("subset")), set()).add(res.scale)
        if runs_differ(res, schedules):
            out.mixed_scales.add(res.scale)  # its own Δ compares unlike runs
    recipes = [(where, recipe_of(i)) for res in results for where, i in _identities(res, schedules)]
    d = next((d for r in recipes[1:] if (d := _difference(recipes[0], r))), None)
    if d:
        out.mismatch = prose("recipes_no_law", scale=None, difference=d.text())
    elif out.mixed_scales:
        res = next(r for r in results if r.scale in out.mixed_scales)  # the first of them
        out.mismatch = prose("recipes_no_law", scale=res.scale, difference=runs_differ(res, schedules).text())
    return out
