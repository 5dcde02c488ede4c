"""How attempts end and roll back: crashes whose job_end runs in a ``finally``, planned stops,
failed last attempts, and MaxText's elastic in-process rollbacks, against the reference's rules
(REFERENCE-SPEC §3.2, §3.3, §3.7) worked out by hand from each trace's times."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core import engine, state_coder
from pipeline.core.events import Event
from pipeline.core.snapshot import (
    CHECKPOINT_RESTORE,
    DATA_LOADING_ASYNC,
    DATA_LOADING_SYNC,
    ELASTIC_REINITIALIZATION,
    ELASTIC_SCALE_UP,
    ELASTIC_SLICE_DOWN,
    INFRASTRUCTURE_RECOVERY,
    OTHER,
    PROGRAM_STARTUP,
    TPU_INITIALIZATION,
    TRAINING_PREP,
    WASTED_PROGRESS,
    Snapshot,
    WindowFigures,
)
from support.runs import S, TraceBuilder, final, messages, micros, record_ours

#: Where the reference is right, ours agrees within this many percentage points.
TOLERANCE_PP = 0.05


def step_time(step: int, first: int, started: float) -> float:
    """When ``step`` starts in a stretch of 2 s steps from ``first`` at ``started`` whose first step
    compiles for 15 s more (``TraceBuilder.steps(first, ..., compile_s=15)``), seconds after T0."""
    return started if step == first else started + 17 + 2 * (step - first - 1)


def axlearn_crash(resume: int = 80) -> TraceBuilder:
    """AXLearn's shape: steps 0..99, a crash 1.3 s into step 99 with END_JOB recorded in a
    ``finally``, two minutes down, a restart that restores step ``resume`` and runs to 199, an end.

    Attempt 1: job_start 0, TPU init 20 s, preparation 10 s, loading 5 s, step 0 at 35, step 99 at
    248, job_end 249.3. Attempt 2: job_start 369.3, the same spans, a 5 s restore from 404.3, step
    ``resume`` at 409.3, step 199 at 662.3 (with ``resume`` 80), job_end 664.3.
    """
    run = TraceBuilder()
    run.start_attempt()
    run.steps(0, 100, compile_s=15)
    run.wait(-0.7)  # the crash, 1.3 s into step 99
    run.end()  # recorded in a finally
    run.wait(120)
    run.start_attempt()
    run.restore(resume, 5.0)
    run.steps(resume, 200, compile_s=15)
    run.end()
    return run


def with_ends(run: TraceBuilder, *failed: bool | None) -> list[Event]:
    """The run's events as the emitter records them, the attempts' job_ends (in time order) saying
    ``failed`` as given (None: the end says nothing)."""
    events = record_ours(run.attempts)
    ends = sorted((e.time_us, e.attempt_id) for e in events if e.kind == "job_end")
    flags = {end: flag for end, flag in zip(ends, failed, strict=True)}
    return [dataclasses.replace(e, body={} if flags[e.time_us, e.attempt_id] is None
                                else {"failed": flags[e.time_us, e.attempt_id]})
            if e.kind == "job_end" else e for e in events]


def start_us(events: list[Event]) -> int:
    return min(e.time_us for e in events)


def snapshot_of(events: list[Event], as_of_us: int) -> Snapshot:
    state = engine.RunState("run")
    state.add_all(events)
    snapshot = state.snapshot(as_of_us)
    assert snapshot is not None
    return snapshot


def assert_buckets(figures: WindowFigures, productive_s: float, expected_s: dict[str, float]) -> None:
    """Goodput and the badput buckets equal the hand computation within TOLERANCE_PP (every
    bucket not named is 0), and goodput plus all badput but async loading is 100 %."""
    total = figures.total_s
    assert figures.goodput_pct == pytest.approx(100 * productive_s / total, abs=TOLERANCE_PP)
    for bucket in set(figures.badput_s) | set(expected_s):
        assert figures.badput_pct(bucket) == pytest.approx(
            100 * expected_s.get(bucket, 0.0) / total, abs=TOLERANCE_PP), bucket
    accounted = figures.productive_s + sum(s for b, s in figures.badput_s.items() if b != DATA_LOADING_ASYNC)
    assert accounted == pytest.approx(total, abs=1e-6)


def axlearn_reference_figures() -> tuple[float, float, dict[str, float]]:
    """(elapsed, productive, badput) seconds of ``axlearn_crash()`` by the reference's rules."""
    crashed_at, restarted_at, ended_at = 249.3, 369.3, 664.3
    t1 = functools.partial(step_time, first=0, started=35.0)
    t2 = functools.partial(step_time, first=80, started=409.3)
    # Segment 1 keeps the intervals 0→1 … 79→80, less its first step's excess over the mean of
    # the others (15 s of compilation); segment 2 keeps 80→…→199 (less the same), and the last
    # step counts once the job has ended.
    startup1 = (t1(1) - t1(0)) - (t1(80) - t1(1)) / 79
    startup2 = (t2(81) - t2(80)) - (t2(199) - t2(81)) / 118
    productive = (t1(80) - t1(0) - startup1) + (t2(199) - t2(80) - startup2) + (ended_at - t2(199))
    assert crashed_at > t1(99)
    badput = {
        INFRASTRUCTURE_RECOVERY: restarted_at - t1(99),  # next job_start − last step start
        WASTED_PROGRESS: t1(99) - t1(80),  # t(k) − t(resume step)
        PROGRAM_STARTUP: startup1 + startup2,
        TPU_INITIALIZATION: 40.0, TRAINING_PREP: 20.0,
        DATA_LOADING_SYNC: 10.0,  # each attempt's load before its first step
        CHECKPOINT_RESTORE: 5.0,
    }
    badput[OTHER] = ended_at - productive - sum(badput.values())
    return ended_at, productive, badput


@pytest.mark.parametrize("failed", [True, None], ids=["failed", "says-nothing"])
def test_crash_whose_job_end_runs_in_a_finally_is_a_disruption(failed: bool | None):
    """A crash recorded with a job_end (failed, or saying nothing while the restart re-runs steps)
    is one disruption with infrastructure recovery and its gap elapsed, as the reference counts it."""
    events = with_ends(axlearn_crash(), failed, None)
    snapshot = snapshot_of(events, start_us(events) + round(664.3 * S))
    elapsed, productive, badput = axlearn_reference_figures()
    assert snapshot.ended
    assert snapshot.cumulative.total_s == pytest.approx(elapsed, abs=1e-6)  # the gap is elapsed time
    assert_buckets(snapshot.cumulative, productive, badput)
    assert badput[OTHER] == pytest.approx(0.0, abs=1e-6)
    (disruption,) = snapshot.disruptions
    assert not disruption.in_process
    assert (disruption.last_step_before, disruption.resume_step) == (99, 80)
    assert disruption.recovery_s == pytest.approx(badput[INFRASTRUCTURE_RECOVERY], abs=1e-6)
    assert disruption.wasted_progress_s == pytest.approx(badput[WASTED_PROGRESS], abs=1e-6)
    assert snapshot.max_productive_step == 199


def test_an_end_that_says_nothing_looks_planned_until_the_rerun_arrives():
    """Before the restart records a step or a restore, its end looks planned; once the restore of
    an earlier step arrives, the figures are a crash's."""
    events = with_ends(axlearn_crash(), None, None)
    start = start_us(events)
    before = snapshot_of(events, start + 400 * S)  # restarted at 369.3, restores from 404.3
    assert before.disruptions == ()
    assert before.cumulative.total_s == pytest.approx(400 - 120, abs=1e-6)  # the stop is no elapsed time
    after = snapshot_of(events, start + 405 * S)
    assert len(after.disruptions) == 1 and after.disruptions[0].resume_step is None
    assert after.cumulative.total_s == pytest.approx(405, abs=1e-6)
    assert after.cumulative.badput_s[INFRASTRUCTURE_RECOVERY] == pytest.approx(369.3 - 248, abs=1e-6)
    assert after.cumulative.badput_s[WASTED_PROGRESS] == pytest.approx(248 - step_time(80, 0, 35.0), abs=1e-6)


@pytest.mark.parametrize("failed", [None, False], ids=["says-nothing", "planned"])
def test_clean_end_and_lossless_resume_stay_a_planned_stop(failed: bool | None):
    """An end, then a resume above the last recorded step: no disruption, the stop not elapsed."""
    run = TraceBuilder()
    run.start_attempt()
    run.steps(0, 100, compile_s=15)  # step 99 at 248, its checkpoint written at 250
    run.end()
    run.wait(600)
    run.start_attempt()
    run.restore(100, 5.0)
    run.steps(100, 200, compile_s=15)
    run.end()
    events = with_ends(run, failed, None)
    snapshot = snapshot_of(events, run.as_of_us())
    assert snapshot.disruptions == ()
    elapsed = (run.as_of_us() - start_us(events)) / S
    assert snapshot.cumulative.total_s == pytest.approx(elapsed - 600, abs=1e-6)
    assert snapshot.cumulative.badput_s[INFRASTRUCTURE_RECOVERY] == 0.0
    assert snapshot.cumulative.badput_s[WASTED_PROGRESS] == 0.0


def test_end_that_says_planned_stays_planned_though_steps_are_rerun():
    """``failed: false``: no disruption and the stop is not elapsed; the re-run steps (and the
    unfinished step 99) are still wasted progress."""
    events = with_ends(axlearn_crash(), False, None)
    snapshot = snapshot_of(events, start_us(events) + round(664.3 * S))
    assert snapshot.disruptions == ()
    assert snapshot.cumulative.total_s == pytest.approx(664.3 - 120, abs=1e-6)
    assert snapshot.cumulative.badput_s[INFRASTRUCTURE_RECOVERY] == 0.0
    assert snapshot.cumulative.badput_s[WASTED_PROGRESS] == pytest.approx(
        249.3 - step_time(80, 0, 35.0), abs=1e-6)


def test_end_that_says_failed_is_a_crash_though_nothing_is_rerun():
    """``failed: true`` makes the stop a crash whatever step the restart resumes at."""
    events = with_ends(axlearn_crash(resume=100), True, None)
    end = max(e.time_us for e in events)
    snapshot = snapshot_of(events, end)
    (disruption,) = snapshot.disruptions
    assert disruption.recovery_s == pytest.approx(369.3 - 248, abs=1e-6)
    assert snapshot.cumulative.badput_s[WASTED_PROGRESS] == 0.0
    assert snapshot.cumulative.total_s == pytest.approx((end - start_us(events)) / S)  # the gap too


def test_failed_last_attempt_ends_the_run_without_its_unfinished_step():
    """A run whose last job_end says failed ends there; the step the crash cut short is OTHER, not
    productive (the reference counts it productive)."""
    run = TraceBuilder()
    run.start_attempt()
    run.steps(0, 100, compile_s=15)
    run.wait(-0.7)  # the crash, 1.3 s into step 99 (at 248)
    run.end()
    events = with_ends(run, True)
    snapshot = snapshot_of(events, run.as_of_us() + 3600 * S)
    assert snapshot.ended
    assert snapshot.cumulative.total_s == pytest.approx(249.3, abs=1e-6)
    assert snapshot.cumulative.badput_s[OTHER] == pytest.approx(1.3, abs=1e-6)
    assert snapshot.cumulative.productive_s == pytest.approx(248 - 35 - 15, abs=1e-6)
    assert snapshot.max_productive_step == 98
    assert snapshot.disruptions == ()


def elastic_rollback(wait_type: str) -> TraceBuilder:
    """MaxText's elastic path: steps 0..59, a slice lost 1 s into step 59 (at 168), a 40 s
    ``wait_type`` wait, 30 s re-initialization, 5 s data loading and a 4 s restore of step 50, then
    steps 50..119 in the same process (step 50 again at 248, 10 s compilation), an end at 398."""
    run = TraceBuilder()
    run.start_attempt()
    run.call("record_elastic_slice_counts", 4, 4, 4, run.now())
    run.steps(0, 60, compile_s=15)
    run.wait(-1.0)
    run.call("record_elastic_slice_counts", 3, 4, 3, run.now())
    run.call("record_elastic_wait_start_time", wait_type, run.now())
    run.wait(40)
    run.call("record_elastic_wait_end_time", wait_type, run.now())
    run.span("elastic_reinit", 30)
    run.span("data_loading", 5)
    run.restore(50, 4.0)
    run.steps(50, 120, compile_s=10)
    run.end()
    return run


@pytest.mark.parametrize(("wait_type", "bucket"), [("slice_down", ELASTIC_SLICE_DOWN),
                                                   ("scale_up", ELASTIC_SCALE_UP)])
def test_elastic_slice_loss_and_rollback_fill_the_elastic_buckets(wait_type: str, bucket: str):
    """The wait and re-initialization after a slice loss are elastic badput, only the rolled-back
    steps are wasted progress, as the reference counts them."""
    run = elastic_rollback(wait_type)
    snapshot = snapshot_of(record_ours(run.attempts), run.as_of_us())
    # The reference's rules by hand: segment 1 keeps 0→…→50 and wastes 50→…→59; segment 2 keeps
    # 50→…→119 and the last step (ended); each loses its first step's excess as program startup.
    t1 = functools.partial(step_time, first=0, started=35.0)
    startup1 = 15.0
    startup2 = 10.0
    productive = (t1(50) - t1(0) - startup1) + (2 * 69 + 10 - startup2) + 2.0
    badput = {
        bucket: 40.0, ELASTIC_REINITIALIZATION: 30.0,
        WASTED_PROGRESS: t1(59) - t1(50),  # only the rolled-back steps' intervals
        PROGRAM_STARTUP: startup1 + startup2, TPU_INITIALIZATION: 20.0, TRAINING_PREP: 10.0,
        DATA_LOADING_SYNC: 10.0,  # the first load and the one before step 50 runs again
        CHECKPOINT_RESTORE: 4.0,
        OTHER: 1.0,  # step 59 until the slice was lost
    }
    assert snapshot.cumulative.total_s == pytest.approx(398, abs=1e-6)
    assert_buckets(snapshot.cumulative, productive, badput)
    (rollback,) = snapshot.disruptions
    assert rollback.in_process and rollback.recovery_s == 0.0
    assert (rollback.last_step_before, rollback.resume_step) == (59, 50)
    assert rollback.wasted_progress_s == pytest.approx(badput[WASTED_PROGRESS], abs=1e-6)


def test_in_process_rollback_tail_is_other_as_in_the_reference():
    """Without recorded spans, the time from the last step before a rollback to the re-run step is
    OTHER (the reference counts it in no segment), and only the rolled-back steps are wasted."""
    run = TraceBuilder()
    run.start_attempt()
    run.steps(0, 60, compile_s=15)  # step 59 at 168
    run.wait(9)
    run.steps(50, 100)  # step 50 again at 179
    run.end()
    snapshot = snapshot_of(record_ours(run.attempts), run.as_of_us())
    assert snapshot.cumulative.badput_s[OTHER] == pytest.approx(179 - 168, abs=1e-6)
    assert snapshot.cumulative.badput_s[WASTED_PROGRESS] == pytest.approx(168 - 150, abs=1e-6)
    assert len(snapshot.disruptions) == 1 and snapshot.disruptions[0].in_process


#: The traces above, each with the time to take its snapshot at.
TRACES = {
    "crash_failed": lambda: (with_ends(axlearn_crash(), True, None), 664.3),
    "crash_says_nothing": lambda: (with_ends(axlearn_crash(), None, None), 664.3),
    "planned_rerun": lambda: (with_ends(axlearn_crash(), False, None), 664.3),
    "lossless_says_nothing": lambda: (with_ends(axlearn_crash(resume=100), None, None), 700.0),
    "elastic": lambda: (record_ours(elastic_rollback("slice_down").attempts), 398.0),
}


@functools.cache
def trace(name: str) -> tuple[tuple[Event, ...], int]:
    events, as_of_s = TRACES[name]()
    return tuple(events), start_us(events) + round(as_of_s * S)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(TRACES)), rng=st.randoms(use_true_random=False),
       size=st.integers(1, 60), live=st.booleans())
def test_order_and_duplicates_do_not_change_these_figures(name: str, rng: random.Random, size: int,
                                                          live: bool):
    """Every message delivered twice, in any order, with snapshots along the way or not, gives the
    snapshot of the events in order."""
    events, as_of = trace(name)
    delivered = messages(events, size) * 2
    rng.shuffle(delivered)
    assert final(delivered, as_of, along_the_way=live) == snapshot_of(list(events), as_of)


def test_failed_flag_survives_the_state_coder():
    """A job_end's failed flag is encoded with the state; without flags the encoding has none."""
    events, as_of = trace("crash_failed")
    state = engine.RunState("run")
    state.add_all(events)
    decoded = state_coder.decode_state(state_coder.encode_state(state))
    assert decoded.snapshot(as_of) == state.snapshot(as_of)
    assert len(decoded.snapshot(as_of).disruptions) == 1
    planned = engine.RunState("run")
    planned.add_all(trace("lossless_says_nothing")[0])
    assert b'"failed"' not in state_coder.encode_state(planned)  # as encoded before the flag existed


def test_a_failure_wins_over_other_ends_of_the_attempt_in_any_order():
    """Two job_ends of one attempt, one failed: the attempt failed, whichever arrives first."""
    base = micros(TraceBuilder().now())
    start = Event("run", "a", 0, base, "job_start", {})
    ends = [Event("run", "a", 1, base + S, "job_end", {"failed": True}),
            Event("run", "a", 2, base + 2 * S, "job_end", {"failed": False}),
            Event("run", "a", 3, base + 3 * S, "job_end", {})]
    for order in (ends, ends[::-1]):
        state = engine.RunState("run")
        state.add_all([start, *order])
        assert state.attempts["a"].failed is True
