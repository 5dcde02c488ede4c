"""Packed int64 columns: any columns round-trip to the same bytes, and a run's steps take a
couple of bytes each."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.packing import pack_columns, pack_each, unpack_columns, unpack_each

INT64 = st.integers(-(2**63), 2**63 - 1)
T0_US = 1_700_000_000_000_000
CHUNK = 1024  # the state coder's chunks
STEADY_STEPS = 50 * CHUNK


@st.composite
def columns(draw: st.DrawFn) -> list[list[int]]:
    """One to four int64 columns of one length (0 included), any values in any order."""
    count, width = draw(st.integers(0, 300)), draw(st.integers(1, 4))
    return [draw(st.lists(INT64, min_size=count, max_size=count)) for _ in range(width)]


@settings(max_examples=300, deadline=None)
@given(columns(), st.lists(st.booleans(), max_size=4))
def test_any_columns_round_trip_to_the_same_bytes(cols, by_value):
    """Unpacking gives the columns back, and packing them again gives the same bytes, each
    column coded by its deltas or by value."""
    data = pack_columns(cols, by_value)
    unpacked = unpack_columns(data, len(cols), by_value)
    assert [column.tolist() for column in unpacked] == cols
    assert all(column.dtype == np.int64 for column in unpacked)
    assert pack_columns(unpacked, by_value) == data


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(INT64, max_size=50), min_size=1, max_size=5), st.lists(st.booleans(), max_size=5))
def test_columns_of_any_lengths_packed_each_round_trip(cols, by_value):
    data = pack_each(cols, by_value)
    assert [column.tolist() for column in unpack_each(data, len(cols), by_value)] == cols
    with pytest.raises(ValueError, match="not packed int64 columns"):
        unpack_each(data + b"\x00", len(cols), by_value)


@pytest.mark.parametrize("cols", [
    [[], [], []],
    [[7], [-3], [2**63 - 1]],
    [[2**63 - 1, -(2**63), 2**63 - 1], [-(2**63), 2**63 - 1, -(2**63)], [0, -1, 1]],
])
def test_empty_single_and_extreme_columns_round_trip(cols):
    """Empty and one-value columns, and deltas that wrap past the int64 limits, come back."""
    assert [column.tolist() for column in unpack_columns(pack_columns(cols), 3)] == cols


@pytest.mark.parametrize("damage", [lambda data: data[:-3], lambda data: data + b"\x00",
                                    lambda data: b"GPS2" + data[4:]])
def test_a_truncated_extended_or_foreign_packing_is_refused(damage):
    """Bytes that end too soon, go on after their end or are not a packing are a ValueError."""
    data = pack_columns(_steady(1000, 1_000_000, 1000, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="not packed int64 columns"):
        unpack_columns(damage(data), 3)


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        pack_columns([[1, 2], [1]])


@pytest.mark.parametrize(("period_us", "jitter_us", "every", "bound"), [
    (1_000_000, 0, 1, 0.40),  # exact: only the seqs' 1-3 steps cost anything
    (1_000_000, 1_000, 1, 1.95),  # measured 1.78 at chunks of 1,024
    (300_000, 1_000, 1, 1.95),
    (1_000_000, 1_000, 10, 1.95),  # every 10th step recorded
])
def test_a_steady_run_costs_under_two_bytes_a_step(period_us, jitter_us, every, bound):
    """Steady steps with µs times jittered by up to ±1 ms, seqs 1-3 apart, packed a chunk at a
    time, stay under their bound."""
    steps, times, seqs = _steady(STEADY_STEPS, period_us, jitter_us, np.random.default_rng(1))
    packed = sum(len(pack_columns([steps[at:at + CHUNK] * every, times[at:at + CHUNK], seqs[at:at + CHUNK]]))
                 for at in range(0, STEADY_STEPS, CHUNK))
    assert packed / STEADY_STEPS < bound


def test_a_run_with_restarts_costs_under_two_bytes_a_step():
    """Step numbers going back at each restart (after a pause) cost little more."""
    steps, times, seqs = _with_restarts(STEADY_STEPS, 20_000, np.random.default_rng(2))
    packed = sum(len(pack_columns([steps[at:at + CHUNK], times[at:at + CHUNK], seqs[at:at + CHUNK]]))
                 for at in range(0, STEADY_STEPS, CHUNK))
    assert packed / STEADY_STEPS < 1.95


def _steady(count: int, period_us: int, jitter_us: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 0, 1, ... every ``period_us`` with each time jittered by up to ``jitter_us``, and
    seqs 1 to 3 apart (other events between steps)."""
    steps = np.arange(count, dtype=np.int64)
    jitter = rng.integers(-jitter_us, jitter_us + 1, count) if jitter_us else 0
    return steps, T0_US + steps * period_us + jitter, np.cumsum(rng.integers(1, 4, count))


def _with_restarts(count: int, every: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """1 s steps (±1 ms each) that every ``every`` steps pause 5 minutes and go back up to 1,000
    steps, to the last checkpoint."""
    durations = 1_000_000 + rng.integers(-1_000, 1_001, count)
    back = np.zeros(count, dtype=np.int64)
    back[every::every] = rng.integers(1, 1_000, len(back[every::every]))
    durations[every - 1::every] += 300_000_000
    steps = np.arange(count, dtype=np.int64) - np.cumsum(back)
    times = T0_US + np.concatenate([[0], np.cumsum(durations[:-1])])
    return steps, times, np.cumsum(rng.integers(1, 4, count))
