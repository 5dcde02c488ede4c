"""Runs the same recorder calls through the reference library and through this project.

The reference (ml-goodput-measurement 0.2.3) records through its own ``GoodputRecorder`` into an
in-memory stand-in for Cloud Logging, and computes with its own ``GoodputCalculator`` reading
from that stand-in. This project records through the emitter and computes with the engine.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ml_goodput_measurement.src import goodput, goodput_elastic, goodput_utils
from ml_goodput_measurement.src.goodput_utils import BadputType

from benchmarks.common import InMemoryCloudLogging
from emitter import ElasticGoodputRecorder, EmitterSettings
from emitter.testing import capture_events
from pipeline.core import engine
from pipeline.core.events import Event
from pipeline.core.snapshot import CUSTOM_PREFIX, Snapshot

T0 = datetime.datetime(2026, 11, 1, 8, 0, tzinfo=datetime.timezone.utc)
Call = tuple[str, tuple[Any, ...]]


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


def reference_log(attempts: Sequence[Sequence[Call]]) -> InMemoryCloudLogging:
    """The log the reference recorder (one per attempt) and Orbax write for the calls."""
    log = InMemoryCloudLogging()
    for calls in attempts:
        recorder = goodput_elastic.ElasticGoodputRecorder("run", "log", True, cloud_logger=log)
        for method, args in calls:
            if method in ORBAX:
                log.write_cloud_logging_entry(_orbax_entry(method, *args))
            else:
                getattr(recorder, method)(*args)
    return log


def run_reference(attempts: Sequence[Sequence[Call]], cache_dir: Path, elastic: bool = False) -> Result:
    log = reference_log(attempts)
    calculator_class = goodput_elastic.ElasticGoodputCalculator if elastic else goodput.GoodputCalculator
    calculator = calculator_class("run", "log", cloud_logger=log, cache_dir=str(cache_dir))
    calculator.get_job_goodput(include_badput_breakdown=True)
    details = calculator.get_job_goodput_details()
    badput: dict[str, float] = {}
    for bucket, value in details["badput_time"].items():
        if isinstance(value, dict):
            for sub, seconds in value.items():
                badput[f"{CUSTOM_PREFIX}{sub}"] = seconds
        else:
            badput[BadputType(bucket).name if not isinstance(bucket, BadputType) else bucket.name] = value
    total = details["total_elapsed_time"]
    productive = details["goodput_time"][next(iter(details["goodput_time"]))]
    step_info = calculator._goodput_cache.get_step_info()
    deviations = step_info.step_deviations if step_info else {}
    return Result(total, 100.0 * productive / total, badput, details["max_productive_step"],
                  details["disruption_count"],
                  step_info.ideal_step_time if step_info else None,
                  goodput_utils.compute_step_deviation_from_baseline(deviations) if deviations else None)


ORBAX = ("orbax_save", "orbax_restore")


def _orbax_entry(method: str, step: int, start: datetime.datetime, seconds: float,
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


def record_ours(attempts: Sequence[Sequence[Call]]) -> list[Event]:
    from pipeline.core.events import parse_message

    events: list[Event] = []
    settings = EmitterSettings(heartbeat_interval_s=None)
    with capture_events() as captured:
        for calls in attempts:
            recorder = ElasticGoodputRecorder("run", "log", True, settings=settings)
            for method, args in calls:
                if method == "orbax_save":
                    step, start, seconds, *persistent = args
                    recorder.record_checkpoint_save(step, start, start + datetime.timedelta(seconds=seconds),
                                                    *persistent)
                elif method == "orbax_restore":
                    step, start, seconds = args[:3]
                    end = start + datetime.timedelta(seconds=seconds)
                    recorder.record_checkpoint_restore(step, start, end)
                else:
                    getattr(recorder, method)(*args)
            recorder.close()
        messages = captured.messages
    for message in messages:
        parsed, dead = parse_message(message.data)
        assert not dead, dead
        events.extend(parsed)
    return events


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


@dataclasses.dataclass
class TraceBuilder:
    """Builds recorder calls on a simulated clock, attempt by attempt."""

    seed: int = 0
    clock: float = 0.0
    attempts: list[list[Call]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def now(self) -> datetime.datetime:
        return T0 + datetime.timedelta(seconds=self.clock)

    def call(self, method: str, *args: Any) -> None:
        self.attempts[-1].append((method, args))

    def span(self, name: str, seconds: float) -> None:
        self.call(f"record_{name}_start_time", self.now())
        self.clock += seconds
        self.call(f"record_{name}_end_time", self.now())

    def start_attempt(self, *, init_s: float = 20, prep_s: float = 10, load_s: float = 5) -> None:
        self.attempts.append([])
        self.call("record_job_start_time", self.now())
        self.span("tpu_init", init_s)
        self.span("training_preparation", prep_s)
        self.span("data_loading", load_s)

    def steps(self, first: int, last: int, step_s: float = 2.0, noise: float = 0.0,
              compile_s: float = 0.0, eval_every: int = 0, eval_s: float = 5.0,
              save_every: int = 0, save_s: float = 3.0, every: int = 1) -> None:
        """Steps first..last-1, recording every ``every``-th step start."""
        for step in range(first, last):
            if (step - first) % every == 0:
                self.call("record_step_start_time", step, self.now())
            self.clock += step_s * (1 + self.rng.uniform(-noise, noise))
            if step == first:
                self.clock += compile_s
            if eval_every and step % eval_every == eval_every - 1:
                self.clock += 0.1
                self.call("record_custom_badput_event_start_time", self.now(), "eval_step")
                self.clock += eval_s
                self.call("record_custom_badput_event_end_time", self.now(), "eval_step")
                self.clock += 0.1
            if save_every and step % save_every == save_every - 1:
                self.clock += 0.05
                self.save(step, save_s)

    def save(self, step: int, seconds: float, persistent: bool = True) -> None:
        """An Orbax-style checkpoint save that blocks the training loop for ``seconds``."""
        self.call("orbax_save", step, self.now(), seconds, persistent)
        self.clock += seconds

    def restore(self, step: int, seconds: float) -> None:
        self.call("orbax_restore", step, self.now(), seconds)
        self.clock += seconds

    def end(self) -> None:
        self.call("record_job_end_time", self.now())

    def wait(self, seconds: float) -> None:
        self.clock += seconds

    def as_of_us(self) -> int:
        return micros(self.now())


def micros(moment: datetime.datetime) -> int:
    """Microseconds since the epoch."""
    return (moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)) // datetime.timedelta(
        microseconds=1)
