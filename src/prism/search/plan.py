"""A search as its arguments define it (reproduce/search.py): the space, seeds, rungs, budget,
trial order and study folder, all checked before anything is written, and the dry run's plan and
cost (docs/search.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from prism.cluster import check_training_launch
from prism.config.overrides import override_value
from prism.config.schema import ConfigError, RunConfig, load_config
from prism.core.schedule import ScheduleFilter
from prism.runs.layout import (
    BENCH_NAME,
    LAST_CHECKPOINT_NAME,
    STUDY_JOURNAL_NAME,
    STUDY_RUNS_DIR,
    default_study_dir,
    scale_result,
)

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class SearchArgs:
    """What a search is asked for: search.py's arguments (prism.cli.search), with its defaults."""

    scale: str
    rungs: str  # token rungs, e.g. "768,1536" or "1%,3%,9%" of train.tokens
    overrides: list[str] = field(default_factory=list)  # key=value, for every trial
    space: list[str] = field(default_factory=list)  # table5 | rules | schedule names or head lists
    smooth: bool = False  # space "rules": the design filters of describe.py --enumerate
    baseline_preservation: bool = False
    power_of_two: bool = False
    max_head_dim: int | None = None
    seeds: list[int] | None = None  # train seeds (None: the scale's first)
    trials: int | None = None  # the budget: at most one of trials, tokens, gpu_hours
    tokens: str | None = None
    gpu_hours: float | None = None
    workers: int = 1
    devices_per_trial: int | None = None
    study_dir: str | None = None
    seed: int = 0  # the study seed: the order of the trials
    dry_run: bool = False
    final: bool = False
    top_k: int | None = None
    final_stages: str | None = None
    worker: bool = False  # this process is one of the workers --workers started


class Search:
    """Everything the arguments define, checked before anything is written."""

    def __init__(self, args: SearchArgs) -> None:
        from prism.search.budget import parse_rungs, trials_for_budget
        from prism.search.space import build_space
        from prism.search.study import trial_order
        from prism.search.trial_config import trial_devices

        self.args = args
        self.cfg = cfg = load_config(args.scale, args.overrides)
        # the flags' ranges are their rules (prism.cli.search); what the config holds, its own
        # checked before the study runs, which may take days; the workers never run the final stage
        if args.final and not args.worker:  # run_all.stages (--final-stages) of the full-budget stage
            from prism.pipeline.stages import STAGES

            unknown = [t for t in cfg.run_all.stages if t not in STAGES]
            if unknown:
                raise ConfigError(
                    f"run_all.stages {unknown[0]!r} is invalid: give some of {','.join(STAGES)}."
                )
        rules = ScheduleFilter(
            smooth=args.smooth,
            baseline_preservation=args.baseline_preservation,
            power_of_two=args.power_of_two,
            max_head_dim=args.max_head_dim,
        )
        self.candidates = build_space(cfg, args.space, rules)
        self.seeds = list(dict.fromkeys(args.seeds if args.seeds else cfg.seeds[:1]))
        self.rungs = parse_rungs(args.rungs, cfg)
        self.costs = None
        if args.dry_run or args.gpu_hours is not None:  # prism.pipeline imports Lightning: seconds
            from prism.pipeline.estimate import estimate

            self.costs = estimate(cfg)
        rate = self.costs and (self.costs.measured.get("uniform") or self.costs.paper_tps_per_gpu)
        n = len(self.candidates) * len(self.seeds)
        self.budget = trials_for_budget(self.rungs, n, len(self.seeds), args, cfg.train.tokens, rate)
        self.study_dir = Path(args.study_dir or default_study_dir(cfg))
        self.runs_dir = self.study_dir / STUDY_RUNS_DIR
        keys = [c.key for c in self.candidates]
        self.order = trial_order(keys, self.seeds, self.budget.trials, args.seed)
        self.devices = trial_devices(cfg, args)  # train.devices of every trial
        if not args.dry_run and (args.worker or (args.workers == 1 and self.devices == 1)):
            # this process trains the trials: refuse a layout that cannot, before any trial fails on it
            check_training_launch(self.devices, int(cfg.train.num_nodes))
        # the refusals training gives before its first step, which every trial would meet (each
        # trial's config is the first's with another schedule or seed); a dry run plans for data it
        # may not reach from here (run_all.py's too)
        from prism.train.plan import plan_run  # Lightning: seconds, once the cheap checks passed

        first = self.trial_config(self.order[0]["schedule"], self.order[0]["seed"])
        self.trial_plan = plan_run(first, launch=False, reach_data=not args.dry_run)
        self.definition = {
            "scale": cfg.scale,
            "space": [c.text for c in self.candidates],
            "candidates": [c.to_dict() for c in self.candidates],
            "seeds": self.seeds,
            "rungs": list(self.rungs.tokens),
            "factor": self.rungs.factor,
            "trials": self.budget.trials,
            "budget": {"trials": args.trials, "tokens": args.tokens, "gpu_hours": args.gpu_hours},
            "study_seed": args.seed,
            "overrides": list(args.overrides),
        }

    def trial_config(self, key: str, seed: int) -> RunConfig:
        """The config of the trial of schedule `key` and train seed `seed`."""
        from prism.search.trial_config import trial_config

        a = self.args
        return trial_config(a.scale, a.overrides, self.rungs, self.runs_dir, key, seed, self.devices)

    def top_k(self, recorded: dict | None) -> int:
        """--top-k (the override search.top_k), else the k of the study's last final stage
        (`recorded`), else the config's search.top_k."""
        given = override_value(self.args.overrides, "search.top_k")
        return given if given is not None else (recorded or {}).get("top_k", self.cfg.search.top_k)

    def continue_from(self, old: dict) -> None:
        """Keep the trial count of a study made with the same budget flags: --gpu-hours buys trials
        at the measured rate once results/<scale>/bench.json exists, so the same command would
        otherwise count other trials after a benchmark and be refused."""
        from prism.search.budget import Budget
        from prism.search.study import trial_order

        n = old.get("trials")
        if old.get("budget") != self.definition["budget"] or n is None or n == self.budget.trials:
            return
        self.budget = Budget(n, f"{self.budget.why}; {n} as when the study was made")
        self.order = trial_order([c.key for c in self.candidates], self.seeds, n, self.args.seed)
        self.definition["trials"] = n

    # ----- the plan ----------------------------------------------------------------------------
    def show(self, console: Console) -> None:
        """The dry run's plan and cost, on `console` as plain lines."""
        from prism.pipeline.estimate import human_bytes
        from prism.search.final import FINAL_ATTR
        from prism.search.study import existing_study

        # plain lines, never wrapped: the plan's table stays aligned
        say = partial(console.print, markup=False, highlight=False, emoji=False, soft_wrap=True)
        cfg, r, n = self.cfg, self.rungs, self.budget.trials
        paper, measured = self.costs.paper_tps_per_gpu, self.costs.measured.get("uniform")
        workers = min(self.args.workers, n)
        say(
            f"scale {cfg.scale}: L={cfg.model.n_layer}, d_model={cfg.model.d_model}, "
            f"h_base={cfg.model.h_base}, {self.costs.n_params:,} parameters; full budget "
            f"train.tokens={cfg.train.tokens:,}"
        )
        marked = ", ".join(f"{c.key} ({c.marks[0]})" for c in self.candidates if c.marks)
        say(
            f"space: {len(self.candidates)} schedules (uniform included)"
            + (f", of them {marked}" if marked else "")
        )
        say(f"seeds: {', '.join(map(str, self.seeds))}; trials: {n} ({self.budget.why})")
        say(
            f"rungs: successive halving keeps 1/{r.factor} of the trials at each rung; uniform is never "
            f"stopped; each trial's LR warmup and cosine span the last rung"
        )
        row = "{:>4} {:>16} {:>8} {:>5} {:>14} {:>17}".format
        say(row("rung", "tokens", "steps", "runs", "GPU-h (paper)", "GPU-h (measured)"))
        runs, rates = r.runs_at(n, min(n, len(self.seeds))), (paper, measured)
        for i, (tokens, steps, k, seg) in enumerate(zip(r.tokens, r.steps, runs, r.segment_tokens())):
            say(row(i, f"{tokens:,}", f"{steps:,}", k, *(_gpu_h(k * seg, rate) for rate in rates)))
        cost = r.cost_tokens(n, min(n, len(self.seeds)))
        say(row("all", f"{cost:,}", "", n, *(_gpu_h(cost, rate) for rate in rates)))
        paper_rate = (
            f"{paper:,.0f} tokens/s per H100 (Table 2 / 8)" if paper else f"n/a (no {cfg.scale} in the paper)"
        )
        measured_rate = (
            f"{measured:,.0f} tokens/s per device on {self.costs.measured_hardware}"
            if measured
            else f"n/a until the benchmark has run ({scale_result(cfg, BENCH_NAME)})"
        )
        say(
            f"paper rate: {paper_rate}; measured rate: {measured_rate}; with {self.args.workers} worker(s) "
            f"the wall time is about GPU-h / {self.args.workers}"
        )
        ckpt, export, kept = self.costs.ckpt_bytes, self.costs.export_bytes, runs[-1]
        say(
            f"disk: {human_bytes(ckpt)} per checkpoint, {human_bytes(export)} exported weights; a trial "
            f"keeps {LAST_CHECKPOINT_NAME} only, a stopped trial deletes it, so the {kept} trial(s) of "
            f"the last rung keep {human_bytes(kept * (ckpt + export))}, about "
            f"{human_bytes(kept * (ckpt + export) + workers * ckpt)} at most while {workers} train"
        )
        # --final's cost: top-k + uniform x the scale's seeds at the full budget; a study keeps the
        # k of its last --final
        study = existing_study(self.study_dir, self.rungs)
        k = self.top_k(study.user_attrs.get(FINAL_ATTR) if study is not None else None)
        runs = (min(k, len(self.candidates) - 1) + 1) * len(cfg.seeds)
        tokens = runs * cfg.train.tokens
        say(
            f"full budget (--final{'' if self.args.final else ', not given'}): the best {k} of the last "
            f"rung besides uniform, and uniform, each with seeds {', '.join(map(str, cfg.seeds))} at "
            f"train.tokens={cfg.train.tokens:,} through the pipeline: {runs} runs, {tokens:,} tokens, "
            f"GPU-h {_gpu_h(tokens, paper)} (paper), {_gpu_h(tokens, measured)} (measured), plus evaluation"
        )
        exists = (self.study_dir / STUDY_JOURNAL_NAME).exists()
        say(f"study: {self.study_dir} ({'exists' if exists else 'new'})")
        say("trial order (study seed %d):" % self.args.seed)
        for i, params in enumerate(self.order[:20]):
            say(f"  {i:>3} {params['schedule']} seed {params['seed']}")
        if len(self.order) > 20:
            say(f"  ... and {len(self.order) - 20} more")


def _gpu_h(tokens: int, rate: float | None) -> str:
    """GPU-hours of `tokens` at `rate` tokens/s, or n/a without a rate."""
    return f"{tokens / rate / 3600:,.2f}" if rate else "n/a"
