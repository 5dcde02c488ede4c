"""Restoring runs from the raw events table, a step of its own before the stream's tracker.

The DirectRunner keeps run state in memory. Started again on the DuckDB file it wrote before, a
stream would know each run only from its next message on. ``RestoreRuns`` sends the first message
of a run that this pipeline does not hold, but whose events are in the raw events table
(``RunHistory``), to the tracker with the run's history (``Restored``): after the pipeline was
stopped and started again, and after the tracker forgot a run that had ended and a late or
resumed attempt speaks again. So a restarted stream catches up to the numbers of one that never
stopped. (On Dataflow, state survives an update; a restore from BigQuery is not built.)

Which runs are held is this step's own state, keyed by run like the tracker's. It forgets a run
after ``gc_after_s / 2`` of silence, before the tracker can forget it (``gc_after_s`` after the
last message of a run that has ended): so a run the tracker forgot is always restored. A run the
tracker still holds may be sent its history again after a long silence; the tracker keeps the
state it has.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import BooleanCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.shared import Shared
from apache_beam.utils.timestamp import Timestamp

from pipeline.core.events import Batch, parse_batch
from pipeline.sinks import raw_events

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Restored:
    """A run's first message since this pipeline held the run, with the run's history from the
    raw events table and the time of its latest snapshot there (microseconds), if any."""

    history: tuple[Batch, ...]
    batch: Batch
    reported_us: int | None


class RunHistory:
    """The raw events table of a DuckDB file, as a stream restores runs from it: the runs it
    holds (read once per process, and shared by the process's threads: the DirectRunner sets a
    DoFn up for every bundle), and a run's history, read when the run needs it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._runs = set(raw_events.run_ids(path))
        self._lock = threading.Lock()

    def holds(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._runs

    def add(self, run_id: str) -> None:
        """Notes a run whose events this pipeline wrote to the table."""
        with self._lock:
            self._runs.add(run_id)

    def load(self, run_id: str) -> tuple[tuple[Batch, ...], int | None]:
        """The run's messages in the table, and the time of its latest snapshot there."""
        messages, reported_us = raw_events.run_history(self.path, run_id)
        history = []
        for source, data in messages:
            batch, _ = parse_batch(data, source)  # rows of accepted events: no dead letter
            if batch is not None:
                history.append(batch)
        return tuple(history), reported_us


class _RestoreRun(beam.DoFn):
    """Passes messages on; the first of a run not held here comes with the run's history."""

    HELD = ReadModifyWriteStateSpec("held", BooleanCoder())
    FORGET_TIMER = TimerSpec("forget", TimeDomain.REAL_TIME)

    def __init__(self, path: str, forget_after_s: float, clock: Callable[[], float]) -> None:
        self.path, self.forget_after_s, self.clock = path, forget_after_s, clock
        self._shared = Shared()
        self.restored = Metrics.counter("goodput", "restored_runs")

    def setup(self) -> None:
        self.history: RunHistory = self._shared.acquire(lambda: RunHistory(self.path), tag=self.path)

    def process(self, element: tuple[str, Batch], held: Any = beam.DoFn.StateParam(HELD),
                forget: Any = beam.DoFn.TimerParam(FORGET_TIMER)) -> Iterator[tuple[str, Any]]:
        run_id, batch = element
        forget.set(Timestamp(micros=round((self.clock() + self.forget_after_s) * 1e6)))
        if held.read():
            yield element
            return
        held.write(True)
        if not self.history.holds(run_id):
            yield element
            return
        history, reported_us = self.history.load(run_id)
        self.restored.inc()
        _LOG.info("restored run %r from the events table of %s: %d messages", run_id, self.path,
                  len(history))
        yield run_id, Restored(history, batch, reported_us)

    @on_timer(FORGET_TIMER)
    def on_forget(self, run_id: Any = beam.DoFn.KeyParam, held: Any = beam.DoFn.StateParam(HELD)) -> None:
        held.clear()
        self.history.add(run_id)  # its events are in the table now


class RestoreRuns(beam.PTransform):
    """(run_id, Batch) in; (run_id, Batch or Restored) out, as this module's docstring says. The
    stream's raw events go to ``path``, the table the runs are restored from."""

    def __init__(self, path: str, gc_after_s: float, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.path, self.gc_after_s, self.clock = path, gc_after_s, clock

    def expand(self, keyed_batches: Any) -> Any:
        return keyed_batches | "RestoreRun" >> beam.ParDo(
            _RestoreRun(self.path, self.gc_after_s / 2, self.clock)).with_output_types(tuple[str, Any])
