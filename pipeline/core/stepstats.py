"""Step-time statistics kept up to date one step at a time.

The reference measures a run's step times as ``{step: duration}`` for consecutive step numbers
(a later attempt overwrites an earlier one, keeping its position), computes the ideal step time
as the mean of the durations up to median + 3 MAD, and the step-time deviation from the
deviations ``|duration - ideal|`` in that order: their mean below 100 steps, else the 90th
percentile of the last 100, less the median of the 1,000 before those once there are enough.

Recomputed from scratch that is O(n log n) per query. Here the durations are also kept sorted,
and the 1,100 most recent in two sorted windows, so that every query is O(log n): the median is
an index, and the k-th smallest ``|duration - x|`` is a selection over two sorted runs (the values
below ``x`` read backwards, those above it forwards). Give durations as integers (microseconds)
and every figure is exact, whatever order the updates came in.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

RECENT = 100
BASELINE = 1000
_DTYPES = {"q": np.int64, "d": np.float64}  # numpy's names for the ``array`` typecodes used
_MERGE_FROM = 16  # new steps from which one merge beats an insert each


def kth_distance(values: Sequence[float], lo: int, hi: int, center: float, k: int) -> float:
    """The k-th smallest (0-based) ``|v - center|`` over sorted ``values[lo:hi]``."""
    return kth_distances(values, lo, hi, center, k)[0]


def kth_distances(values: Sequence[float], lo: int, hi: int, center: float,
                  k: int) -> tuple[float, float]:
    """The k-th and (k+1)-th smallest ``|v - center|`` over sorted ``values[lo:hi]`` (the
    second is the first again when there is no (k+1)-th).

    The distances of the values below ``center``, read backwards from the split, and of those
    above it, read forwards, are two ascending runs; take ``taken`` from the first and
    ``k + 1 - taken`` from the second, and binary-search ``taken``.
    """
    split = bisect.bisect_left(values, center, lo, hi)
    below, above = split - lo, hi - split
    low, high = max(0, k + 1 - above), min(k + 1, below)
    while low < high:
        taken = (low + high) // 2
        # If the next distance from below is smaller than the last one taken from above,
        # more must come from below.
        if values[split + k - taken] - center > center - values[split - 1 - taken]:
            low = taken + 1
        else:
            high = taken
    kth = -math.inf
    if low > 0:
        kth = center - values[split - low]
    if k + 1 - low > 0:
        kth = max(kth, values[split + k - low] - center)
    following = math.inf
    if low < below:
        following = center - values[split - 1 - low]
    if k + 1 - low < above:
        following = min(following, values[split + k + 1 - low] - center)
    return kth, (kth if following == math.inf else following)


def median_distance(values: Sequence[float], lo: int, hi: int, center: float) -> float:
    """The median of ``|v - center|`` over sorted ``values[lo:hi]`` (as numpy's median)."""
    n = hi - lo
    if n % 2:
        return kth_distance(values, lo, hi, center, n // 2)
    first, second = kth_distances(values, lo, hi, center, n // 2 - 1)
    return (first + second) / 2


def percentile_distance(values: Sequence[float], center: float, percentile: float) -> float:
    """The reference's linear-interpolation percentile of ``|v - center|`` over sorted values."""
    index = (len(values) - 1) * percentile / 100.0
    low = int(index)
    a, b = kth_distances(values, 0, len(values), center, low)
    return a + (b - a) * (index - low)


def _median(values: Sequence[float], lo: int, hi: int) -> float:
    n = hi - lo
    middle = lo + n // 2
    return values[middle] if n % 2 else (values[middle - 1] + values[middle]) / 2


class StepStatistics:
    """Step durations by step number, with the reference's ideal step time and deviation.

    Args:
        typecode: How the sorted durations are stored (``array`` typecode): ``"q"`` for integer
            microseconds (exact, and an insert moves 8-byte values rather than objects),
            ``"d"`` for float seconds.
    """

    def __init__(self, typecode: str = "d") -> None:
        self.durations: dict[int, float] = {}
        self._typecode = typecode
        self._sorted: array[Any] = array(typecode)
        self._total: float = 0
        # The last RECENT + BASELINE steps in step-time order, and their values sorted.
        self._window: collections.deque[int] = collections.deque()
        self._recent: list[float] = []
        self._baseline: list[float] = []

    def __len__(self) -> int:
        return len(self.durations)

    def set(self, step: int, duration: float) -> None:
        """Records the duration of ``step``, replacing an earlier one (which keeps its place)."""
        old = self.durations.get(step)
        if old is not None:
            del self._sorted[bisect.bisect_left(self._sorted, old)]
            self._total -= old
            if step in self._window:
                self._rebuild_windows(replace=(step, duration))
                self.durations[step] = duration
                self._insert(duration)
                return
        self.durations[step] = duration
        self._insert(duration)
        if old is None:
            self._slide(step, duration)

    def _insert(self, duration: float) -> None:
        self._sorted.insert(bisect.bisect_right(self._sorted, duration), duration)
        self._total += duration

    def set_many(self, pairs: list[tuple[int, float]]) -> None:
        """``set`` for each pair in order; many at once are sorted once instead of inserted, and
        a few new steps against a long history merged into it in one pass (an insert each would
        move the history once per step)."""
        if len(pairs) < 64 or len(pairs) * 8 < len(self.durations):
            if len(pairs) >= _MERGE_FROM and self._all_new(pairs):
                self._merge(pairs)
                return
            for step, duration in pairs:
                self.set(step, duration)
            return
        self.durations.update(pairs)
        ordered = np.fromiter(self.durations.values(), _DTYPES[self._typecode], len(self.durations))
        ordered.sort()
        self._sorted = array(self._typecode, ordered.tobytes())
        self._total = sum(self._sorted)
        self._window = collections.deque(reversed(list(
            itertools.islice(reversed(self.durations), RECENT + BASELINE))))
        values = [self.durations[step] for step in self._window]
        self._recent = sorted(values[-RECENT:])
        self._baseline = sorted(values[:-RECENT])

    def _all_new(self, pairs: list[tuple[int, float]]) -> bool:
        """Whether no step of ``pairs`` has a duration yet, nor appears twice in them."""
        steps = {step for step, _ in pairs}
        return len(steps) == len(pairs) and not any(step in self.durations for step in steps)

    def _merge(self, pairs: list[tuple[int, float]]) -> None:
        """``set`` for each of ``pairs`` (new steps), with the sorted durations merged at once."""
        self.durations.update(pairs)
        values = np.array([duration for _, duration in pairs], dtype=_DTYPES[self._typecode])
        values.sort()
        history = np.frombuffer(self._sorted, dtype=_DTYPES[self._typecode]) if self._sorted else values[:0]
        merged = np.insert(history, np.searchsorted(history, values, "right"), values)
        self._sorted = array(self._typecode, merged.tobytes())  # a new array: the view keeps the old
        for step, duration in pairs:  # in order, so that a float total adds up as ``set`` would
            self._total += duration
            self._slide(step, duration)

    def _slide(self, step: int, duration: float) -> None:
        self._window.append(step)
        bisect.insort(self._recent, duration)
        if len(self._window) > RECENT:
            moved = self.durations[self._window[-RECENT - 1]]
            del self._recent[bisect.bisect_left(self._recent, moved)]
            bisect.insort(self._baseline, moved)
        if len(self._window) > RECENT + BASELINE:
            gone = self._window.popleft()
            del self._baseline[bisect.bisect_left(self._baseline, self.durations[gone])]

    def _rebuild_windows(self, replace: tuple[int, float]) -> None:
        step, duration = replace
        values = [duration if s == step else self.durations[s] for s in self._window]
        self._recent = sorted(values[-RECENT:])
        self._baseline = sorted(values[:-RECENT])

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 to 1) of every duration, by nearest rank; None with none."""
        if not self._sorted:
            return None
        return float(self._sorted[min(len(self._sorted) - 1, max(0, math.ceil(q * len(self._sorted)) - 1))])

    def mean(self) -> float | None:
        return float(self._total / len(self._sorted)) if self._sorted else None

    def recent_median(self) -> float | None:
        """The median of the most recent RECENT durations: where a regression shows first."""
        return _median(self._recent, 0, len(self._recent)) if self._recent else None

    def any_below(self, value: float) -> bool:
        """Whether any duration is below ``value``."""
        return bool(self._sorted) and self._sorted[0] < value

    def ideal(self, minimum: float = -math.inf) -> float | None:
        """Mean of the durations (those >= ``minimum``) up to their median + 3 MAD."""
        values = self._sorted
        lo, hi = bisect.bisect_left(values, minimum), len(values)
        if lo >= hi:
            return None
        median = _median(values, lo, hi)
        mad = median_distance(values, lo, hi, median)
        cut = bisect.bisect_right(values, median + 3 * mad, lo, hi)
        if cut == lo:
            return None
        if (cut - lo) * 2 <= hi:
            kept = sum(values[lo:cut])
        else:
            kept = self._total - sum(values[:lo]) - sum(values[cut:])
        return float(kept / (cut - lo))

    def excess(self, ideal: float) -> float:
        """The durations' sum beyond ``ideal``: each one's ``max(0, duration - ideal)``."""
        values = self._sorted
        cut = bisect.bisect_right(values, ideal)
        if cut == len(values):
            return 0.0
        beyond = np.frombuffer(values, dtype=_DTYPES[self._typecode])[cut:]  # numpy: a long run's half
        return float(beyond.sum() - ideal * len(beyond))

    def deviation(self, ideal: float) -> float | None:
        """The reference's cumulative step-time deviation against ``ideal``."""
        n = len(self.durations)
        if n == 0:
            return None
        if n < RECENT:
            return math.fsum(abs(v - ideal) for v in self.durations.values()) / n
        spike = percentile_distance(self._recent, ideal, 90)
        if n < RECENT + BASELINE:
            return spike
        return spike - median_distance(self._baseline, 0, len(self._baseline), ideal)
