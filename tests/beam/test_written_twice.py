"""Rows written twice: the README's replay run again into its own file, a stream started again
over the messages it read, and rows a retried or repeated write left twice in a warehouse change
no table, view or saved query, and nothing the report shows.

Each test reads everything a reader can of a file (``readings``) before and after, through the
readers' own connection (``open_reader``): every table, every view of ``goodput_schemas/views``,
every saved query, and the data the report draws (``pipeline.app.report._read``), as text
(``support.text.canonical``).
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline

from goodput_schemas import saved_queries, table_names, views
from pipeline.app.alerts import AlertThresholds
from pipeline.app.cli import main
from pipeline.app.fleet_sql import DUCKDB_DATASET, run_saved
from pipeline.app.report import _read
from pipeline.beam.live import TrackRunsLive
from pipeline.beam.restore import UnreportedRuns
from pipeline.beam.transforms import DeadLetterRows, ParseEvents, SnapshotRows, WriteToDuckDB
from pipeline.core.events import parse_batch
from pipeline.core.rows import batch_rows
from pipeline.sinks.duckdb import create_table_sql, open_reader, opened
from pipeline.sinks.raw_events import DuckDBEvents
from support.beam import keyed_stream, streaming_options
from support.runs import FLEET, as_run, messages, recorded, with_configs_and_metrics
from support.text import canonical

T = datetime.datetime(2026, 11, 1, 8, tzinfo=datetime.timezone.utc)
#: A message no reader can parse: a dead letter in every replay of the file.
BAD_LINE = b'{"schema_version": 1, "run_id": "run-a"}'
#: What a reader may find empty in the fleet's file: the tables imports fill (goodput import
#: capacity, gke-metrics) and what reads only them, the queries of runs whose books do not balance
#: or that need attention (none does), and the anomalies (none need be found in these runs;
#: ``test_a_row_with_null_in_its_key_is_written_once`` writes one twice). The checks below hold
#: for them too, but say nothing.
EMPTY = {"capacity", "jobset_metrics", "latest_jobset_metrics", "query capacity_goodput",
         "query jobset_goodput", "query unbalanced_books", "query stalled_or_regressed",
         "run_anomalies", "latest_anomalies"}


@pytest.fixture(scope="module")
def fleet_lines() -> list[bytes]:
    """The fleet's messages (a restart, a rollback, sparse steps; checkpoints, evals), its runs
    in one run group, each with user configs of its own and metrics, a NaN among them; and a
    bad line."""
    events = [event for number, (run_id, name) in enumerate(sorted(FLEET.items()))
              for event in with_configs_and_metrics(as_run(recorded(name)[0], run_id),
                                                    {"optimizer.lr": f"0.{number + 1}", "model": "llama"})]
    grouped = [dataclasses.replace(event, body={**event.body, "run_group": "llama"})
               if event.kind == "job_start" else event for event in events]
    return [*messages(grouped, 100), BAD_LINE]


def readings(database: Path) -> dict[str, Any]:
    """Everything a reader reads of the file, by name: each table's and view's rows, each saved
    query's result, and what the report shows."""
    connection = open_reader(database)
    try:
        read: dict[str, Any] = {}
        for name in (*table_names(), *views(DUCKDB_DATASET)):
            rows = connection.execute(f'SELECT * FROM "{name}"').fetchall()
            read[name] = sorted(map(canonical, rows))
        for name in saved_queries(DUCKDB_DATASET):
            columns, rows = run_saved(name, connection)
            read[f"query {name}"] = (columns, sorted(map(canonical, rows)))
        read["report"] = canonical(dataclasses.asdict(_read(connection, AlertThresholds())))
    finally:
        connection.close()
    return read


def assert_all_read_something(read: dict[str, Any]) -> None:
    """Every table, view and saved query of the fleet's file has rows, but those of ``EMPTY``."""
    empty = {name for name, rows in read.items()
             if name != "report" and not (rows[1] if name.startswith("query ") else rows)}
    assert empty <= EMPTY, empty - EMPTY


def test_the_readmes_replay_run_twice_into_one_file_changes_nothing(fleet_lines, tmp_path):
    """goodput replay of the same file into the DuckDB file it wrote before adds no row to any
    table, and leaves every view, saved query and figure of the report as they were."""
    events, database = tmp_path / "events.jsonl", tmp_path / "goodput.duckdb"
    events.write_bytes(b"".join(line + b"\n" for line in fleet_lines))
    assert main(["replay", f"--events={events}", f"--duckdb={database}"]) == 0
    once = readings(database)
    assert_all_read_something(once)
    assert main(["replay", f"--events={events}", f"--duckdb={database}"]) == 0
    twice = readings(database)
    for name in once:
        assert twice[name] == once[name], name


def test_a_replay_at_an_earlier_as_of_adds_its_snapshots_and_no_event(fleet_lines, tmp_path):
    """Replayed again as of an earlier time, the file gains that time's snapshots, not one raw
    event, run or config more; the latest_* views still show the latest snapshots."""
    events, database = tmp_path / "events.jsonl", tmp_path / "goodput.duckdb"
    events.write_bytes(b"".join(line + b"\n" for line in fleet_lines))
    assert main(["replay", f"--events={events}", f"--duckdb={database}"]) == 0
    latest = readings(database)
    assert main(["replay", f"--events={events}", f"--duckdb={database}", "--as_of=2026-11-01T08:05:00Z"]) == 0
    earlier = readings(database)
    for name in ("events", "run_metadata", "run_configs", "model_metrics", "dead_letter",
                 "latest_goodput", "latest_badput"):
        assert earlier[name] == latest[name], name
    assert len(earlier["goodput_snapshots"]) > len(latest["goodput_snapshots"])


def stream(lines: list[bytes], database: Path) -> None:
    """The stream's graph (``pipeline.beam.graph``) on ``lines`` (published at 0, read at
    processing time 0, on a clock that says 0), as a stream launched with ``--duckdb=database``
    runs it: runs it holds no state for restored from the file's raw events, the runs the file
    left unreported reported at its start, the rows of every message, snapshot and dead letter
    written to the file; then 31 s on (the snapshot timer fires at 30 s), then the end of the
    input."""
    tables = DuckDBEvents(str(database))
    elements = [(f"message-{number}", line) for number, line in enumerate(lines)]
    test_stream = keyed_stream().add_elements(elements).advance_processing_time(31)
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        parsed = pipeline | test_stream | ParseEvents()
        unreported = pipeline | UnreportedRuns(tables, clock=lambda: 0.0)
        tracked = ((parsed.events, unreported) | beam.Flatten()
                   | TrackRunsLive((300,), 30.0, 10_000.0, 600.0, clock=lambda: 0.0, tables=tables))
        tracked.snapshots | "SnapshotRows" >> SnapshotRows() | "Snapshots" >> WriteToDuckDB(str(database))
        (parsed.events | "InputRows" >> beam.FlatMap(lambda keyed: batch_rows(keyed[1]))
         | "Inputs" >> WriteToDuckDB(str(database)))
        ((parsed.dead_letter, tracked.dead_letter) | "AllDeadLetters" >> beam.Flatten() | DeadLetterRows()
         | "DeadLetters" >> WriteToDuckDB(str(database)))


def test_a_stream_started_again_over_the_same_messages_changes_nothing(fleet_lines, tmp_path):
    """A stream stopped once it had read and reported every message, then started again on its
    file with every message delivered again (a subscription sought back), restores each run from
    the file's raw events and adds no row to any table: every view, saved query and figure of the
    report stays as it was."""
    database = tmp_path / "goodput.duckdb"
    stream(fleet_lines, database)
    once = readings(database)
    assert_all_read_something(once)
    stream(fleet_lines, database)
    twice = readings(database)
    for name in once:
        assert twice[name] == once[name], name


def test_a_message_the_file_holds_that_no_snapshot_counted_is_reported_when_it_comes_again(
        fleet_lines, tmp_path):
    """A stream that wrote a message's events to the file and stopped before it reported them,
    the message having come late (the run's latest snapshot is later than its events), then the
    message delivered again to the next stream: the run, restored with it, is reported again, and
    its latest snapshot counts it. (Before, a restored run whose latest snapshot was later than
    all its events was taken to be reported, and its gap stayed.)"""
    database = tmp_path / "goodput.duckdb"
    lines = [line for line in fleet_lines if parse_batch(line)[0] is not None]
    late = next(line for line in lines[len(lines) // 2:] if parse_batch(line)[0].run_id == "run-a")
    run_id = parse_batch(late)[0].run_id

    def latest_missing() -> int:
        with opened(database) as sink:
            [(missing,)] = sink.query("SELECT missing_events FROM goodput_snapshots WHERE run_id = ? "
                                      "AND window_s = 0 ORDER BY snapshot_time DESC LIMIT 1", [run_id])
        return int(missing)

    stream([line for line in lines if line is not late], database)
    assert latest_missing() > 0
    with opened(database) as sink:
        sink.write_events([parse_batch(late)[0]])
    stream([late], database)
    assert latest_missing() == 0


def test_rows_a_warehouse_holds_twice_count_once_in_every_view_and_saved_query(fleet_lines, tmp_path):
    """Every row of every table written twice, as BigQuery holds rows that a retried insert
    wrote after its de-duplication window, or a replay run twice: each view and saved query
    reads what it read of the file with each row once."""
    events, database = tmp_path / "events.jsonl", tmp_path / "goodput.duckdb"
    events.write_bytes(b"".join(line + b"\n" for line in fleet_lines))
    assert main(["replay", f"--events={events}", f"--duckdb={database}"]) == 0
    once = readings(database)
    doubled = tmp_path / "doubled.duckdb"
    with_every_row_twice(database, doubled)
    twice = readings(doubled)
    for name in once:
        if name in table_names() or name == "report":
            continue  # the tables hold every row twice; the report reads a DuckDB file, never doubled
        assert twice[name] == once[name], name


def with_every_row_twice(database: Path, doubled: Path) -> None:
    """A copy of ``database`` in which every table holds each of its rows twice."""
    import duckdb

    with duckdb.connect(str(doubled)) as connection:
        connection.execute("ATTACH ? AS original (READ_ONLY)", [str(database)])
        for name in table_names():
            connection.execute(create_table_sql(name))
            connection.execute(f'INSERT INTO "{name}" SELECT * FROM original."{name}" '
                               f'UNION ALL SELECT * FROM original."{name}"')


def test_a_row_with_null_in_its_key_is_written_once(tmp_path):
    """An anomaly's row (its host NULL: the whole run's) written again, alone and beside a new
    one, is in the table once; the new one is written."""
    found = {"run_id": "run-a", "kind": "hang", "host": None, "started_at": T, "detected_at": T,
             "ended_at": None, "changed_at": T, "baseline_step_s": 1.0, "observed_step_s": 60.0,
             "lost_s": 59.0}
    later = T + datetime.timedelta(minutes=5)
    ended = {**found, "ended_at": later, "changed_at": later}
    with opened(tmp_path / "goodput.duckdb") as sink:
        assert sink.write("run_anomalies", [found]) == 1
        assert sink.write("run_anomalies", [found, found]) == 0
        assert sink.write("run_anomalies", [found, ended]) == 1
        assert sink.query("SELECT count(*), count(ended_at) FROM run_anomalies") == [(2, 1)]


def test_both_copies_of_a_conflicting_duplicate_are_kept_once(tmp_path):
    """Two different events under one id (a producer's bug) are both in the events table, as the
    engine needs them to resolve the conflict again in a backfill; each written again is not."""
    first = {"run_id": "run-a", "attempt_id": "a", "seq": 2, "event_time": T, "kind": "step_start",
             "step": 2, "body": None}
    conflicting = {**first, "event_time": T + datetime.timedelta(microseconds=1), "step": 40}
    with opened(tmp_path / "goodput.duckdb") as sink:
        assert sink.write("events", [first, conflicting]) == 2
        assert sink.write("events", [conflicting, first]) == 0
        assert sink.query("SELECT step FROM events ORDER BY step") == [(2,), (40,)]
