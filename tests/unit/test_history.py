"""The step history: its chunk codec round-trips any int64 columns in a few bytes a step, and its
index finds exactly the chunks a step or time range needs, so a reader loads only those."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.history import (
    CHUNK_STEPS,
    Chunk,
    StepHistory,
    decode_chunk,
    encode_chunk,
    index_from_bytes,
    index_to_bytes,
    read_chunks,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
T0_US = 1_700_000_000_000_000
STEADY_STEPS = 50 * CHUNK_STEPS


@st.composite
def columns(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    """Three int64 columns of one length (0 included), any values in any order."""
    count = draw(st.integers(0, 300))
    steps, times, seqs = (draw(st.lists(INT64, min_size=count, max_size=count)) for _ in range(3))
    return steps, times, seqs


@settings(max_examples=300, deadline=None)
@given(columns())
def test_any_columns_round_trip_to_the_same_bytes(cols):
    """Decoding gives the columns back, and encoding them again gives the same bytes."""
    data = encode_chunk(*cols)
    decoded = decode_chunk(data)
    assert [column.tolist() for column in decoded] == list(cols)
    assert all(column.dtype == np.int64 for column in decoded)
    assert encode_chunk(*decoded) == data


@pytest.mark.parametrize("cols", [
    ([], [], []),
    ([7], [-3], [2**63 - 1]),
    ([2**63 - 1, -(2**63), 2**63 - 1], [-(2**63), 2**63 - 1, -(2**63)], [0, -1, 1]),
])
def test_empty_single_and_extreme_columns_round_trip(cols):
    """Empty and one-value columns, and deltas that wrap past the int64 limits, come back."""
    assert [column.tolist() for column in decode_chunk(encode_chunk(*cols))] == list(cols)


def test_an_array_of_another_kind_is_refused():
    """Bytes that are not a chunk (here an index) are refused with a clear error."""
    with pytest.raises(ValueError, match="not an encoded step-history chunk"):
        decode_chunk(index_to_bytes([Chunk(0, 1, 1, 1, 1, 1)]))


@pytest.mark.parametrize("damage", [lambda data: data[:-3], lambda data: data + b"\x00"])
def test_a_truncated_or_extended_chunk_is_refused(damage):
    """A chunk that ends too soon or goes on after its end is a ValueError."""
    data = encode_chunk(*_steady(1000, 1_000_000, 1000, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="not an encoded step-history chunk"):
        decode_chunk(damage(data))


@pytest.mark.parametrize(("period_us", "jitter_us", "every", "bound"), [
    (1_000_000, 0, 1, 0.30),  # exact: only the seqs' 1-3 steps cost anything (measured 0.25)
    (1_000_000, 1_000, 1, 1.85),  # measured 1.73
    (300_000, 1_000, 1, 1.85),  # measured 1.73
    (1_000_000, 1_000, 10, 1.85),  # every 10th step recorded: measured 1.73
])
def test_a_steady_run_costs_under_two_bytes_a_step(period_us, jitter_us, every, bound):
    """Steady steps with µs times jittered by up to ±1 ms, seqs 1-3 apart, stay under their bound."""
    steps, times, seqs = _steady(STEADY_STEPS, period_us, jitter_us, np.random.default_rng(1))
    history = StepHistory()
    sealed = history.extend(steps * every, times, seqs)
    assert len(sealed) == STEADY_STEPS // CHUNK_STEPS
    assert sum(len(data) for _, data in sealed) / STEADY_STEPS < bound


def test_a_run_with_restarts_costs_under_two_bytes_a_step():
    """Step numbers going back at each restart (after a pause) cost little more (measured 1.65)."""
    steps, times, seqs = _with_restarts(STEADY_STEPS, 20_000, np.random.default_rng(2))
    sealed = StepHistory().extend(steps, times, seqs)
    assert sum(len(data) for _, data in sealed) / STEADY_STEPS < 1.8


def test_the_index_round_trips_in_a_few_bytes_a_chunk():
    """A steady run's index comes back whole from under 8 bytes a chunk (measured 3.3)."""
    history = StepHistory()
    history.extend(*_steady(STEADY_STEPS, 1_000_000, 1_000, np.random.default_rng(3)))
    data = index_to_bytes(history.chunks)
    assert index_from_bytes(data) == list(history.chunks)
    assert index_to_bytes(index_from_bytes(data)) == data
    assert len(data) / len(history.chunks) < 8
    assert index_from_bytes(index_to_bytes([])) == []


def test_bytes_that_are_not_an_index_are_refused():
    """A chunk's bytes are not an index."""
    with pytest.raises(ValueError, match="not an encoded chunk index"):
        index_from_bytes(encode_chunk([1], [2], [3]))


@st.composite
def restarted_runs(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], int]:
    """A run's steps in time order whose numbers mostly go up and sometimes go back, some at
    the same time, and a chunk size."""
    moves = draw(st.lists(st.tuples(st.integers(-40, 3), st.integers(0, 3)), max_size=200))
    steps, times, step, time_us = [], [], 0, T0_US
    for step_move, time_move in moves:
        step += step_move
        time_us += time_move
        steps.append(step)
        times.append(time_us)
    return steps, times, list(range(len(steps))), draw(st.integers(1, 16))


@settings(max_examples=200, deadline=None)
@given(restarted_runs(), st.integers(-60, 160), st.integers(0, 60), st.integers(0, 250), st.integers(0, 250))
def test_the_index_finds_exactly_the_chunks_a_range_needs(run, step_lo, step_span, time_lo, time_span):
    """The chunks found for a step or time range are those whose steps span part of it, as a
    scan of every chunk finds them: all that hold a step in the range, and perhaps one whose
    steps skip over it."""
    steps, times, seqs, chunk_steps = run
    history = StepHistory(chunk_steps=chunk_steps)
    stored = dict(_by_id(history.extend(steps, times, seqs)))
    decoded = {chunk_id: decode_chunk(data) for chunk_id, data in stored.items()}
    time_lo_us = T0_US + time_lo
    for found, by, lo, hi in ((history.chunks_for_steps(step_lo, step_lo + step_span), 0, step_lo,
                               step_lo + step_span),
                              (history.chunks_for_times(time_lo_us, time_lo_us + time_span), 1, time_lo_us,
                               time_lo_us + time_span)):
        found_ids = [chunk.chunk_id for chunk in found]
        assert found_ids == [chunk_id for chunk_id, cols in decoded.items()
                             if cols[by].min() <= hi and cols[by].max() >= lo]
        assert set(found_ids) >= {chunk_id for chunk_id, cols in decoded.items()
                                  if np.any((cols[by] >= lo) & (cols[by] <= hi))}


@settings(max_examples=100, deadline=None)
@given(restarted_runs(), st.integers(-60, 160), st.integers(0, 60))
def test_a_selection_holds_the_rows_in_range_sealed_or_not(run, lo, span):
    """The steps selected by number or time are every step of the run in that range, in order."""
    steps, times, seqs, chunk_steps = run
    history = StepHistory(chunk_steps=chunk_steps)
    stored = dict(_by_id(history.extend(steps, times, seqs)))
    everything = np.array([steps, times, seqs], dtype=np.int64).reshape(3, -1)
    for selected, by, low in ((history.select_steps(lo, lo + span, stored.__getitem__), 0, lo),
                              (history.select_times(T0_US + lo, T0_US + lo + span, stored.__getitem__), 1,
                               T0_US + lo)):
        keep = (everything[by] >= low) & (everything[by] <= low + span)
        assert np.array(selected).tolist() == everything[:, keep].tolist()


def test_a_restart_reads_only_the_chunks_from_its_step_on():
    """Reading the steps from step R on loads the chunks that hold them and nothing else."""
    steps, times, seqs = _steady(20 * CHUNK_STEPS + 1000, 1_000_000, 1_000, np.random.default_rng(4))
    history = StepHistory()
    stored = dict(_by_id(history.extend(steps, times, seqs)))
    loaded: list[int] = []

    def load(chunk_id: int) -> bytes:
        loaded.append(chunk_id)
        return stored[chunk_id]

    restart_step = 15 * CHUNK_STEPS + 100
    selected = history.select_steps(restart_step, int(steps[-1]), load)
    assert loaded == [15, 16, 17, 18, 19]
    assert selected[0].tolist() == steps[restart_step:].tolist()
    assert selected[2].tolist() == seqs[restart_step:].tolist()
    read_bytes = sum(len(stored[chunk_id]) for chunk_id in loaded)
    assert read_bytes / (len(steps) - restart_step) < 2


def test_a_history_restored_from_its_index_and_tail_goes_on_as_before():
    """A history rebuilt from its encoded index and tail seals the same chunks as one never stored."""
    steps, times, seqs = _steady(3 * CHUNK_STEPS + 500, 1_000_000, 1_000, np.random.default_rng(5))
    whole = StepHistory()
    expected = whole.extend(steps, times, seqs)
    half = len(steps) // 2
    first = StepHistory()
    sealed = first.extend(steps[:half], times[:half], seqs[:half])
    hot = index_to_bytes(first.chunks), encode_chunk(*first.tail)  # what the hot state keeps
    restored = StepHistory(index_from_bytes(hot[0]), decode_chunk(hot[1]))
    sealed += restored.extend(steps[half:], times[half:], seqs[half:])
    assert sealed == expected
    assert restored.chunks == whole.chunks
    assert [column.tolist() for column in restored.tail] == [column.tolist() for column in whole.tail]
    assert len(restored) == len(steps)


def test_steps_one_at_a_time_seal_the_chunks_of_steps_added_at_once():
    """Appending step by step seals each chunk when full, with the same bytes as one extend."""
    steps, times, seqs = _steady(2 * 64 + 5, 1_000_000, 1_000, np.random.default_rng(6))
    at_once = StepHistory(chunk_steps=64).extend(steps, times, seqs)
    one_by_one = StepHistory(chunk_steps=64)
    sealed_at = [(i, one_by_one.append(int(step), int(t), int(seq)))
                 for i, (step, t, seq) in enumerate(zip(steps, times, seqs, strict=True))]
    assert [i for i, sealed in sealed_at if sealed] == [63, 127]
    assert [chunk for _, sealed in sealed_at for chunk in sealed] == at_once


def test_a_step_before_the_last_ones_time_is_refused():
    """Steps are added in time order, across calls as within one."""
    history = StepHistory()
    history.append(1, T0_US, 1)
    with pytest.raises(ValueError, match="time order"):
        history.append(2, T0_US - 1, 2)
    with pytest.raises(ValueError, match="time order"):
        history.extend([2, 3], [T0_US + 2, T0_US + 1], [2, 3])
    assert len(history) == 1


def test_a_chunk_that_is_not_the_one_indexed_is_refused():
    """A load that returns a chunk of another length than its index says is an error."""
    history = StepHistory(chunk_steps=4)
    history.extend(range(8), range(8), range(8))
    with pytest.raises(ValueError, match="holds 3 steps, not 4"):
        read_chunks(history.chunks, lambda chunk_id: encode_chunk([1, 2, 3], [1, 2, 3], [1, 2, 3]))


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


def _by_id(sealed: list[tuple[Chunk, bytes]]) -> list[tuple[int, bytes]]:
    return [(chunk.chunk_id, data) for chunk, data in sealed]
