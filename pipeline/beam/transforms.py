"""The pipeline's composite transforms, each a named step Dataflow can match on update.

``ParseEvents`` validates messages; ``TrackRuns`` computes each run's snapshot with the engine
(``pipeline.beam.live.TrackRunsLive`` does it for a stream); both have a ``dead_letter`` output of
``DeadLetter`` objects beside their main one. ``SnapshotRows`` and ``DeadLetterRows`` make the
output rows; ``WriteToDuckDB`` and ``WriteToBigQuery`` append rows, and ``WriteToMonitoring``
writes the points of each snapshot. What the services reject for its content is a dead letter.
What the cloud writers cannot write for another reason (an outage past their retries) depends on
the runner (``fail_work_items``, set by ``pipeline.beam.graph.fails_work_items``): on the local
one, where a failed bundle stops the pipeline, it is a dead letter too, or their output; on
Dataflow, which retries a failed work item until it succeeds, it fails the bundle, and the retry
writes it idempotently (see ``pipeline.sinks.bigquery`` and ``pipeline.sinks.monitoring``).
Pub/Sub's messages are acknowledged once the bundle's output is durable: a bundle that succeeded
without its rows would have lost them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder, VarIntCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import AsSingleton, PCollection, TaggedOutput
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.timestamp import Timestamp

from pipeline.core import engine
from pipeline.core.detect import DetectionSettings
from pipeline.core.events import Batch, DeadLetter, parse_batch
from pipeline.core.rows import (
    DEAD_LETTER,
    Element,
    Row,
    by_table,
    dead_letter_row,
    engine_failure_letter,
    snapshot_rows,
)
from pipeline.core.series import Cadence
from pipeline.core.snapshot import Snapshot
from pipeline.sinks.monitoring import MonitoringSettings, Point, point_dead_letter, snapshot_points
from pipeline.sinks.retries import never

_LOG = logging.getLogger(__name__)
DEAD_LETTER_TAG = "dead_letter"
_ENGINE_FAILURES = Metrics.counter("goodput", "engine_failures")

#: Says whether the job is stopping (``pipeline.beam.direct_runner.stopping`` for a local
#: stream); the batch path and Dataflow never are (``never``).
Stopping = Callable[[], bool]


def engine_failure(run_id: str, error: Exception, batch: Batch | None = None) -> TaggedOutput:
    """The dead letter of what the engine failed on (a message, or a snapshot when ``batch`` is
    None), logged with its traceback and counted; called from an ``except`` block."""
    _ENGINE_FAILURES.inc()
    _LOG.exception("the engine failed on %s of run %r: see the dead_letter table",
                   "a message" if batch is not None else "a snapshot", run_id)
    return TaggedOutput(DEAD_LETTER_TAG, engine_failure_letter(run_id, error, batch))


class _ParseMessage(beam.DoFn):
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.messages = Metrics.counter("goodput", "messages")
        self.events = Metrics.counter("goodput", "events")
        self.rejected = Metrics.counter("goodput", "rejected")

    def process(self, element: tuple[str, bytes]) -> Iterator[Any]:
        source, data = element
        self.messages.inc()
        batch, dead = parse_batch(data, source, round(self.clock() * 1_000_000))
        for letter in dead:
            self.rejected.inc()
            yield TaggedOutput(DEAD_LETTER_TAG, letter)
        if batch is not None:
            self.events.inc(len(batch))
            yield batch.run_id, batch


class ParseEvents(beam.PTransform):
    """Validates (source, message) pairs against the event contract.

    The main output is (run_id, Batch) per message (a message holds one attempt's events),
    typed so that a stateful step keyed by run has a deterministic key coder; the
    ``dead_letter`` output carries a ``DeadLetter`` for every rejected message or event, with the
    raw payload and the reason. Nothing is dropped silently. ``clock`` is the pipeline's clock
    (seconds since the epoch), which no event time may pass by more than ``MAX_CLOCK_AHEAD_S``.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.clock = clock

    def expand(self, messages: PCollection) -> Any:
        return messages | "Validate" >> beam.ParDo(_ParseMessage(self.clock)).with_output_types(
            tuple[str, Batch]).with_outputs(DEAD_LETTER_TAG, main="events")


class _SnapshotRun(beam.DoFn):
    """A run's snapshot from all its messages, and the dead letters of conflicting duplicates
    (the same in any order); with ``every_s``, its snapshots at that cadence before it
    (``pipeline.core.series``). An exception in the engine (a bug) makes a dead letter of the
    message it failed on, or of the snapshot (of the series: its remaining snapshots), and never
    stops the replay."""

    def __init__(self, windows_s: tuple[int, ...], exclusions: tuple[tuple[int, int], ...],
                 detection: DetectionSettings | None, every_s: float | None = None) -> None:
        self.windows_s, self.exclusions, self.detection = windows_s, exclusions, detection
        self.every_s = every_s

    def process(self, element: tuple[str, Iterable[Batch]], as_of_us: int | None) -> Iterator[Any]:
        run_id, batches = element
        state = engine.RunState(run_id)
        added: list[Batch] = []
        conflicts: list[DeadLetter] = []
        for batch in batches:
            try:
                state.add_batch(batch, conflicts)
            except Exception as error:  # noqa: BLE001 -- see the class docstring
                yield engine_failure(run_id, error, batch)
                state, conflicts = engine.RunState(run_id), []  # possibly half changed: the others again
                for other in added:
                    state.add_batch(other, conflicts)
            else:
                added.append(batch)
        for letter in conflicts:
            yield TaggedOutput(DEAD_LETTER_TAG, letter)
        if as_of_us is None:
            return
        try:
            snapshot = state.snapshot(as_of_us, self.windows_s, self.exclusions, detection=self.detection)
        except Exception as error:  # noqa: BLE001 -- see the class docstring
            yield engine_failure(run_id, error)
            return
        if snapshot is None:
            return
        if self.every_s is not None:
            del state  # the series builds its own, in time order
            cadence = Cadence(run_id, self.every_s, self.windows_s, self.exclusions, self.detection)
            try:
                yield from cadence.snapshots(added, as_of_us, snapshot.missing_events)
            except Exception as error:  # noqa: BLE001 -- see the class docstring
                yield engine_failure(run_id, error)
            snapshot = cadence.fresh(snapshot)
        yield snapshot


class TrackRuns(beam.PTransform):
    """Assembles each run from its events and emits its ``Snapshot`` as of one time, and with
    ``every_s`` a time series before it.

    ``as_of_us`` None means the latest event time in the input; ``exclusions`` are intervals
    left out of every run's elapsed time and buckets; ``detection`` says what anomalies are
    looked for (every one found up to ``as_of_us`` is in the snapshots, each once). ``every_s``
    adds a snapshot of each run at every multiple of it (seconds since the epoch) after its first
    event, up to its last one and before ``as_of_us``, each with the figures a replay as of its
    time has (``pipeline.core.series``). Deduplication and
    reordering are the engine's: duplicates and order never change a number. The
    ``dead_letter`` output holds what the engine failed on, and the copies of conflicting
    duplicates it did not keep.
    """

    def __init__(self, as_of_us: int | None, windows_s: tuple[int, ...],
                 exclusions: tuple[tuple[int, int], ...] = (),
                 detection: DetectionSettings | None = None, every_s: float | None = None) -> None:
        super().__init__()
        self.as_of_us = as_of_us
        self.windows_s = windows_s
        self.exclusions = exclusions
        self.detection = detection
        self.every_s = every_s

    def expand(self, keyed_batches: PCollection) -> Any:
        if self.as_of_us is not None:
            as_of = keyed_batches.pipeline | "AsOf" >> beam.Create([self.as_of_us])
        else:
            as_of = (keyed_batches
                     | "LatestTime" >> beam.Map(lambda kv: kv[1].max_time_us)
                     | "AsOf" >> beam.CombineGlobally(max).without_defaults())
        return (keyed_batches
                | "ByRun" >> beam.GroupByKey()
                | "Snapshot" >> beam.ParDo(_SnapshotRun(self.windows_s, self.exclusions, self.detection,
                                                        self.every_s),
                                           AsSingleton(as_of, default_value=None)).with_outputs(
                    DEAD_LETTER_TAG, main="snapshots"))


class SnapshotRows(beam.PTransform):
    """Each ``Snapshot`` as (table, row) pairs: goodput and badput per window, step statistics,
    disruptions (``pipeline.core.rows.snapshot_rows``)."""

    def expand(self, snapshots: PCollection) -> Any:
        return snapshots | "Rows" >> beam.FlatMap(snapshot_rows)


class DeadLetterRows(beam.PTransform):
    """Each ``DeadLetter``, whatever rejected it, as its ("dead_letter", row) pair."""

    def expand(self, letters: PCollection) -> Any:
        return letters | "Rows" >> beam.Map(lambda letter: (DEAD_LETTER, dead_letter_row(letter)))


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


class WriteToDuckDB(beam.PTransform):
    """Appends (table, row) pairs to a DuckDB file.

    Each bundle's rows are appended as the bundle finishes, and every ``FLUSH_ROWS`` rows within
    it, so that memory stays bounded however large the input. DuckDB has one writer per file:
    each append opens the file only for the write, under a lock shared by the process's threads,
    and retries while another process holds it, so readers can open it between writes. (On
    Dataflow the sinks are BigQuery and Cloud Monitoring; DuckDB is the local stand-in.) Batch and
    streaming pipelines append alike.
    """

    #: Rows (as ``_buffered_rows`` weighs them) buffered before an append: an append costs a
    #: few milliseconds to open the file, and the rows a few hundred bytes each.
    FLUSH_ROWS = 100_000

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def expand(self, rows: PCollection) -> Any:
        return rows | "AppendPerBundle" >> beam.ParDo(
            _AppendPerBundle(self.path, self.FLUSH_ROWS))


class _InsertPerBundle(beam.DoFn):
    """Gathers rows and inserts them into BigQuery when the bundle finishes, or sooner, once they
    hold ``FLUSH_ROWS`` rows (a batch runner may make its whole input one bundle); outputs
    ("dead_letter", row) for each row it could write nowhere (logged and counted). With
    ``fail_work_items``, a write that fails raises ``WriteFailed`` out of the bundle."""

    FLUSH_ROWS = 10_000  # a few dozen insertAll requests

    def __init__(self, project: str, dataset: str, endpoint: str | None,
                 retry: tuple[float, float, float], stopping: Stopping, fail_work_items: bool) -> None:
        self.project, self.dataset, self.endpoint, self.retry = project, dataset, endpoint, retry
        self.stopping, self.fail_work_items = stopping, fail_work_items
        self.dead_lettered = Metrics.counter("goodput", "bigquery_rows_dead_lettered")
        self.unwritten = Metrics.counter("goodput", "bigquery_rows_not_written")
        self._elements: list[Element] = []
        self._rows = 0

    def setup(self) -> None:
        from pipeline.sinks.bigquery import BigQueryWriter, make_client

        deadline_s, initial_s, maximum_s = self.retry
        # A job that is stopping retries nothing (the writer gives up): a bundle waiting out an
        # outage would hold up the messages read before the stop until the job is cancelled and
        # they are lost.
        self._writer = BigQueryWriter(make_client(self.project, self.endpoint), self.project, self.dataset,
                                      retry_deadline_s=deadline_s, initial_backoff_s=initial_s,
                                      max_backoff_s=maximum_s, give_up=self.stopping,
                                      raise_failures=self.fail_work_items)

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
        self.dead_lettered.inc(self._writer.write(by_table(elements),
                                                  lambda table, row, reason: lost.append(row)))
        self.unwritten.inc(len(lost))
        for row in lost:
            yield DEAD_LETTER, row


class WriteToBigQuery(beam.PTransform):
    """Appends (table, row) pairs to the output tables of a BigQuery dataset, each bundle's rows
    in a few streaming inserts; rows BigQuery rejects for their content land in its
    ``dead_letter`` table (see ``pipeline.sinks.bigquery``). The retries are ``BigQueryWriter``'s,
    with its defaults unless given. What they cannot write (an outage past them, a missing table)
    fails the bundle with ``fail_work_items`` (Dataflow, whose retry of the work item writes it,
    the rows written before deduplicated by their insert ids); without it (the local runner) it
    goes to ``dead_letter`` too, and a stopping job (``stopping``) retries nothing. The output is
    ("dead_letter", row) for each row that could not be written even there."""

    def __init__(self, project: str, dataset: str, endpoint: str | None = None, *,
                 retry_deadline_s: float = 120.0, initial_backoff_s: float = 1.0,
                 max_backoff_s: float = 32.0, stopping: Stopping = never,
                 fail_work_items: bool = False) -> None:
        super().__init__()
        self.project, self.dataset, self.endpoint = project, dataset, endpoint
        self.retry = (retry_deadline_s, initial_backoff_s, max_backoff_s)
        self.stopping, self.fail_work_items = stopping, fail_work_items

    def expand(self, rows: PCollection) -> Any:
        return rows | "InsertPerBundle" >> beam.ParDo(_InsertPerBundle(self.project, self.dataset,
                                                                       self.endpoint, self.retry,
                                                                       self.stopping, self.fail_work_items))


class _GateSeries(beam.DoFn):
    """Per run: releases the points of its snapshots, so that each of the run's series has one
    writer, in time order, and no point sooner than ``min_interval_s`` after the last. A snapshot
    that the interval holds back waits, replaced by any later one, until the interval allows
    (while streaming) or the input ends (the end of a batch, a drain); one older than
    ``max_lag_s`` is history and is not written, unless ``latest_now``.

    While streaming, RELEASE fires once more ``min_interval_s`` after a release, and forgets the
    time of the last points if none came since: a run's state here lasts an interval past its
    last snapshot, and its timers with it. The state's coders are deterministic (the pending
    points as versioned JSON, ``encode_pending``), so that an update (``--update``) carries it."""

    PENDING = ReadModifyWriteStateSpec("pending", BytesCoder())  # encode_pending(as_of_us, points)
    LAST = ReadModifyWriteStateSpec("last_us", VarIntCoder())  # end time of the last points
    RELEASE = TimerSpec("release", TimeDomain.REAL_TIME)
    FINAL = TimerSpec("final", TimeDomain.WATERMARK)

    def __init__(self, settings: MonitoringSettings, streaming: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings, self.streaming, self.clock = settings, streaming, clock
        self.stale = Metrics.counter("goodput", "monitoring_stale_points_not_written")

    def process(self, element: tuple[str, Snapshot], window: Any = beam.DoFn.WindowParam,
                pending: Any = beam.DoFn.StateParam(PENDING), last: Any = beam.DoFn.StateParam(LAST),
                release: Any = beam.DoFn.TimerParam(RELEASE),
                final: Any = beam.DoFn.TimerParam(FINAL)) -> Iterator[Point]:
        snapshot = element[1]
        settings = self.settings
        points = snapshot_points(snapshot, settings.location, settings.cluster_name)
        earliest = self._earliest(last)
        if not self.streaming or (self._now_us() >= earliest and pending.read() is None):
            yield from self._release(snapshot.as_of_us, points, last, release)
            return
        if pending.read() is None:
            release.set(Timestamp(micros=earliest))
            final.set(window.max_timestamp())
        pending.write(encode_pending(snapshot.as_of_us, points))

    @on_timer(RELEASE)
    def on_release(self, pending: Any = beam.DoFn.StateParam(PENDING),
                   last: Any = beam.DoFn.StateParam(LAST), release: Any = beam.DoFn.TimerParam(RELEASE),
                   final: Any = beam.DoFn.TimerParam(FINAL)) -> Iterator[Point]:
        if pending.read() is not None:
            final.clear()
            yield from self._release_pending(pending, last, release)
        elif self._now_us() >= self._earliest(last):  # an interval after the last points: forget them
            last.clear()

    @on_timer(FINAL)
    def on_final(self, pending: Any = beam.DoFn.StateParam(PENDING),
                 last: Any = beam.DoFn.StateParam(LAST), release: Any = beam.DoFn.TimerParam(RELEASE)
                 ) -> Iterator[Point]:
        yield from self._release_pending(pending, last, release)

    def _release_pending(self, pending: Any, last: Any, release: Any) -> Iterator[Point]:
        held = pending.read()
        pending.clear()
        if held is not None:
            yield from self._release(*decode_pending(held), last, release)

    def _release(self, as_of_us: int, points: list[Point], last: Any, release: Any) -> Iterator[Point]:
        """The points stamped now, or as soon as the interval allows; none if they are history."""
        now_us = self._now_us()
        if (now_us - as_of_us) / 1e6 > self.settings.max_lag_s and not self.settings.latest_now:
            self.stale.inc(len(points))
            return
        end_us = max(now_us, self._earliest(last))
        last.write(end_us)
        if self.streaming:
            release.set(Timestamp(micros=self._earliest(last)))  # to forget end_us then
        for point in points:
            yield dataclasses.replace(point, end_us=end_us)

    def _earliest(self, last: Any) -> int:
        """When the run's next points may be stamped: ``min_interval_s`` after its last ones."""
        previous = last.read()
        return 0 if previous is None else previous + round(self.settings.min_interval_s * 1e6)

    def _now_us(self) -> int:
        return round(self.clock() * 1e6)


#: The version of ``encode_pending``'s layout.
PENDING_VERSION = 1


def encode_pending(as_of_us: int, points: list[Point]) -> bytes:
    """A snapshot's points held back by the gate, as deterministic, versioned JSON."""
    return json.dumps([PENDING_VERSION, as_of_us, [
        [p.metric, [list(label) for label in p.labels], p.run_id, p.location, p.value] for p in points]],
        separators=(",", ":")).encode()


def decode_pending(data: bytes) -> tuple[int, list[Point]]:
    version, as_of_us, points = json.loads(data)
    if version != PENDING_VERSION:
        raise ValueError(f"not a version {PENDING_VERSION} pending snapshot: version {version}")
    return as_of_us, [Point(metric, tuple((key, value) for key, value in labels), run_id, location, value)
                      for metric, labels, run_id, location, value in points]


class _WritePoints(beam.DoFn):
    """Writes a bundle's points when it finishes; outputs a ``DeadLetter`` for each point that was
    not written (refused, or, without ``fail_work_items``, its request failed after the retries),
    logged and counted. With ``fail_work_items`` a request that failed raises ``WriteFailed`` out
    of the bundle, and points the service already holds (the bundle's retry) are only counted."""

    def __init__(self, project: str, endpoint: str | None, settings: MonitoringSettings,
                 stopping: Stopping, fail_work_items: bool) -> None:
        self.project, self.endpoint, self.settings, self.stopping = project, endpoint, settings, stopping
        self.fail_work_items = fail_work_items
        self.refused = Metrics.counter("goodput", "monitoring_points_refused")
        self.already_written = Metrics.counter("goodput", "monitoring_points_already_written")
        self._points: list[Point] = []

    def setup(self) -> None:
        from pipeline.sinks.monitoring import MetricWriter, make_client

        settings = self.settings
        self._writer = MetricWriter(make_client(self.endpoint), self.project, settings.retry_deadline_s,
                                    settings.initial_backoff_s, settings.max_backoff_s,
                                    give_up=self.stopping, raise_failures=self.fail_work_items)

    def start_bundle(self) -> None:
        self._points = []

    def process(self, point: Point) -> None:
        self._points.append(point)

    def finish_bundle(self) -> Iterator[Any]:
        if not self._points:
            return
        letters: list[DeadLetter] = []
        points, self._points = self._points, []
        written_before = self._writer.already_written
        self.refused.inc(self._writer.write(
            points, lambda point, reason: letters.append(point_dead_letter(point, reason))))
        self.already_written.inc(self._writer.already_written - written_before)
        for letter in letters:
            yield GlobalWindows.windowed_value(letter)


class WriteToMonitoring(beam.PTransform):
    """Writes the reference's Cloud Monitoring metrics of every run from its snapshots (see
    ``pipeline.sinks.monitoring``), each run's series gated by ``_GateSeries``. The output is a
    ``DeadLetter`` for each point that was not written. With ``fail_work_items`` (Dataflow) a
    write whose request failed after the retries fails the bundle instead, and its retry writes
    the points (``MetricWriter`` says why the points the failed try wrote are neither refused
    into a loop nor dead letters); without it (the local runner) a stopping job (``stopping``)
    retries nothing."""

    def __init__(self, project: str, settings: MonitoringSettings, streaming: bool,
                 endpoint: str | None = None, stopping: Stopping = never,
                 fail_work_items: bool = False) -> None:
        super().__init__()
        self.project, self.settings, self.streaming, self.endpoint = project, settings, streaming, endpoint
        self.stopping, self.fail_work_items = stopping, fail_work_items

    def expand(self, snapshots: PCollection) -> Any:
        return (snapshots
                | "ByRun" >> beam.Map(lambda snapshot: (snapshot.run_id, snapshot)).with_output_types(
                    tuple[str, Snapshot])
                | "Gate" >> beam.ParDo(_GateSeries(self.settings, self.streaming))
                | "Write" >> beam.ParDo(_WritePoints(self.project, self.endpoint, self.settings,
                                                     self.stopping, self.fail_work_items)))
