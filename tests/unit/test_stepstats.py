"""Incremental step statistics equal the reference's formulas computed from scratch (the
reference's own functions, in its venv through ``support.reference``)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.stepstats import (
    EXACT_LIMIT,
    BoundedStepStatistics,
    StepStatistics,
    bin_bounds,
    bin_of,
    kth_distances,
)
from support.reference import reference as reference_worker

durations = st.floats(0.01, 100, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(updates=st.lists(st.tuples(st.integers(0, 1500), durations), min_size=1, max_size=1300),
       minimum=st.sampled_from([0.0, 1.0, 5.0]))
def test_incremental_statistics_equal_the_reference_from_scratch(updates, minimum):
    """After any sequence of step durations (with overwrites), ideal and deviation match."""
    stats = StepStatistics()
    reference: dict[int, float] = {}
    for step, duration in updates:
        stats.set(step, duration)
        reference[step] = duration
    assert stats.durations == reference
    expected_ideal = reference_function("compute_ideal_step_time", [
        v for v in reference.values() if v >= minimum]) if minimum >= 1.0 else _ideal(reference, minimum)
    ideal = stats.ideal(minimum)
    if expected_ideal is None:
        assert ideal is None
        return
    assert ideal == pytest.approx(float(expected_ideal), rel=1e-12)
    deviations = {s: abs(v - ideal) for s, v in reference.items()}
    expected = reference_function("compute_step_deviation_from_baseline", deviations)
    assert stats.deviation(ideal) == pytest.approx(float(expected), rel=1e-9, abs=1e-12)


def reference_function(name: str, *args: object) -> Any:
    """The reference's ``goodput_utils.NAME(*args)``."""
    return reference_worker().function(f"goodput_utils.{name}", *args)


def _ideal(values: dict[int, float], minimum: float) -> float | None:
    kept = [v for v in values.values() if v >= minimum]
    if not kept:
        return None
    median = float(np.median(kept))
    mad = float(np.median([abs(v - median) for v in kept]))
    normal = [v for v in kept if v <= median + 3 * mad]
    return statistics.fmean(normal) if normal else None


@settings(max_examples=40, deadline=None)
@given(first=st.lists(st.tuples(st.integers(0, 3000), durations), max_size=1500),
       second=st.lists(st.tuples(st.integers(0, 3000), durations), max_size=1500))
def test_set_many_equals_one_by_one(first, second):
    """Bulk updates leave exactly the state that one-by-one updates leave."""
    bulk, single = StepStatistics(), StepStatistics()
    for pairs in (first, second):
        bulk.set_many(pairs)
        for step, duration in pairs:
            single.set(step, duration)
    assert bulk.durations == single.durations
    assert list(bulk.durations) == list(single.durations)
    assert bulk.ideal() == pytest.approx(single.ideal(), rel=1e-12) if single.durations else True
    if single.durations:
        ideal = single.ideal()
        assert ideal is not None
        assert bulk.deviation(ideal) == pytest.approx(single.deviation(ideal), rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(durations, min_size=1, max_size=60), center=st.floats(-10, 110),
       data=st.data())
def test_kth_distances_gives_the_next_one_too(values, center, data):
    """Selection over two sorted runs gives the k-th and (k+1)-th smallest distances, as sorting
    all distances does (the k-th twice at the end)."""
    values = sorted(values)
    k = data.draw(st.integers(0, len(values) - 1))
    distances = sorted(abs(v - center) for v in values)
    expected = (distances[k], distances[min(k + 1, len(values) - 1)])
    assert kth_distances(values, 0, len(values), center, k) == expected


# -- BoundedStepStatistics: exact up to EXACT_LIMIT, a histogram beyond -----------------------

QUANTILES = (0.0, 0.01, 0.5, 0.9, 0.99, 1.0)
SECOND = 1_000_000


def _trace(seed: int, segments: list[tuple[int, int]], draw: Callable[[np.random.Generator, int], np.ndarray],
           limit: int | None = None) -> list[tuple[int, int]]:
    """(step, duration) pairs of attempts in turn, each resuming ``back`` steps before the last
    one's end (re-running those) and running ``count`` steps; at most ``limit`` distinct steps."""
    rng = np.random.default_rng(seed)
    pairs: list[tuple[int, int]] = []
    end = 0
    for back, count in segments:
        start = max(0, end - back)
        if limit is not None:
            count = min(count, limit - end + (end - start))
        durations = draw(rng, count).tolist()
        pairs += zip(range(start, start + count), durations, strict=True)
        end = max(end, start + count)
    return pairs


def _normal(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.rint(rng.normal(SECOND, SECOND / 100, n)).astype(np.int64)


def _chunks(pairs: list[tuple[int, int]], sizes: list[int]) -> list[list[tuple[int, int]]]:
    """``pairs`` cut in chunks of the sizes in turn (round and round)."""
    chunks, at = [], 0
    for size in itertools.cycle(sizes):
        if at >= len(pairs):
            return chunks
        chunks.append(pairs[at:at + size])
        at += size
    return chunks


def _fed(chunks: list[list[tuple[int, int]]]) -> tuple[BoundedStepStatistics, StepStatistics]:
    """Both statistics fed the chunks, the bounded one asking the exact one for earlier durations."""
    bounded, exact = BoundedStepStatistics(), StepStatistics("q")
    for chunk in chunks:
        bounded.set_many(chunk, lambda step: int(exact.durations[step]))
        exact.set_many(chunk)
    return bounded, exact


def _figures(stats: BoundedStepStatistics | StepStatistics) -> tuple[Any, ...]:
    ideal = stats.ideal()
    return (len(stats), *(stats.quantile(q) for q in QUANTILES), stats.mean(), stats.recent_median(),
            stats.any_below(SECOND), stats.any_below(SECOND // 2), ideal, stats.ideal(SECOND),
            stats.ideal(SECOND // 2), None if ideal is None else stats.excess(ideal),
            None if ideal is None else stats.deviation(ideal), stats.excess(SECOND), stats.deviation(SECOND))


segments = st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 4000)), min_size=1, max_size=5)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), segments=segments,
       sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=6))
def test_bounded_statistics_equal_step_statistics_up_to_the_exact_limit(seed, segments, sizes):
    """Up to EXACT_LIMIT durations, with restarts re-running steps and any chunks, every figure
    equals StepStatistics("q")'s."""
    pairs = _trace(seed, segments, _normal, limit=EXACT_LIMIT)
    bounded, exact = _fed(_chunks(pairs, sizes))
    assert bounded.exact
    assert _figures(bounded) == _figures(exact)


def test_one_duration_past_the_exact_limit_makes_a_histogram():
    """EXACT_LIMIT durations are kept exactly; one more step makes a histogram."""
    pairs = _trace(1, [(0, EXACT_LIMIT + 1)], _normal)
    bounded, exact = _fed([pairs[:-1]])
    assert bounded.exact and _figures(bounded) == _figures(exact)
    bounded.set_many(pairs[-1:])
    assert not bounded.exact and len(bounded) == EXACT_LIMIT + 1


def _lognormal(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.rint(1.2 * SECOND * rng.lognormal(0, 0.5, n)).astype(np.int64)


def _with_evals(rng: np.random.Generator, n: int) -> np.ndarray:
    """1.5 s steps, and a 30 s one (an eval) every 100."""
    durations = np.rint(rng.normal(1.5 * SECOND, 0.03 * SECOND, n)).astype(np.int64)
    durations[::100] = np.rint(rng.normal(30 * SECOND, SECOND, len(durations[::100])))
    return durations


def _sub_second(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.rint(rng.normal(0.3 * SECOND, 0.003 * SECOND, n)).astype(np.int64)


def _assert_within_bounds(bounded: BoundedStepStatistics, exact: StepStatistics) -> None:
    """The figures beyond EXACT_LIMIT are within the bounds the module docstring states."""
    values = np.frombuffer(exact._sorted, dtype=np.int64)
    assert len(bounded) == len(exact) and bounded.mean() == exact.mean()
    for q in QUANTILES:  # the exact one and the estimate lie in one bin, under 0.1 % wide
        assert abs(bounded.quantile(q) - exact.quantile(q)) <= exact.quantile(q) / 1000
    for minimum in (-math.inf, SECOND):
        assert bounded.any_below(minimum) == exact.any_below(minimum)
        expected = exact.ideal(minimum)
        assert bounded.ideal(minimum) == (None if expected is None else pytest.approx(expected, rel=5e-4))
    ideal = exact.ideal()
    near = np.count_nonzero(np.abs(values - ideal) < ideal / 1000)  # what the ideal's bin may hold
    assert abs(bounded.excess(ideal) - exact.excess(ideal)) <= near * ideal / 1000
    assert bounded.deviation(ideal) == exact.deviation(ideal)
    assert bounded.recent_median() == exact.recent_median()


@pytest.mark.parametrize("draw", [_normal, _sub_second, _lognormal, _with_evals])
def test_beyond_the_exact_limit_figures_are_within_their_bounds(draw):
    """200,000 durations and a restart that re-runs 2,000 steps (most before the last 1,100), in
    chunks of live-run sizes: mean exact, quantiles, ideal and excess within their bounds,
    deviation and recent median exact."""
    pairs = _trace(7, [(0, 200_000), (2000, 3000)], draw)
    bounded, exact = _fed(_chunks(pairs, [1, 37, 500, 3, 2000, 250]))
    assert not bounded.exact
    _assert_within_bounds(bounded, exact)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       segments=st.lists(st.tuples(st.integers(0, 2500), st.integers(1, 5000)), min_size=3, max_size=6),
       sizes=st.lists(st.integers(1, 4000), min_size=1, max_size=6))
def test_re_run_steps_in_and_before_the_kept_durations_replace_theirs(seed, segments, sizes):
    """Across the exact limit, restarts re-run steps among the last 1,100 and before them: the
    deviation and the recent median stay exact, the rest within bounds."""
    pairs = _trace(seed, [(0, EXACT_LIMIT - 500), *segments], _normal)
    bounded, exact = _fed(_chunks(pairs, sizes))
    if len(exact) > EXACT_LIMIT:
        _assert_within_bounds(bounded, exact)
    else:
        assert _figures(bounded) == _figures(exact)


def test_a_step_run_again_before_the_kept_durations_needs_its_earlier_one():
    """A histogram cannot replace a duration it does not know: without ``previous`` a step run
    again before the last 1,100 raises, and the statistics are unchanged."""
    bounded, _ = _fed([_trace(3, [(0, 20_000)], _normal)])
    encoded = bounded.to_bytes()
    with pytest.raises(ValueError, match="step 5 is run again"):
        bounded.set_many([(19_999, 1), (5, SECOND), (20_000, SECOND)])
    assert bounded.to_bytes() == encoded


def test_an_earlier_duration_the_statistics_do_not_hold_is_refused():
    """``previous`` giving a duration that is not the one held raises, and changes nothing."""
    bounded, _ = _fed([_trace(3, [(0, 20_000)], _normal)])
    encoded = bounded.to_bytes()
    with pytest.raises(ValueError, match="not one the statistics hold"):
        bounded.set_many([(5, SECOND)], lambda step: 7)
    assert bounded.to_bytes() == encoded


@pytest.mark.parametrize("steps", [3, 90, 1500, EXACT_LIMIT, 30_000])
def test_encoding_round_trips_and_reencodes_to_the_same_bytes(steps):
    """Decoded statistics answer every figure as the encoded ones, and encode to the same bytes."""
    bounded, _ = _fed(_chunks(_trace(5, [(0, steps), (steps // 3, steps // 2)], _with_evals), [700, 13]))
    data = bounded.to_bytes()
    decoded = BoundedStepStatistics.from_bytes(data)
    assert decoded.exact == bounded.exact
    assert _figures(decoded) == _figures(bounded)
    assert decoded.to_bytes() == data


def test_equal_statistics_encode_to_equal_bytes():
    """The same durations fed in other chunks (one by one, or all at once) encode alike."""
    for steps in (EXACT_LIMIT, 3 * EXACT_LIMIT):
        pairs = _trace(9, [(0, steps), (2000, 3000)], _normal)
        encodings = {_fed(_chunks(pairs, sizes))[0].to_bytes() for sizes in ([len(pairs)], [1], [999, 7])}
        assert len(encodings) == 1


def test_a_long_steady_run_encodes_in_a_few_kilobytes():
    """200,000 steady steps (1 % jitter) encode in under 16 kB: the histogram and the last
    1,100 durations, not the history."""
    bounded, _ = _fed([_trace(11, [(0, 200_000)], _normal)])
    assert len(bounded.to_bytes()) < 16_000


def test_empty_statistics_round_trip():
    """Statistics without a duration encode, and decode to statistics without one."""
    decoded = BoundedStepStatistics.from_bytes(BoundedStepStatistics().to_bytes())
    assert len(decoded) == 0 and decoded.ideal() is None and decoded.quantile(0.5) is None


def test_bytes_of_something_else_are_refused():
    """Bytes without the magic, or of another layout version, raise a ValueError that says so."""
    data = BoundedStepStatistics().to_bytes()
    with pytest.raises(ValueError, match="not encoded step statistics"):
        BoundedStepStatistics.from_bytes(b"GPS1" + data[4:])
    with pytest.raises(ValueError, match="layout 2; this version reads layout 1"):
        BoundedStepStatistics.from_bytes(data[:4] + bytes([2]) + data[5:])


def test_bins_hold_their_durations_and_are_under_a_thousandth_as_wide():
    """Every duration lies in its bin, which is under 0.1 % as wide as its lowest duration
    (one duration wide below 10 ms), and whole milliseconds are bin edges."""
    rng = np.random.default_rng(2)
    durations = np.concatenate([np.arange(20_000), rng.integers(0, 2**62, 100_000), 10 ** np.arange(19)])
    low, width = bin_bounds(bin_of(durations))
    assert np.all((low <= durations) & (durations < low + width))
    assert np.all(width * 1000 <= np.maximum(low, 1000))
    edges = np.arange(10, 10_000) * 1000
    assert np.array_equal(bin_bounds(bin_of(edges))[0], edges)
