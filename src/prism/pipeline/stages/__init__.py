"""The stages of a reproduction, in the order they are listed (`--stages`, run_all.stages).
Each is one class (base.Stage); adding a stage is one class and one line here. The plan and the
runner iterate this registry and ask each stage, never test a stage's name."""

from __future__ import annotations

from prism.pipeline.stages.analyze import Analyze
from prism.pipeline.stages.base import Job, Phase, Placement, PlanContext, Run, Stage, launch_prefix
from prism.pipeline.stages.bench import Bench
from prism.pipeline.stages.eval import Eval
from prism.pipeline.stages.report import Report
from prism.pipeline.stages.train import Train

REGISTRY: tuple[Stage, ...] = (Train(), Eval(), Bench(), Analyze(), Report())
STAGES = tuple(s.name for s in REGISTRY)


def stage(name: str) -> Stage:
    return next(s for s in REGISTRY if s.name == name)


__all__ = [
    "REGISTRY",
    "STAGES",
    "Job",
    "Phase",
    "Placement",
    "PlanContext",
    "Run",
    "Stage",
    "launch_prefix",
    "stage",
]
