"""The long-context evaluation (docs/evaluation.md, "Beyond the training context"): per-position loss
and attention distance (Eq. 1) of a run's final weights past its training length, per RoPE choice."""

from prism.measure.long_context.buckets import bucket_edges, bucket_means
from prism.measure.long_context.settings import LongContextError, Settings, Unit, settings_for

__all__ = ["LongContextError", "Settings", "Unit", "bucket_edges", "bucket_means", "settings_for"]
