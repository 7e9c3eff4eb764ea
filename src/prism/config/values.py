"""The range of every config value, declared on its schema field as a Rule (a pydantic type and the
sentence saying what is valid); what ties two fields together is checked after (check_values)."""

from __future__ import annotations

import math
import shlex
import typing
from dataclasses import dataclass, fields, is_dataclass
from functools import cache, cached_property, reduce
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, Field, StrictInt, StrictStr, TypeAdapter, ValidationError, create_model
from pydantic.types import Strict

from prism.compat import registered_accelerators, registered_strategies
from prism.config.roles import checks_of
from prism.core.model import VOCAB_SIZE
from prism.core.rope import SCALINGS
from prism.errors import ConfigError

RunConfig = Any  # a prism.config.schema.RunConfig, which imports this module: read by key path only

# RoPE factors a scaled read is made for (docs/evaluation.md): 1 reads model.seq_len as trained;
# YaRN was shown to work up to 32, so 64 leaves room while 1e9 stays a typo
ROPE_FACTOR_RANGE = (1, 64)
SEED_MAX = 2**32 - 1  # numpy's bound, which Lightning's seed_everything holds seeds to
# Lightning's `precision` names (not Transformer Engine's: the layers are plain torch), and `auto`
PRECISIONS = ("auto", "32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true")

Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]  # an int or a finite float, no bool
Text = Annotated[StrictStr, Field(min_length=1), AfterValidator(lambda v: v.strip() or _bad())]


def _bad() -> Any:
    raise ValueError


@dataclass(frozen=True)
class Rule:
    """A setting's range: `type` is what pydantic accepts; `valid` completes "<key>=<value> is invalid:
    ..."; `example` is a valid value, shown where a value is not even of the field's kind."""

    type: Any
    valid: str
    example: str | None = None

    @cached_property
    def adapter(self) -> TypeAdapter:
        return TypeAdapter(self.type)

    def ok(self, value: Any) -> bool:
        try:
            self.adapter.validate_python(value)
        except ValidationError:
            return False
        return True


def number(valid: str, **bounds: float) -> Rule:
    """A finite number within pydantic's `bounds` (gt, ge, lt, le)."""
    return Rule(Annotated[Number, Field(**bounds)], valid)


def optional(rule: Rule, valid: str) -> Rule:
    """`rule`, or null."""
    return Rule(Optional[rule.type], valid)


def names(
    valid: str, example: str, item: Any = StrictStr, min_length: int = 0, distinct: bool = False
) -> Rule:
    """A list of `item`s (at least `min_length`; all different when `distinct`)."""
    check = AfterValidator(lambda v: v if not distinct or len(set(v)) == len(v) else _bad())
    return Rule(Annotated[list[item], Field(min_length=min_length), check], valid, example)


def one_of(choices: tuple, valid: str | None = None) -> Rule:
    return Rule(Literal[choices], valid or f"use one of {', '.join(map(str, choices))}")


def judged(fn: Any, valid: str = "", example: str | None = None) -> Rule:
    """A value `fn` judges: it raises ValueError, whose text (or else `valid`) says what is valid."""
    return Rule(Annotated[Any, AfterValidator(fn)], valid, example)


POSITIVE = number("it must be positive", gt=0)
AT_LEAST_1 = number("it must be at least 1", gt=0)  # a count: 1 or more
POSITIVE_FLOAT = number("it must be positive and finite", gt=0)
NON_NEGATIVE = number("use 0 or more", ge=0)
FINITE = number("it must be a finite number")
SEED = number(f"use an integer from 0 to {SEED_MAX}", ge=0, le=SEED_MAX)
NON_EMPTY = Rule(Text, "it must not be empty")


def between(low: float, high: float, closed_high: bool = False, what: str = "a value") -> Rule:
    bracket = "]" if closed_high else ")"
    return number(
        f"use {what} in [{low:g}, {high:g}{bracket}", ge=low, **{"le" if closed_high else "lt": high}
    )


def positive(valid: str) -> Rule:
    return number(valid, gt=0)


def at_least_zero(valid: str) -> Rule:
    return number(valid, ge=0)


def seconds(example: str = "") -> Rule:
    return number(f"use a positive, finite number of seconds{example}", gt=0)


MICRO_BATCH = Rule(
    Union[Literal["auto"], Annotated[StrictInt, Field(gt=0)]],
    "use a positive count of sequences, e.g. 8, or auto (the largest that the memory plan fits)",
)
# evaluate.py's --limit, as lm_eval's: the first N documents of each task, or below 1 that fraction
EVAL_LIMIT = Rule(
    Optional[Union[Annotated[StrictInt, Field(ge=1)], Annotated[float, Strict(), Field(gt=0, lt=1)]]],
    "use null (every example), a whole number of documents (>= 1) or a fraction between 0 and 1",
)
VOCAB = number(
    f"use at least {VOCAB_SIZE}, the GPT-2 tokenizer's vocabulary (every token id needs an embedding "
    f"row), e.g. model.vocab_size={VOCAB_SIZE}",
    ge=VOCAB_SIZE,
)
ROPE_FACTOR = number(
    f"use a factor in [{ROPE_FACTOR_RANGE[0]}, {ROPE_FACTOR_RANGE[1]}]: 1 reads model.seq_len positions "
    f"as trained, 2 reads twice as many (docs/evaluation.md)",
    ge=ROPE_FACTOR_RANGE[0],
    le=ROPE_FACTOR_RANGE[1],
)
LONG_CONTEXT_ROPE_FACTOR = optional(
    ROPE_FACTOR,
    f"use null (length / model.seq_len at each length) or a factor in [{ROPE_FACTOR_RANGE[0]}, "
    f"{ROPE_FACTOR_RANGE[1]}], e.g. 2",
)
PRECISION = one_of(PRECISIONS)
MILESTONES = names(
    "give positive, finite validation-loss thresholds, e.g. train.milestones=[4.0,3.5]",
    "[4.0,3.5]",
    item=POSITIVE.type,
)
SEEDS = names(
    f"give one or more distinct integers from 0 to {SEED_MAX}",
    "[0,1,2]",
    item=Annotated[StrictInt, Field(ge=0, le=SEED_MAX)],
    min_length=1,
    distinct=True,
)
SCHEDULE_NAMES = names(
    "give one or more schedule names, e.g. [uniform,prism]", "[uniform,prism]", item=Text, min_length=1
)
STAGES = names("give one or more stages, e.g. [train,eval]", "[train,eval]", item=Any, min_length=1)
TRACKERS = names("give tracker names, e.g. train.loggers=[tensorboard,csv]", "[tensorboard,csv]")


def tasks(key: str) -> Rule:
    """Names only: prism.eval.tasks knows which tasks exist (prism.eval.tasks.check_task_config)."""
    return names(f"give task names, e.g. {key}=[piqa,hellaswag]", "[piqa,hellaswag]")


def _words(line: Any) -> Any:
    try:
        shlex.split(line or "")
    except ValueError as exc:
        raise ValueError(f"it must split into words ({exc})") from None
    return line


WORDS = judged(_words)


def _devices(devices: Any) -> Any:
    """'auto' (and Lightning's -1, the same), a positive count, or a list of device indices."""
    text = str(devices).strip()
    if text in ("auto", "-1"):
        return devices
    if isinstance(devices, list):
        if devices and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
            if len(set(devices)) == len(devices):
                return devices
    elif not isinstance(devices, (bool, float)) and text.isdigit() and int(text) > 0:
        return devices
    raise ValueError


DEVICES = judged(
    _devices,
    "use auto (every visible GPU, else one CPU process), a positive count such as 8, or a list of "
    "distinct device indices such as [0,1]",
)


def _profile_steps(steps: Any) -> Any:
    """[] (off) or [START,END], optimizer steps counted from 1; whether END is within the run's
    steps is prism.train.callbacks.profile's check."""
    whole = all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
    if steps and not (len(steps) == 2 and whole and 1 <= steps[0] <= steps[1]):
        raise ValueError
    return steps


PROFILE_STEPS = judged(
    _profile_steps,
    "give [] (off) or two optimizer steps [START,END] with 1 <= START <= END, counted from 1, "
    "e.g. train.profile_steps=[10,12]",
    "[10,12]",
)

# Lightning's own accelerators, accepted without importing it; another name is asked of its registry
BUILTIN_ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")


def _accelerator(accelerator: Any) -> Any:
    if str(accelerator) in BUILTIN_ACCELERATORS:
        return accelerator
    valid = ["auto", "gpu", *registered_accelerators()]
    if str(accelerator) not in valid:
        raise ValueError(f"use one of {', '.join(valid)}")
    return accelerator


# train.strategy's own values (fsdp: the kit's FSDP2), accepted at once; another name is asked of
# Lightning's registry (prism.compat), whose import takes seconds
KIT_STRATEGIES = ("auto", "ddp", "fsdp")
UNUSED = "_find_unused_parameters_"  # Lightning's DDP variants: <name>_find_unused_parameters_true/false


def _strategy(strategy: Any) -> Any:
    if str(strategy) in KIT_STRATEGIES:
        return strategy
    others = [n for n in registered_strategies() if n not in KIT_STRATEGIES]
    if str(strategy) not in others:
        listed = [n for n in others if UNUSED not in n]
        stems = sorted({n.split(UNUSED)[0] for n in others if UNUSED in n})
        raise ValueError(
            f"use auto, ddp or fsdp (the kit's FSDP2; docs/cluster.md), or another of Lightning's "
            f"strategy names: {', '.join(listed)} (and {', '.join(stems)} followed by {UNUSED}true "
            f"or {UNUSED}false)"
        )
    return strategy


ACCELERATOR = judged(_accelerator)
STRATEGY = judged(_strategy)

# ----- long_context: the evaluation past the training length --------------------------------------
LONG_CONTEXT_SOURCES = ("auto", "own", "path")
LENGTH_EXAMPLE = "e.g. [1x,2x,4x] (multiples of model.seq_len) or [2048,4096] (tokens)"


# ----- checking -----------------------------------------------------------------------------------
def get(run: RunConfig, key: str) -> Any:
    return reduce(getattr, key.split("."), run)


def invalid(key: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is invalid: {valid}.")


@cache
def rules(schema: type, prefix: str = "") -> dict[str, Rule]:
    """key -> Rule of every field of the dataclass `schema` and its sections, in their order: the
    rule its field declares, else FINITE for a float field."""
    hints = typing.get_type_hints(schema)
    declared = checks_of(schema)
    found: dict[str, Rule] = {}
    for f in fields(schema):
        key, hint = f"{prefix}{f.name}", hints[f.name]
        if f.name in declared:
            found[key] = declared[f.name]
        elif is_dataclass(hint):
            found.update(rules(hint, f"{key}."))
        elif hint is float or hint == Optional[float]:
            found[key] = FINITE if hint is float else optional(FINITE, FINITE.valid)
    return found


@cache
def _model(schema: type) -> tuple[type, list[str]]:
    """One pydantic model of every rule of `schema` (fields f0, f1, ... in key order), and the keys."""
    keys = list(rules(schema))
    model = create_model(
        f"{schema.__name__}Values", **{f"f{i}": (rules(schema)[k].type, ...) for i, k in enumerate(keys)}
    )
    return model, keys


def check_values(run: RunConfig) -> None:
    """Raise ConfigError, naming the key, for the first value out of its range (in the order of the
    keys), then check what ties fields together."""
    model, keys = _model(type(run))
    try:
        model.model_validate({f"f{i}": get(run, key) for i, key in enumerate(keys)})
    except ValidationError as exc:
        error = exc.errors()[0]
        key = keys[int(str(error["loc"][0])[1:])]
        said = error.get("ctx", {}).get("error")
        valid = str(said) if isinstance(said, ValueError) and str(said) else rules(type(run))[key].valid
        raise invalid(key, get(run, key), valid) from None
    # settings the RoPE scaling reads only under YaRN; how wide a head each choice needs is the
    # decoder's check (prism.core.rope.check_head_width), made when the schedules are resolved
    model = run.model
    if model.rope_scaling != "yarn" and model.rope_train_len is not None:
        raise invalid(
            "model.rope_train_len",
            model.rope_train_len,
            f"only model.rope_scaling=yarn reads it (this run's is {model.rope_scaling}); leave it "
            f"out, or use yarn",
        )
    if model.rope_scaling == "yarn" and model.rope_beta_fast < model.rope_beta_slow:
        raise invalid(
            "model.rope_beta_fast",
            model.rope_beta_fast,
            f"YaRN keeps pairs that turn more than rope_beta_fast times and interpolates those that "
            f"turn fewer than rope_beta_slow={model.rope_beta_slow!r} times, so rope_beta_fast must "
            f"be at least rope_beta_slow (defaults 32 and 1)",
        )
    _check_long_context(run.long_context)


def context_length(item: Any, seq_len: int) -> int:
    """One entry of long_context.lengths in tokens: "<k>x" is k times seq_len, a whole number is a
    token count. Raises ConfigError naming the entry; whether it is at least seq_len is the
    evaluation's own check (prism.measure.long_context.settings)."""
    text = str(item).strip()
    try:
        if isinstance(item, bool):
            raise ValueError
        if text.lower().endswith("x"):
            multiple = float(text[:-1])
            if not (math.isfinite(multiple) and multiple > 0):
                raise ValueError
            return int(round(multiple * seq_len))
        if isinstance(item, float) or not text.isdigit() or int(text) < 1:
            raise ValueError
        return int(text)
    except ValueError:
        raise invalid(
            "long_context.lengths", item, f"give multiples of model.seq_len or token counts, {LENGTH_EXAMPLE}"
        ) from None


def _check_long_context(section: Any) -> None:
    """The lengths' spelling, the RoPE choices' names, a path where the source is one."""
    if not section.lengths:
        raise invalid(
            "long_context.lengths", list(section.lengths), f"give one or more lengths, {LENGTH_EXAMPLE}"
        )
    for item in section.lengths:
        context_length(item, 1)
    chosen = list(section.rope_scalings)
    bad = [n for n in chosen if n not in SCALINGS]
    if not chosen or bad:
        raise invalid(
            "long_context.rope_scalings",
            bad[0] if bad else chosen,
            f"use one or more of {', '.join(SCALINGS)}",
        )
    if section.source == "path" and not (section.path or "").strip():
        raise invalid(
            "long_context.path",
            section.path,
            "long_context.source=path needs a jsonl file of documents, e.g. long_context.path=test.jsonl",
        )
