"""The pipeline's composite transforms, each a named step Dataflow can match on update.

``ParseEvents`` validates messages and routes rejects to a dead-letter output; ``TrackRuns``
keys events by run and computes each run's snapshot with the engine; ``WriteToDuckDB`` appends
every output row to a DuckDB file.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import AsSingleton, PCollection

from pipeline import engine
from pipeline.events import Batch, parse_batch
from pipeline.rows import DEAD_LETTER, Row, dead_letter_row, snapshot_rows

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


def _run_rows(element: tuple[str, Iterable[Batch]], as_of_us: int | None,
              windows_s: tuple[int, ...], exclusions: tuple[tuple[int, int], ...]
              ) -> Iterator[tuple[str, Row]]:
    run_id, batches = element
    state = engine.RunState(run_id)
    for batch in batches:
        state.add_batch(batch)
    if as_of_us is None:
        return
    snapshot = state.snapshot(as_of_us, windows_s, exclusions)
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
                | "Snapshot" >> beam.FlatMap(_run_rows, AsSingleton(as_of, default_value=None),
                                             self.windows_s, self.exclusions))


class _WriteAll(beam.DoFn):
    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, element: tuple[int, Iterable[tuple[str, Row]]]) -> None:
        from pipeline.duckdb_sink import append

        by_table: dict[str, list[Row]] = {}
        for table, row in element[1]:
            by_table.setdefault(table, []).append(row)
        append(self.path, by_table)


Sink = Callable[[dict[str, list[Row]]], object]


class _WritePerBundle(beam.DoFn):
    """Buffers a bundle's rows by table and hands them to a sink when the bundle finishes."""

    def __init__(self, open_sink: Callable[[], Sink]) -> None:
        self.open_sink = open_sink
        self._rows: dict[str, list[Row]] = {}

    def setup(self) -> None:
        self._sink = self.open_sink()

    def start_bundle(self) -> None:
        self._rows = {}

    def process(self, element: tuple[str, Row]) -> None:
        table, row = element
        self._rows.setdefault(table, []).append(row)

    def finish_bundle(self) -> None:
        if self._rows:
            self._sink(self._rows)
            self._rows = {}


def _duckdb_appender(path: str) -> Sink:
    from pipeline.duckdb_sink import append

    return functools.partial(append, path)


def _bigquery_writer(project: str, dataset: str, endpoint: str | None) -> Sink:
    from pipeline.bigquery_sink import BigQueryWriter, make_client

    return BigQueryWriter(make_client(project, endpoint), project, dataset).write


class WriteToBigQuery(beam.PTransform):
    """Appends (table, row) pairs to the output tables of a BigQuery dataset, each bundle's rows
    in a few streaming inserts; rows BigQuery rejects land in its ``dead_letter`` table (see
    ``pipeline.bigquery_sink``)."""

    def __init__(self, project: str, dataset: str, endpoint: str | None = None) -> None:
        super().__init__()
        self.open_sink = functools.partial(_bigquery_writer, project, dataset, endpoint)

    def expand(self, rows: PCollection) -> Any:
        return rows | "InsertPerBundle" >> beam.ParDo(_WritePerBundle(self.open_sink))


class WriteToDuckDB(beam.PTransform):
    """Appends (table, row) pairs to a DuckDB file.

    DuckDB has one writer per file: a batch pipeline gathers every row to one writer; a
    streaming one appends each bundle's rows as the bundle finishes, opening the file only for
    the write, so that readers can open it between writes. (On Dataflow the sinks are BigQuery
    and Cloud Monitoring; DuckDB is the local stand-in.)
    """

    def __init__(self, path: str, streaming: bool = False) -> None:
        super().__init__()
        self.path = path
        self.streaming = streaming

    def expand(self, rows: PCollection) -> Any:
        if self.streaming:
            return rows | "AppendPerBundle" >> beam.ParDo(
                _WritePerBundle(functools.partial(_duckdb_appender, self.path)))
        return (rows
                | "OneWriter" >> beam.WithKeys(lambda _: 0)
                | "Gather" >> beam.GroupByKey()
                | "Append" >> beam.ParDo(_WriteAll(self.path)))
