"""bench: training throughput of every schedule on one device (paper Table 2),
results/<scale>/bench.json. It runs before the training runs, so the plan can tell their cost
at the measured rate."""

from __future__ import annotations

from prism.pipeline.stages.base import Job, Phase, PlanContext, PlannedRun, Stage
from prism.runs import records
from prism.runs.identity import drop_later_keys_at_default
from prism.runs.layout import BENCH_NAME


class Bench(Stage):
    name = "bench"
    script = "benchmark.py"
    phase = Phase.before_runs
    output_record = records.Bench
    nonempty = "schedules"

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        cfg, full = ctx.cfg, ctx.full
        out = ctx.results / BENCH_NAME
        micro_batch = cfg.bench.micro_batch or cfg.train.micro_batch
        config = {
            # as in a run's identity: keys added later hold no place at their earlier value, so
            # that an existing benchmark keeps its record
            "model": drop_later_keys_at_default({"model": dict(full["model"])})["model"],
            "bench": full["bench"],
            "heads": {s: list(cfg.head_schedule(s).heads) for s in cfg.run_schedules},
            "micro_batch": micro_batch,
            "compile": cfg.train.compile,
            "precision": cfg.train.precision,
        }

        def argv() -> list[str]:
            # ';' between head lists, whose own items are comma-separated
            schedules = (";" if any("," in s for s in cfg.run_schedules) else ",").join(cfg.run_schedules)
            given = None if micro_batch == "auto" else micro_batch  # auto: benchmark.py takes the plan's
            a = ctx.command(
                self, scale=cfg.scale, schedules=schedules, steps=cfg.bench.steps, micro_batch=given
            )
            if cfg.train.compile is not None:
                a.append("--compile" if cfg.train.compile else "--no-compile")
            return [*a, "--out", str(out), *ctx.passed]

        return self.one_job(ctx, run, out, config, argv)
