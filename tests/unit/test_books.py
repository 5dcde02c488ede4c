"""Books that balance: in every snapshot, productive time plus every badput bucket but the
informational DATA_LOADING_ASYNC is the elapsed time (``unaccounted_s`` within a millisecond).

Held over every run the suites, the demo and the benchmarks generate, at many times during each
run: taken from the whole run's events (each snapshot classified from scratch), and as a stream
takes them (events arriving in time order, a snapshot after each few, the timeline moved on
incrementally)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import costs as costs_bench
from benchmarks import engine as engine_bench
from benchmarks import fleet as fleet_bench
from benchmarks import replay as replay_bench
from benchmarks import restarts as restarts_bench
from emitter.testing import capture_events
from goodput_schemas.wire import encode_batch
from pipeline.core import engine
from pipeline.core.events import Event, parse_batch
from pipeline.core.rows import GOODPUT, snapshot_rows
from pipeline.core.snapshot import DATA_LOADING_ASYNC, OTHER, TRAINING_PREP, Snapshot, WindowFigures
from pipeline.demo import simulated_job
from pipeline.demo.fleet import FLEET as DEMO_FLEET
from support.reference import reference_trace
from support.runs import (
    ODD_T0,
    SHAPE_NAMES,
    SHAPES,
    S,
    batch_of,
    events_of,
    fleet_events,
    odd_messages,
    odd_runs,
    record_ours,
    recorded,
    shape,
    training_run,
)

#: The most time a snapshot may leave unaccounted, either way.
BOUND_S = 0.001
#: Rolling windows checked beside the cumulative figures: the defaults and one shorter than a step.
WINDOWS_S = (1, 60, 300, 900, 3600)


def check(snapshot: Snapshot | None) -> int:
    """Asserts the snapshot's books balance, in every window and in its goodput rows; 1 if it had
    figures to check."""
    if snapshot is None:
        return 0
    figures = (snapshot.cumulative, *snapshot.windows)
    for window in figures:
        if window is not None:
            assert abs(window.unaccounted_s) <= BOUND_S, (snapshot.as_of_us, window)
    rows = [row for table, row in snapshot_rows(snapshot) if table == GOODPUT]
    assert [row["unaccounted_s"] for row in rows] == [None if w is None else w.unaccounted_s for w in figures]
    return 1


def times_during(events: Sequence[Event], count: int = 24) -> list[int]:
    """``count`` times from a second before the run's first event to a minute after its last."""
    first = min(e.time_us for e in events) - S
    span = max(e.time_us for e in events) + 60 * S - first
    return [first + span * k // (count - 1) for k in range(count)]


def balanced_snapshots(events: Sequence[Event], as_of_us: Sequence[int] = (), chunk: int = 25,
                       exclusions: Sequence[tuple[int, int]] = ()) -> int:
    """Asserts the books balance as of ``as_of_us`` (else times during the run) with every event
    known, and as a stream snapshots the run after every ``chunk`` events in time order; returns
    how many snapshots had figures."""
    state = engine.RunState("run")
    state.add_all(events)
    times = sorted(as_of_us or times_during(events))
    checked = sum(check(state.snapshot(t, WINDOWS_S, exclusions)) for t in times)
    stream, latest = engine.RunState("run"), 0
    arriving = sorted(events, key=lambda e: (e.time_us, e.attempt_id, e.seq))
    for index in range(0, len(arriving), chunk):
        arrived = arriving[index:index + chunk]
        stream.add_all(arrived)
        latest = max(latest, arrived[-1].time_us)
        checked += check(stream.snapshot(latest, WINDOWS_S, exclusions))
    return checked


def events_of_records(records: Sequence[tuple[int, int, str, dict[str, object]]],
                      attempt_id: str = "attempt-1") -> list[Event]:
    """The events of one attempt's records, parsed from the message the emitter would send."""
    batch, dead = parse_batch(encode_batch("run", attempt_id, list(records)).data)
    assert batch is not None and not dead, dead
    return list(batch.events())


# -- what is unaccounted -----------------------------------------------------------------------


def test_unaccounted_time_is_elapsed_time_no_bucket_holds():
    """Buckets that miss 0.7 % of elapsed time, or hold 0.7 % too much, leave it unaccounted either
    way; DATA_LOADING_ASYNC, which overlaps other time, is not counted."""
    badput = {TRAINING_PREP: 900.0, OTHER: 30.0, DATA_LOADING_ASYNC: 500.0}
    figures = WindowFigures(0, 0, 10_000 * S, 10_000.0, 9_000.0, badput, 0, 0.0, 0.0)
    assert figures.unaccounted_s == pytest.approx(70.0)
    over = dataclasses.replace(figures, badput_s={**badput, OTHER: 170.0})
    assert over.unaccounted_s == pytest.approx(-70.0)


def test_float_rounding_of_balanced_figures_is_not_unaccounted_time():
    """Figures that balance in exact arithmetic give 0, not the float error of their difference."""
    figures = WindowFigures(0, 0, 300_000, 0.3, 0.1, {OTHER: 0.2}, 0, 0.0, 0.0)
    assert 0.3 - 0.1 - 0.2 != 0
    assert figures.unaccounted_s == 0.0 and str(figures.unaccounted_s) == "0.0"


def test_goodput_rows_carry_unaccounted_time_and_null_in_an_empty_window():
    """Each goodput row carries its window's unaccounted seconds; an empty rolling window's is NULL."""
    run = shape("ended")
    state = engine.RunState("run")
    state.add_all(record_ours(run.attempts))
    snapshot = state.snapshot(run.as_of_us() + 7200 * S, (60, 86_400))
    assert snapshot is not None and snapshot.windows[0] is None
    rows = {row["window_s"]: row for table, row in snapshot_rows(snapshot) if table == GOODPUT}
    assert rows[0]["unaccounted_s"] == 0.0 and rows[86_400]["unaccounted_s"] == 0.0
    assert rows[60]["unaccounted_s"] is None


# -- the suites' runs --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shape_balances(name: str):
    """Every named shape of run balances, during the run and as of its end."""
    run = shape(name, seed=3)
    events = record_ours(run.attempts)
    assert balanced_snapshots(events, [*times_during(events), run.as_of_us()])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), every=st.sampled_from([1, 3, 7]),
       rollback_to=st.none() | st.integers(0, 119), planned_stop=st.booleans(), restart=st.booleans(),
       ended=st.booleans(), hung_s=st.sampled_from([0.0, 45.0, 600.0]))
def test_every_training_run_variant_balances(seed, every, rollback_to, planned_stop, restart, ended, hung_s):
    """``training_run`` balances with any mix of its rollback, stop, restart, end and hang."""
    run = training_run(seed, every=every, rollback_to=rollback_to, planned_stop=planned_stop,
                       restart=restart, ended=ended, hung_s=hung_s)
    assert balanced_snapshots(record_ours(run.attempts), chunk=40)


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_recorded_shapes_balance_with_their_metrics_and_heartbeats(name: str):
    """The shapes as the fault suites record them (model metrics, heartbeats) balance."""
    events, as_of = recorded(name)
    assert balanced_snapshots(events, [*times_during(events), as_of], chunk=10)


def test_the_replayed_fleet_balances():
    """Each run of the replayed fleet balances."""
    by_run = {run_id: list(events) for run_id, events in
              itertools.groupby(sorted(fleet_events(), key=lambda e: e.run_id), key=lambda e: e.run_id)}
    assert len(by_run) == 3
    for events in by_run.values():
        assert balanced_snapshots([dataclasses.replace(e, run_id="run") for e in events])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=odd_runs, excluded=st.lists(st.tuples(st.integers(-5, 65), st.integers(0, 30)), max_size=2))
def test_odd_runs_balance_at_every_second(run, excluded):
    """Valid but odd runs balance at every second of their minute, with or without exclusions."""
    events = [event for data in odd_messages(run) for event in batch_of(data).events()]
    exclusions = [(ODD_T0 + start * S, ODD_T0 + (start + length) * S) for start, length in excluded]
    balanced_snapshots(events, [ODD_T0 + second * S for second in range(-1, 63)], chunk=3,
                         exclusions=exclusions)


def test_reference_traces_balance():
    """The differential suites' traces (every reference method, a crash, a restart) balance."""
    for seed in (1, 2, 3):
        assert balanced_snapshots(record_ours(list(reference_trace(seed))))


# -- the demo ----------------------------------------------------------------------------------


def simulated(profile: simulated_job.JobProfile, steps: int, seed: int) -> list[Event]:
    """The events of a simulated job's run, on a simulated clock."""
    with capture_events() as captured:
        simulated_job.simulate("file:unused.jsonl", run_id="run", steps=steps, seed=seed, spool_dir=None,
                               profile=profile)
        messages = captured.messages
    return events_of(messages)


@pytest.mark.parametrize("profile", [
    simulated_job.JobProfile(),
    simulated_job.JobProfile(restore_checkpoint=False, crashes_at=(0.3, 0.8)),
    simulated_job.JobProfile(slowdown=2.0, hang_at=0.7, crashes_at=(0.2,)),
], ids=["default", "no_restore", "slowdown_and_hang"])
def test_the_simulated_job_balances(profile: simulated_job.JobProfile):
    """The simulated job balances with its default profile and its command line's options."""
    assert balanced_snapshots(simulated(profile, 2000, seed=7), chunk=200)


@pytest.mark.parametrize("run", DEMO_FLEET, ids=[run.run_id for run in DEMO_FLEET])
def test_every_run_of_the_demo_fleet_balances(run):
    """Each run of the demo's fleet balances (a hang the demo's end would stop lasts an hour)."""
    profile = simulated_job.JobProfile(**run.profile)
    if profile.hang_at is not None and profile.hang_for_s is None:
        profile = dataclasses.replace(profile, hang_for_s=3600.0)
    assert balanced_snapshots(simulated(profile, run.steps, seed=sum(map(ord, run.run_id))), chunk=200)


# -- the benchmarks ----------------------------------------------------------------------------


def test_the_benchmarks_runs_balance():
    """The runs the benchmarks generate balance: restarts, the fleet's, the replayed run, the cost
    model's, the engine's steps without a job start and its mixed events."""
    restarted, as_of = restarts_bench.restarted_run(300)
    assert balanced_snapshots(restarted, [*times_during(restarted), as_of], chunk=50)
    for index in range(3):
        assert balanced_snapshots(events_of_records(fleet_bench._records(index)))
    assert balanced_snapshots(record_ours([replay_bench._calls(3000)]), chunk=100)
    assert balanced_snapshots(events_of_records(costs_bench._fleet_records(2000)), chunk=100)
    for messages in (engine_bench._step_messages(3), engine_bench._mixed_messages()[:5]):
        assert balanced_snapshots([e for data in messages for e in batch_of(data).events()], chunk=250)
