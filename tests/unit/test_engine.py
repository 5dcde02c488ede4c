"""The engine on its own: order independence, time semantics, windows, exclusions, state size."""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core import engine, state_coder
from pipeline.core.events import Event
from pipeline.core.snapshot import INFRASTRUCTURE_RECOVERY, OTHER, WASTED_PROGRESS, Snapshot
from pipeline.core.timeline import IntervalSums
from support.runs import TraceBuilder, record_ours, shape

S = 1_000_000


#: The shapes of run the properties hold for.
KINDS = ("ended", "restarted", "rolled_back", "running")


@functools.cache
def scenario_events(kind: str) -> tuple[tuple[Event, ...], int]:
    run = shape(kind, seed=KINDS.index(kind))
    return tuple(record_ours(run.attempts)), run.as_of_us() + 30 * S


def snapshot_of(events, as_of_us: int, **kwargs) -> Snapshot:
    state = engine.RunState("run")
    state.add_all(events)
    result = state.snapshot(as_of_us, **kwargs)
    assert result is not None
    return result


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), rng=st.randoms(use_true_random=False),
       duplicate_fraction=st.floats(0, 1))
def test_order_and_duplicates_do_not_change_any_number(kind, rng: random.Random, duplicate_fraction):
    """Any permutation of a run's events, with any of them delivered twice, gives the same snapshot."""
    events, as_of = scenario_events(kind)
    shuffled = list(events) + [e for e in events if rng.random() < duplicate_fraction]
    rng.shuffle(shuffled)
    assert snapshot_of(shuffled, as_of) == snapshot_of(events, as_of)


def test_state_survives_its_coder():
    """encode_state/decode_state round-trip to a state with the same snapshot."""
    events, as_of = scenario_events("restarted")
    state = engine.RunState("run")
    state.add_all(events)
    decoded = state_coder.decode_state(state_coder.encode_state(state))
    assert decoded.snapshot(as_of) == state.snapshot(as_of)
    decoded.add_all(events)  # the dedup memory survives too
    assert decoded.events == state.events


@pytest.mark.parametrize("kind", KINDS)
def test_a_message_survives_its_coder(kind):
    """encode_batch/decode_batch round-trip every message of a run to the same events, and a
    state built from the decoded messages has the same snapshot (a run's log in Beam state)."""
    from goodput_schemas.wire import encode_batch
    from pipeline.core.events import parse_batch

    events, as_of = scenario_events(kind)
    original, decoded = engine.RunState("run"), engine.RunState("run")
    for attempt_id in dict.fromkeys(e.attempt_id for e in events):
        mine = [e for e in events if e.attempt_id == attempt_id]
        for start in range(0, len(mine), 7):
            records = [(e.seq, e.time_us, e.kind, e.body) for e in mine[start:start + 7]]
            batch, _ = parse_batch(encode_batch("run", attempt_id, records).data)
            assert batch is not None
            again = state_coder.decode_batch("run", state_coder.encode_batch(batch))
            assert again.events() == batch.events()
            original.add_batch(batch)
            decoded.add_batch(again)
    assert decoded.snapshot(as_of) == original.snapshot(as_of)


def test_the_state_packs_its_steps_and_its_hot_part_sealed_is_the_same_at_any_length():
    """The encoded state of a run packs each recorded step (its number, time and seq) in a few
    bits (these are exactly a second apart), from a small constant; sealed, its hot part holds
    only the tails, and is the same size at 10,000 and 40,000 steps."""
    def state(steps: int) -> engine.RunState:
        state = engine.RunState("run")
        state.add(Event("run", "a", 0, 1_800_000_000 * S, "job_start", {"chip_count": 8}))
        for step in range(steps):
            state.add(Event("run", "a", step + 1, 1_800_000_000 * S + step * S, "step_start",
                            {"step": step}))
        return state

    base, large = (len(state_coder.encode_state(state(steps))) for steps in (0, 10_000))
    assert base < 1024
    assert large - base <= 10_000 // 4
    hot = []
    for steps in (10_000, 40_000):
        sealed = state(steps)
        state_coder.seal(sealed)
        hot.append(len(state_coder.encode_state(sealed)))
    assert abs(hot[1] - hot[0]) <= 16  # the counts' digits


def test_elapsed_time_runs_to_as_of_never_the_wall_clock():
    """A run without an end is measured to the snapshot time, whatever the machine's clock says."""
    events, _ = scenario_events("running")
    start = min(e.time_us for e in events)
    early, late = snapshot_of(events, start + 2000 * S), snapshot_of(events, start + 3000 * S)
    assert early.cumulative.total_s == pytest.approx(2000)
    assert late.cumulative.total_s == pytest.approx(3000)
    assert late.cumulative.productive_s == pytest.approx(early.cumulative.productive_s)


def test_events_after_as_of_are_ignored():
    """A snapshot as of a past time equals the snapshot of the events recorded until then."""
    events, _ = scenario_events("ended")
    cut = sorted(e.time_us for e in events)[len(events) // 2]
    before = [e for e in events if e.time_us <= cut]
    assert snapshot_of(events, cut) == snapshot_of(before, cut)


def test_job_end_does_not_stick_across_a_restart():
    """An attempt that ended, then a new attempt: the run is running again and its time grows."""
    run = TraceBuilder(seed=20)
    run.start_attempt()
    run.steps(0, 50)
    run.end()
    run.wait(600)  # a planned stop
    run.start_attempt()
    run.steps(50, 100)
    events = record_ours(run.attempts)
    as_of = run.as_of_us() + 100 * S
    snapshot = snapshot_of(events, as_of)
    assert not snapshot.ended
    assert snapshot.disruptions == ()  # a planned stop and resume is no disruption
    start = min(e.time_us for e in events)
    assert snapshot.cumulative.total_s == pytest.approx((as_of - start) / S - 600, abs=1e-3)
    assert snapshot.max_productive_step == 98


def test_rolling_windows_are_clipped_to_the_run_and_empty_is_none():
    """Windows end at as_of; the part before the run starts or after it ends is not counted."""
    events, _ = scenario_events("ended")
    start = min(e.time_us for e in events)
    end = max(e.time_us for e in events)
    snapshot = snapshot_of(events, end + 120 * S, windows_s=(60, 300, 100_000))
    assert snapshot.windows[0] is None  # the run ended 120 s before: nothing in the last 60 s
    assert snapshot.windows[1] is not None and snapshot.windows[1].total_s == pytest.approx(180)
    assert snapshot.windows[2] is not None
    assert snapshot.windows[2].total_s == pytest.approx((end - start) / S)
    assert snapshot.windows[2].goodput_pct == pytest.approx(snapshot.cumulative.goodput_pct)


def test_a_hang_shows_as_lost_time_in_rolling_windows():
    """Ten minutes without a step: the last five minutes are all OTHER, goodput 0."""
    events, _ = scenario_events("running")
    last = max(e.time_us for e in events)
    snapshot = snapshot_of(events, last + 600 * S, windows_s=(300,))
    window = snapshot.windows[0]
    assert window is not None
    assert window.goodput_pct == 0.0
    assert window.badput_s[OTHER] == pytest.approx(300)


def test_exclusions_leave_time_out_of_elapsed_and_every_bucket():
    """An excluded stretch (e.g. a capacity stock-out) counts nowhere."""
    events, as_of = scenario_events("restarted")
    plain = snapshot_of(events, as_of)
    outage = next(d for d in plain.disruptions if not d.in_process)
    excluded = (outage.restart_us - 40 * S, outage.restart_us)
    with_exclusion = snapshot_of(events, as_of, exclusions=[excluded])
    assert with_exclusion.cumulative.total_s == pytest.approx(plain.cumulative.total_s - 40)
    assert with_exclusion.cumulative.badput_s[INFRASTRUCTURE_RECOVERY] == pytest.approx(
        plain.cumulative.badput_s[INFRASTRUCTURE_RECOVERY] - 40)
    assert with_exclusion.cumulative.productive_s == pytest.approx(plain.cumulative.productive_s)


def test_in_process_rollback_is_a_disruption_without_recovery_time():
    """Steps going back inside one attempt waste the rolled-back progress, with no outage."""
    events, as_of = scenario_events("rolled_back")
    snapshot = snapshot_of(events, as_of)
    rollback, restart = snapshot.disruptions
    assert rollback.in_process and rollback.recovery_s == 0.0
    assert (rollback.last_step_before, rollback.resume_step) == (119, 105)
    assert rollback.wasted_progress_s > 0 and not restart.in_process
    assert rollback.wasted_progress_s + restart.wasted_progress_s == pytest.approx(
        snapshot.cumulative.badput_s[WASTED_PROGRESS])


def test_restore_step_marks_lost_progress_before_the_first_step():
    """Restarted and restored from step 100 but no step yet: steps from 100 on are already lost."""
    events, _ = scenario_events("restarted")
    restore = next(e for e in events if e.kind == "checkpoint_restore")
    before_steps = [e for e in events if not (e.kind == "step_start" and e.time_us > restore.time_us)]
    snapshot = snapshot_of(before_steps, restore.time_us + 60 * S)
    assert snapshot.cumulative.badput_s[WASTED_PROGRESS] > 0
    assert snapshot.disruptions[-1].resume_step is None


def test_chip_seconds_weight_time_by_the_attempts_chip_count():
    """Productive chip-seconds are productive seconds times the chips of the attempt."""
    base = 1_800_000_000 * S
    events = [Event("run", "a", 0, base, "job_start", {"chip_count": 256})]
    events += [Event("run", "a", i + 1, base + (10 + i) * S, "step_start", {"step": i}) for i in range(11)]
    events.append(Event("run", "a", 12, base + 21 * S, "job_end", {}))
    figures = snapshot_of(events, base + 21 * S).cumulative
    assert figures.productive_s == pytest.approx(11)
    assert figures.chip_seconds_productive == pytest.approx(11 * 256)
    assert figures.chip_seconds_total == pytest.approx(21 * 256)


def test_run_with_nothing_before_as_of_has_no_snapshot():
    """No snapshot is invented for a run whose events all come after the snapshot time."""
    state = engine.RunState("run")
    state.add(Event("run", "a", 0, 1_800_000_000 * S, "job_start", {}))
    assert state.snapshot(1_700_000_000 * S) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), rng=st.randoms(use_true_random=False), chunks=st.integers(1, 12))
def test_snapshots_along_the_way_do_not_change_the_result(kind, rng: random.Random, chunks):
    """A state snapshotted after every chunk of (shuffled) events ends where a fresh one does."""
    events, as_of = scenario_events(kind)
    shuffled = list(events)
    if rng.random() < 0.5:
        rng.shuffle(shuffled)
    state = engine.RunState("run")
    size = max(1, len(shuffled) // chunks)
    for start in range(0, len(shuffled), size):
        state.add_all(shuffled[start:start + size])
        latest = max(e.time_us for e in shuffled[:start + size])
        state.snapshot(latest - rng.randrange(0, 60) * S)  # also as of times before some steps
    assert state.snapshot(as_of) == snapshot_of(events, as_of)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 50)), max_size=150),
       start=st.integers(0, 8000), width=st.integers(0, 8000))
def test_interval_sums_equal_direct_overlap(lengths, start, width):
    """Overlap from prefix sums equals clipping each interval, with few or many intervals."""
    intervals, t = [], 0
    for gap, length in lengths:
        intervals.append((t + gap, t + gap + length))
        t += gap + length
    expected = sum(max(0, min(e, start + width) - max(s, start)) for s, e in intervals)
    assert IntervalSums(intervals).overlap(start, start + width) == expected


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), rng=st.randoms(use_true_random=False), chunks=st.integers(1, 12))
def test_metrics_and_heartbeats_keep_incremental_snapshots_exact(kind, rng: random.Random, chunks):
    """Model metrics and heartbeats among the steps (one a new attempt's first event) change no figure."""
    events, as_of = scenario_events(kind)
    extra = []
    next_seq = {e.attempt_id: e.seq + 1 for e in sorted(events, key=lambda e: e.seq)}  # no gaps
    for i, event in enumerate(events):
        if event.kind == "step_start":
            kind_ = "model_metrics" if i % 2 else "heartbeat"
            body = {"step": event.body["step"], "loss": 1.0} if kind_ == "model_metrics" else {}
            extra.append(Event(event.run_id, event.attempt_id, next_seq[event.attempt_id], event.time_us + 1,
                               kind_, body))
            next_seq[event.attempt_id] += 1
    extra.append(Event("run", "attempt-with-heartbeats-only", 0, events[-1].time_us, "heartbeat", {}))
    mixed = sorted(events + tuple(extra), key=lambda e: e.time_us)
    state = engine.RunState("run")
    size = max(1, len(mixed) // chunks)
    for start in range(0, len(mixed), size):
        state.add_all(mixed[start:start + size])
        state.snapshot(max(e.time_us for e in mixed[:start + size]) - rng.randrange(0, 60) * S)
    assert state.snapshot(as_of) == snapshot_of(events, as_of)
