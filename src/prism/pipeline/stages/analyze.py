"""analyze: attention distance per layer (paper §4.1, Figure 4) of every run's final weights on
validation text, results/<scale>/analysis.json. Its identity is the analysis settings, the validation data
and the hashes of the runs it reads."""

from __future__ import annotations

from typing import Callable

from prism.config.schema import RunConfig
from prism.pipeline.stages.base import Job, Phase, PlanContext, PlannedRun, Stage
from prism.pipeline.stages.train import run_weights
from prism.runs.layout import ANALYSIS_NAME
from prism.runs.records import Analysis


class Analyze(Stage):
    name = "analyze"
    script = "analyze.py"
    phase = Phase.after_runs
    reads_training_data = True  # attention distance is measured on held-out training text
    output_record = Analysis
    nonempty = "checkpoints"

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        cfg, full, trains = ctx.cfg, ctx.full, ctx.of("train")
        out = ctx.results / ANALYSIS_NAME

        def argv() -> list[str]:
            # --scale: the exported weights carry the model, not the run's data settings
            weights = [run_weights(t.run_dir) for t in trains]
            a = ctx.command(
                self, scale=cfg.scale, checkpoints=weights, sequences=cfg.analysis.sequences, out=out
            )
            return [*a, *ctx.passed]

        config = {
            "analysis": full["analysis"],
            "data": ctx.data_identity(),
            "checkpoints": [[t.config["schedule"], t.config["train"]["seed"], t.hash] for t in trains],
        }
        return self.one_job(ctx, run, out, config, argv, deps=list(trains))

    def skip_reason(self, job: Job, cfg: RunConfig, hub_offline: Callable[[], str | None]) -> str | None:
        if "uniform" not in cfg.run_schedules or len(cfg.run_schedules) < 2:
            return "needs the uniform schedule and at least one other"
        return None
