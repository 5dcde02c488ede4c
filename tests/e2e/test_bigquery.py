"""The BigQuery sink and the local BigQuery stand-in, through the real ``google-cloud-bigquery``
client: the stand-in's insertAll rules, the sink's requests and dead letters, and the batch
replay writing the same rows to BigQuery as to DuckDB."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import duckdb
import pytest
from google.api_core import exceptions

from goodput_schemas import parse_dataset, table_names, table_options, views
from pipeline.app.cli import main
from pipeline.emulators.bigquery import BigQueryEmulator
from pipeline.sinks.bigquery import BigQueryWriter, create_tables, make_client
from pipeline.sinks.raw_events import BigQueryEvents, DuckDBEvents
from support import REPO

PROJECT, DATASET = "goodput-local", "goodput"
UTC = datetime.timezone.utc
T = datetime.datetime(2026, 11, 1, 8, tzinfo=UTC)
#: Tables no replay writes: an import fills them (goodput import gke-metrics, goodput import capacity).
IMPORTED_TABLES = frozenset({"jobset_metrics", "capacity"})


@pytest.fixture
def emulator() -> Iterator[BigQueryEmulator]:
    with BigQueryEmulator() as started:
        yield started


@pytest.fixture
def client(emulator: BigQueryEmulator) -> Any:
    client = make_client(PROJECT, emulator.endpoint)
    create_tables(client, PROJECT, DATASET)
    return client


def dead_letter(emulator: BigQueryEmulator) -> list[dict[str, Any]]:
    return emulator.store.rows(PROJECT, DATASET, "dead_letter")


def letter(source: str = "file:1") -> dict[str, Any]:
    return {"received_time": T, "source": source, "run_id": "run-1", "reason": "bad", "payload": "{}"}


def test_tables_are_created_from_the_schemas_with_partitioning_and_clustering(client, emulator):
    for name in table_names():
        table = client.get_table(f"{PROJECT}.{DATASET}.{name}")
        partitioning = table.time_partitioning
        assert (partitioning and partitioning.field) == table_options(name)["partition_field"]
        assert table.clustering_fields == table_options(name)["cluster"]
    assert [f.name for f in client.get_table(f"{PROJECT}.{DATASET}.dead_letter").schema] == [
        "received_time", "source", "run_id", "reason", "payload"]
    prices = emulator.store.rows(PROJECT, DATASET, "accelerator_prices")
    assert {"accelerator_type": "v5p", "usd_per_chip_hour": 4.2} in [
        {k: row[k] for k in ("accelerator_type", "usd_per_chip_hour")} for row in prices]
    peaks = emulator.store.rows(PROJECT, DATASET, "accelerator_peaks")
    assert {"accelerator_type": "v5p", "bf16_tflops_per_chip": 459.0} in [
        {k: row[k] for k in ("accelerator_type", "bf16_tflops_per_chip")} for row in peaks]
    create_tables(client, PROJECT, DATASET)  # again: nothing to do, no error, no second seed
    assert emulator.store.rows(PROJECT, DATASET, "accelerator_prices") == prices
    assert emulator.store.rows(PROJECT, DATASET, "accelerator_peaks") == peaks


def test_insert_all_checks_each_row_against_the_schema(client, emulator):
    table = f"{PROJECT}.{DATASET}.dead_letter"
    rows = [{"received_time": "2026-11-01T08:00:00Z", "reason": "r", "payload": "p"},
            {"received_time": "2026-11-01T08:00:00Z", "reason": "r", "payload": "p", "colour": "red"},
            {"received_time": "yesterday", "reason": "r", "payload": "p"},
            {"received_time": "2026-11-01T08:00:00Z", "payload": "p"}]
    errors = client.insert_rows_json(table, rows)  # one bad row stops the request
    assert [(e["index"], e["errors"][0]["reason"]) for e in errors] == [
        (0, "stopped"), (1, "invalid"), (2, "invalid"), (3, "invalid")]
    assert "no such field: colour" in errors[1]["errors"][0]["message"]
    assert "Cannot convert value to timestamp" in errors[2]["errors"][0]["message"]
    assert "Missing required field: reason" in errors[3]["errors"][0]["message"]
    assert dead_letter(emulator) == []
    errors = client.insert_rows_json(table, rows, skip_invalid_rows=True)
    assert [e["index"] for e in errors] == [1, 2, 3]
    assert [row["received_time"] for row in dead_letter(emulator)] == [T]


def test_insert_all_limits_retries_and_insert_ids(client, emulator):
    table = f"{PROJECT}.{DATASET}.dead_letter"
    row = {"received_time": "2026-11-01T08:00:00Z", "reason": "r", "payload": "p"}
    with pytest.raises(exceptions.BadRequest, match="too many rows"):
        client.insert_rows_json(table, [row] * 50_001)
    with pytest.raises(exceptions.BadRequest, match="payload size exceeds the limit"):
        client.insert_rows_json(table, [{**row, "payload": "x" * 1_000_000}] * 11)
    with pytest.raises(exceptions.NotFound, match="no_such_table"):
        client.insert_rows_json(f"{PROJECT}.{DATASET}.no_such_table", [row])
    emulator.store.fail_next(2, HTTPStatus.SERVICE_UNAVAILABLE)
    before = emulator.store.insert_requests
    assert client.insert_rows_json(table, [row, row], row_ids=["a", "b"]) == []  # retried
    assert emulator.store.insert_requests - before == 3
    assert client.insert_rows_json(table, [row], row_ids=["a"]) == []  # a duplicate of "a"
    assert len(dead_letter(emulator)) == 2


def test_insert_all_takes_a_request_of_exactly_ten_mebibytes(client, emulator):
    """An insertAll body of 10,485,760 bytes is served; one byte more is refused whole with the
    front end's 400 "Request payload size exceeds the limit: 10485760 bytes."."""
    path = f"/projects/{PROJECT}/datasets/{DATASET}/tables/dead_letter/insertAll"

    def body(size: int) -> str:  # ten rows of about 1 MB: each under BigQuery's 10 MB per row
        rows = [{"json": {"received_time": "2026-11-01T08:00:00Z", "reason": "r", "payload": "x" * 1_000_000}}
                for _ in range(10)]
        rows[-1]["json"]["payload"] += "x" * (size - len(json.dumps({"rows": rows})))
        return json.dumps({"rows": rows})

    def insert(size: int) -> Any:
        return client._connection.api_request(method="POST", path=path, data=body(size),
                                              content_type="application/json")

    assert "insertErrors" not in insert(10 * 1024 * 1024)
    assert len(dead_letter(emulator)) == 10
    with pytest.raises(exceptions.BadRequest) as refused:
        insert(10 * 1024 * 1024 + 1)
    assert refused.value.message.endswith(": Request payload size exceeds the limit: 10485760 bytes.")
    assert len(dead_letter(emulator)) == 10


def test_queries_take_parameters_and_come_back_in_pages_as_from_bigquery(client, emulator):
    """The client's query_and_wait against the stand-in: named parameters of each type, a result
    of several pages (jobs.query, then jobs.get and jobs.getQueryResults), BigQuery's types back,
    and the errors BigQuery gives for a missing table or parameter, or SQL that does not parse."""
    from google.cloud import bigquery

    rows = [{"run_id": f"run-{i % 3}", "attempt_id": "a", "seq": i, "kind": "step_start", "step": i,
             "event_time": (T + datetime.timedelta(seconds=i)).isoformat(), "body": None}
            for i in range(3000)]
    assert not client.insert_rows_json(f"{PROJECT}.{DATASET}.events", rows)
    parameters = [bigquery.ScalarQueryParameter("run", "STRING", "run-1"),
                  bigquery.ScalarQueryParameter("after", "TIMESTAMP", T + datetime.timedelta(seconds=99)),
                  bigquery.ScalarQueryParameter("half", "FLOAT64", 0.5),
                  bigquery.ArrayQueryParameter("kinds", "STRING", ["step_start", "job_end"])]
    result = client.query_and_wait(
        f"SELECT seq, event_time, UNIX_MICROS(event_time) AS us, step * @half AS half, step > 600 AS late "
        f"FROM `{PROJECT}.{DATASET}.events` WHERE run_id = @run AND event_time > @after "
        "AND kind IN UNNEST(@kinds) ORDER BY seq",
        job_config=bigquery.QueryJobConfig(query_parameters=parameters), page_size=300)
    got = [tuple(row) for row in result]
    assert len(got) == 967 and result.total_rows == 967  # seq 100, 103, ..., 2998: four pages
    assert got[0] == (100, T + datetime.timedelta(seconds=100), round(T.timestamp() * 1e6) + 100_000_000,
                      50.0, False)
    assert got[-1][0] == 2998 and got[-1][3:] == (1499.0, True)
    [(count, latest)] = client.query_and_wait(
        "SELECT COUNT(*), MAX(event_time) FROM events",
        job_config=bigquery.QueryJobConfig(default_dataset=f"{PROJECT}.{DATASET}"))
    assert (count, latest) == (3000, T + datetime.timedelta(seconds=2999))
    for sql, error, message in [
            (f"SELECT * FROM {DATASET}.nothing", exceptions.NotFound, "Not found: Table"),
            (f"SELECT @none FROM {DATASET}.events", exceptions.BadRequest, "parameter 'none' not found"),
            ("SELEC 1", exceptions.BadRequest, "Syntax error"),
            ("SELECT * FROM events", exceptions.BadRequest, "must be qualified with a dataset")]:
        with pytest.raises(error, match=message):
            client.query_and_wait(sql)


def test_views_are_created_as_terraform_creates_them_and_read_as_their_query(client, emulator):
    """create_tables makes every view of goodput_schemas/views/; a query reads one as the subquery
    it stands for (its dataset its own, whatever the query's default); a view is refused rows, and a
    view of a table that does not exist is refused."""
    from google.cloud import bigquery

    for name in views(DATASET):
        assert client.get_table(f"{PROJECT}.{DATASET}.{name}").table_type == "VIEW"
    snapshots = [{"run_id": "r", "snapshot_time": (T + datetime.timedelta(minutes=i)).isoformat(),
                  "window_s": 0, "window_start": T.isoformat(),
                  "window_end": (T + datetime.timedelta(minutes=i)).isoformat(), "goodput_pct": 10.0 * i,
                  "productive_time_s": 0.0, "total_time_s": 60.0 * i, "disruptions": 0,
                  "max_productive_step": 0, "productive_chip_s": 0.0, "total_chip_s": 0.0, "chip_count": 8,
                  "ended": False} for i in (1, 2)]
    assert not client.insert_rows_json(f"{PROJECT}.{DATASET}.goodput_snapshots", snapshots)
    [(goodput,)] = client.query_and_wait(
        "SELECT l.goodput_pct FROM latest_goodput AS l WHERE l.window_s = 0",
        job_config=bigquery.QueryJobConfig(default_dataset=f"{PROJECT}.{DATASET}"))
    assert goodput == 20.0
    [(runtime,)] = client.query_and_wait(
        f"SELECT runtime_goodput FROM `{PROJECT}.{DATASET}.run_productivity_factors`")
    assert runtime == pytest.approx(0.2)
    with pytest.raises(exceptions.BadRequest, match="is a view"):
        client.insert_rows_json(f"{PROJECT}.{DATASET}.latest_goodput", [{"run_id": "r"}])
    view = bigquery.Table(f"{PROJECT}.{DATASET}.later")
    view.view_query = f"SELECT * FROM `{PROJECT}.{DATASET}.nothing`"
    with pytest.raises(exceptions.NotFound, match="Not found: Table"):
        client.create_table(view)


def test_a_capacity_import_overlapping_one_in_the_dataset_writes_nothing(client, emulator, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]):
    """goodput import capacity reads the spans already in the dataset: one overlapping them is
    refused, naming them, and the table keeps what it held; the same span again is imported."""
    csv = tmp_path / "capacity.csv"
    command = ["import", "capacity", "--csv", str(csv), "--bigquery_dataset", f"{PROJECT}:{DATASET}",
               "--bigquery_endpoint", emulator.endpoint]
    header = "accelerator_type,location,start_time,end_time,chips\n"
    csv.write_text(header + "v5p,us-a,2026-11-01T00:00:00Z,2026-11-03T00:00:00Z,8\n")
    assert main(command) == 0
    csv.write_text(header + "v5p,us-a,2026-11-02T00:00:00Z,2026-11-04T00:00:00Z,8\n")
    capsys.readouterr()
    assert main(command) == 1
    assert (f"line 2: its span overlaps the one imported to {PROJECT}:{DATASET} before, from "
            "2026-11-01T00:00:00Z to 2026-11-03T00:00:00Z (v5p in us-a)") in capsys.readouterr().err
    assert [row["chips"] for row in emulator.store.rows(PROJECT, DATASET, "capacity")] == [8]
    csv.write_text(header + "v5p,us-a,2026-11-01T00:00:00Z,2026-11-03T00:00:00Z,16\n")
    assert main(command) == 0
    assert [row["chips"] for row in emulator.store.rows(PROJECT, DATASET, "capacity")] == [8, 16]


def test_writer_routes_rejected_rows_to_dead_letter(client, emulator):
    writer = BigQueryWriter(client, PROJECT, DATASET, retry_deadline_s=10)
    good = {"run_id": "run-1", "attempt_id": "a", "start_time": T, "chip_count": 8}
    bad = {"run_id": "run-2", "attempt_id": "a", "start_time": T, "chip_count": "eight"}
    assert writer.write({"run_metadata": [good, bad], "dead_letter": [letter()]}) == 1
    assert [r["run_id"] for r in emulator.store.rows(PROJECT, DATASET, "run_metadata")] == ["run-1"]
    letters = dead_letter(emulator)
    assert letters[0]["source"] == "file:1"
    rejected = letters[1]
    assert (rejected["source"], rejected["run_id"]) == ("bigquery:run_metadata", "run-2")
    assert "Cannot convert value to int64" in rejected["reason"] and '"eight"' in rejected["payload"]


def test_writer_splits_requests_retries_and_is_idempotent(client, emulator):
    writer = BigQueryWriter(client, PROJECT, DATASET, retry_deadline_s=10)
    letters = [letter(f"file:{i}") for i in range(1_200)]
    before = emulator.store.insert_requests
    emulator.store.fail_next(1)
    assert writer.write({"dead_letter": letters}) == 0
    assert emulator.store.insert_requests - before == 4  # 500 + 500 + 200, one retried
    writer.write({"dead_letter": letters[:10]})  # a retried bundle: deduplicated by insert id
    assert len(dead_letter(emulator)) == 1_200


def test_writer_hands_back_what_it_cannot_write_when_the_tables_are_missing(emulator):
    """No table at all: nothing raises; the rows come back as dead letters not written."""
    writer = BigQueryWriter(make_client(PROJECT, emulator.endpoint), PROJECT, DATASET)
    unwritten: list[tuple[str, dict[str, Any], str]] = []
    assert writer.write({"dead_letter": [letter()]}, lambda *failure: unwritten.append(failure)) == 1
    ((table, row, reason),) = unwritten
    assert (table, row["source"], row["run_id"]) == ("dead_letter", "bigquery:dead_letter", "run-1")
    assert "Not found: Table" in reason and '"source": "file:1"' in row["payload"]


def test_dataset_option_is_checked():
    assert parse_dataset("goodput-local:d") == parse_dataset("goodput-local.d") == ("goodput-local", "d")
    assert parse_dataset("example.com:my-project.d") == ("example.com:my-project", "d")
    with pytest.raises(ValueError, match="PROJECT:DATASET"):
        parse_dataset("just-a-dataset")


def test_batch_replay_writes_the_same_rows_to_bigquery_and_duckdb(tmp_path: Path, emulator):
    env = dict(os.environ)
    events = tmp_path / "events.jsonl"
    subprocess.run([sys.executable, "-m", "pipeline.demo.simulated_job", "--output", str(events),
                    "--steps", "300", "--hang-at", "0.9"],  # a crash and a hang: every table has rows
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
    with events.open("a") as out:
        out.write("not json\n")
    database = tmp_path / "goodput.duckdb"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", f"--events={events}", f"--duckdb={database}",
         f"--bigquery_dataset={PROJECT}:{DATASET}", f"--bigquery_endpoint={emulator.endpoint}",
         "--bigquery_create_tables"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(database), read_only=True) as connection:
        for table in sorted(set(table_names()) - IMPORTED_TABLES):
            cursor = connection.execute(f'SELECT * FROM "{table}"')
            columns = [c[0] for c in cursor.description]
            local = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            remote = emulator.store.rows(PROJECT, DATASET, table)
            assert local, table
            assert sorted(map(comparable, remote)) == sorted(map(comparable, local)), table
    # A stream restores a run from either warehouse: the same messages, the same latest snapshot.
    warehouses = BigQueryEvents(PROJECT, DATASET, emulator.endpoint), DuckDBEvents(str(database))
    run_ids = {row["run_id"] for row in emulator.store.rows(PROJECT, DATASET, "events")}
    assert run_ids and warehouses[1].run_ids() == run_ids and warehouses[0].run_ids() is None
    for run_id in [*run_ids, "no-such-run"]:
        (remote_messages, remote_at), (local_messages, local_at) = (w.run_history(run_id) for w in warehouses)
        assert [m for _, m in remote_messages] == [m for _, m in local_messages]
        assert remote_at == local_at and (remote_at is None) == (run_id == "no-such-run")
    # Every run is reported; then events of a run that no snapshot counts (a stream stopped before
    # it reported them): both warehouses name it, and only it, to a stream that starts.
    assert [w.unreported_runs(0) for w in warehouses] == [[], []]
    late = {"run_id": "late-run", "attempt_id": "a", "seq": 0, "event_time": "2026-11-01T08:00:00Z",
            "kind": "step_start", "step": 0, "body": json.dumps({"step": 0})}
    emulator.store.insert_all(PROJECT, DATASET, "events", {"rows": [{"json": late}]})
    with duckdb.connect(str(database)) as connection:
        connection.execute("INSERT INTO events VALUES ('late-run', 'a', 0, TIMESTAMP '2026-11-01 08:00:00', "
                           "'step_start', 0, ?)", [late["body"]])
    since = round(datetime.datetime(2026, 11, 1, 8, tzinfo=UTC).timestamp() * 1e6)
    assert [w.unreported_runs(0) for w in warehouses] == [["late-run"], ["late-run"]]
    assert [w.unreported_runs(since + 1) for w in warehouses] == [[], []]


def comparable(row: dict[str, Any]) -> str:
    """A row as text, timestamps as naive UTC (as DuckDB returns them), received times dropped."""
    values = {name: value.astimezone(UTC).replace(tzinfo=None)
              if isinstance(value, datetime.datetime) and value.tzinfo else value
              for name, value in row.items() if name != "received_time"}
    return repr(sorted(values.items()))


def test_a_write_backing_off_gives_up_as_soon_as_the_job_stops(client, emulator):
    """BigQuery fails every request: a write backs off for up to its two minutes, but stops
    retrying within a fraction of a second once ``give_up()`` turns true (a stream stopping);
    what it could not write comes back."""
    emulator.store.fail_next(100_000)
    stop_at = time.monotonic() + 1.0
    writer = BigQueryWriter(client, PROJECT, DATASET, initial_backoff_s=5.0,
                            give_up=lambda: time.monotonic() >= stop_at)
    unwritten: list[tuple[str, dict[str, Any], str]] = []
    assert writer.write({"dead_letter": [letter()]}, lambda *failure: unwritten.append(failure)) == 1
    assert time.monotonic() - stop_at < 0.5
    ((_, _, reason),) = unwritten
    assert "the job is stopping" in reason
