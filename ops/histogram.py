"""Fixed log-spaced histograms of milliseconds, from which percentiles are read (docs/ops.md).

Bucket 0 holds values under 1 ms; bucket ``k >= 1`` holds ``[2^((k-1)/16), 2^(k/16))`` ms: sixteen
buckets per doubling, up to :data:`TOP` (2^24 ms, 4.7 hours, and above). Histograms of different
hours, routes or workers add up bucket by bucket, so a rollup stores one per hour and route and a
window's percentile is read from their sum, never from the raw rows.

**Error bound.** A percentile is the nearest-rank one (the smallest value with at least p% of the
values at or below it, as ``ops.selectors.percentile``). The histogram knows which bucket holds
that value and reports the bucket's geometric middle, moved into the values' ``[min, max]``
(stored beside the buckets). The exact value lies in the same bucket, so for values from 1 ms to
2^24 ms the report is within a factor 2^(1/32) of it: at most :data:`ERROR_BOUND` (2.19%) off;
under 1 ms, at most 0.5 ms off. Moving the middle into ``[min, max]`` only brings it closer (the
exact value lies in that range too), and makes a window whose values are all alike exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: Buckets per doubling of milliseconds.
PER_DOUBLING = 16
#: The last bucket: 2^24 ms (about 4.7 hours) and above.
TOP = 1 + PER_DOUBLING * 24
#: Largest relative error of a percentile read from a histogram, for values from 1 ms up to the
#: last bucket: half a bucket's width in log terms.
ERROR_BOUND = 2 ** (1 / (2 * PER_DOUBLING)) - 1


def bucket(ms: float) -> int:
    """The bucket of a value in milliseconds (negative values count as 0)."""
    if ms < 1:
        return 0
    return min(TOP, 1 + math.floor(PER_DOUBLING * math.log2(ms)))


def middle(k: int) -> float:
    """The value reported for bucket ``k``: 0.5 ms for bucket 0, else its geometric middle."""
    return 0.5 if k <= 0 else 2 ** ((k - 0.5) / PER_DOUBLING)


@dataclass
class Hist:
    """Counts per bucket (``{bucket: count}``, only non-empty ones), how many values, and the
    smallest and largest value (None when empty)."""

    counts: dict[int, int] = field(default_factory=dict)
    n: int = 0
    lo: float | None = None
    hi: float | None = None

    def add(self, ms: float) -> None:
        k = bucket(ms)
        self.counts[k] = self.counts.get(k, 0) + 1
        self.n += 1
        self.lo = ms if self.lo is None or ms < self.lo else self.lo
        self.hi = ms if self.hi is None or ms > self.hi else self.hi

    def merge(self, other: Hist) -> None:
        if not other.n:
            return
        counts = self.counts
        for k, c in other.counts.items():
            counts[k] = counts.get(k, 0) + c
        self.n += other.n
        assert other.lo is not None and other.hi is not None
        self.lo = other.lo if self.lo is None or other.lo < self.lo else self.lo
        self.hi = other.hi if self.hi is None or other.hi > self.hi else self.hi

    def percentile(self, p: float) -> float | None:
        """The ``p``-th percentile (0-100), nearest rank, read from the buckets (see the module's
        error bound); None when empty."""
        if not self.n:
            return None
        assert self.lo is not None and self.hi is not None
        rank = max(1, math.ceil(p / 100 * self.n))
        seen = 0
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen >= rank:
                return min(self.hi, max(self.lo, middle(k)))
        return self.hi  # not reached: the counts add up to n

    def to_json(self) -> dict[str, int]:
        """The buckets as a JSON object (``{"26": 3}``) for a ``JSONField``."""
        return {str(k): c for k, c in sorted(self.counts.items())}

    @classmethod
    def from_stored(cls, counts: dict[str, Any] | None, n: int, lo: float | None, hi: float | None) -> Hist:
        return cls({int(k): int(c) for k, c in (counts or {}).items()}, int(n), lo, hi)
