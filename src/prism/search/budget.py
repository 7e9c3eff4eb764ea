"""Rungs, budgets and costs of a search: the rungs are a geometric series, the last one each
trial's training budget. Why the LR schedule follows that proxy budget, and how the cost is
counted: docs/search.md, "Rungs and budget" and "What a search costs"."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from prism.config.schema import ConfigError, RunConfig
from prism.runs.layout import BENCH_NAME

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}


@dataclass(frozen=True)
class Rungs:
    tokens: tuple[int, ...]  # validation points, the last = each trial's training budget
    factor: int  # successive halving keeps 1/factor of the trials at each rung
    global_batch_tokens: int

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(t // self.global_batch_tokens for t in self.tokens)

    @property
    def budget(self) -> int:
        return self.tokens[-1]

    def runs_at(self, n: int, protected: int) -> list[int]:
        """About how many of `n` trials reach each rung; `protected` of them are never stopped."""
        free = max(0, n - protected)
        return [min(n, protected + math.ceil(free / self.factor**i)) for i in range(len(self.tokens))]

    def segment_tokens(self) -> list[int]:
        """Tokens trained from the previous rung to each rung."""
        return [t - (self.tokens[i - 1] if i else 0) for i, t in enumerate(self.tokens)]

    def cost_tokens(self, n: int, protected: int) -> int:
        return sum(r * s for r, s in zip(self.runs_at(n, protected), self.segment_tokens()))


def parse_token_count(text: str, full: int) -> int:
    """'1536', '25M', '2.5B' or '1%' (of the scale's full budget `full`) as a token count."""
    item = text.strip().lower().replace("_", "")
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*%", item)  # a sign is read, then refused as such
    if m:
        return int(float(m.group(1)) / 100 * full)
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*([kmbg]?)", item)
    if not m:
        raise ConfigError(
            f"cannot read {text!r} as a token count: write e.g. 1536, 25M, 2.5B or 1% (of train.tokens)."
        )
    return int(float(m.group(1)) * _SUFFIX[m.group(2)])


def parse_rungs(text: str, cfg: RunConfig) -> Rungs:
    """--rungs: increasing token counts, whole optimizer steps (a percentage is rounded down to
    them), each the previous times one integer factor >= 2, the last within the scale's budget."""
    gbt, full = cfg.train.global_batch_tokens, cfg.train.tokens
    items = [s for s in text.split(",") if s.strip()]
    if not items:
        raise ConfigError(f"--rungs {text!r} is empty: give token counts such as 768,1536 or 1%,3%,9%.")
    tokens = []
    for item in items:
        n = parse_token_count(item, full)
        if item.strip().endswith("%"):
            n -= n % gbt
        if n < gbt or n % gbt:
            steps = max(1, min(n, full) // gbt)  # a suggestion within the budget, as --rungs reads it
            raise ConfigError(
                f"--rungs {item.strip()} = {n:,} tokens is not a whole number of optimizer steps of "
                f"train.global_batch_tokens={gbt:,}; use a positive multiple, e.g. {steps * gbt}."
            )
        tokens.append(n)
    if tokens[-1] > full:
        raise ConfigError(
            f"--rungs {items[-1].strip()} = {tokens[-1]:,} tokens exceeds the scale's training budget "
            f"train.tokens={full:,}; the last rung is a proxy, at most the full budget."
        )
    if len(tokens) == 1:
        return Rungs(tuple(tokens), 1, gbt)
    factors = [b / a for a, b in zip(tokens, tokens[1:])]
    factor = round(factors[0])
    if factor < 2 or any(abs(f - factor) > 1e-9 for f in factors):
        raise ConfigError(
            f"--rungs {text} is not a geometric series with one integer factor >= 2 (successive "
            f"halving keeps 1/factor of the trials at each rung); use e.g. "
            f"{suggest_rungs(tokens[0], len(tokens), gbt, full)}."
        )
    return Rungs(tuple(tokens), factor, gbt)


def suggest_rungs(first: int, n: int, gbt: int, full: int) -> str:
    """A geometric series of `n` rungs (fewer where the budget is too small) from about `first`,
    each a whole number of steps of `gbt` tokens, the last within `full`: written as --rungs reads
    it (no thousands separators, which would split one count into several)."""
    for k in range(n, 1, -1):
        for factor in (3, 2):
            most = full // (gbt * factor ** (k - 1))  # steps of the first rung that fit the budget
            if most >= 1:
                start = min(max(1, first // gbt), most) * gbt
                return ",".join(str(start * factor**i) for i in range(k))
    return str(gbt)  # one step is all the budget holds


@dataclass(frozen=True)
class Budget:
    trials: int
    why: str  # how the trial count followed from the budget given


def trials_for_budget(
    rungs: Rungs, n_max: int, protected: int, args, full: int, rate: float | None
) -> Budget:
    """How many trials the budget of search.py's arguments `args` (--trials, --tokens of the scale's
    `full` train.tokens, --gpu-hours at `rate` tokens/s) buys, at most the space's `n_max`. Raises
    ConfigError when it buys less than one rung of the baseline."""
    trials, gpu_hours = args.trials, args.gpu_hours
    tokens = parse_token_count(args.tokens, full) if args.tokens is not None else None
    if gpu_hours is not None:
        if not (math.isfinite(gpu_hours) and gpu_hours > 0):  # 0, negative, inf or nan buys nothing
            raise ConfigError(f"--gpu-hours {gpu_hours:g} is invalid: give a positive number of GPU-hours.")
        if rate is None:
            raise ConfigError(
                "--gpu-hours needs a throughput for this scale and there is none (no paper rate, no "
                f"results/<scale>/{BENCH_NAME}); give --trials or --tokens."
            )
        tokens = int(gpu_hours * 3600 * rate)
        given = f"--gpu-hours {gpu_hours:g} = {tokens:,} tokens at {rate:,.0f} tokens/s per GPU"
    elif tokens is not None:
        if tokens < 1:
            raise ConfigError(f"--tokens {tokens} is invalid: give a positive token budget, e.g. 20B.")
        given = f"--tokens {tokens:,}"
    if trials is not None:
        if trials < 1:
            raise ConfigError(f"--trials {trials} is smaller than one trial; give 1 or more.")
        n = min(trials, n_max)
        capped = f", capped at the space's {n_max}" if trials > n_max else ""
        return Budget(n, f"--trials {trials}{capped}")
    if tokens is None:
        return Budget(n_max, "every candidate x seed")
    if tokens < rungs.tokens[0]:
        raise ConfigError(
            f"{given} is smaller than one rung of {rungs.tokens[0]:,} tokens; give a larger budget or "
            f"smaller --rungs."
        )
    fits = [k for k in range(1, n_max + 1) if rungs.cost_tokens(k, min(k, protected)) <= tokens]
    if not fits:
        raise ConfigError(
            f"{given} buys no trial: uniform, the baseline, is never stopped and trains the last rung's "
            f"{rungs.budget:,} tokens; give at least --tokens {rungs.cost_tokens(1, 1)} or smaller --rungs."
        )
    n = max(fits)
    return Budget(n, f"{given} buys {n} of the space's {n_max} trials under successive halving")
