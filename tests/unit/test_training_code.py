"""MaxText's and AXLearn's goodput code, unchanged, against ``ml_goodput_measurement``: every call
they make works, and the numbers of what they record equal the reference library's on the same
events (run in its own venv), where the reference is right.

The clients (``support.clients``) pass no times: they run on the wall clock, with short sleeps
standing for training. Ours and the reference compute from the same recorded events.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from emitter.testing import CapturedEvents, capture_events
from ml_goodput_measurement import goodput
from pipeline.core.events import Event
from pipeline.core.snapshot import (
    ELASTIC_REINITIALIZATION,
    ELASTIC_SLICE_DOWN,
    INFRASTRUCTURE_RECOVERY,
    WASTED_PROGRESS,
)
from support import clients
from support.reference import Result, run_ours, run_reference
from support.runs import Call, events_of

#: Where the reference is right, ours agrees within this many percentage points.
TOLERANCE_PP = 0.05
UTC = datetime.timezone.utc
STEP_S = 0.01


def recorded(captured: CapturedEvents) -> list[Event]:
    return events_of(captured.messages)


def _moment(time_us: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(time_us / 1e6, UTC)


_SPANS = {"tpu_init": "tpu_init", "training_prep": "training_preparation",
          "data_loading": "data_loading", "elastic_reinit": "elastic_reinit"}


def as_reference_calls(events: Sequence[Event]) -> list[list[Call]]:
    """The reference recorder's calls that log what the emitter recorded, per attempt."""
    attempts: dict[str, list[tuple[int, int, Call]]] = {}
    for event in events:
        at, body, kind = _moment(event.time_us), event.body, event.kind
        name, _, edge = kind.rpartition("_")
        call: Call | None
        if kind in ("job_start", "job_end"):
            call = (f"record_{kind}_time", (at,))
        elif kind == "step_start":
            call = ("record_step_start_time", (body["step"], at))
        elif name in _SPANS:
            call = (f"record_{_SPANS[name]}_{edge}_time", (at,))
        elif name == "custom_badput":
            call = (f"record_custom_badput_event_{edge}_time", (at, body["badput_type"]))
        elif name == "elastic_wait":
            call = (f"record_elastic_wait_{edge}_time", (body["event_type"], at))
        elif kind == "elastic_slice_counts":
            call = ("record_elastic_slice_counts",
                    (body["active_slices"], body["total_slices"], body["available_slices"], at))
        else:
            call = None  # heartbeats and what the reference has no call for
        if call is not None:
            attempts.setdefault(event.attempt_id, []).append((event.time_us, event.seq, call))
    ordered = sorted(attempts.values(), key=lambda calls: min(calls)[0])
    return [[call for *_, call in sorted(calls)] for calls in ordered]


def both(events: Sequence[Event], cache_dir: Path, elastic: bool = False) -> tuple[Result, Result]:
    """(reference, ours) for an ended run."""
    theirs = run_reference(as_reference_calls(events), cache_dir, elastic)
    ours, _ = run_ours(events, max(e.time_us for e in events))
    return theirs, ours


def assert_equal_buckets(theirs: Result, ours: Result, buckets: Sequence[str]) -> None:
    assert ours.goodput_pct == pytest.approx(theirs.goodput_pct, abs=TOLERANCE_PP)
    for bucket in buckets:
        assert ours.pct(bucket) == pytest.approx(theirs.pct(bucket), abs=TOLERANCE_PP), bucket
    assert ours.disruptions == theirs.disruptions


def train(record_step: Any, first: int, last: int) -> None:
    for step in range(first, last):
        record_step(step)
        time.sleep(STEP_S)


@pytest.fixture(autouse=True)
def no_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The monitors find no tables to read here: they say so and keep the job running."""
    monkeypatch.delenv("GOODPUT_DUCKDB", raising=False)
    monkeypatch.delenv("GOODPUT_BIGQUERY_DATASET", raising=False)


@pytest.fixture
def captured() -> Iterator[CapturedEvents]:
    with capture_events() as capture:
        yield capture


# -- AXLearn ---------------------------------------------------------------------------------------

def axlearn_attempt(tmp_path: Path, steps: tuple[int, int], crash: bool) -> None:
    """One process of an AXLearn job: its events as context managers, END_JOB in a ``finally``."""
    recorder = clients.AXLearnGoodputRecorder("axl-run", str(tmp_path / "tb"), upload_interval=1,
                                              rolling_window_size=[60])
    with recorder.maybe_monitor_goodput(), recorder.maybe_monitor_rolling_window_goodput():
        try:
            with recorder.record_event(clients.Event.JOB):
                with recorder.record_event(clients.Event.ACCELERATOR_INIT):
                    time.sleep(0.05)
                with recorder.record_event(clients.Event.TRAINING_PREPARATION):
                    time.sleep(0.03)
                with recorder.record_event(clients.Event.DATA_LOADING):
                    time.sleep(0.02)

                def step(number: int) -> None:
                    with recorder.record_event(clients.Event.STEP, number):
                        pass

                train(step, *steps)
                if crash:
                    time.sleep(STEP_S / 2)
                    raise RuntimeError("a host went away")
        except RuntimeError:
            pass
    recorder._recorder.close()


def test_an_axlearn_crash_with_its_end_in_a_finally_is_a_disruption(captured, tmp_path):
    """The crashed process records END_JOB as the exception passes: one disruption, with the time
    until the restart as infrastructure recovery, as the reference counts it."""
    axlearn_attempt(tmp_path, (0, 30), crash=True)
    time.sleep(0.3)  # down
    axlearn_attempt(tmp_path, (20, 50), crash=False)  # resumes from the checkpoint at step 20
    events = recorded(captured)
    ends = [e.body for e in events if e.kind == "job_end"]
    assert ends == [{"failed": True}, {}]
    theirs, ours = both(events, tmp_path / "cache")
    assert ours.disruptions == 1
    assert ours.pct(INFRASTRUCTURE_RECOVERY) > 10
    assert_equal_buckets(theirs, ours, [INFRASTRUCTURE_RECOVERY, WASTED_PROGRESS])


def test_an_axlearn_job_logs_once_that_the_monitor_has_no_tables(caplog, captured, tmp_path):
    """Its two monitors, started and stopped as AXLearn does, never raise into the job: each
    says once that it has no tables to read, and the job records on."""
    with caplog.at_level(logging.INFO, logger="ml_goodput_measurement"):
        axlearn_attempt(tmp_path, (0, 3), crash=False)
    told = [r for r in caplog.records if "writes no TensorBoard scalars" in r.getMessage()]
    assert len(told) == 2
    assert [e.kind for e in recorded(captured)][:2] == ["job_start", "tpu_init_start"]


# -- MaxText ---------------------------------------------------------------------------------------

def maxtext_job(config: Any, steps: tuple[int, int], slice_loss_at: int | None = None,
                resume: int = 0) -> None:
    """MaxText's train entry: the recorder, the job start, preparation, the loop, the end; with a
    slice lost at ``slice_loss_at``, its elastic recovery back to step ``resume`` in the process."""
    recorder = clients.maxtext_create_goodput_recorder(config)
    clients.maxtext_record_goodput(recorder, "record_job_start_time")
    with clients.maxtext_maybe_monitor_goodput(config):
        with clients.maxtext_maybe_record_goodput(recorder, clients.GoodputEvent.TPU_INIT):
            time.sleep(0.05)
        with clients.maxtext_maybe_record_goodput(recorder, clients.GoodputEvent.TRAINING_PREPARATION):
            time.sleep(0.03)
        first, last = steps

        def step(number: int) -> None:
            clients.maxtext_record_goodput(recorder, "record_step_start_time", number)

        if slice_loss_at is None:
            train(step, first, last)
        else:
            train(step, first, slice_loss_at)
            time.sleep(STEP_S / 2)  # the slice goes away in the middle of a step
            clients.maxtext_record_elastic_event_start(recorder, scale_up=False, slices=(1, 2))
            time.sleep(0.3)
            clients.maxtext_record_elastic_wait_end_and_reinit_start(recorder, "elastic_slice_down",
                                                                     slices=(1, 2))
            time.sleep(0.2)
            clients.maxtext_record_elastic_reinit_end(recorder, slices=(1, 2))
            # The retry makes a recorder of its own, as MaxText's elastic wrapper does.
            retry = clients.maxtext_create_goodput_recorder(config)
            train(lambda number: clients.maxtext_record_goodput(retry, "record_step_start_time", number),
                  resume, last)
            retry.close()
    clients.maxtext_record_goodput(recorder, "record_job_end_time")
    recorder.close()


def test_a_maxtext_elastic_rollback_has_the_references_buckets(captured, tmp_path):
    """A slice lost, the wait, the re-initialization and a rollback to the checkpoint in the same
    process: the wait is ELASTIC_SLICE_DOWN, the re-initialization ELASTIC_REINITIALIZATION and
    only the rolled-back steps are wasted progress, as the reference reports them."""
    config = clients.maxtext_config("mt-elastic", str(tmp_path / "tb"), elastic_enabled=True)
    maxtext_job(config, (0, 40), slice_loss_at=30, resume=20)
    theirs, ours = both(recorded(captured), tmp_path / "cache", elastic=True)
    assert ours.pct(ELASTIC_SLICE_DOWN) > 10 and ours.pct(ELASTIC_REINITIALIZATION) > 5
    assert_equal_buckets(theirs, ours, [ELASTIC_SLICE_DOWN, ELASTIC_REINITIALIZATION, WASTED_PROGRESS])


def test_a_maxtext_job_records_and_monitors_with_no_line_changed(captured, tmp_path):
    config = clients.maxtext_config("mt-clean", str(tmp_path / "tb"))
    maxtext_job(config, (0, 10))
    kinds = [e.kind for e in recorded(captured) if e.kind != "configs"]  # configs: the emitter's own
    assert kinds[0] == "job_start" and kinds[-1] == "job_end" and kinds.count("step_start") == 10


def test_the_references_restart_on_one_recorder_is_a_restart(captured, tmp_path):
    """The reference's own tests restart a job by a second job start on the same recorder."""
    recorder = goodput.GoodputRecorder("one-recorder", "goodput_one-recorder", True)
    recorder.record_job_start_time()
    train(recorder.record_step_start_time, 0, 20)
    time.sleep(0.2)
    recorder.record_job_start_time()  # the restart
    train(recorder.record_step_start_time, 10, 30)
    recorder.record_job_end_time()
    recorder.close()
    theirs, ours = both(recorded(captured), tmp_path / "cache")
    assert ours.disruptions == 1 and ours.pct(INFRASTRUCTURE_RECOVERY) > 10
    assert_equal_buckets(theirs, ours, [INFRASTRUCTURE_RECOVERY, WASTED_PROGRESS])

