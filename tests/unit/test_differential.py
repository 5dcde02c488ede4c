"""Differential tests: the reference library and this project on the same recorder calls.

Where DESIGN says the reference is right, goodput and every badput bucket agree within 0.01
percentage points, and disruptions and max productive step agree. Where we differ on purpose
(``docs/differences.md``), the test asserts our number and says why.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from goodput_schemas.wire import workload_run_id
from pipeline.core import engine
from pipeline.core.snapshot import (
    CHECKPOINT_RESTORE,
    CHECKPOINT_SAVE,
    CUSTOM_PREFIX,
    DATA_LOADING_ASYNC,
    DATA_LOADING_SYNC,
    ELASTIC_SLICE_DOWN,
    INFRASTRUCTURE_RECOVERY,
    OTHER,
    TRAINING_PREP,
    WASTED_PROGRESS,
)
from support.reference import TOLERANCE_PP, Result, compare, reference, reference_log, run_reference
from support.runs import (
    FIRST_UID,
    SECOND_UID,
    T0,
    TraceBuilder,
    batch_of,
    micros,
    record_ours,
    workload_messages,
)


def assert_matches(reference: Result, ours: Result, except_buckets: tuple[str, ...] = ()) -> None:
    assert ours.total_s == pytest.approx(reference.total_s, abs=1e-3)
    assert ours.goodput_pct == pytest.approx(reference.goodput_pct, abs=TOLERANCE_PP)
    for bucket in set(reference.badput_s) | set(ours.badput_s):
        if bucket not in except_buckets:
            assert ours.pct(bucket) == pytest.approx(reference.pct(bucket), abs=TOLERANCE_PP), bucket
    assert ours.disruptions == reference.disruptions
    assert ours.max_productive_step == reference.max_productive_step


def assert_complete(ours: Result) -> None:
    """Goodput plus every bucket but the informational async loading is 100 % of elapsed time."""
    accounted = ours.goodput_pct + sum(
        ours.pct(b) for b in ours.badput_s if b != DATA_LOADING_ASYNC)
    assert accounted == pytest.approx(100.0, abs=1e-6)


def test_clean_run_matches(tmp_path: Path):
    """Init, prep, loading, compile, noisy steps, evals inside steps, an end: all buckets match."""
    run = TraceBuilder(seed=1)
    run.start_attempt()
    run.steps(0, 420, noise=0.1, compile_s=40, eval_every=50)
    run.wait(0.5)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    assert_matches(reference, ours)
    assert ours.badput_s["CUSTOM_BADPUT_EVENTS.EVAL_STEP"] > 0
    assert_complete(ours)


def test_restart_that_reruns_steps_matches(tmp_path: Path):
    """A crash after step 249 and a restart from the step-200 checkpoint: every bucket matches."""
    run = TraceBuilder(seed=2)
    run.start_attempt()
    run.steps(0, 250, noise=0.05, compile_s=30)
    run.wait(1.0)  # dies mid-step
    run.wait(180)  # outage
    run.start_attempt(init_s=25, prep_s=15)
    run.steps(200, 500, noise=0.05, compile_s=30)
    run.end()
    reference, ours, snapshot = compare(run, tmp_path)
    assert_matches(reference, ours)
    assert ours.badput_s[WASTED_PROGRESS] > 0
    (disruption,) = snapshot.disruptions
    assert (disruption.last_step_before, disruption.resume_step) == (249, 200)
    assert disruption.wasted_progress_s == pytest.approx(ours.badput_s[WASTED_PROGRESS])
    assert_complete(ours)


def test_running_job_without_end_matches(tmp_path: Path):
    """A job still running: elapsed time runs to the query time, the running step is OTHER."""
    run = TraceBuilder(seed=3)
    run.start_attempt()
    run.steps(0, 300, noise=0.05, compile_s=20, eval_every=100)
    reference, ours, _ = compare(run, tmp_path)
    assert_matches(reference, ours)
    assert_complete(ours)


def test_long_noisy_run_matches_step_statistics(tmp_path: Path):
    """5,000 noisy steps: goodput, buckets, ideal step time and step deviation all match."""
    run = TraceBuilder(seed=4)
    run.start_attempt()
    run.steps(0, 5000, step_s=1.5, noise=0.3, compile_s=60)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    assert_matches(reference, ours)
    assert ours.ideal_step_time_s == pytest.approx(reference.ideal_step_time_s, rel=1e-6)
    assert ours.step_time_deviation_s == pytest.approx(reference.step_time_deviation_s, rel=1e-6)


def test_orbax_checkpoint_saves_inside_steps_match(tmp_path: Path):
    """Blocking saves between steps: UNPRODUCTIVE_CHECKPOINT_SAVE_TIME and goodput match."""
    run = TraceBuilder(seed=5)
    run.start_attempt()
    run.steps(0, 600, noise=0.05, compile_s=30, save_every=100, save_s=4.0)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    assert_matches(reference, ours)
    assert ours.badput_s[CHECKPOINT_SAVE] == pytest.approx(6 * 4.0, abs=1e-3)


# -- where we differ on purpose (docs/differences.md) ------------------------------------------


def test_resume_at_a_never_recorded_step_is_a_disruption(tmp_path: Path):
    """The reference misses a restart that resumes at an unrecorded step and counts the outage
    as productive; we count the disruption and the outage as recovery."""
    run = TraceBuilder(seed=6)
    run.start_attempt()
    run.steps(0, 200, compile_s=20)  # checkpoint of step 200 written, then a crash
    run.wait(300)
    run.start_attempt()
    run.steps(200, 400, compile_s=20)
    run.end()
    reference, ours, snapshot = compare(run, tmp_path)
    assert reference.disruptions == 0
    assert ours.disruptions == 1 and snapshot.disruptions[0].resume_step == 200
    recovery = ours.badput_s[INFRASTRUCTURE_RECOVERY]
    assert recovery == pytest.approx(300 + 2.0, abs=1e-3)  # the outage and the dying step
    assert ours.goodput_pct < reference.goodput_pct - 100 * 250 / ours.total_s
    assert_complete(ours)


def test_restart_from_step_zero_wastes_the_lost_progress(tmp_path: Path):
    """With no checkpoint the restart begins again at step 0: the reference discards the first
    attempt into OTHER; we count its steps as wasted progress."""
    run = TraceBuilder(seed=7)
    run.start_attempt()
    run.steps(0, 100, compile_s=10)
    run.wait(60)
    run.start_attempt()
    run.steps(0, 150, compile_s=10)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    assert reference.badput_s.get(WASTED_PROGRESS, 0.0) == 0.0
    assert ours.badput_s[WASTED_PROGRESS] == pytest.approx(99 * 2.0 + 10, abs=1e-3)
    assert ours.badput_s[OTHER] < reference.badput_s[OTHER] - 150
    assert_complete(ours)


def test_custom_event_counts_by_overlap(tmp_path: Path):
    """An eval that straddles a step boundary is badput for its whole duration, not zero."""
    run = TraceBuilder(seed=8)
    run.start_attempt()
    run.steps(0, 50)
    second = datetime.timedelta(seconds=1)
    # The eval runs from 1 s before step 50 starts to 1 s after step 51 starts.
    run.call("record_custom_badput_event_start_time", run.now() - second, "eval")
    run.steps(50, 51)
    run.call("record_custom_badput_event_end_time", run.now() + second, "eval")
    run.steps(51, 100)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    assert reference.badput_s.get("CUSTOM_BADPUT_EVENTS.EVAL", 0.0) == 0.0
    assert ours.badput_s["CUSTOM_BADPUT_EVENTS.EVAL"] == pytest.approx(4.0, abs=1e-3)
    assert_complete(ours)


def test_custom_event_after_the_last_step_counts(tmp_path: Path):
    """An eval after the last step start is still badput (the reference drops it into OTHER)."""
    run = TraceBuilder(seed=9)
    run.start_attempt()
    run.steps(0, 100, eval_every=100, eval_s=30)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    assert reference.badput_s.get("CUSTOM_BADPUT_EVENTS.EVAL_STEP", 0.0) == 0.0
    assert ours.badput_s["CUSTOM_BADPUT_EVENTS.EVAL_STEP"] == pytest.approx(30.0, abs=1e-3)
    assert ours.goodput_pct == pytest.approx(reference.goodput_pct - 100 * 30 / ours.total_s, abs=1e-6)


def test_sparse_step_recording_still_counts(tmp_path: Path):
    """Recording every 10th step loses nothing: goodput equals the densely recorded run's."""
    dense, sparse = TraceBuilder(seed=10), TraceBuilder(seed=10)
    for run, every in ((dense, 1), (sparse, 10)):
        run.start_attempt()
        run.steps(0, 1000, step_s=1.0, compile_s=30, every=every)
        run.end()
    _, dense_ours, _ = compare(dense, tmp_path / "dense")
    sparse_reference, sparse_ours, _ = compare(sparse, tmp_path / "sparse")
    assert sparse_reference.goodput_pct < 5.0
    assert sparse_ours.goodput_pct == pytest.approx(dense_ours.goodput_pct, abs=0.2)
    assert_complete(sparse_ours)


def test_restore_inside_training_prep_is_not_double_counted(tmp_path: Path):
    """A checkpoint restore during training preparation is restore time, not also prep time."""
    run = TraceBuilder(seed=11)
    run.attempts.append([])
    run.call("record_job_start_time", run.now())
    run.call("record_training_preparation_start_time", run.now())
    run.clock += 2
    run.restore(0, 12.0)
    run.clock += 3
    run.call("record_training_preparation_end_time", run.now())
    run.steps(0, 100)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    assert reference.badput_s[TRAINING_PREP] == pytest.approx(17.0, abs=1e-3)
    assert reference.badput_s[CHECKPOINT_RESTORE] == pytest.approx(12.0, abs=1e-3)
    assert ours.badput_s[TRAINING_PREP] == pytest.approx(5.0, abs=1e-3)
    assert ours.badput_s[CHECKPOINT_RESTORE] == pytest.approx(12.0, abs=1e-3)
    assert ours.goodput_pct == pytest.approx(reference.goodput_pct, abs=TOLERANCE_PP)
    assert_complete(ours)


def test_only_loading_before_the_first_step_is_sync_after_a_restart(tmp_path: Path):
    """The reference also counts the first in-training (async) load after a restart as sync."""
    run = TraceBuilder(seed=12)
    run.start_attempt(load_s=5)
    run.steps(0, 60)
    run.span("data_loading", 1.5)  # overlapped with training: async
    run.steps(60, 120)
    run.wait(30)
    run.start_attempt(load_s=5)
    run.steps(100, 130)
    run.span("data_loading", 1.5)
    run.steps(130, 200)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    # The reference: both startup loads, plus the first in-training load after the restart.
    assert reference.badput_s[DATA_LOADING_SYNC] == pytest.approx(5 + 5 + 1.5, abs=1e-3)
    assert ours.badput_s[DATA_LOADING_SYNC] == pytest.approx(10.0, abs=1e-3)
    assert ours.badput_s[DATA_LOADING_ASYNC] == pytest.approx(3.0, abs=1e-3)


def test_elastic_wait_is_taken_from_productive_time(tmp_path: Path):
    """Steps recorded during an elastic wait are not also productive: the buckets sum to 100 %."""
    run = TraceBuilder(seed=13)
    run.start_attempt()
    run.call("record_elastic_slice_counts", 4, 4, 4, run.now())
    run.steps(0, 100)
    run.call("record_elastic_wait_start_time", "slice_down", run.now())
    run.call("record_elastic_slice_counts", 3, 4, 3, run.now())
    run.steps(100, 110)
    run.call("record_elastic_wait_end_time", "slice_down", run.now())
    run.steps(110, 200)
    run.end()
    reference, ours, snapshot = compare(run, tmp_path, elastic=True)
    assert ours.badput_s[ELASTIC_SLICE_DOWN] == pytest.approx(
        reference.badput_s[ELASTIC_SLICE_DOWN], abs=1e-3)
    assert ours.goodput_pct == pytest.approx(
        reference.goodput_pct - 100 * ours.badput_s[ELASTIC_SLICE_DOWN] / ours.total_s, abs=1e-6)
    assert snapshot.stepping_slice_efficiency is not None and snapshot.stepping_slice_efficiency < 1.0
    assert_complete(ours)


def test_max_productive_step_survives_a_fresh_restart(tmp_path: Path):
    """Right after a restart the reference reports max productive step 0; we keep the progress."""
    run = TraceBuilder(seed=14)
    run.start_attempt()
    run.steps(0, 300)
    run.wait(40)
    run.start_attempt()
    run.steps(250, 251)
    reference, ours, _ = compare(run, tmp_path)
    assert reference.max_productive_step == 0
    assert ours.max_productive_step == 249


def test_sub_second_steps_get_a_real_ideal_step_time(tmp_path: Path):
    """With 0.35 s steps the reference's ideal step time is the compile step; ours is 0.35 s."""
    run = TraceBuilder(seed=15)
    run.start_attempt()
    run.steps(0, 500, step_s=0.35, compile_s=20)
    run.end()
    reference, ours, snapshot = compare(run, tmp_path)
    assert reference.ideal_step_time_s == pytest.approx(20.35, abs=1e-3)
    assert ours.ideal_step_time_s == pytest.approx(20.35, abs=1e-3)  # the reference's, reproduced
    assert snapshot.ideal_step_time_s == pytest.approx(0.35, abs=1e-3)
    assert snapshot.step_time_deviation_s is not None and snapshot.step_time_deviation_s < 0.1


def test_save_during_lost_progress_is_not_taken_from_productive_time(tmp_path: Path):
    """A checkpoint save inside progress that a crash later loses is wasted, not subtracted
    again from productive time."""
    run = TraceBuilder(seed=16)
    run.start_attempt()
    run.steps(0, 100)
    run.save(99, 4.0)  # a local save that the restart cannot use
    run.steps(100, 120)
    run.wait(50)
    run.start_attempt()
    run.steps(50, 200)
    run.end()
    reference, ours, _ = compare(run, tmp_path)
    assert ours.badput_s[CHECKPOINT_SAVE] == 0.0
    assert ours.goodput_pct == pytest.approx(reference.goodput_pct + 100 * 4.0 / ours.total_s, abs=1e-6)
    assert_complete(ours)


def test_a_name_reused_by_a_new_workload_is_a_new_run(tmp_path: Path):
    """A JobSet that reuses the name of one that ended an hour before: the reference merges both
    into one run, the new JobSet's start a restart (a disruption, the hour between them elapsed);
    told apart by the workload uid their messages carry, each is a run of its own, and each has the
    figures the reference gives it alone."""
    first = TraceBuilder(seed=18)
    first.start_attempt()
    first.steps(0, 200, noise=0.05, compile_s=20)
    first.end()
    second = TraceBuilder(seed=19, clock=first.clock + 3600)
    second.start_attempt()
    second.steps(0, 150, noise=0.05, compile_s=20)
    second.end()
    merged = run_reference([*first.attempts, *second.attempts], tmp_path / "merged")
    assert merged.disruptions == 1 and merged.total_s > 3600
    states: dict[str, engine.RunState] = {}
    for run, uid in ((first, FIRST_UID), (second, SECOND_UID)):
        for message in workload_messages(record_ours(run.attempts), "run", uid):
            batch = batch_of(message)
            states.setdefault(batch.run_id, engine.RunState(batch.run_id)).add_batch(batch)
    run_ids = [workload_run_id("run", uid) for uid in (FIRST_UID, SECOND_UID)]
    assert sorted(states) == sorted(run_ids)
    for run, run_id in zip((first, second), run_ids, strict=True):
        snapshot = states[run_id].snapshot(second.as_of_us())
        assert snapshot is not None
        figures = snapshot.cumulative
        ours = Result(figures.total_s, figures.goodput_pct or 0.0, figures.badput_s,
                      snapshot.max_productive_step, len(snapshot.disruptions))
        assert_matches(run_reference(run.attempts, tmp_path / run_id), ours)
        assert ours.disruptions == 0


def test_exclusion_intervals_match(tmp_path: Path):
    """Time the user excludes (during init, and inside steps) leaves elapsed time and every
    bucket as in the reference's get_job_goodput_with_exclusions."""
    run = TraceBuilder(seed=17)
    run.start_attempt(init_s=20)
    run.steps(0, 310, noise=0.05, compile_s=20, eval_every=100)
    run.end()
    excluded = [(T0 + datetime.timedelta(seconds=5), T0 + datetime.timedelta(seconds=12)),
                (T0 + datetime.timedelta(seconds=400), T0 + datetime.timedelta(seconds=430))]
    calculator = reference().calculator(reference_log(run.attempts, recorder="goodput.GoodputRecorder"),
                                        tmp_path)
    goodput_pct, breakdown, _, excluded_s = reference().call(
        calculator, "get_job_goodput_with_exclusions", excluded, include_badput_breakdown=True)
    state = engine.RunState("run")
    state.add_all(record_ours(run.attempts))
    as_of = run.as_of_us()
    snapshot = state.snapshot(as_of, exclusions=[(micros(s), micros(e)) for s, e in excluded])
    assert snapshot is not None
    figures = snapshot.cumulative
    assert excluded_s == pytest.approx(37.0)
    assert figures.total_s == pytest.approx(
        (as_of - micros(T0)) / 1e6 - excluded_s, abs=1e-3)
    assert figures.goodput_pct == pytest.approx(goodput_pct, abs=TOLERANCE_PP)
    for bucket, pct in breakdown.items():
        if isinstance(pct, dict):
            for sub, value in pct.items():
                ours = figures.badput_pct(CUSTOM_PREFIX + sub)
                assert ours == pytest.approx(value, abs=TOLERANCE_PP)
        elif bucket not in ("OTHER", "DATA_LOADING_ASYNC"):  # the reference's buckets by name
            assert figures.badput_pct(bucket) == pytest.approx(pct, abs=TOLERANCE_PP), bucket
