"""Differential tests: the reference library and this project on the same recorder calls.

Where DESIGN says the reference is right, goodput and every badput bucket agree within 0.01
percentage points, and disruptions and max productive step agree. Where we differ on purpose
(``docs/differences.md``), the test asserts our number and says why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reference_harness import Result, TraceBuilder, compare

from pipeline import engine

TOLERANCE_PP = 0.01


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
        ours.pct(b) for b in ours.badput_s if b != engine.DATA_LOADING_ASYNC)
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
    assert ours.badput_s[engine.WASTED_PROGRESS] > 0
    (disruption,) = snapshot.disruptions
    assert (disruption.last_step_before, disruption.resume_step) == (249, 200)
    assert disruption.wasted_progress_s == pytest.approx(ours.badput_s[engine.WASTED_PROGRESS])
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
    assert ours.badput_s[engine.CHECKPOINT_SAVE] == pytest.approx(6 * 4.0, abs=1e-3)
