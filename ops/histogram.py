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

**Stored form** (:meth:`Hist.to_bytes`): the first non-empty bucket as a little-endian unsigned
16-bit integer, then the counts from it to the last non-empty bucket as little-endian unsigned
32-bit integers; ``None`` when empty. A month of hourly histograms is read and added with numpy in
milliseconds (as JSON, decoding alone took half a second).
"""

from __future__ import annotations

import math
import struct

import numpy as np

#: Buckets per doubling of milliseconds.
PER_DOUBLING = 16
#: The last bucket: 2^24 ms (about 4.7 hours) and above.
TOP = 1 + PER_DOUBLING * 24
#: Largest relative error of a percentile read from a histogram, for values from 1 ms up to the
#: last bucket: half a bucket's width in log terms.
ERROR_BOUND = 2 ** (1 / (2 * PER_DOUBLING)) - 1
_COUNT = np.dtype("<u4")


def bucket(ms: float) -> int:
    """The bucket of a value in milliseconds (negative values count as 0)."""
    if ms < 1:
        return 0
    return min(TOP, 1 + math.floor(PER_DOUBLING * math.log2(ms)))


def middle(k: int) -> float:
    """The value reported for bucket ``k``: 0.5 ms for bucket 0, else its geometric middle."""
    return 0.5 if k <= 0 else 2 ** ((k - 0.5) / PER_DOUBLING)


class Hist:
    """Counts per bucket (a numpy array of :data:`TOP` + 1), how many values, and the smallest
    and largest value (None when empty)."""

    __slots__ = ("counts", "hi", "lo", "n")

    def __init__(self) -> None:
        self.counts = np.zeros(TOP + 1, dtype=np.int64)
        self.n = 0
        self.lo: float | None = None
        self.hi: float | None = None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Hist)
            and (self.n, self.lo, self.hi) == (other.n, other.lo, other.hi)
            and bool(np.array_equal(self.counts, other.counts))
        )

    def __repr__(self) -> str:
        return f"Hist(n={self.n}, lo={self.lo}, hi={self.hi}, buckets={self.pairs()})"

    def add(self, ms: float) -> None:
        self.counts[bucket(ms)] += 1
        self.n += 1
        self.lo = ms if self.lo is None or ms < self.lo else self.lo
        self.hi = ms if self.hi is None or ms > self.hi else self.hi

    def _range(self, n: int, lo: float | None, hi: float | None) -> None:
        self.n += n
        assert lo is not None and hi is not None
        self.lo = lo if self.lo is None or lo < self.lo else self.lo
        self.hi = hi if self.hi is None or hi > self.hi else self.hi

    def merge(self, other: Hist) -> None:
        if other.n:
            self.counts += other.counts
            self._range(other.n, other.lo, other.hi)

    def percentile(self, p: float) -> float | None:
        """The ``p``-th percentile (0-100), nearest rank, read from the buckets (see the module's
        error bound); None when empty."""
        if not self.n:
            return None
        assert self.lo is not None and self.hi is not None
        rank = max(1, math.ceil(p / 100 * self.n))
        k = int(np.searchsorted(np.cumsum(self.counts), rank))
        return min(self.hi, max(self.lo, middle(k)))

    def pairs(self) -> list[tuple[int, int]]:
        """The non-empty buckets as ``(bucket, count)``, ascending."""
        return [(int(k), int(self.counts[k])) for k in np.flatnonzero(self.counts)]

    def to_bytes(self) -> bytes | None:
        """The stored form (module docstring); None when empty."""
        nonzero = np.flatnonzero(self.counts)
        if not len(nonzero):
            return None
        first, last = int(nonzero[0]), int(nonzero[-1])
        return struct.pack("<H", first) + self.counts[first : last + 1].astype(_COUNT).tobytes()

    def merge_stored(self, blob: bytes | memoryview | None, n: int, lo: float | None, hi: float | None) -> None:
        """Add a stored histogram (:meth:`to_bytes`, its count, min and max)."""
        if not n or not blob:
            return
        first = int.from_bytes(bytes(blob[:2]), "little")
        counts = np.frombuffer(blob, dtype=_COUNT, offset=2)
        self.counts[first : first + len(counts)] += counts
        self._range(n, lo, hi)

    @classmethod
    def from_stored(cls, blob: bytes | memoryview | None, n: int, lo: float | None, hi: float | None) -> Hist:
        h = cls()
        h.merge_stored(blob, n, lo, hi)
        return h
