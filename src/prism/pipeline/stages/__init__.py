"""The stages of a reproduction, in the order the plan runs them (`--stages`, run_all.stages).
Each is one class (base.Stage); adding a stage is one class and one entry in the tuple below. The
plan and the runner iterate this registry and ask each stage, never test a stage's name."""

from __future__ import annotations

from prism.pipeline.stages.analyze import Analyze
from prism.pipeline.stages.base import Job, Phase, Placement, PlanContext, PlannedRun, Stage, launch_prefix
from prism.pipeline.stages.bench import Bench
from prism.pipeline.stages.eval import Eval
from prism.pipeline.stages.long_context import LongContext
from prism.pipeline.stages.report import Report
from prism.pipeline.stages.train import Train
from prism.registry import Registry

# registration order is the order of the plan's jobs within each phase, and of --stages' listing
STAGES: Registry[Stage] = Registry("stage")
for stage in (Train(), Eval(), Bench(), Analyze(), LongContext(), Report()):
    STAGES.add(stage.name, stage)

__all__ = ["STAGES", "Job", "Phase", "Placement", "PlanContext", "PlannedRun", "Stage", "launch_prefix"]
