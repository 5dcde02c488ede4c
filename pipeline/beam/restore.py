"""Where the stream's tracker restores runs from: the raw events table of the warehouse it writes.

A stream started anew has no run state: the DirectRunner keeps it in memory, and a Dataflow job
that is drained and launched again (rather than updated) starts empty. It would know each run
only from its next message on. So when the tracker (``pipeline.beam.live``) gets a message of a
run it holds no state for, it first reads the run's history from the raw events table
(``pipeline.sinks.raw_events.EventsTables``: the DuckDB file, or the BigQuery dataset) through a
``RunHistory``: after the pipeline was stopped and started again, and after the tracker forgot a
run (``gc_after_s`` after its last message) that then speaks again. So a restarted stream
catches up to the numbers of one that never stopped.

A run may also have events in the table that no snapshot there counts: a stream that read them
stopped before it reported them (a local stop that gave up waiting, a cancelled job). A run that
sends nothing more would keep its old numbers; so at its start the stream also asks the table
for such runs (``UnreportedRuns``, the last ``UNREPORTED_WITHIN_S`` of event time) and sends the
tracker each with no message (``Unreported``): the tracker restores it and reports it as if its
last message had just arrived.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import TimestampedValue

from pipeline.core.events import Batch, parse_batch
from pipeline.sinks.raw_events import UNREPORTED_WITHIN_S, EventsTables, LatestSnapshot

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Unreported:
    """In place of a message: the table holds events of the run that no snapshot counts."""


class RunHistory:
    """The tables runs are restored from, as a stream reads them: the runs they hold, where that
    is cheap to know (``EventsTables.run_ids``; shared by a process's threads, and read again once
    it is ``refresh_after_s`` old, so that a run this pipeline wrote and then forgot is known
    wherever it speaks again), and a run's history, read when the run needs it."""

    def __init__(self, tables: EventsTables, refresh_after_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tables, self.refresh_after_s, self.clock = tables, refresh_after_s, clock
        self._runs: frozenset[str] | None = None
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def holds(self, run_id: str, ask_again: bool = False) -> bool:
        """Whether the run may have events in the tables; with ``ask_again``, the runs they hold
        are read again before a run is said not to be among them (a run's message that follows
        earlier ones: those may have been written since the runs were last read)."""
        with self._lock:
            now = self.clock()
            stale = self._read_at is None or now - self._read_at >= self.refresh_after_s
            if stale or (ask_again and self._runs is not None and run_id not in self._runs):
                self._runs, self._read_at = self.tables.run_ids(), now
            return self._runs is None or run_id in self._runs

    def load(self, run_id: str) -> tuple[tuple[Batch, ...], LatestSnapshot | None]:
        """The run's messages in the tables, and its latest snapshot there."""
        messages, latest = self.tables.run_history(run_id)
        history = []
        for source, data in messages:
            batch, _ = parse_batch(data, source)  # rows of accepted events: no dead letter
            if batch is not None:
                history.append(batch)
        return tuple(history), latest


class UnreportedRuns(beam.PTransform):
    """Once, at the start: (run_id, Unreported()) of each run the tables hold events of that no
    snapshot counts, of the last ``UNREPORTED_WITHIN_S`` of event time, timestamped with the
    start; none, logged, if the tables cannot tell (each run is then restored when it speaks)."""

    def __init__(self, tables: EventsTables, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.tables, self.clock = tables, clock

    def expand(self, begin: Any) -> Any:
        return (begin
                | "Start" >> beam.Impulse()
                | "UnreportedRuns" >> beam.FlatMap(_unreported_runs, self.tables, self.clock)
                .with_output_types(tuple[str, Any]))


def _unreported_runs(_: bytes, tables: EventsTables, clock: Callable[[], float]) -> Iterator[Any]:
    now = clock()
    try:
        runs = tables.unreported_runs(round((now - UNREPORTED_WITHIN_S) * 1e6))
    except Exception as error:  # noqa: BLE001 -- the stream goes on: each run restores on its message
        _LOG.warning("could not ask %s for runs it holds unreported events of; each is restored when it "
                     "speaks again: %s: %s", tables.source, type(error).__name__, error)
        return
    if runs:
        _LOG.info("restoring %d runs whose latest events %s holds unreported", len(runs), tables.source)
    for run_id in runs:
        yield TimestampedValue((run_id, Unreported()), now)
