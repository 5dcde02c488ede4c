"""Restoring runs from the raw events table, a step of its own before the stream's tracker.

A stream started anew has no run state: the DirectRunner keeps it in memory, and a Dataflow job
that is drained and launched again (rather than updated) starts empty. It would know each run
only from its next message on. ``RestoreRuns`` sends the first message of a run that this
pipeline does not hold, but whose events are in the raw events table of the warehouse it writes
(``pipeline.sinks.raw_events.EventsTables``: the DuckDB file, or the BigQuery dataset), to the
tracker with the run's history (``Restored``): after the pipeline was stopped and started
again, and after the tracker forgot a run that had ended and a late or resumed attempt speaks
again. So a restarted stream catches up to the numbers of one that never stopped.

A run may also have events in the table that no snapshot there counts: a stream that read them
stopped before it reported them (a local stop that gave up waiting, a cancelled job). A run that
sends nothing more would keep its old numbers; so at its start the step also asks the table for
such runs (``EventsTables.unreported_runs``, the last ``UNREPORTED_WITHIN_S`` of event time) and
restores each that it does not hold yet at once, with no message (``Restored.batch`` None): the
tracker reports it as if its last message had just arrived.

Which runs are held is this step's own state, keyed by run like the tracker's. It forgets a run
after ``gc_after_s / 2`` of silence, before the tracker can forget it (``gc_after_s`` after the
last message of a run that has ended): so a run the tracker forgot is always restored. A run the
tracker still holds may be sent its history again after a long silence; the tracker keeps the
state it has. A run whose history cannot be read (the warehouse refuses, or does not answer in
time) is logged and counted (``restore_failures``), and goes on from its message.
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
from pipeline.sinks.raw_events import UNREPORTED_WITHIN_S, EventsTables

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Restored:
    """A run's first message since this pipeline held the run (None for a run restored because
    the table holds events of it that no snapshot counts), with the run's history from the raw
    events table and the time of its latest snapshot there (microseconds), if any."""

    history: tuple[Batch, ...]
    batch: Batch | None
    reported_us: int | None


@dataclasses.dataclass(frozen=True)
class Unreported:
    """In place of a message: the table holds events of the run that no snapshot counts."""


class RunHistory:
    """The tables runs are restored from, as a stream reads them: the runs they hold, when that is
    cheap to know (read once per process, and shared by the process's threads: the DirectRunner
    sets a DoFn up for every bundle), and a run's history, read when the run needs it."""

    def __init__(self, tables: EventsTables) -> None:
        self.tables = tables
        runs = tables.run_ids()
        self._runs = None if runs is None else set(runs)
        self._lock = threading.Lock()

    def holds(self, run_id: str) -> bool:
        """Whether the run may have events in the tables."""
        with self._lock:
            return self._runs is None or run_id in self._runs

    def add(self, run_id: str) -> None:
        """Notes a run whose events this pipeline wrote to the tables."""
        with self._lock:
            if self._runs is not None:
                self._runs.add(run_id)

    def load(self, run_id: str) -> tuple[tuple[Batch, ...], int | None]:
        """The run's messages in the tables, and the time of its latest snapshot there."""
        messages, reported_us = self.tables.run_history(run_id)
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

    def __init__(self, tables: EventsTables, forget_after_s: float, clock: Callable[[], float]) -> None:
        self.tables, self.forget_after_s, self.clock = tables, forget_after_s, clock
        self._shared = Shared()
        self.restored = Metrics.counter("goodput", "restored_runs")
        self.failures = Metrics.counter("goodput", "restore_failures")

    def setup(self) -> None:
        self.history: RunHistory = self._shared.acquire(lambda: RunHistory(self.tables),
                                                        tag=self.tables.source)

    def process(self, element: tuple[str, Batch | Unreported], held: Any = beam.DoFn.StateParam(HELD),
                forget: Any = beam.DoFn.TimerParam(FORGET_TIMER)) -> Iterator[tuple[str, Any]]:
        run_id, message = element
        batch = None if isinstance(message, Unreported) else message
        forget.set(Timestamp(micros=round((self.clock() + self.forget_after_s) * 1e6)))
        history: tuple[Batch, ...] = ()
        reported_us = None
        if not held.read():
            held.write(True)
            history, reported_us = self._load(run_id)
        if history:
            yield run_id, Restored(history, batch, reported_us)
        elif batch is not None:
            yield run_id, batch

    def _load(self, run_id: str) -> tuple[tuple[Batch, ...], int | None]:
        """The run's history in the tables and its latest snapshot's time; none for a run they do
        not hold, or whose history cannot be read (logged and counted)."""
        if not self.history.holds(run_id):
            return (), None
        try:
            history, reported_us = self.history.load(run_id)
        except Exception as error:  # noqa: BLE001 -- one run's history must not stop the stream
            self.failures.inc()
            _LOG.warning("could not restore run %r from %s; it goes on from its next message: %s: %s",
                         run_id, self.tables.source, type(error).__name__, error)
            return (), None
        if history:
            self.restored.inc()
            _LOG.info("restored run %r from %s: %d messages", run_id, self.tables.source, len(history))
        return history, reported_us

    @on_timer(FORGET_TIMER)
    def on_forget(self, run_id: Any = beam.DoFn.KeyParam, held: Any = beam.DoFn.StateParam(HELD)) -> None:
        held.clear()
        self.history.add(run_id)  # its events are in the table now


class RestoreRuns(beam.PTransform):
    """(run_id, Batch) in; (run_id, Batch or Restored) out, as this module's docstring says. The
    stream's raw events go to ``tables``, where the runs are restored from."""

    def __init__(self, tables: EventsTables, gc_after_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.tables, self.gc_after_s, self.clock = tables, gc_after_s, clock

    def expand(self, keyed_batches: Any) -> Any:
        unreported = (keyed_batches.pipeline
                      | "Start" >> beam.Impulse()
                      | "UnreportedRuns" >> beam.FlatMap(_unreported_runs, self.tables, self.clock))
        return ((keyed_batches, unreported)
                | "WithUnreported" >> beam.Flatten()
                | "RestoreRun" >> beam.ParDo(_RestoreRun(self.tables, self.gc_after_s / 2, self.clock))
                .with_output_types(tuple[str, Any]))


def _unreported_runs(_: bytes, tables: EventsTables, clock: Callable[[], float]
                     ) -> Iterator[tuple[str, Unreported]]:
    """Once, at the start: (run_id, Unreported()) of each run the tables hold events of that no
    snapshot counts, of the last ``UNREPORTED_WITHIN_S`` of event time; none, logged, if the
    tables cannot tell."""
    try:
        runs = tables.unreported_runs(round((clock() - UNREPORTED_WITHIN_S) * 1e6))
    except Exception as error:  # noqa: BLE001 -- the stream goes on: each run restores on its message
        _LOG.warning("could not ask %s for runs it holds unreported events of; each is restored when it "
                     "speaks again: %s: %s", tables.source, type(error).__name__, error)
        return
    if runs:
        _LOG.info("restoring %d runs whose latest events %s holds unreported", len(runs), tables.source)
    for run_id in runs:
        yield run_id, Unreported()
