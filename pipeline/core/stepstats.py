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

That keeps every duration: O(steps) memory, and a run decoded from its state rebuilds it from the
whole step history. ``BoundedStepStatistics`` answers the same questions in bounded memory and
encodes itself (``to_bytes``), so a decoded run need not rebuild it. Up to ``EXACT_LIMIT``
durations it is a ``StepStatistics("q")`` and every figure is the same. Beyond that it keeps
the durations in a histogram whose bins keep 4 significant decimal digits of the microseconds
(each bin less than 0.1 % as wide as its values), with each bin's count and exact integer sum,
plus the last RECENT + BASELINE durations themselves and the step numbers as ranges. Its figures
are then those of the durations each replaced by its bin's mean (which moves it less than
0.1 %): the mean exactly; a quantile within 0.1 % of the exact one (the exact value and the bin's
mean lie in one bin); ``any_below(x)`` and the 1 s cut of ``ideal(x)`` exactly where ``x`` is a
bin edge (any integer of at most 4 significant digits, such as 1 s); ``excess`` within the
durations of the bin holding the ideal times its width (each less than 0.1 % of the ideal);
the ideal step time, the mean of the durations up to a cut that those moved durations set,
within 0.05 % on the step-time distributions tested (jitter, heavy tails, slow eval steps,
restarts: 0.016 % at most, measured); the deviation and the recent median exactly, from the
durations kept.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.core.packing import pack_each, unpack_each

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


#: Durations up to which ``BoundedStepStatistics`` keeps every one, and every figure is exact.
#: Above the longest trace compared with the reference (5,000 steps); its encoding is then
#: about 2 bytes a duration (16 KB), the histogram's a few KB however long the run.
EXACT_LIMIT = 8192

Int64s = npt.NDArray[np.int64]
#: A step's duration as the statistics hold it, for a step run again (None: not known).
Previous = Callable[[int], int | None]

_WINDOW = RECENT + BASELINE
_DIGITS = 4  # significant decimal digits a bin keeps: bins under 10**4 µs hold one value each
_SMALL = 10 ** _DIGITS
_PER_DECADE = 9 * 10 ** (_DIGITS - 1)  # the mantissas 1000..9999 of a decade
_POWERS = np.array([10 ** k for k in range(19)], dtype=np.int64)
_MAGIC = b"GSTS"
_VERSION = 1
_EXACT, _BINNED = 0, 1
_REFUSAL = "encoded step statistics"


def bin_of(durations: Int64s) -> Int64s:
    """The histogram bin of each duration (non-negative integer microseconds): the duration
    itself below 10**4, else its 4 leading decimal digits and its number of digits. Integer
    arithmetic only, so every machine bins alike; every bin is under 0.1 % as wide as its values."""
    digits = np.searchsorted(_POWERS, durations, side="right")
    exponent = np.maximum(digits - _DIGITS, 0)
    mantissa = durations // _POWERS[exponent]
    return np.where(exponent == 0, durations, _SMALL + (exponent - 1) * _PER_DECADE + mantissa - _SMALL // 10)


def bin_bounds(bins: Int64s) -> tuple[Int64s, Int64s]:
    """The lowest duration of each bin, and its width (durations ``low`` to ``low + width - 1``)."""
    small = bins < _SMALL
    exponent = np.where(small, 0, (bins - _SMALL) // _PER_DECADE + 1)
    mantissa = np.where(small, bins, (bins - _SMALL) % _PER_DECADE + _SMALL // 10)
    width = _POWERS[exponent]
    return mantissa * width, width


class BoundedStepStatistics:
    """``StepStatistics("q")`` in bounded memory, encodable (see the module docstring).

    Exact up to ``EXACT_LIMIT`` durations; beyond, a histogram of them with the last
    RECENT + BASELINE kept exactly. A step run again replaces its duration and keeps its place,
    as in ``StepStatistics``; once the histogram holds the durations, the one to replace is
    asked of ``previous`` where it is older than the kept ones.
    """

    def __init__(self) -> None:
        self._state: StepStatistics | _Binned = StepStatistics("q")

    def __len__(self) -> int:
        return len(self._state)

    @property
    def exact(self) -> bool:
        """Whether every duration is kept (every figure is exact)."""
        return isinstance(self._state, StepStatistics)

    def set(self, step: int, duration: int, previous: Previous | None = None) -> None:
        """Records the duration of ``step``, replacing an earlier one (which keeps its place)."""
        self.set_many([(step, duration)], previous)

    def set_many(self, pairs: Sequence[tuple[int, int]], previous: Previous | None = None) -> None:
        """``set`` for each pair in order.

        Args:
            pairs: (step, duration in integer microseconds, not negative).
            previous: The duration the statistics hold for a step, asked for a step of
                ``pairs`` that they already hold once they keep a histogram, unless it is among
                the last RECENT + BASELINE. Without it such a step raises ValueError.
        """
        if not pairs:
            return
        if min(duration for _, duration in pairs) < 0:
            raise ValueError("a step duration is negative")
        state = self._state
        if isinstance(state, StepStatistics):
            known = state.durations
            new = len(pairs)
            if len(known) + new > EXACT_LIMIT:
                new = len({step for step, _ in pairs if step not in known})
            if len(known) + new <= EXACT_LIMIT:
                exact_pairs: list[tuple[int, float]] = list(pairs)
                state.set_many(exact_pairs)
                return
            # Beyond the limit: the histogram of what is known, then the pairs, whose earlier
            # durations the exact statistics still hold.
            earlier = {step: int(known[step]) for step, _ in pairs if step in known}
            state = self._state = _Binned.of(known)
            previous = earlier.get
        steps, durations = _collapsed(pairs)
        state.set_many(steps, durations, previous)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 to 1) of every duration, by nearest rank; None with none."""
        return self._state.quantile(q)

    def mean(self) -> float | None:
        return self._state.mean()

    def recent_median(self) -> float | None:
        """The median of the most recent RECENT durations: where a regression shows first."""
        return self._state.recent_median()

    def any_below(self, value: float) -> bool:
        """Whether any duration is below ``value``."""
        return self._state.any_below(value)

    def ideal(self, minimum: float = -math.inf) -> float | None:
        """Mean of the durations (those >= ``minimum``) up to their median + 3 MAD."""
        return self._state.ideal(minimum)

    def excess(self, ideal: float) -> float:
        """The durations' sum beyond ``ideal``: each one's ``max(0, duration - ideal)``."""
        return self._state.excess(ideal)

    def deviation(self, ideal: float) -> float | None:
        """The reference's cumulative step-time deviation against ``ideal``."""
        return self._state.deviation(ideal)

    def to_bytes(self) -> bytes:
        """Compact, deterministic bytes (equal statistics, equal bytes): a magic, a layout
        version, the mode, then integer columns (see ``_encode_column``). Exact: the steps in
        the order they came and their durations; histogram: the step ranges, the bins (each its
        count and its sum less count × its lowest duration) and the durations kept."""
        state = self._state
        if isinstance(state, StepStatistics):
            steps = np.fromiter(state.durations, np.int64, len(state.durations))
            durations = np.fromiter(state.durations.values(), np.int64, len(state.durations))
            columns = [(steps, True), (durations, False)]
            mode = _EXACT
        else:
            columns, mode = state.columns(), _BINNED
        return b"".join([_MAGIC, bytes([_VERSION, mode]),
                         pack_each([column for column, _ in columns], [not deltas for _, deltas in columns])])

    @classmethod
    def from_bytes(cls, data: bytes) -> BoundedStepStatistics:
        """The statistics ``to_bytes`` encoded; ValueError for bytes that are not such an
        encoding, or of another layout version."""
        if data[:len(_MAGIC)] != _MAGIC:
            raise ValueError("not encoded step statistics")
        if len(data) < len(_MAGIC) + 2:
            raise ValueError("encoded step statistics: truncated")
        version, mode = data[len(_MAGIC)], data[len(_MAGIC) + 1]
        if version != _VERSION:
            raise ValueError(f"step statistics encoded in layout {version}; this version reads layout "
                             f"{_VERSION} only")
        body = data[len(_MAGIC) + 2:]
        stats = cls()
        if mode == _EXACT:
            steps, durations = unpack_each(body, 2, (False, True), _REFUSAL)
            if len(steps) > EXACT_LIMIT or len(np.unique(steps)) != len(steps) or np.any(durations < 0):
                raise ValueError("encoded step statistics: not exact statistics")
            exact = StepStatistics("q")
            exact.set_many(list(zip(steps.tolist(), durations.tolist(), strict=True)))
            stats._state = exact
        elif mode == _BINNED:
            by_value = [not deltas for deltas in _Binned.DELTAS]
            stats._state = _Binned.from_columns(unpack_each(body, len(by_value), by_value, _REFUSAL))
        else:
            raise ValueError(f"encoded step statistics: unknown mode {mode}")
        return stats


class _Binned:
    """The durations of more than ``EXACT_LIMIT`` steps: their histogram, which steps have one,
    and the last RECENT + BASELINE of them (in the order their steps came) themselves."""

    DELTAS = (True, True, False, False, True, False)  # the columns' codings: see ``columns``

    def __init__(self, histogram: _Histogram, ranges: _StepRanges, window: _Window) -> None:
        self.histogram, self.ranges, self.window = histogram, ranges, window

    @classmethod
    def of(cls, durations: dict[int, float]) -> _Binned:
        """The durations of ``StepStatistics.durations``, binned."""
        steps = np.fromiter(durations, np.int64, len(durations))
        values = np.fromiter(durations.values(), np.int64, len(durations))
        window = _Window()
        window.extend(steps[-_WINDOW:].tolist(), values[-_WINDOW:].tolist())
        return cls(_Histogram.of(values), _StepRanges.of(np.sort(steps)), window)

    def __len__(self) -> int:
        return self.histogram.count

    def set_many(self, steps: Int64s, durations: Int64s, previous: Previous | None) -> None:
        """Records the durations of distinct ``steps``, new ones placed in their order."""
        held = self.ranges.contains(steps)
        replaced: dict[int, int] = {}
        removed: list[int] = []
        for step, duration in zip(steps[held].tolist(), durations[held].tolist(), strict=True):
            earlier = self.window.durations.get(step)
            if earlier is not None:
                replaced[step] = duration
            elif previous is None or (earlier := previous(step)) is None:
                raise ValueError(f"step {step} is run again, and its earlier duration is not known")
            removed.append(earlier)
        # Computed before anything changes, so that durations that do not add up change nothing.
        histogram = self.histogram.updated(durations, np.array(removed, dtype=np.int64))
        new = ~held
        self.histogram = histogram
        self.ranges = self.ranges.with_steps(np.sort(steps[new]))
        self.window.replace(replaced)
        self.window.extend(steps[new].tolist(), durations[new].tolist())

    def quantile(self, q: float) -> float | None:
        return self.histogram.quantile(q)

    def mean(self) -> float | None:
        return self.histogram.total / self.histogram.count

    def recent_median(self) -> float | None:
        return _median(self.window.recent, 0, RECENT)

    def any_below(self, value: float) -> bool:
        return bool(self.histogram.means[0] < value)

    def ideal(self, minimum: float) -> float | None:
        return self.histogram.ideal(minimum)

    def excess(self, ideal: float) -> float:
        return self.histogram.excess(ideal)

    def deviation(self, ideal: float) -> float | None:
        """As ``StepStatistics.deviation`` with more than RECENT + BASELINE durations."""
        window = self.window
        spike = percentile_distance(window.recent, ideal, 90)
        return spike - median_distance(window.baseline, 0, BASELINE, ideal)

    def columns(self) -> list[tuple[Int64s, bool]]:
        """The integer columns that hold it, each with whether it is coded by its deltas: the
        step ranges' bounds; the bins, their counts, and their sums less count × lowest
        duration (small numbers); the kept steps and durations."""
        histogram, window = self.histogram, self.window
        low, _ = bin_bounds(histogram.bins)
        bounds = np.column_stack([self.ranges.starts, self.ranges.ends]).reshape(-1)
        return list(zip([bounds, histogram.bins, histogram.counts, histogram.sums - histogram.counts * low,
                         np.array(window.order, dtype=np.int64),
                         np.array([window.durations[step] for step in window.order], dtype=np.int64)],
                        self.DELTAS, strict=True))

    @classmethod
    def from_columns(cls, columns: list[Int64s]) -> _Binned:
        """What ``columns`` gave the columns of; ValueError if they do not fit together."""
        bounds, bins, counts, offsets, steps, durations = columns
        low, width = bin_bounds(bins)
        if (len(bounds) % 2 or np.any(bounds[1:] <= bounds[:-1]) or np.any(bins[1:] <= bins[:-1])
                or np.any(counts <= 0) or np.any(offsets < 0) or np.any(offsets > counts * (width - 1))):
            raise ValueError("encoded step statistics: not a histogram of durations")
        sums = offsets + counts * low
        histogram = _Histogram(bins, counts, sums, int(sums.sum()))
        ranges = _StepRanges(bounds[0::2], bounds[1::2])
        if (len(ranges) != histogram.count or histogram.count <= EXACT_LIMIT or len(steps) != _WINDOW
                or len(np.unique(steps)) != _WINDOW or not np.all(ranges.contains(steps))):
            raise ValueError("encoded step statistics: the histogram, steps and kept durations differ")
        window = _Window()
        window.extend(steps.tolist(), durations.tolist())
        return cls(histogram, ranges, window)


class _Histogram:
    """Durations by bin (``bin_of``), ascending: each bin's count and exact sum, and the figures
    of the durations each replaced by its bin's mean."""

    def __init__(self, bins: Int64s, counts: Int64s, sums: Int64s, total: int) -> None:
        self.bins, self.counts, self.sums, self.total = bins, counts, sums, total
        self.count = int(counts.sum())
        self.means = sums / counts  # ascending, as the bins are
        self.ranks = np.cumsum(counts)

    @classmethod
    def of(cls, durations: Int64s) -> _Histogram:
        empty = np.empty(0, dtype=np.int64)
        return cls(empty, empty, empty, 0).updated(durations, empty)

    def updated(self, added: Int64s, removed: Int64s) -> _Histogram:
        """The histogram with ``added`` durations and without ``removed`` ones (each held);
        ValueError if one is not. The sums are int64: a run's durations add up to its time at
        most, far below 2**63 µs."""
        every = np.concatenate([self.bins, bin_of(added), bin_of(removed)])
        bins, where = np.unique(every, return_inverse=True)
        counts = np.zeros(len(bins), dtype=np.int64)
        np.add.at(counts, where, np.concatenate([self.counts, np.ones(len(added), dtype=np.int64),
                                                 np.full(len(removed), -1, dtype=np.int64)]))
        sums = np.zeros(len(bins), dtype=np.int64)
        np.add.at(sums, where, np.concatenate([self.sums, added, -removed]))
        kept = counts > 0
        if np.any(counts < 0) or np.any(sums[~kept]):
            raise ValueError("an earlier duration given is not one the statistics hold")
        total = self.total + int(added.sum()) - int(removed.sum())
        return _Histogram(bins[kept], counts[kept], sums[kept], total)

    def quantile(self, q: float) -> float:
        rank = min(self.count - 1, max(0, math.ceil(q * self.count) - 1))
        return float(self.means[np.searchsorted(self.ranks, rank, side="right")])

    def ideal(self, minimum: float) -> float | None:
        lo = int(np.searchsorted(self.means, minimum, side="left"))
        if lo == len(self.means):
            return None
        means, counts = self.means[lo:], self.counts[lo:]
        median = _weighted_median(means, np.cumsum(counts))
        distances = np.abs(means - median)
        order = np.argsort(distances, kind="stable")
        mad = _weighted_median(distances[order], np.cumsum(counts[order]))
        cut = int(np.searchsorted(means, median + 3 * mad, side="right"))
        if cut == 0:
            return None
        return float(int(self.sums[lo:lo + cut].sum()) / int(counts[:cut].sum()))

    def excess(self, ideal: float) -> float:
        cut = int(np.searchsorted(self.means, ideal, side="right"))
        if cut == len(self.means):
            return 0.0
        return float(int(self.sums[cut:].sum()) - ideal * int(self.counts[cut:].sum()))


def _weighted_median(values: npt.NDArray[np.float64], ranks: Int64s) -> float:
    """The median of ascending ``values``, each as many times as its count (``ranks``: the
    counts' running sums), as numpy's median of them all."""
    n = int(ranks[-1])
    upper = float(values[np.searchsorted(ranks, n // 2, side="right")])
    if n % 2:
        return upper
    return (float(values[np.searchsorted(ranks, n // 2 - 1, side="right")]) + upper) / 2


class _StepRanges:
    """A set of step numbers as ascending, disjoint, non-adjacent ranges ``[start, end)``: a
    run's steps are a few ranges, whatever its length."""

    def __init__(self, starts: Int64s, ends: Int64s) -> None:
        self.starts, self.ends = starts, ends

    @classmethod
    def of(cls, steps: Int64s) -> _StepRanges:
        """The ranges of ascending, distinct ``steps``."""
        return cls.joined(steps, steps + 1)

    @classmethod
    def joined(cls, starts: Int64s, ends: Int64s) -> _StepRanges:
        """Ascending, disjoint ranges, those that touch made one."""
        if not len(starts):
            return cls(starts, ends)
        apart = np.flatnonzero(starts[1:] != ends[:-1])
        return cls(starts[np.concatenate([[0], apart + 1])], ends[np.concatenate([apart, [len(ends) - 1]])])

    def __len__(self) -> int:
        return int((self.ends - self.starts).sum())

    def contains(self, steps: Int64s) -> npt.NDArray[np.bool_]:
        if not len(self.starts):
            return np.zeros(len(steps), dtype=np.bool_)
        at = np.searchsorted(self.starts, steps, side="right") - 1
        return (at >= 0) & (steps < self.ends[np.maximum(at, 0)])

    def with_steps(self, steps: Int64s) -> _StepRanges:
        """These ranges and ascending, distinct ``steps`` that none holds."""
        if not len(steps):
            return self
        starts = np.concatenate([self.starts, steps])
        order = np.argsort(starts, kind="stable")
        return self.joined(starts[order], np.concatenate([self.ends, steps + 1])[order])


class _Window:
    """The durations of the last RECENT + BASELINE steps in the order the steps came, with the
    last RECENT of them sorted and the BASELINE before those sorted."""

    def __init__(self) -> None:
        self.order: collections.deque[int] = collections.deque()
        self.durations: dict[int, int] = {}
        self.recent: list[int] = []
        self.baseline: list[int] = []

    def extend(self, steps: list[int], durations: list[int]) -> None:
        """Appends new steps; one at a time when few, else sorting the windows once."""
        if len(steps) < 64:
            for step, duration in zip(steps, durations, strict=True):
                self._slide(step, duration)
            return
        self.order.extend(steps[-_WINDOW:])
        self.durations.update(zip(steps[-_WINDOW:], durations[-_WINDOW:], strict=True))
        while len(self.order) > _WINDOW:
            del self.durations[self.order.popleft()]
        self._sort()

    def replace(self, durations: dict[int, int]) -> None:
        """New durations of steps in the window, which keep their places."""
        if any(self.durations[step] != duration for step, duration in durations.items()):
            self.durations.update(durations)
            self._sort()

    def _slide(self, step: int, duration: int) -> None:
        self.order.append(step)
        self.durations[step] = duration
        bisect.insort(self.recent, duration)
        if len(self.order) > RECENT:
            moved = self.durations[self.order[-RECENT - 1]]
            del self.recent[bisect.bisect_left(self.recent, moved)]
            bisect.insort(self.baseline, moved)
        if len(self.order) > _WINDOW:
            gone = self.durations.pop(self.order.popleft())
            del self.baseline[bisect.bisect_left(self.baseline, gone)]

    def _sort(self) -> None:
        values = [self.durations[step] for step in self.order]
        self.recent = sorted(values[-RECENT:])
        self.baseline = sorted(values[:-RECENT])


def _collapsed(pairs: Sequence[tuple[int, int]]) -> tuple[Int64s, Int64s]:
    """The distinct steps of ``pairs`` in the order they first come, each with its last
    duration: what ``set`` for each pair in turn leaves."""
    steps = np.fromiter((step for step, _ in pairs), np.int64, len(pairs))
    durations = np.fromiter((duration for _, duration in pairs), np.int64, len(pairs))
    distinct, first = np.unique(steps, return_index=True)
    if len(distinct) == len(steps):
        return steps, durations
    last = len(steps) - 1 - np.unique(steps[::-1], return_index=True)[1]
    order = np.argsort(first)
    return distinct[order], durations[last[order]]
