"""A run's snapshots at a cadence (``pipeline.core.series``): each is the snapshot of a replay as
of its time, and each anomaly row is carried once."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pipeline.core import engine
from pipeline.core.series import Cadence, cadence_times, row_key, split_by_time
from support.runs import SHAPE_NAMES, S, batch_of, messages, recorded

WINDOWS = (60, 300)


def shuffled(events, rng: random.Random, largest: int) -> list[bytes]:
    """Each attempt's events shuffled and cut into messages of up to ``largest``, in any order:
    a message then spans many cadence times."""
    out: list[bytes] = []
    for attempt in sorted({e.attempt_id for e in events}):
        own = [e for e in events if e.attempt_id == attempt]
        rng.shuffle(own)
        out += messages(own, rng.randint(1, largest))
    rng.shuffle(out)
    return out


def whole(batches) -> engine.RunState:
    state = engine.RunState("run")
    for batch in batches:
        state.add_batch(batch)
    return state


@pytest.mark.parametrize("name", SHAPE_NAMES)
@pytest.mark.parametrize("every_s", [7, 30])
def test_each_snapshot_of_the_series_is_the_replay_as_of_its_time(name, every_s):
    """Every snapshot of the series equals the whole run's snapshot as of its time, but for its
    anomaly rows, which are those no earlier snapshot carried."""
    events, as_of = recorded(name)
    batches = [batch_of(data) for data in shuffled(events, random.Random(every_s), 40)]
    state = whole(batches)
    final = state.snapshot(as_of, WINDOWS)
    cadence = Cadence("run", every_s, WINDOWS)
    series = list(cadence.snapshots(batches, as_of, final.missing_events))
    assert len(series) > 5
    for snapshot in series:
        expected = state.snapshot(snapshot.as_of_us, WINDOWS)
        assert dataclasses.replace(snapshot, anomalies=()) == dataclasses.replace(expected, anomalies=())
        assert {row_key(c) for c in snapshot.anomalies} <= {row_key(c) for c in expected.anomalies}
    carried = [row_key(c) for s in [*series, cadence.fresh(final)] for c in s.anomalies]
    assert len(carried) == len(set(carried)) and set(carried) >= {row_key(c) for c in final.anomalies}


def test_the_times_are_multiples_of_the_cadence_inside_the_run():
    """Times line up across runs: multiples of the cadence after the first event, up to the last."""
    assert cadence_times(10 * S + 1, 40 * S, 10 * S) == [20 * S, 30 * S, 40 * S]
    assert cadence_times(10 * S, 19 * S, 10 * S) == []


def test_a_message_across_cadence_times_is_cut_at_them():
    """A message's events go to the stretch their times fall in, every event once."""
    events, _ = recorded("ended")
    (batch,) = [batch_of(data) for data in messages(list(events)[:300], 300)]
    first, last = min(batch.step_times), batch.max_time_us
    times = [first + (last - first) // 3, first + 2 * (last - first) // 3]
    parts = list(split_by_time(batch, times))
    assert [index for index, _ in parts] == [0, 1, 2]
    for index, part in parts:
        low = times[index - 1] if index else -1
        high = times[index] if index < len(times) else last
        assert all(low < e.time_us <= high for e in part.events())
    assert sorted(e.seq for _, p in parts for e in p.events()) == sorted(e.seq for e in batch.events())
