"""Zero-shot evaluation with lm-evaluation-harness 0.4.x semantics (paper Table 3)."""

from prism.eval.evaluator import evaluate
from prism.eval.tasks import DEFAULT_TASKS, SEMANTICS, TASKS, EvalInputError, resolve_tasks

__all__ = ["evaluate", "DEFAULT_TASKS", "SEMANTICS", "TASKS", "EvalInputError", "resolve_tasks"]
