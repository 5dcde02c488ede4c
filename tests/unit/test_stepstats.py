"""Incremental step statistics equal the reference's formulas computed from scratch (the
reference's own functions, in its venv through ``support.reference``)."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.stepstats import StepStatistics, kth_distances
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
