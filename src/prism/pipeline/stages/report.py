"""report: results/RESULTS.md and its figures from whatever results exist, every scale. It keeps
no record: it is regenerated every time (unchanged files are not rewritten)."""

from __future__ import annotations

from prism.pipeline.stages.base import Job, Phase, Placement, PlanContext, PlannedRun, Stage
from prism.runs.layout import report_path


class Report(Stage):
    name = "report"
    script = "report.py"
    phase = Phase.after_runs
    placement = Placement.here
    recorded = False
    always_note = "regenerated every time (unchanged files are not rewritten)"

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        cfg = ctx.cfg

        def argv() -> list[str]:
            return ctx.command(self, runs_dir=cfg.runs_dir, results_dir=cfg.results_dir)

        return self.one_job(ctx, run, report_path(cfg), {}, argv)

    def output_valid(self, job: Job) -> bool:
        return False  # never up to date: it reflects every result there is (RESULTS.md is not JSON)
