"""eval: the zero-shot tasks of one finished run, results/<scale>/eval/<schedule>/seed<k>.json.
Its identity is the task settings and the hash of the run whose weights it scores."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from prism.config.schema import ConfigError, RunConfig
from prism.pipeline.stages.base import Job, Phase, Placement, PlanContext, PlannedRun, Stage
from prism.pipeline.stages.train import run_weights
from prism.runs.layout import eval_result
from prism.runs.records import EvalResult


class Eval(Stage):
    name = "eval"
    script = "evaluate.py"
    phase = Phase.per_run
    placement = Placement.one_node
    output_record = EvalResult
    nonempty = "tasks"

    def check(self, cfg: RunConfig) -> None:
        if cfg.eval.data_dir and not Path(cfg.eval.data_dir).is_dir():
            raise ConfigError(
                f"eval.data_dir={cfg.eval.data_dir!r} is not a folder; point it at local "
                f"copies of the task datasets (docs/evaluation.md) or leave it unset for the hub."
            )

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        cfg, train = ctx.cfg, ctx.job("train", run)
        # the run folder's schedule name: a head list's commas are not in it, and the report pairs
        # a schedule's runs and evaluations by that name
        out = eval_result(ctx.results, train.run_dir.parent.name, run.seed)

        def argv() -> list[str]:
            e = cfg.eval
            options = dict(
                checkpoint=run_weights(train.run_dir), tasks=",".join(e.tasks), batch_size=e.batch_size
            )
            return ctx.command(self, **options, data_dir=e.data_dir or None, limit=e.limit, out=out)

        config = {
            "eval": {"tasks": list(cfg.eval.tasks), "data_dir": cfg.eval.data_dir, "limit": cfg.eval.limit},
            "checkpoint": train.hash,
        }
        return self.one_job(ctx, run, out, config, argv, deps=[train])

    def skip_reason(self, job: Job, cfg: RunConfig, hub_offline: Callable[[], str | None]) -> str | None:
        if job.status == "done" or cfg.eval.data_dir or not hub_offline():
            return None
        return (
            f"eval.data_dir is not set and {hub_offline()}: pass "
            f"eval.data_dir=DIR with local copies of the tasks"
        )
