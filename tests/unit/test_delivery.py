"""Delivery faults: at-least-once delivery, reordering, lateness, splitting and skewed clocks
change no number (goodput, every badput bucket, disruptions, step statistics, rolling windows)."""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core import engine
from pipeline.core.events import Event, encode_events
from pipeline.core.snapshot import DATA_LOADING_ASYNC, Snapshot
from support.runs import (
    ODD_T0,
    SHAPE_NAMES,
    S,
    batch_of,
    final,
    messages,
    odd_messages,
    odd_runs,
    recorded,
    skewed,
    state_of,
)

FAST = settings(max_examples=20, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])


@functools.cache
def clean(shape: str) -> Snapshot:
    """The snapshot of a clean delivery: the emitter's messages, in order, each once."""
    events, as_of = recorded(shape)
    return final(messages(events, 1000), as_of)


def split(events: list[Event], rng: random.Random, largest: int) -> list[bytes]:
    """The events cut into messages of 1 to ``largest`` events, in the order given."""
    out, start = [], 0
    while start < len(events):
        size = rng.randint(1, largest)
        out.append(encode_events(events[start:start + size]))
        start += size
    return out


def shuffled_messages(events: tuple[Event, ...], rng: random.Random, largest: int) -> list[bytes]:
    """Each attempt's events shuffled and cut into messages of random sizes; all of them shuffled."""
    out: list[bytes] = []
    for attempt in sorted({e.attempt_id for e in events}):
        own = [e for e in events if e.attempt_id == attempt]
        rng.shuffle(own)
        out += split(own, rng, largest)
    rng.shuffle(out)
    return out


@FAST
@given(shape=st.sampled_from(SHAPE_NAMES), size=st.integers(1, 400), live=st.booleans(),
       rng=st.randoms(use_true_random=False))
def test_every_message_delivered_twice_changes_no_number(shape, size, live, rng: random.Random):
    """Every message delivered twice, the copies in any order, gives the clean snapshot (with
    snapshots taken along the way or not)."""
    events, as_of = recorded(shape)
    delivered = messages(events, size) * 2
    rng.shuffle(delivered)
    assert final(delivered, as_of, along_the_way=live) == clean(shape)


@FAST
@given(shape=st.sampled_from(SHAPE_NAMES), largest=st.integers(1, 300), live=st.booleans(),
       rng=st.randoms(use_true_random=False))
def test_events_shuffled_across_messages_change_no_number(shape, largest, live, rng: random.Random):
    """A run's events shuffled, cut into messages of any size and delivered in any order give the
    clean snapshot."""
    events, as_of = recorded(shape)
    assert final(shuffled_messages(events, rng, largest), as_of, along_the_way=live) == clean(shape)


@FAST
@given(shape=st.sampled_from(SHAPE_NAMES), first=st.integers(1, 200), second=st.integers(1, 200),
       rng=st.randoms(use_true_random=False))
def test_a_redelivery_batched_differently_changes_no_number(shape, first, second, rng: random.Random):
    """Messages redelivered in other batches (partly overlapping the first ones) give the clean snapshot."""
    events, as_of = recorded(shape)
    delivered = messages(events, first) + messages(events, second)
    rng.shuffle(delivered)
    assert final(delivered, as_of, along_the_way=True) == clean(shape)


@FAST
@given(largest=st.integers(1, 5), rng=st.randoms(use_true_random=False))
def test_a_run_split_across_many_messages_and_attempts_changes_no_number(largest, rng: random.Random):
    """Three attempts' events in messages of a few events, the attempts' messages interleaved
    (a restarted job's spool flushing beside its successor), give the clean snapshot."""
    events, as_of = recorded("sparse")
    assert len({e.attempt_id for e in events}) == 3
    streams = [split([e for e in events if e.attempt_id == attempt], rng, largest)
               for attempt in sorted({e.attempt_id for e in events})]
    delivered = []
    while any(streams):  # each attempt's messages in order, the attempts interleaved at random
        stream = rng.choice([s for s in streams if s])
        delivered.append(stream.pop(0))
    assert final(delivered, as_of, along_the_way=True) == clean("sparse")


@settings(FAST, max_examples=12)
@given(shape=st.sampled_from(SHAPE_NAMES), late_fraction=st.floats(0.05, 0.5), hours=st.integers(1, 6),
       rng=st.randoms(use_true_random=False))
def test_events_hours_late_change_no_number(shape, late_fraction, hours, rng: random.Random):
    """Messages held back for hours arrive after later snapshots were taken: every snapshot along
    the way is that of the events delivered so far, and the last ones are the clean ones."""
    events, as_of = recorded(shape)
    batches = [batch_of(data) for data in messages(events, 20)]
    late = {i for i in range(len(batches)) if rng.random() < late_fraction}
    later = as_of + hours * 3600 * S
    state, delivered = engine.RunState("run"), []

    def deliver(batch, snapshot_at: int) -> None:
        state.add_batch(batch)
        delivered.append(batch)
        assert state.snapshot(snapshot_at) == state_of(delivered).snapshot(snapshot_at)

    latest = 0
    for i, batch in enumerate(batches):  # a live pipeline's snapshots, as of the latest time seen
        if i not in late:
            latest = max(latest, batch.max_time_us)
            deliver(batch, latest)
    state.snapshot(later)  # hours pass
    for i in sorted(late):
        deliver(batches[i], later)
    assert state.snapshot(as_of) == clean(shape)
    assert state.snapshot(later) == state_of(batches).snapshot(later)


@FAST
@given(shape=st.sampled_from(("restarted", "rolled_back", "sparse")), offset_s=st.integers(-900, 3600),
       size=st.integers(1, 300), rng=st.randoms(use_true_random=False))
def test_a_skewed_host_clock_changes_no_number_under_any_delivery(shape, offset_s, size, rng: random.Random):
    """With one attempt's host clock off, duplicated and shuffled messages give the snapshot of
    its clean delivery: the figures depend on the events' times only, never on their arrival."""
    events, as_of = recorded(shape)
    restart = sorted({e.attempt_id for e in events})[-1]
    events = tuple(skewed(events, restart, offset_s))
    as_of = max(as_of, max(e.time_us for e in events))
    delivered = messages(events, size) * 2 + shuffled_messages(events, rng, size)
    rng.shuffle(delivered)
    assert final(delivered, as_of) == final(messages(events, 1000), as_of)


@pytest.mark.parametrize("offset_s", [-3600, -900, -100, -30, 30, 3600])
@pytest.mark.parametrize("shape", ["restarted", "rolled_back", "sparse"])
def test_a_skewed_host_clock_keeps_the_accounting_whole(shape, offset_s):
    """A restart whose clock is off overlaps or leaves a gap: no figure is negative, a recovery is
    never negative, and goodput plus the badput buckets is still the elapsed time."""
    events, as_of = recorded(shape)
    restart = sorted({e.attempt_id for e in events})[-1]
    events = tuple(skewed(events, restart, offset_s))
    snapshot = final(messages(events, 1000), max(as_of, max(e.time_us for e in events)))
    for figures in (snapshot.cumulative, *(w for w in snapshot.windows if w is not None)):
        accounted = figures.productive_s + sum(seconds for bucket, seconds in figures.badput_s.items()
                                               if bucket != DATA_LOADING_ASYNC)
        assert accounted == pytest.approx(figures.total_s, abs=1e-6)
        assert figures.productive_s >= 0 and min(figures.badput_s.values()) >= 0
    assert all(d.recovery_s >= 0 and d.wasted_progress_s >= 0 for d in snapshot.disruptions)


def test_a_restart_before_the_last_step_by_its_clock_has_no_recovery_time():
    """A restarted host whose clock is a minute and a half behind starts "before" the crash: its
    disruption has no recovery time, where it had a positive one with the clocks agreeing."""
    events, as_of = recorded("restarted")
    (plain,) = final(messages(events, 1000), as_of).disruptions
    assert plain.recovery_s > 60
    behind_events = skewed(events, "attempt-1", -(plain.recovery_s + 30))
    (behind,) = final(messages(behind_events, 1000), as_of).disruptions
    assert behind.recovery_s == 0.0


def test_steps_sharing_a_start_time_count_the_same_in_any_order():
    """Two steps recorded at the same microsecond (a coarse clock) are no rollback, whichever
    arrives first."""
    events, as_of = recorded("ended")
    steps = [e for e in events if e.kind == "step_start"]
    a, b = steps[10], steps[11]
    tied = tuple(e if e is not b else Event(b.run_id, b.attempt_id, b.seq, a.time_us, b.kind, b.body)
                 for e in events)
    in_order = final([encode_events(list(tied))], as_of)
    reversed_pair = [e for e in tied if e.seq not in (a.seq, b.seq)]
    late_first = final([encode_events([e for e in tied if e.seq == b.seq]), encode_events(reversed_pair),
                        encode_events([e for e in tied if e.seq == a.seq])], as_of)
    assert late_first == in_order
    assert in_order.disruptions == ()


def test_two_job_starts_of_one_attempt_at_one_time_count_the_same_in_any_order():
    """An attempt with two job starts at the same time (a producer's bug) takes the same metadata
    either way."""
    events, as_of = recorded("ended")
    start = next(e for e in events if e.kind == "job_start")
    other = Event(start.run_id, start.attempt_id, 10**6, start.time_us, "job_start",
                  {**start.body, "chip_count": 512, "run_group": "other"})
    rest = [e for e in events if e is not start]
    first = final([encode_events([start]), encode_events([other]), encode_events(rest)], as_of)
    second = final([encode_events([other]), encode_events([start]), encode_events(rest)], as_of)
    assert first == second


def test_a_run_as_of_the_instant_it_starts_has_a_snapshot_of_no_time():
    """A run whose first message (its job start alone) is all there is as of the snapshot has zero
    elapsed time and no goodput, rather than no snapshot or an error."""
    events, _ = recorded("ended")
    start = next(e for e in events if e.kind == "job_start")
    snapshot = final([encode_events([start])], start.time_us)
    assert snapshot.cumulative.total_s == 0 and snapshot.cumulative.goodput_pct is None
    assert snapshot.windows == (None,) * len(snapshot.windows)


@settings(FAST, max_examples=150)
@given(run=odd_runs, as_of_s=st.integers(-5, 80), rng=st.randoms(use_true_random=False))
def test_odd_runs_give_the_same_snapshot_in_any_order(run, as_of_s, rng: random.Random):
    """Valid but odd runs (unpaired spans, ends before starts, steps anywhere) give the same
    snapshot whatever the order of their messages and the snapshots taken along the way."""
    delivered = odd_messages(run)
    as_of = ODD_T0 + as_of_s * S
    expected = state_of(batch_of(data) for data in delivered).snapshot(as_of)
    rng.shuffle(delivered)
    state = engine.RunState("run")
    for data in delivered:
        state.add_batch(batch_of(data))
        state.snapshot(ODD_T0 + rng.randint(-5, 80) * S)
    assert state.snapshot(as_of) == expected


# -- the same through the Beam batch pipeline ---------------------------------------------------


