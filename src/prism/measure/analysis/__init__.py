"""Analyses of trained checkpoints. `attention_distance` measures how far each layer looks
back (paper §4.1, Eq. 1); `compare` runs it over checkpoints and forms ΔD_l against uniform."""

from prism.measure.analysis.attention_distance import (
    DistanceAccumulator,
    attention_distance,
    distance_matrix,
    query_positions,
)

__all__ = ["DistanceAccumulator", "attention_distance", "distance_matrix", "query_positions"]
