"""The pipeline's composite transforms, each a named step Dataflow can match on update.

``ParseEvents`` validates messages and routes rejects to a dead-letter output; ``TrackRuns``
keys events by run and computes each run's snapshot with the engine; ``WriteToDuckDB`` appends
every output row to a DuckDB file. ``WriteToBigQuery`` and ``WriteToMonitoring`` never stop the
pipeline for a service's error: each returns, as its output, ("dead_letter", row) for what it
could not write (see ``pipeline.sinks.bigquery`` and ``pipeline.sinks.monitoring``).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import AsSingleton, PCollection
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.timestamp import Timestamp

from pipeline.beam.live import DRAINING, engine_failure
from pipeline.core import engine
from pipeline.core.events import Batch, parse_batch
from pipeline.core.rows import (
    BADPUT,
    DEAD_LETTER,
    GOODPUT,
    Element,
    Row,
    by_table,
    dead_letter_row,
    snapshot_rows,
)
from pipeline.sinks.monitoring import MonitoringSettings, Point, snapshot_points

DEAD_LETTER_TAG = "dead_letter"


class _ParseMessage(beam.DoFn):
    def __init__(self) -> None:
        self.messages = Metrics.counter("goodput", "messages")
        self.events = Metrics.counter("goodput", "events")
        self.rejected = Metrics.counter("goodput", "rejected")

    def process(self, element: tuple[str, bytes]) -> Iterator[Any]:
        source, data = element
        self.messages.inc()
        batch, dead = parse_batch(data, source)
        received = datetime.datetime.now(datetime.timezone.utc)
        for letter in dead:
            self.rejected.inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER_TAG, (DEAD_LETTER, dead_letter_row(letter, received)))
        if batch is not None:
            self.events.inc(len(batch))
            yield batch.run_id, batch


class ParseEvents(beam.PTransform):
    """Validates (source, message) pairs against the event contract.

    The main output is (run_id, Batch) per message (a message holds one attempt's events);
    the ``dead_letter`` output carries ("dead_letter", row) for every rejected message or event,
    with the raw payload and the reason. Nothing is dropped silently.
    """

    def expand(self, messages: PCollection) -> Any:
        return messages | "Validate" >> beam.ParDo(_ParseMessage()).with_outputs(
            DEAD_LETTER_TAG, main="events")


class _SnapshotRun(beam.DoFn):
    """A run's snapshot rows from all its messages. An exception in the engine (a bug) makes a
    dead letter of the message it failed on, or of the snapshot, and never stops the replay."""

    def __init__(self, windows_s: tuple[int, ...], exclusions: tuple[tuple[int, int], ...]) -> None:
        self.windows_s, self.exclusions = windows_s, exclusions

    def process(self, element: tuple[str, Iterable[Batch]], as_of_us: int | None
                ) -> Iterator[tuple[str, Row]]:
        run_id, batches = element
        state = engine.RunState(run_id)
        added: list[Batch] = []
        for batch in batches:
            try:
                state.add_batch(batch)
            except Exception as error:  # noqa: BLE001 -- see the class docstring
                yield engine_failure(run_id, error, batch)
                state = engine.RunState(run_id)  # possibly half changed: the others again
                for other in added:
                    state.add_batch(other)
            else:
                added.append(batch)
        if as_of_us is None:
            return
        try:
            snapshot = state.snapshot(as_of_us, self.windows_s, self.exclusions)
        except Exception as error:  # noqa: BLE001 -- see the class docstring
            yield engine_failure(run_id, error)
            return
        if snapshot is not None:
            yield from snapshot_rows(snapshot)


class TrackRuns(beam.PTransform):
    """Assembles each run from its events and emits its snapshot rows as of one time.

    ``as_of_us`` None means the latest event time in the input; ``exclusions`` are intervals
    left out of every run's elapsed time and buckets. Deduplication and reordering are the
    engine's: duplicates and order never change a number.
    """

    def __init__(self, as_of_us: int | None, windows_s: tuple[int, ...],
                 exclusions: tuple[tuple[int, int], ...] = ()) -> None:
        super().__init__()
        self.as_of_us = as_of_us
        self.windows_s = windows_s
        self.exclusions = exclusions

    def expand(self, keyed_batches: PCollection) -> Any:
        if self.as_of_us is not None:
            as_of = keyed_batches.pipeline | "AsOf" >> beam.Create([self.as_of_us])
        else:
            as_of = (keyed_batches
                     | "LatestTime" >> beam.Map(lambda kv: kv[1].max_time_us)
                     | "AsOf" >> beam.CombineGlobally(max).without_defaults())
        return (keyed_batches
                | "ByRun" >> beam.GroupByKey()
                | "Snapshot" >> beam.ParDo(_SnapshotRun(self.windows_s, self.exclusions),
                                           AsSingleton(as_of, default_value=None)))


def _buffered_rows(value: Any) -> int:
    """What an output element weighs in a writer's buffer, in rows: a message's step starts are
    int64 columns, each a tenth of a row's bytes or less; its other events are rows."""
    return 1 + len(value.others) + len(value.steps) // 10 if isinstance(value, Batch) else 1


class _AppendPerBundle(beam.DoFn):
    """Buffers output elements and appends them to the DuckDB file when the bundle finishes, or
    sooner, once they weigh ``flush_rows`` rows: a batch runner may make its whole input one
    bundle, and the buffer must not grow with the input."""

    def __init__(self, path: str, flush_rows: int) -> None:
        self.path = path
        self.flush_rows = flush_rows
        self._elements: list[Element] = []
        self._rows = 0

    def start_bundle(self) -> None:
        self._elements, self._rows = [], 0

    def process(self, element: Element) -> None:
        self._elements.append(element)
        self._rows += _buffered_rows(element[1])
        if self._rows >= self.flush_rows:
            self._flush()

    def finish_bundle(self) -> None:
        self._flush()

    def _flush(self) -> None:
        from pipeline.sinks.duckdb import append

        if self._elements:
            append(self.path, self._elements)
        self._elements, self._rows = [], 0


def _retry_deadline_s(configured_s: float) -> float:
    """How long a sink retries a write: as configured, but not at all while a DirectRunner job is
    stopping (``pipeline.beam.live.DRAINING``), where a bundle waiting out a service's outage would
    hold up the messages read before the stop until the job is cancelled and they are lost; what
    fails then is dead-lettered like any write that gave up."""
    return 0.0 if DRAINING.is_set() else configured_s


class _InsertPerBundle(beam.DoFn):
    """Gathers rows and inserts them into BigQuery when the bundle finishes, or sooner, once they
    hold ``FLUSH_ROWS`` rows (a batch runner may make its whole input one bundle); outputs
    ("dead_letter", row) for each row it could write nowhere (logged and counted)."""

    FLUSH_ROWS = 10_000  # a few dozen insertAll requests

    def __init__(self, project: str, dataset: str, endpoint: str | None,
                 retry: tuple[float, float, float]) -> None:
        self.project, self.dataset, self.endpoint, self.retry = project, dataset, endpoint, retry
        self.dead_lettered = Metrics.counter("goodput", "bigquery_rows_dead_lettered")
        self.unwritten = Metrics.counter("goodput", "bigquery_rows_not_written")
        self._elements: list[Element] = []
        self._rows = 0

    def setup(self) -> None:
        from pipeline.sinks.bigquery import BigQueryWriter, make_client

        deadline_s, initial_s, maximum_s = self.retry
        self._writer = BigQueryWriter(make_client(self.project, self.endpoint), self.project, self.dataset,
                                      retry_deadline_s=deadline_s, initial_backoff_s=initial_s,
                                      max_backoff_s=maximum_s)

    def start_bundle(self) -> None:
        self._elements, self._rows = [], 0

    def process(self, element: Element) -> Iterator[tuple[str, Row]]:
        self._elements.append(element)
        self._rows += len(element[1]) if isinstance(element[1], Batch) else 1  # each a row of a request
        if self._rows >= self.FLUSH_ROWS:
            yield from self._flush()

    def finish_bundle(self) -> Iterator[Any]:
        for letter in self._flush():
            yield GlobalWindows.windowed_value(letter)

    def _flush(self) -> Iterator[tuple[str, Row]]:
        elements, self._elements, self._rows = self._elements, [], 0
        if not elements:
            return
        lost: list[Row] = []
        self._writer.retry_deadline_s = _retry_deadline_s(self.retry[0])
        self.dead_lettered.inc(self._writer.write(by_table(elements),
                                                  lambda table, row, reason: lost.append(row)))
        self.unwritten.inc(len(lost))
        for row in lost:
            yield DEAD_LETTER, row


class WriteToBigQuery(beam.PTransform):
    """Appends (table, row) pairs to the output tables of a BigQuery dataset, each bundle's rows
    in a few streaming inserts; rows BigQuery rejects land in its ``dead_letter`` table (see
    ``pipeline.sinks.bigquery``). The output is ("dead_letter", row) for each row that could not
    be written even there. The retries are ``BigQueryWriter``'s, with its defaults unless given."""

    def __init__(self, project: str, dataset: str, endpoint: str | None = None, *,
                 retry_deadline_s: float = 120.0, initial_backoff_s: float = 1.0,
                 max_backoff_s: float = 32.0) -> None:
        super().__init__()
        self.project, self.dataset, self.endpoint = project, dataset, endpoint
        self.retry = (retry_deadline_s, initial_backoff_s, max_backoff_s)

    def expand(self, rows: PCollection) -> Any:
        return rows | "InsertPerBundle" >> beam.ParDo(_InsertPerBundle(self.project, self.dataset,
                                                                       self.endpoint, self.retry))


class WriteToDuckDB(beam.PTransform):
    """Appends (table, row) pairs to a DuckDB file.

    Each bundle's rows are appended as the bundle finishes, and every ``FLUSH_ROWS`` rows within
    it, so that memory stays bounded however large the input. DuckDB has one writer per file:
    each append opens the file only for the write, under a lock shared by the process's threads,
    and retries while another process holds it, so readers can open it between writes. (On
    Dataflow the sinks are BigQuery and Cloud Monitoring; DuckDB is the local stand-in.) Batch and
    streaming pipelines append alike.
    """

    #: Rows (as ``_buffered_rows`` weighs them) buffered before an append: an append costs
    #: tens of milliseconds to open the file, and the rows a few hundred bytes each.
    FLUSH_ROWS = 100_000

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def expand(self, rows: PCollection) -> Any:
        return rows | "AppendPerBundle" >> beam.ParDo(
            _AppendPerBundle(self.path, self.FLUSH_ROWS))


class _GateSeries(beam.DoFn):
    """Per run: gathers its snapshot rows and releases them as points, so that each of the run's
    series has one writer, in time order, and no point sooner than ``min_interval_s`` after the
    last: while streaming, ``settle_s`` after the first row not yet released (the rest of its
    snapshot arrives meanwhile) and no sooner than the interval allows; at the end of the input
    (the end of a batch, a drain), whatever is left."""

    PENDING = BagStateSpec("pending", PickleCoder())
    LAST = ReadModifyWriteStateSpec("last_us", VarIntCoder())  # end time of the last points
    DUE = ReadModifyWriteStateSpec("due_us", VarIntCoder())  # a release is pending
    RELEASE = TimerSpec("release", TimeDomain.REAL_TIME)
    FINAL = TimerSpec("final", TimeDomain.WATERMARK)

    def __init__(self, settings: MonitoringSettings, streaming: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings, self.streaming, self.clock = settings, streaming, clock
        self.stale = Metrics.counter("goodput", "monitoring_stale_points_not_written")

    def process(self, element: tuple[str, tuple[str, Row]], window: Any = beam.DoFn.WindowParam,
                pending: Any = beam.DoFn.StateParam(PENDING), last: Any = beam.DoFn.StateParam(LAST),
                due: Any = beam.DoFn.StateParam(DUE), release: Any = beam.DoFn.TimerParam(RELEASE),
                final: Any = beam.DoFn.TimerParam(FINAL)) -> None:
        pending.add(element[1])
        final.set(window.max_timestamp())
        if self.streaming and due.read() is None:
            interval_us = round(self.settings.min_interval_s * 1e6)
            previous = last.read()
            at = max(self._now_us() + round(self.settings.settle_s * 1e6),
                     0 if previous is None else previous + interval_us)
            release.set(Timestamp(micros=at))
            due.write(at)

    @on_timer(RELEASE)
    def on_release(self, pending: Any = beam.DoFn.StateParam(PENDING), last: Any = beam.DoFn.StateParam(LAST),
                   due: Any = beam.DoFn.StateParam(DUE)) -> Iterator[Point]:
        yield from self._release(pending, last, due)

    @on_timer(FINAL)
    def on_final(self, pending: Any = beam.DoFn.StateParam(PENDING), last: Any = beam.DoFn.StateParam(LAST),
                 due: Any = beam.DoFn.StateParam(DUE)) -> Iterator[Point]:
        yield from self._release(pending, last, due)

    def _release(self, pending: Any, last: Any, due: Any) -> Iterator[Point]:
        rows, due_us = list(pending.read()), due.read() or 0
        pending.clear()
        due.clear()
        settings = self.settings
        points = snapshot_points(rows, settings.location, settings.cluster_name)
        if not points:
            return
        now_us = self._now_us()
        latest = max(row["snapshot_time"] for table, row in rows if table == GOODPUT)
        lag_s = now_us / 1e6 - latest.timestamp()
        if lag_s > settings.max_lag_s and not settings.latest_now:
            self.stale.inc(len(points))
            return
        previous = last.read()
        earliest = 0 if previous is None else previous + round(settings.min_interval_s * 1e6)
        end_us = max(now_us, due_us, earliest)
        last.write(end_us)
        for point in points:
            yield dataclasses.replace(point, end_us=end_us)

    def _now_us(self) -> int:
        return round(self.clock() * 1e6)


class _WritePoints(beam.DoFn):
    """Writes a bundle's points when it finishes; outputs ("dead_letter", row) for each point that
    was not written (refused, or its request failed after the retries), logged and counted."""

    def __init__(self, project: str, endpoint: str | None, settings: MonitoringSettings) -> None:
        self.project, self.endpoint, self.settings = project, endpoint, settings
        self.refused = Metrics.counter("goodput", "monitoring_points_refused")
        self._points: list[Point] = []

    def setup(self) -> None:
        from pipeline.sinks.monitoring import MetricWriter, make_client

        settings = self.settings
        self._writer = MetricWriter(make_client(self.endpoint), self.project, settings.retry_deadline_s,
                                    settings.initial_backoff_s, settings.max_backoff_s)

    def start_bundle(self) -> None:
        self._points = []

    def process(self, point: Point) -> None:
        self._points.append(point)

    def finish_bundle(self) -> Iterator[Any]:
        if not self._points:
            return
        from pipeline.sinks.monitoring import dead_letter_row

        received = datetime.datetime.now(datetime.timezone.utc)
        letters: list[Row] = []
        self._writer.retry_deadline_s = _retry_deadline_s(self.settings.retry_deadline_s)
        self.refused.inc(self._writer.write(
            self._points, lambda point, reason: letters.append(dead_letter_row(point, reason, received))))
        self._points = []
        for row in letters:
            yield GlobalWindows.windowed_value((DEAD_LETTER, row))


class WriteToMonitoring(beam.PTransform):
    """Writes the reference's Cloud Monitoring metrics of every run from the snapshot rows (see
    ``pipeline.sinks.monitoring``), each run's series gated by ``_GateSeries``. The output is
    ("dead_letter", row) for each point that was not written."""

    def __init__(self, project: str, settings: MonitoringSettings, streaming: bool,
                 endpoint: str | None = None) -> None:
        super().__init__()
        self.project, self.settings, self.streaming, self.endpoint = project, settings, streaming, endpoint

    def expand(self, rows: PCollection) -> Any:
        return (rows
                | "Snapshots" >> beam.Filter(lambda tr: tr[0] in (GOODPUT, BADPUT))
                | "ByRun" >> beam.Map(lambda tr: (tr[1]["run_id"], tr)).with_output_types(
                    tuple[str, Any])
                | "Gate" >> beam.ParDo(_GateSeries(self.settings, self.streaming))
                | "Write" >> beam.ParDo(_WritePoints(self.project, self.endpoint, self.settings)))
