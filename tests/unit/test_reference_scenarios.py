"""The reference library's own test scenarios (REFERENCE-SPEC §10), written anew, on the
compatibility layer end to end: recorded through ``ml_goodput_measurement.goodput``'s recorder,
computed by the engine, written by the pipeline's DuckDB sink, read back through
``ml_goodput_measurement``'s calculators, and held against the reference's expected figures or,
for an ended run, against the reference itself (run in its own venv) on the same calls."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from emitter.testing import capture_events
from ml_goodput_measurement import goodput, goodput_elastic
from ml_goodput_measurement.src.goodput_utils import BadputType
from pipeline.core.engine import RunState
from pipeline.core.events import parse_batch
from pipeline.core.rows import Element, batch_rows, snapshot_rows
from pipeline.sinks.duckdb import append
from support.reference import reference, reference_log
from support.runs import Call

T0 = datetime.datetime(2026, 3, 1, 12, tzinfo=datetime.timezone.utc)
TOLERANCE_PP = 0.01


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def through_the_pipeline(attempts: Sequence[Sequence[Call]], as_of: Sequence[float], path: Path,
                         elastic: bool = False) -> Any:
    """The calls recorded by the drop-in's recorders (one per attempt), snapshotted at each of
    ``as_of`` (seconds after T0) into ``path``; a calculator of the run reading it."""
    with capture_events() as captured:
        for calls in attempts:
            recorder = goodput_elastic.ElasticGoodputRecorder("run", "goodput_run", True)
            for method, args in calls:
                getattr(recorder, method)(*args)
            recorder.close()
        messages = captured.messages
    state = RunState("run")
    elements: list[Element] = []
    for message in messages:
        batch, dead = parse_batch(message.data)
        assert batch is not None and not dead
        elements.extend(batch_rows(batch))
        state.add_batch(batch)
    for seconds in as_of:
        snapshot = state.snapshot(round(at(seconds).timestamp() * 1e6))
        assert snapshot is not None
        elements.extend(snapshot_rows(snapshot))
    append(path, elements)
    calculator = goodput_elastic.ElasticGoodputCalculator if elastic else goodput.GoodputCalculator
    return calculator("run", "goodput_run", duckdb_path=path)


def references_figures(attempts: Sequence[Sequence[Call]], cache_dir: Path, elastic: bool = False
                       ) -> tuple[float, dict[str, Any], int]:
    """The reference's ``get_job_goodput(include_badput_breakdown=True)`` on the same calls."""
    runner = reference()
    log = reference_log(attempts)
    calculator = runner.calculator(log, cache_dir, elastic=elastic)
    try:
        result: tuple[float, dict[str, Any], int] = tuple(runner.call(  # type: ignore[assignment]
            calculator, "get_job_goodput", include_badput_breakdown=True))
    finally:
        runner.release(log, calculator)
    return result


def steps(first: int, last: int, start: float, every: float = 3.0, extra_first: float = 0.0) -> list[Call]:
    """Step starts ``first``..``last - 1`` every ``every`` s from ``start``, the first longer by
    ``extra_first``."""
    return [("record_step_start_time", (step, at(start + (step - first) * every
                                                + (extra_first if step > first else 0.0))))
            for step in range(first, last)]


def assert_as_the_reference(ours: Any, theirs: tuple[float, dict[str, Any], int],
                            buckets: Sequence[BadputType]) -> None:
    goodput_pct, breakdown, _ = ours
    their_pct, their_breakdown, _ = theirs
    assert goodput_pct == pytest.approx(their_pct, abs=TOLERANCE_PP)
    for bucket in buckets:
        assert breakdown[bucket] == pytest.approx(their_breakdown[bucket.name], abs=TOLERANCE_PP), bucket


def test_basic(tmp_path):
    """Five 3 s steps from T0+5 s, the end at T0+20 s: 75 %, max productive step 4."""
    calls = [("record_job_start_time", (at(0),)), *steps(0, 5, 5), ("record_job_end_time", (at(20),))]
    goodput_pct, _, max_step = through_the_pipeline([calls], [20], tmp_path / "t.duckdb").get_job_goodput()
    assert goodput_pct == pytest.approx(75.0)
    assert max_step == 4
    assert goodput_pct == pytest.approx(references_figures([calls], tmp_path / "cache")[0], abs=TOLERANCE_PP)


def test_program_startup(tmp_path):
    """The first step 5 s longer: 15 s of 25 productive, 60 %, and the 5 s are program startup."""
    calls = [("record_job_start_time", (at(0),)), *steps(0, 5, 5, extra_first=5),
             ("record_job_end_time", (at(25),))]
    calculator = through_the_pipeline([calls], [25], tmp_path / "t.duckdb")
    ours = calculator.get_job_goodput(include_badput_breakdown=True)
    assert ours[0] == pytest.approx(60.0)
    assert ours[1][BadputType.PROGRAM_STARTUP] == pytest.approx(20.0)
    theirs = references_figures([calls], tmp_path / "cache")
    assert_as_the_reference(ours, theirs, [BadputType.PROGRAM_STARTUP])


def test_complete_restart_counts_only_the_restarts_progress(tmp_path):
    """Steps 0-4, a crash, 5 s down, a restart from step 0, steps 0-2, a query 2 s after: only the
    restart's two intervals are productive (6 s of 33), as the reference expects."""
    first = [("record_job_start_time", (at(0),)), *steps(0, 5, 5)]
    second = [("record_job_start_time", (at(24),)), *steps(0, 3, 25)]
    calculator = through_the_pipeline([first, second], [33], tmp_path / "t.duckdb")
    goodput_pct, _, _ = calculator.get_job_goodput()
    assert goodput_pct == pytest.approx(100 * 6 / 33)
    assert calculator.get_job_goodput_details()["disruption_count"] == 1


def test_partial_restart(tmp_path):
    """Steps 0-9, a crash, a restart that resumes at step 5: wasted progress, one disruption and
    infrastructure recovery, as the reference computes them."""
    first = [("record_job_start_time", (at(0),)), *steps(0, 10, 5)]
    second = [("record_job_start_time", (at(40),)), *steps(5, 15, 42), ("record_job_end_time", (at(74),))]
    calculator = through_the_pipeline([first, second], [74], tmp_path / "t.duckdb")
    ours = calculator.get_job_goodput(include_badput_breakdown=True)
    assert calculator.get_job_goodput_details()["disruption_count"] == 1
    assert ours[1][BadputType.WASTED_PROGRESS_FROM_DISRUPTION] > 0
    assert_as_the_reference(ours, references_figures([first, second], tmp_path / "cache"), [
        BadputType.WASTED_PROGRESS_FROM_DISRUPTION, BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION])


def test_badput_buckets(tmp_path):
    """TPU init, training preparation, the first (sync) data load, later (async) loads inside
    steps, an eval every 3rd step (custom sync badput): every bucket as the reference's."""
    calls: list[Call] = [
        ("record_job_start_time", (at(0),)),
        ("record_tpu_init_start_time", (at(1),)), ("record_tpu_init_end_time", (at(4),)),
        ("record_training_preparation_start_time", (at(4),)),
        ("record_training_preparation_end_time", (at(9),)),
        ("record_data_loading_start_time", (at(9),)), ("record_data_loading_end_time", (at(12),)),
    ]
    t = 12.0
    for step in range(12):
        calls.append(("record_step_start_time", (step, at(t))))
        calls += [("record_data_loading_start_time", (at(t + 0.5),)),
                  ("record_data_loading_end_time", (at(t + 1.0),))]
        if step % 3 == 2:
            calls += [("record_custom_badput_event_start_time", (at(t + 3), "eval_step")),
                      ("record_custom_badput_event_end_time", (at(t + 13), "eval_step"))]
            t += 10
        t += 3
    calls.append(("record_step_start_time", (12, at(t))))
    calls.append(("record_job_end_time", (at(t + 3),)))
    calculator = through_the_pipeline([calls], [t + 3], tmp_path / "t.duckdb")
    ours = calculator.get_job_goodput(include_badput_breakdown=True)
    theirs = references_figures([calls], tmp_path / "cache")
    assert_as_the_reference(ours, theirs, [
        BadputType.TPU_INITIALIZATION, BadputType.TRAINING_PREP, BadputType.DATA_LOADING_SYNC,
        BadputType.DATA_LOADING_ASYNC, BadputType.PROGRAM_STARTUP])
    assert ours[1][BadputType.CUSTOM_BADPUT_EVENTS]["EVAL_STEP"] == pytest.approx(
        theirs[1]["CUSTOM_BADPUT_EVENTS"]["EVAL_STEP"], abs=TOLERANCE_PP)


def test_step_deviation(tmp_path):
    """get_step_deviation: each step's distance from the ideal step time, as the reference's."""
    calls: list[Call] = [("record_job_start_time", (at(0),))]
    t = 5.0
    for step in range(20):
        calls.append(("record_step_start_time", (step, at(t))))
        t += 3.0 + (0.5 if step % 4 == 0 else 0.0) + (7.0 if step == 0 else 0.0)
    calls.append(("record_job_end_time", (at(t),)))
    ours = through_the_pipeline([calls], [t], tmp_path / "t.duckdb").get_step_deviation()
    runner = reference()
    log = reference_log([calls])
    calculator = runner.calculator(log, tmp_path / "cache")
    try:
        theirs = runner.call(calculator, "get_step_deviation")
    finally:
        runner.release(log, calculator)
    assert sorted(ours) == sorted(int(step) for step in theirs)
    for step, deviation in theirs.items():
        assert ours[int(step)] == pytest.approx(deviation, abs=1e-6)


def test_elastic_waits_and_reinitialization(tmp_path):
    """goodput_elastic's scenario: a slice-down wait, a scale-up wait, a re-initialization holding
    TPU init and preparation, then steps: the elastic buckets, and TPU init and preparation
    inside the re-initialization not counted twice, as the reference."""
    calls: list[Call] = [
        ("record_job_start_time", (at(0),)),
        ("record_elastic_wait_start_time", ("slice_down", at(10))),
        ("record_elastic_wait_end_time", ("slice_down", at(20))),
        ("record_elastic_wait_start_time", ("scale_up", at(30))),
        ("record_elastic_wait_end_time", ("scale_up", at(45))),
        ("record_elastic_reinit_start_time", (at(55),)),
        ("record_tpu_init_start_time", (at(57),)), ("record_tpu_init_end_time", (at(62),)),
        ("record_training_preparation_start_time", (at(65),)),
        ("record_training_preparation_end_time", (at(70),)),
        ("record_elastic_reinit_end_time", (at(75),)),
        *steps(0, 10, 75, every=2.0),
        ("record_job_end_time", (at(95),)),
    ]
    calculator = through_the_pipeline([calls], [95], tmp_path / "t.duckdb", elastic=True)
    ours = calculator.get_job_goodput(include_badput_breakdown=True)
    assert_as_the_reference(ours, references_figures([calls], tmp_path / "cache", elastic=True), [
        BadputType.ELASTIC_SLICE_DOWN, BadputType.ELASTIC_SCALE_UP, BadputType.ELASTIC_REINITIALIZATION,
        BadputType.TPU_INITIALIZATION, BadputType.TRAINING_PREP])
