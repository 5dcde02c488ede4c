"""The raw ``events`` table read back as messages: what a backfill replays and what a restarted
stream restores its runs from (``EventsTables``: a DuckDB file, or a BigQuery dataset).

Every event the pipeline accepted is a row of ``events`` (``pipeline.core.rows.event_rows``), kept
whole: ids within the table's limits, the body as JSON. Read back, one attempt's rows in
sequence order become messages again in the emitter's encoding, which the parser reads as it read
the originals, so a replay of the table gives every number the stream gave. A redelivered message
leaves its rows in the table twice; the repeats are dropped here (and would be by the engine).
The rows of a run whose id the pipeline derived (a workload's run, or one whose run id ends as a
derived id does: ``goodput_schemas.wire.workload_run_id``) hold that id; a backfill encodes the
messages of such a run under the name the job gave and its workload uid again, as ``run_metadata``
records them, so the replay derives the same run and its ``run_metadata`` names it as the original's.

    goodput replay --from_duckdb=live.duckdb --duckdb=backfill.duckdb
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from goodput_schemas import parse_dataset
from pipeline.core.events import Event, encode_events

#: Events per message read back: the emitter's default batch.
EVENTS_PER_MESSAGE = 1000
#: The columns a message is made of, in this order.
COLUMNS = "run_id, attempt_id, seq, epoch_us(event_time), kind, step, body"
BIGQUERY_COLUMNS = "run_id, attempt_id, seq, UNIX_MICROS(event_time), kind, step, body"
_FETCH_ROWS = 10_000
#: How far back in event time a stream that starts looks for runs it left unreported.
UNREPORTED_WITHIN_S = 7 * 86_400
#: (run_id, attempt_id) -> (the run id the job gave, its workload uid or ""), for attempts of a
#: run whose id the pipeline derived; and (run_id, "") -> those of the run's first attempt, for
#: an attempt whose job start is not in ``run_metadata`` (all of a run's are the same).
Workloads = Mapping[tuple[str, str], tuple[str, str]]
#: The attempts of a run whose id the pipeline derived, as ``run_metadata`` records them.
_WORKLOADS_SQL = ("SELECT DISTINCT run_id, attempt_id, run_name, workload_uid FROM run_metadata "
                 "WHERE run_name <> run_id ORDER BY run_id, attempt_id")


def messages(rows: Iterable[Sequence[Any]], source: str,
             workloads: Workloads | None = None) -> Iterator[tuple[str, bytes]]:
    """(source, message) for rows of ``COLUMNS``, ordered by run, attempt and seq; an attempt of
    a workload (``workloads``) encoded under the name the job gave, with the workload's uid."""
    own: list[Event] = []
    last: tuple[str, str, int] | None = None
    for run_id, attempt_id, seq, time_us, kind, step, body in rows:
        if (run_id, attempt_id, seq) == last:
            continue  # a redelivered message's row
        last = run_id, attempt_id, seq
        if own and ((own[-1].run_id, own[-1].attempt_id) != (run_id, attempt_id)
                    or len(own) == EVENTS_PER_MESSAGE):
            yield _message(own, source, workloads or {})
            own = []
        values = {"step": step} if kind == "step_start" else json.loads(body)
        own.append(Event(run_id, attempt_id, seq, time_us, kind, values))
    if own:
        yield _message(own, source, workloads or {})


def _message(events: list[Event], source: str, workloads: Workloads) -> tuple[str, bytes]:
    first = events[0]
    run_name, uid = workloads.get((first.run_id, first.attempt_id)) or workloads.get((first.run_id, ""),
                                                                                       ("", ""))
    return (f"{source}#{first.run_id}/{first.attempt_id}/{first.seq}",
            encode_events(events, run_name, uid))


def backfill_messages(path: str) -> Iterator[tuple[str, bytes]]:
    """The messages of every run in the ``events`` table of a DuckDB file that no process is
    writing, read in chunks."""
    from pipeline.sinks.duckdb import open_reader

    with open_reader(path) as connection:
        named = connection.execute("SELECT 1 FROM duckdb_columns() WHERE table_name = 'run_metadata' "
                                   "AND column_name = 'workload_uid'").fetchall()
        workloads: dict[tuple[str, str], tuple[str, str]] = {}
        for run_id, attempt_id, name, uid in connection.execute(_WORKLOADS_SQL).fetchall() if named else ():
            workloads[run_id, attempt_id] = (name, uid or "")
            workloads.setdefault((run_id, ""), (name, uid or ""))
        cursor = connection.execute(f"SELECT {COLUMNS} FROM events ORDER BY run_id, attempt_id, seq")
        yield from messages(_chunks(cursor), f"duckdb:{path}", workloads)


class EventsTables(abc.ABC):
    """The ``events`` and ``goodput_snapshots`` tables of a warehouse the pipeline writes, as a
    stream restores a run from them (``pipeline.beam.restore``). Picklable: a backend connects
    when it first reads."""

    #: Names the warehouse in logs, and the messages read back from it.
    source: str

    @abc.abstractmethod
    def run_ids(self) -> frozenset[str] | None:
        """Every run with a row in ``events``, when that is cheap to know; None where each run is
        looked up when the stream first sees it."""

    @abc.abstractmethod
    def run_history(self, run_id: str) -> tuple[list[tuple[str, bytes]], LatestSnapshot | None]:
        """The run's messages in ``events`` (none for a run it does not hold), and its latest
        snapshot in ``goodput_snapshots``, if it has one."""

    @abc.abstractmethod
    def unreported_runs(self, since_us: int) -> list[str]:
        """The runs with an event dated from ``since_us`` on whose latest event is later than
        their latest snapshot, or that have no snapshot: events a stream wrote to ``events`` and
        stopped before it reported (a snapshot is dated at or after the events it counts)."""


#: The figures of a run's latest cumulative snapshot that a restore compares with its restored
#: history's as of that time (``pipeline.beam.live``): where one differs, that snapshot did not
#: count every event the table now holds (a message written to ``events`` after it: read late, or
#: read by a stream that stopped before it reported it), and the run is reported again.
LATEST_FIGURES = ("missing_events", "last_step", "max_productive_step", "disruptions",
                  "productive_time_s", "total_time_s", "unaccounted_s")
_LATEST_COLUMNS = ", ".join(LATEST_FIGURES)


@dataclasses.dataclass(frozen=True)
class LatestSnapshot:
    """A run's latest snapshot in ``goodput_snapshots``: its time, and its ``LATEST_FIGURES``."""

    time_us: int
    figures: tuple[Any, ...]

    @classmethod
    def of(cls, rows: Sequence[Sequence[Any]]) -> LatestSnapshot | None:
        """From the rows of a query of its time (microseconds) and figures, the latest first."""
        if not rows or rows[0][0] is None:
            return None
        return cls(int(rows[0][0]), tuple(rows[0][1:]))

    def same_figures(self, row: Mapping[str, Any]) -> bool:
        """Whether ``row`` (a cumulative ``goodput_snapshots`` row) has these figures."""
        return all(_same(value, row[name]) for value, name in zip(self.figures, LATEST_FIGURES, strict=True))


def _same(mine: Any, theirs: Any) -> bool:
    """Equal, numbers as a warehouse's DOUBLE holds them."""
    numbers = (int, float)
    if isinstance(mine, numbers) and isinstance(theirs, numbers):
        return math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=1e-9)
    return bool(mine == theirs)


class DuckDBEvents(EventsTables):
    """The tables of a DuckDB file that this process may be writing too: read whole, under the
    lock its writers take (``pipeline.sinks.duckdb``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.source = f"duckdb:{path}"

    def run_ids(self) -> frozenset[str]:
        from pipeline.sinks.duckdb import opened

        if not Path(self.path).is_file():
            return frozenset()
        with opened(self.path) as sink:
            return frozenset(str(run_id) for run_id, in sink.query("SELECT DISTINCT run_id FROM events"))

    def run_history(self, run_id: str) -> tuple[list[tuple[str, bytes]], LatestSnapshot | None]:
        from pipeline.sinks.duckdb import opened

        with opened(self.path) as sink:
            rows = sink.query(f"SELECT {COLUMNS} FROM events WHERE run_id = ? ORDER BY attempt_id, seq",
                              [run_id])
            latest = sink.query(f"SELECT epoch_us(snapshot_time), {_LATEST_COLUMNS} "
                                "FROM goodput_snapshots WHERE run_id = ? AND window_s = 0 "
                                "ORDER BY snapshot_time DESC LIMIT 1", [run_id])
        return list(messages(rows, self.source)), LatestSnapshot.of(latest)

    def unreported_runs(self, since_us: int) -> list[str]:
        from pipeline.sinks.duckdb import opened

        if not Path(self.path).is_file():
            return []
        with opened(self.path) as sink:
            rows = sink.query(
                "SELECT e.run_id FROM (SELECT run_id, max(event_time) AS latest FROM events "
                "WHERE event_time >= make_timestamp(?::BIGINT) GROUP BY run_id) AS e "
                "LEFT JOIN (SELECT run_id, max(snapshot_time) AS reported FROM goodput_snapshots "
                "WHERE snapshot_time >= make_timestamp(?::BIGINT) GROUP BY run_id) AS g "
                "ON g.run_id = e.run_id WHERE g.reported IS NULL OR e.latest > g.reported ORDER BY e.run_id",
                [since_us, since_us])
        return [str(run_id) for run_id, in rows]


class BigQueryEvents(EventsTables):
    """The tables of a BigQuery dataset. Listing every run would scan the ``run_id`` column of the
    whole ``events`` table each time a worker starts: each run is looked up instead, when the
    stream first sees it, with two queries that read only that run's blocks (both tables are
    clustered by ``run_id``). A query waits at most ``timeout_s``, its retries included."""

    def __init__(self, project: str, dataset: str, endpoint: str | None = None,
                 timeout_s: float = 60.0) -> None:
        if parse_dataset(f"{project}.{dataset}") != (project, dataset):
            raise ValueError(f"not a BigQuery project and dataset: {project!r}, {dataset!r}")
        self.project, self.dataset, self.endpoint, self.timeout_s = project, dataset, endpoint, timeout_s
        self.source = f"bigquery:{project}.{dataset}"
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    def run_ids(self) -> None:
        return None

    def run_history(self, run_id: str) -> tuple[list[tuple[str, bytes]], LatestSnapshot | None]:
        dataset = f"{self.project}.{self.dataset}"
        rows = self._query(f"SELECT {BIGQUERY_COLUMNS} FROM `{dataset}.events` WHERE run_id = @run_id "
                           "ORDER BY attempt_id, seq", run_id=run_id)
        latest = self._query(f"SELECT UNIX_MICROS(snapshot_time), {_LATEST_COLUMNS} "
                             f"FROM `{dataset}.goodput_snapshots` WHERE run_id = @run_id AND window_s = 0 "
                             "ORDER BY snapshot_time DESC LIMIT 1", run_id=run_id)
        return list(messages(rows, self.source)), LatestSnapshot.of(latest)

    def unreported_runs(self, since_us: int) -> list[str]:
        dataset = f"{self.project}.{self.dataset}"
        rows = self._query(
            f"SELECT e.run_id FROM (SELECT run_id, MAX(event_time) AS latest FROM `{dataset}.events` "
            "WHERE event_time >= TIMESTAMP_MICROS(@since_us) GROUP BY run_id) AS e "
            f"LEFT JOIN (SELECT run_id, MAX(snapshot_time) AS reported FROM `{dataset}.goodput_snapshots` "
            "WHERE snapshot_time >= TIMESTAMP_MICROS(@since_us) GROUP BY run_id) AS g ON g.run_id = e.run_id "
            "WHERE g.reported IS NULL OR e.latest > g.reported ORDER BY e.run_id", since_us=since_us)
        return [str(run_id) for run_id, in rows]

    def _query(self, sql: str, **parameters: str | int) -> list[tuple[Any, ...]]:
        """The rows of ``sql``, its ``@`` parameters given by name (a str, or an int)."""
        from google.cloud import bigquery
        from google.cloud.bigquery.retry import DEFAULT_JOB_RETRY, DEFAULT_RETRY

        from pipeline.sinks.bigquery import make_client

        if self._client is None:
            self._client = make_client(self.project, self.endpoint)
        config = bigquery.QueryJobConfig(query_parameters=[
            bigquery.ScalarQueryParameter(name, "STRING" if isinstance(value, str) else "INT64", value)
            for name, value in parameters.items()])
        rows = self._client.query_and_wait(
            sql, job_config=config, api_timeout=self.timeout_s, wait_timeout=self.timeout_s,
            retry=DEFAULT_RETRY.with_timeout(self.timeout_s),
            job_retry=DEFAULT_JOB_RETRY.with_timeout(self.timeout_s))
        return [tuple(row) for row in rows]


def _chunks(cursor: Any) -> Iterator[Sequence[Any]]:
    while rows := cursor.fetchmany(_FETCH_ROWS):
        yield from rows
