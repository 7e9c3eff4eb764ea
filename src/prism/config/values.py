"""The range of every config value: what prism.config.schema.validate checks beyond the types.

Each rule names its key and says what is valid, in one sentence, so that a bad value stops the
command before anything is written. Any float of any section, listed here or not, must be finite.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any, Callable

from prism.core.model import VOCAB_SIZE
from prism.errors import ConfigError

RunConfig = Any  # a prism.config.schema.RunConfig, which imports this module: read by key path only

# RoPE factors a scaled read is made for (docs/evaluation.md): 1 reads model.seq_len as trained;
# below 1 would squeeze the trained positions into fewer, which no longer input needs; YaRN was
# shown to work up to 32, so 64 leaves room while 1e9 stays a typo
ROPE_FACTOR_RANGE = (1, 64)
SEED_MAX = 2**32 - 1  # numpy's bound, which Lightning's seed_everything holds seeds to
# what Lightning's Trainer takes as `precision` (its full names), and the kit's own `auto`;
# Transformer Engine's modes are left out: the kit's layers are plain torch modules
PRECISIONS = ("auto", "32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Rule:
    ok: Callable[[Any], bool]
    valid: str  # what is valid, completing "<key>=<value> is invalid: ..."


def _between(low: float, high: float, closed_high: bool = False, what: str = "a value") -> Rule:
    bracket = "]" if closed_high else ")"
    return Rule(
        lambda v: _number(v) and low <= v and (v <= high if closed_high else v < high),
        f"use {what} in [{low:g}, {high:g}{bracket}",
    )


POSITIVE = Rule(lambda v: _number(v) and v > 0, "it must be positive")
POSITIVE_FLOAT = Rule(lambda v: _number(v) and v > 0, "it must be positive and finite")
NON_NEGATIVE = Rule(lambda v: _number(v) and v >= 0, "use 0 or more")
OPTIONAL_POSITIVE = Rule(lambda v: v is None or (_number(v) and v > 0), "use null or a positive count")
SEED = Rule(lambda v: _number(v) and 0 <= v <= SEED_MAX, f"use an integer from 0 to {SEED_MAX}")

RULES: dict[str, Rule] = {
    "train.seed": SEED,
    "train.tokens": POSITIVE,
    "train.global_batch_tokens": POSITIVE,
    "train.micro_batch": Rule(
        lambda v: v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
        "use a positive count of sequences, e.g. 8, or auto (the largest that the memory plan fits)",
    ),
    "train.lr": Rule(POSITIVE_FLOAT.ok, "it must be positive and finite, e.g. train.lr=6e-4"),
    "train.min_lr_ratio": _between(0, 1, closed_high=True),
    "train.warmup_frac": _between(0, 1, what="a fraction"),
    "train.weight_decay": Rule(NON_NEGATIVE.ok, "use 0 (off) or a positive finite value"),
    "train.beta1": _between(0, 1),
    "train.beta2": _between(0, 1),
    "train.eps": POSITIVE_FLOAT,
    "train.grad_clip": Rule(NON_NEGATIVE.ok, "use 0 (no clipping) or a positive finite norm"),
    "train.num_nodes": POSITIVE,
    "train.ddp_bucket_cap_mb": POSITIVE,
    "train.ddp_timeout_s": Rule(POSITIVE_FLOAT.ok, "use a positive, finite number of seconds, e.g. 600"),
    "train.hang_timeout_s": Rule(NON_NEGATIVE.ok, "use 0 (off) or a positive number of seconds, e.g. 300"),
    "train.straggler_every_steps": Rule(NON_NEGATIVE.ok, "use 0 (off) or a count of steps, e.g. 50"),
    "train.straggler_slower_pct": Rule(POSITIVE_FLOAT.ok, "use a positive percentage, e.g. 20"),
    "train.straggler_intervals": Rule(POSITIVE.ok, "use a positive count of intervals, e.g. 3"),
    "train.tracker_wait_s": Rule(POSITIVE_FLOAT.ok, "use a positive, finite number of seconds, e.g. 60"),
    "train.loss_chunk_tokens": Rule(NON_NEGATIVE.ok, "use 0 (off) or a positive token count"),
    "train.gpu_memory_gib": Rule(
        lambda v: v is None or POSITIVE_FLOAT.ok(v), "use null (the visible GPU's memory) or a positive GiB"
    ),
    "train.memory_overhead_gib": Rule(NON_NEGATIVE.ok, "use 0 or a positive, finite GiB, e.g. 1.5"),
    "train.memory_fraction": Rule(lambda v: _number(v) and 0 < v <= 1, "use a fraction in (0, 1], e.g. 0.95"),
    "train.val_every_steps": POSITIVE,
    "train.ckpt_every_steps": POSITIVE,
    "train.log_every_steps": POSITIVE,
    "train.keep_checkpoints": Rule(
        lambda v: _number(v) and v >= -1, "use -1 (keep all), 0 (last.ckpt only) or a count"
    ),
    "model.vocab_size": Rule(
        lambda v: _number(v) and v >= VOCAB_SIZE,
        f"use at least {VOCAB_SIZE}, the GPT-2 tokenizer's vocabulary (every token id needs an "
        f"embedding row), e.g. model.vocab_size={VOCAB_SIZE}",
    ),
    "model.vocab_multiple": POSITIVE,
    "model.seq_len": POSITIVE,
    "model.mlp_hidden": Rule(OPTIONAL_POSITIVE.ok, "use null (8*d_model/3, rounded) or a positive width"),
    "model.norm_eps": POSITIVE_FLOAT,
    "model.dropout": _between(0, 1),
    "model.init_std": POSITIVE_FLOAT,
    "model.rope_base": POSITIVE_FLOAT,
    "model.rope_factor": Rule(
        lambda v: _number(v) and ROPE_FACTOR_RANGE[0] <= v <= ROPE_FACTOR_RANGE[1],
        f"use a factor in [{ROPE_FACTOR_RANGE[0]}, {ROPE_FACTOR_RANGE[1]}]: 1 reads model.seq_len "
        f"positions as trained, 2 reads twice as many (docs/evaluation.md)",
    ),
    "data.val_tokens": POSITIVE,
    "data.num_workers": Rule(NON_NEGATIVE.ok, "use 0 (in the training process) or more"),
    "data.seed": SEED,
    "data.shuffle_buffer": Rule(NON_NEGATIVE.ok, "use 0 (off) or more"),
    "data.doc_batch": POSITIVE,
    "data.tokenizer_threads": POSITIVE,
    "data.prefetch_factor": POSITIVE,
    "data.hub_retries": POSITIVE,
    "data.hub_retry_interval_s": Rule(NON_NEGATIVE.ok, "use 0 or a finite number of seconds"),
    "data.hub_open_attempts": POSITIVE,
    "data.stall_timeout_s": Rule(POSITIVE_FLOAT.ok, "use a positive, finite number of seconds"),
    "train.eval_every_tokens": Rule(NON_NEGATIVE.ok, "use 0 (off) or a token count"),
    "train.eval_limit": POSITIVE,
    "eval.batch_size": POSITIVE,
    "eval.limit": Rule(OPTIONAL_POSITIVE.ok, "use null (every example) or a positive count"),
    "bench.steps": POSITIVE,
    "bench.warmup": NON_NEGATIVE,
    "bench.micro_batch": Rule(OPTIONAL_POSITIVE.ok, "use null (train.micro_batch) or a positive count"),
    "analysis.sequences": POSITIVE,
    "long_context.documents": POSITIVE,
    "long_context.buckets": POSITIVE,
    "long_context.rope_factor": Rule(
        lambda v: v is None or (_number(v) and ROPE_FACTOR_RANGE[0] <= v <= ROPE_FACTOR_RANGE[1]),
        f"use null (length / model.seq_len at each length) or a factor in [{ROPE_FACTOR_RANGE[0]}, "
        f"{ROPE_FACTOR_RANGE[1]}], e.g. 2",
    ),
    "run_all.train_retries": Rule(NON_NEGATIVE.ok, "use 0 (no retry) or a count of retries"),
    "run_all.retry_pause_s": Rule(NON_NEGATIVE.ok, "use 0 or a finite number of seconds"),
    "search.top_k": Rule(POSITIVE.ok, "use a positive count of schedules besides uniform, e.g. 3"),
    "search.max_attempts": Rule(POSITIVE.ok, "use a positive count of attempts, e.g. 3"),
    "search.idle_poll_s": Rule(POSITIVE_FLOAT.ok, "use a positive, finite number of seconds, e.g. 1"),
    "search.alpha": Rule(lambda v: _number(v) and 0 < v < 1, "use a significance level in (0, 1), e.g. 0.05"),
}
NON_EMPTY_TEXT = ("runs_dir", "results_dir", "data.hub_name", "data.subset", "data.revision")


def get(run: RunConfig, key: str) -> Any:
    obj: Any = run
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def invalid(key: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is invalid: {valid}.")


def check_values(run: RunConfig) -> None:
    """Raise ConfigError, naming the key, for the first value out of its range."""
    for key, rule in RULES.items():
        value = get(run, key)
        if not rule.ok(value):
            raise invalid(key, value, rule.valid)
    for key, value in _floats(run):  # the float fields no rule above names
        if not math.isfinite(value):
            raise invalid(key, value, "it must be a finite number")
    for key in NON_EMPTY_TEXT:
        if not str(get(run, key)).strip():
            raise invalid(key, get(run, key), "it must not be empty")
    t = run.train
    if str(t.precision) not in PRECISIONS:
        raise invalid("train.precision", t.precision, f"use one of {', '.join(PRECISIONS)}")
    _check_accelerator(t.accelerator)
    _check_strategy(t.strategy)
    _check_devices(t.devices)
    _check_milestones(t.milestones)
    _check_profile_steps(t.profile_steps)
    _check_seeds(run.seeds)
    if not run.run_schedules or not all(isinstance(s, str) and s.strip() for s in run.run_schedules):
        raise invalid(
            "run_schedules", run.run_schedules, "give one or more schedule names, e.g. [uniform,prism]"
        )
    _check_tasks(run.eval.tasks)
    _check_tasks(run.train.eval_tasks, "train.eval_tasks")
    _check_tracker_names(t.loggers)
    _check_rope(run.model)
    _check_long_context(run.long_context)
    if not run.run_all.stages:
        raise invalid("run_all.stages", run.run_all.stages, "give one or more stages, e.g. [train,eval]")
    for stage, line in vars(run.run_all.launcher).items():
        try:
            shlex.split(line or "")
        except ValueError as exc:
            raise invalid(f"run_all.launcher.{stage}", line, f"it must split into words ({exc})") from None


def _floats(run: RunConfig, prefix: str = ""):
    """(key, value) of every float field of `run`'s sections, nested ones included."""
    for name, value in vars(run).items():
        key = f"{prefix}{name}"
        if isinstance(value, float):
            yield key, value
        elif hasattr(value, "__dataclass_fields__"):
            yield from _floats(value, f"{key}.")


# Lightning's own accelerators: these are accepted without importing Lightning (seconds), so that
# a refused value is refused at once; any other name is looked up in Lightning's registry
BUILTIN_ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")


def _check_accelerator(accelerator: str) -> None:
    if str(accelerator) in BUILTIN_ACCELERATORS:
        return
    from prism.compat import registered_accelerators

    valid = ["auto", "gpu", *registered_accelerators()]
    if str(accelerator) not in valid:
        raise invalid("train.accelerator", accelerator, f"use one of {', '.join(valid)}")


# train.strategy: the kit's own values (prism.train.strategy; fsdp is the kit's FSDP2) are accepted
# at once; any other name is asked of Lightning's strategy registry (prism.compat), which costs
# Lightning's import (seconds) only for a name outside these three
KIT_STRATEGIES = ("auto", "ddp", "fsdp")
UNUSED = "_find_unused_parameters_"  # Lightning's DDP variants: <name>_find_unused_parameters_true/false


def _check_strategy(strategy: str) -> None:
    if str(strategy) in KIT_STRATEGIES:
        return
    from prism.compat import registered_strategies

    others = [n for n in registered_strategies() if n not in KIT_STRATEGIES]
    if str(strategy) not in others:
        names = [n for n in others if UNUSED not in n]
        stems = sorted({n.split(UNUSED)[0] for n in others if UNUSED in n})
        raise invalid(
            "train.strategy",
            strategy,
            f"use auto, ddp or fsdp (the kit's FSDP2; docs/cluster.md), or another of Lightning's "
            f"strategy names: {', '.join(names)} (and {', '.join(stems)} followed by {UNUSED}true "
            f"or {UNUSED}false)",
        )


def _check_devices(devices: Any) -> None:
    """'auto' (and Lightning's -1, the same), a positive count, or a list of device indices."""
    text = str(devices).strip()
    if text in ("auto", "-1"):
        return
    if isinstance(devices, list):
        if devices and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
            if len(set(devices)) == len(devices):
                return
    elif not isinstance(devices, (bool, float)) and text.isdigit() and int(text) > 0:
        return
    raise invalid(
        "train.devices",
        devices,
        "use auto (every visible GPU, else one CPU process), a positive count such as 8, or a list of "
        "distinct device indices such as [0,1]",
    )


def _check_milestones(milestones: list) -> None:
    if not all(_number(m) and m > 0 for m in milestones):
        raise invalid(
            "train.milestones",
            list(milestones),
            "give positive, finite validation-loss thresholds, e.g. train.milestones=[4.0,3.5]",
        )


def _check_profile_steps(steps: list) -> None:
    """[] (off) or [START,END], optimizer steps counted from 1; whether END is within the run's
    steps is prism.train.callbacks.profile's check."""
    whole = all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
    if steps and not (len(steps) == 2 and whole and 1 <= steps[0] <= steps[1]):
        raise invalid(
            "train.profile_steps",
            list(steps),
            "give [] (off) or two optimizer steps [START,END] with 1 <= START <= END, counted from 1, "
            "e.g. train.profile_steps=[10,12]",
        )


def _check_seeds(seeds: list) -> None:
    good = all(isinstance(s, int) and SEED.ok(s) for s in seeds)
    if not seeds or not good or len(set(seeds)) != len(seeds):
        raise invalid("seeds", list(seeds), f"give one or more distinct integers from 0 to {SEED_MAX}")


def _check_tasks(tasks: list, key: str = "eval.tasks") -> None:
    """Names only: prism.eval.tasks knows which tasks exist (prism.eval.tasks.check_task_config)."""
    if not all(isinstance(t, str) for t in tasks):
        raise invalid(key, list(tasks), f"give task names, e.g. {key}=[piqa,hellaswag]")


def _check_tracker_names(loggers: list) -> None:
    """Names only: prism.train.trackers knows which trackers exist and checks their settings
    (prism.train.trackers.check_trackers)."""
    if not all(isinstance(n, str) for n in loggers):
        raise invalid(
            "train.loggers", list(loggers), "give tracker names, e.g. train.loggers=[tensorboard,csv]"
        )


def _check_rope(model: Any) -> None:
    """Settings the RoPE scaling reads only under YaRN; how wide a head each choice needs is the
    decoder's check (prism.core.rope.check_head_width), made when the schedules are resolved."""
    if model.rope_scaling != "yarn":
        if model.rope_train_len is not None:
            raise invalid(
                "model.rope_train_len",
                model.rope_train_len,
                f"only model.rope_scaling=yarn reads it (this run's is {model.rope_scaling}); leave it "
                f"out, or use yarn",
            )
        return
    if model.rope_beta_fast < model.rope_beta_slow:
        raise invalid(
            "model.rope_beta_fast",
            model.rope_beta_fast,
            f"YaRN keeps pairs that turn more than rope_beta_fast times and interpolates those that "
            f"turn fewer than rope_beta_slow={model.rope_beta_slow!r} times, so rope_beta_fast must "
            f"be at least rope_beta_slow (defaults 32 and 1)",
        )


# ----- long_context: the evaluation past the training length --------------------------------------
LONG_CONTEXT_SOURCES = ("auto", "own", "path")
LENGTH_EXAMPLE = "e.g. [1x,2x,4x] (multiples of model.seq_len) or [2048,4096] (tokens)"


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
    """The lengths' spelling, the RoPE choices' names, the document source: types and names only."""
    from prism.core.rope import SCALINGS

    if not section.lengths:
        raise invalid(
            "long_context.lengths", list(section.lengths), f"give one or more lengths, {LENGTH_EXAMPLE}"
        )
    for item in section.lengths:
        context_length(item, 1)
    names = list(section.rope_scalings)
    bad = [n for n in names if n not in SCALINGS]
    if not names or bad:
        raise invalid(
            "long_context.rope_scalings",
            bad[0] if bad else names,
            f"use one or more of {', '.join(SCALINGS)}",
        )
    if section.source not in LONG_CONTEXT_SOURCES:
        raise invalid("long_context.source", section.source, f"use one of {', '.join(LONG_CONTEXT_SOURCES)}")
    if section.source == "path" and not (section.path or "").strip():
        raise invalid(
            "long_context.path",
            section.path,
            "long_context.source=path needs a jsonl file of documents, e.g. long_context.path=test.jsonl",
        )
    if not str(section.text_field).strip():
        raise invalid("long_context.text_field", section.text_field, "it must not be empty")
