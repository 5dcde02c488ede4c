"""Runs the same recorder calls through the reference library and through this project.

The reference (ml-goodput-measurement 0.2.3) runs in a venv of its own, ``.venv-reference``,
driven through ``tools.reference_runner``: it records through its own ``GoodputRecorder`` into
an in-memory stand-in for Cloud Logging, and computes with its own ``GoodputCalculator`` reading
from that stand-in. This project records through the emitter and computes with the engine. One
worker serves the whole session; without the reference's venv (``make .venv-reference``) the
tests that need it skip, saying so.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import functools
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ml_goodput_measurement import goodput
from pipeline.core import engine
from pipeline.core.events import Event
from pipeline.core.snapshot import CUSTOM_PREFIX, Snapshot
from support.runs import Call, TraceBuilder, at, record_ours
from tools.reference_runner import ReferenceRunner, missing_reason

#: Where the reference is right, ours agrees within this many percentage points.
TOLERANCE_PP = 0.01


def reference() -> ReferenceRunner:
    """The session's reference worker, started on first use. Skips the test when the reference's
    venv is missing."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    return _worker()


@functools.cache
def _worker() -> ReferenceRunner:
    runner = ReferenceRunner()
    runner.start()
    atexit.register(runner.close)
    return runner


@dataclasses.dataclass(frozen=True)
class Result:
    """Goodput figures in one shape for both implementations."""

    total_s: float
    goodput_pct: float
    badput_s: dict[str, float]
    max_productive_step: int
    disruptions: int
    ideal_step_time_s: float | None = None
    step_time_deviation_s: float | None = None

    def pct(self, bucket: str) -> float:
        return 100.0 * self.badput_s.get(bucket, 0.0) / self.total_s


def reference_calls(calls: Sequence[Call], job_name: str = "run") -> list[Call]:
    """The calls as the reference worker takes them: Orbax's saves and restores become the entries
    Orbax writes to the log itself."""
    return [("write_cloud_logging_entry", ({**orbax_entry(method, *args), "job_name": job_name},))
            if method in ORBAX else (method, args) for method, args in calls]


def reference_log(attempts: Sequence[Sequence[Call]],
                  recorder: str = "goodput_elastic.ElasticGoodputRecorder", job_name: str = "run") -> str:
    """The worker's log that the reference recorder (one per attempt) and Orbax write for the
    calls: its handle."""
    runner = reference()
    log = runner.log()
    runner.record(log, [reference_calls(calls, job_name) for calls in attempts], recorder=recorder,
                  job_name=job_name)
    return log


@functools.cache
def _badput_names() -> dict[int, str]:
    return {value: name for name, value in reference().members("goodput_utils.BadputType")}


def run_reference(attempts: Sequence[Sequence[Call]], cache_dir: Path, elastic: bool = False) -> Result:
    runner = reference()
    log = reference_log(attempts)
    calculator = runner.calculator(log, cache_dir, elastic=elastic)
    try:
        runner.call(calculator, "get_job_goodput", include_badput_breakdown=True)
        details = runner.call(calculator, "get_job_goodput_details")
        step_info = runner.request("step_info", calculator=calculator)
        deviations = step_info["step_deviations"] if step_info else {}
        deviation = (runner.function("goodput_utils.compute_step_deviation_from_baseline", deviations)
                     if deviations else None)
    finally:
        runner.release(log, calculator)
    badput: dict[str, float] = {}
    for bucket, value in details["badput_time"].items():
        if isinstance(value, dict):
            for sub, seconds in value.items():
                badput[f"{CUSTOM_PREFIX}{sub}"] = seconds
        else:  # enum members come back as their names; a value, as its member's name
            badput[bucket if isinstance(bucket, str) else _badput_names()[bucket]] = value
    total = details["total_elapsed_time"]
    productive = details["goodput_time"][next(iter(details["goodput_time"]))]
    return Result(total, 100.0 * productive / total, badput, details["max_productive_step"],
                  details["disruption_count"], step_info["ideal_step_time"] if step_info else None,
                  deviation)


ORBAX = ("orbax_save", "orbax_restore")


def orbax_entry(method: str, step: int, start: datetime.datetime, seconds: float,
                 persistent: bool = True) -> dict[str, Any]:
    """The entry Orbax's CheckpointManager logs for a save or restore (fields the reference reads)."""
    entry: dict[str, Any] = {"job_name": "run", "step": step,
                             "directory": "gs://bucket/ckpt" if persistent else "/local/ckpt"}
    if method == "orbax_save":
        entry.update(event_type="save", checkpoint_manager_blocking_duration_secs=seconds,
                     checkpointer_blocking_duration_secs=seconds, wait_for_prev_duration_secs=0.0,
                     get_old_steps_duration_secs=0.0, wait_for_prev_start_time=start.timestamp())
    else:
        entry.update(event_type="restore", checkpoint_manager_duration_secs=seconds,
                     checkpointer_duration_secs=seconds, checkpointer_start_time=start.timestamp())
    return entry


def run_ours(events: Sequence[Event], as_of_us: int) -> tuple[Result, Snapshot]:
    state = engine.RunState("run")
    state.add_all(events)
    snapshot = state.snapshot(as_of_us)
    assert snapshot is not None
    figures = snapshot.cumulative
    return Result(figures.total_s, figures.goodput_pct or 0.0, figures.badput_s,
                  snapshot.max_productive_step, len(snapshot.disruptions),
                  snapshot.reference_ideal_step_time_s, snapshot.step_time_deviation_s), snapshot


def compare(builder: TraceBuilder, cache_dir: Path, elastic: bool = False
            ) -> tuple[Result, Result, Snapshot]:
    """(reference, ours, our snapshot) for the builder's calls, as of the reference's query.

    A run without an end is evaluated by the reference at the wall clock; ours is evaluated at
    the same elapsed time after the run's start.
    """
    reference = run_reference(builder.attempts, cache_dir, elastic)
    events = record_ours(builder.attempts)
    start = min(e.time_us for e in events if e.kind == "job_start")
    ours, snapshot = run_ours(events, start + round(reference.total_s * 1e6))
    return reference, ours, snapshot


def reference_result(attempts: Sequence[Sequence[Call]], cache_dir: Path) -> tuple[Any, ...]:
    """The reference's own get_job_goodput(include_badput_breakdown=True) on the calls, its
    breakdown keyed by BadputType name."""
    return _goodput_of(reference_log(attempts), cache_dir)


def reference_result_of(payloads: Sequence[dict[str, Any]], cache_dir: Path) -> tuple[Any, ...]:
    """The same, on log entries already written (payloads)."""
    return _goodput_of(reference().log(payloads), cache_dir)


def _goodput_of(log: str, cache_dir: Path) -> tuple[Any, ...]:
    runner = reference()
    calculator = runner.calculator(log, cache_dir)
    try:
        result: tuple[Any, ...] = runner.call(calculator, "get_job_goodput", include_badput_breakdown=True)
    finally:
        runner.release(log, calculator)
    return result


def assert_same_as_reference(ours: tuple[Any, ...], theirs: tuple[Any, ...]) -> None:
    """Goodput, every bucket (custom events by type) and the max productive step of our
    ``get_job_goodput`` (``ml_goodput_measurement.goodput``) agree with the reference's (its
    breakdown keyed by name)."""
    assert ours[0] == pytest.approx(theirs[0], abs=TOLERANCE_PP)
    assert ours[2] == theirs[2]
    assert {b.name for b in ours[1]} == set(theirs[1])
    for bucket, value in theirs[1].items():
        mine = ours[1][goodput.BadputType[bucket]]
        if isinstance(value, dict):
            assert isinstance(mine, dict) and mine.keys() == value.keys()
            for sub, pct in value.items():
                assert mine[sub] == pytest.approx(pct, abs=TOLERANCE_PP), sub
        else:
            assert mine == pytest.approx(value, abs=TOLERANCE_PP), bucket


# The reference's payload time key for each of our kinds.
TIME_KEY = {
    "job_start": "job_start_time", "job_end": "job_end_time", "step_start": "step_start_time",
    "tpu_init_start": "tpu_init_start_time", "tpu_init_end": "tpu_init_end_time",
    "training_prep_start": "training_prep_start_time", "training_prep_end": "training_prep_end_time",
    "data_loading_start": "data_loading_start_time", "data_loading_end": "data_loading_end_time",
    "custom_badput_start": "custom_badput_event_start_time",
    "custom_badput_end": "custom_badput_event_end_time",
    "elastic_slice_counts": "elastic_slice_counts_timestamp",
    "elastic_wait_start": "elastic_wait_start_time", "elastic_wait_end": "elastic_wait_end_time",
    "elastic_reinit_start": "elastic_reinit_start_time", "elastic_reinit_end": "elastic_reinit_end_time",
}


# Our body field -> the reference's payload field, where they carry the same value.
FIELD = {"step": "step_count", "badput_type": "custom_badput_event_type",
         "event_type": "elastic_wait_event_type", "active_slices": "active_slices",
         "total_slices": "total_slices", "available_slices": "available_slices"}


def reference_trace(seed: int) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """Calls of two attempts (a crash and a restart), every reference method, explicit times."""
    rng = random.Random(seed)
    clock = 0.0

    def now() -> datetime.datetime:
        return at(clock)

    for attempt, (first, last) in enumerate([(0, 140), (100, 220)]):
        calls: list[tuple[str, tuple[Any, ...]]] = [("record_job_start_time", (now(),))]
        for name in ("tpu_init", "training_preparation", "data_loading"):
            calls.append((f"record_{name}_start_time", (now(),)))
            clock += rng.uniform(1, 30)
            calls.append((f"record_{name}_end_time", (now(),)))
        calls.append(("record_elastic_slice_counts", (4, 4, 4, now())))
        for step in range(first, last):
            calls.append(("record_step_start_time", (step, now())))
            clock += rng.uniform(0.2, 3.0)
            if step % 50 == 49:
                calls.append(("record_custom_badput_event_start_time", (now(), "EVAL_STEP")))
                clock += rng.uniform(1, 5)
                calls.append(("record_custom_badput_event_end_time", (now(), "EVAL_STEP")))
                calls.append(("record_checkpoint_progress", (step, now())))
                calls.append(("record_data_loading_start_time", (now(),)))
                clock += rng.uniform(0.1, 1)
                calls.append(("record_data_loading_end_time", (now(),)))
            if step == first + 70:
                calls.append(("record_elastic_wait_start_time", ("slice_down", now())))
                clock += 12.5
                calls.append(("record_elastic_wait_end_time", ("slice_down", now())))
                calls.append(("record_elastic_reinit_start_time", (now(),)))
                clock += 4.25
                calls.append(("record_elastic_reinit_end_time", (now(),)))
                calls.append(("record_elastic_slice_counts", (3, 4, 3, now())))
        if attempt == 1:
            calls.append(("record_job_end_time", (now(),)))
        clock += 300.0  # the outage between attempts
        yield calls


LOG_NAME = "projects/my-project/logs/goodput_run"


def reference_payloads(attempts: Sequence[Sequence[Call]], job_name: str = "run") -> list[dict[str, Any]]:
    """The jsonPayloads the reference recorder (and Orbax) write for the calls, in order."""
    runner = reference()
    log = reference_log(attempts, job_name=job_name)
    try:
        return runner.entries(log)
    finally:
        runner.release(log)


def payload_time(payload: dict[str, Any]) -> float:
    """The first field whose name says it is a time, as the reference reads it."""
    return next(value for key, value in payload.items() if "time" in key and value is not None)


def as_struct(value: Any) -> Any:
    """A value as Cloud Logging returns it from a protobuf Struct: every number a double."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: as_struct(v) for k, v in value.items()}
    return value


def log_entries(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The payloads as exported LogEntry objects, newest first, as ``gcloud logging read`` lists."""
    entries = []
    for index, payload in enumerate(payloads):
        written = datetime.datetime.fromtimestamp(payload_time(payload), datetime.timezone.utc)
        entries.append({
            "insertId": f"{index:012x}", "jsonPayload": as_struct(payload), "logName": LOG_NAME,
            "receiveTimestamp": written.isoformat().replace("+00:00", "Z"),
            "resource": {"type": "global", "labels": {"project_id": "my-project"}}, "severity": "INFO",
            "timestamp": written.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z",  # nanoseconds, as Cloud Logging
        })
    return entries[::-1]
