"""The straggler line: which rank is slower than the others, and when to say so (docs/cluster.md,
"When a run hangs or crawls")."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class RankTimes:
    """One rank's mean seconds per optimizer step over one interval."""

    own_s: float  # data wait + forward: the part no peer can slow down
    data_s: float
    step_s: float


@dataclass(frozen=True)
class Interval:
    """What one interval's gather says: the slowest rank by its own work, and the median."""

    slowest: int
    slowest_s: float
    median_s: float
    data_s: float  # the slowest rank's data wait

    @property
    def slower_pct(self) -> float:
        return 100.0 * (self.slowest_s / self.median_s - 1) if self.median_s > 0 else 0.0


def assess(times: list[RankTimes]) -> Interval:
    """The slowest rank of one interval (the first of equals) and the median of all ranks."""
    own = [t.own_s for t in times]
    slowest = max(range(len(own)), key=lambda r: (own[r], -r))
    return Interval(slowest, own[slowest], statistics.median(own), times[slowest].data_s)


@dataclass
class StragglerRule:
    """Say so when one rank is over `slower_pct` % above the median for `intervals` intervals in a row."""

    slower_pct: float
    intervals: int
    rank: int | None = None
    streak: int = 0

    def update(self, interval: Interval) -> bool:
        """Take one interval; True when the line is due now."""
        if interval.slower_pct <= self.slower_pct:
            self.rank, self.streak = None, 0
            return False
        if interval.slowest != self.rank:
            self.rank, self.streak = interval.slowest, 0
        self.streak += 1
        return self.streak % self.intervals == 0


def line(interval: Interval, node: str, streak: int, every: int) -> str:
    return (
        f"straggler: rank {interval.slowest} on {node} spends {interval.slowest_s:.3g} s per step on "
        f"its own work (data wait {interval.data_s:.3g} s), {interval.slower_pct:.0f} % above the "
        f"median of {interval.median_s:.3g} s, for {streak} intervals of {every} steps in a row; "
        f"every step waits for it"
    )
