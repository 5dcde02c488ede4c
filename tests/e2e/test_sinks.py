"""Sink faults: BigQuery and Cloud Monitoring throttling (429, RESOURCE_EXHAUSTED, 403
quotaExceeded), failing (5xx, UNAVAILABLE), refusing part of a request, or away for longer than
the retries last. Faults are injected into the local stand-ins and reach the sinks through the
real client libraries. What must hold: transient errors are retried with bounded, jittered
backoff; what still fails becomes a dead letter; nothing raises into the pipeline."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import apache_beam as beam
import grpc
import pytest
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from goodput_schemas import table_schema
from pipeline.beam.transforms import WriteToBigQuery, WriteToMonitoring
from pipeline.core.rows import dead_letter_row
from pipeline.emulators.bigquery import BigQueryEmulator, check_row
from pipeline.emulators.monitoring import MetricStore, MonitoringEmulator
from pipeline.sinks.bigquery import BigQueryWriter, create_tables
from pipeline.sinks.bigquery import make_client as bigquery_client
from pipeline.sinks.monitoring import (
    CUSTOM,
    REFERENCE,
    MetricWriter,
    MonitoringSettings,
    Point,
    point_dead_letter,
)
from pipeline.sinks.monitoring import make_client as monitoring_client
from pipeline.sinks.retries import backoff
from support.runs import snapshot_at

PROJECT, DATASET = "goodput-local", "goodput"
UTC = datetime.timezone.utc
NOW = datetime.datetime.now(UTC).replace(microsecond=0)
QUICK = {"initial_backoff_s": 0.01, "max_backoff_s": 0.05}  # backoff waits kept short in tests


# -- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture
def bigquery() -> Iterator[BigQueryEmulator]:
    with BigQueryEmulator() as started:
        create_tables(bigquery_client(PROJECT, started.endpoint), PROJECT, DATASET)
        yield started


@pytest.fixture
def monitoring() -> Iterator[MonitoringEmulator]:
    with MonitoringEmulator(store=MetricStore(min_interval_s=0.0)) as started:
        yield started


def bq_writer(emulator: BigQueryEmulator, deadline_s: float = 5.0, **options: Any) -> BigQueryWriter:
    return BigQueryWriter(bigquery_client(PROJECT, emulator.endpoint), PROJECT, DATASET,
                          retry_deadline_s=deadline_s, **{**QUICK, **options})


def gcm_writer(emulator: MonitoringEmulator, deadline_s: float = 5.0) -> MetricWriter:
    return MetricWriter(monitoring_client(emulator.host), PROJECT, retry_deadline_s=deadline_s, **QUICK)


def rows(emulator: BigQueryEmulator, table: str) -> list[dict[str, Any]]:
    return emulator.store.rows(PROJECT, DATASET, table)


def metadata(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": "a", "start_time": NOW, "chip_count": 8}


def points(count: int, run_id: str = "run-1") -> list[Point]:
    """``count`` series of one metric, stamped now."""
    end_us = round(NOW.timestamp() * 1e6)
    return [Point(CUSTOM + "goodput_pct", (("accelerator_type", f"acc-{i}"),), run_id, "global", 50.0,
                  end_us) for i in range(count)]


# -- the stand-ins' fault hooks ---------------------------------------------------------------------

def test_bigquery_stand_in_fails_whole_requests_with_the_given_status_and_reason(bigquery):
    """fail_next answers the next requests with the status and BigQuery's reason for it, then recovers."""
    from google.api_core import exceptions

    client = bigquery_client(PROJECT, bigquery.endpoint)
    table = f"{PROJECT}.{DATASET}.run_metadata"
    row = {"run_id": "r", "attempt_id": "a", "start_time": "2026-11-01T08:00:00Z"}
    for status, error, reason in (
            (HTTPStatus.TOO_MANY_REQUESTS, exceptions.TooManyRequests, "rateLimitExceeded"),
            (HTTPStatus.FORBIDDEN, exceptions.Forbidden, "quotaExceeded"),
            (HTTPStatus.INTERNAL_SERVER_ERROR, exceptions.InternalServerError, "backendError")):
        bigquery.store.fail_next(1, status)
        with pytest.raises(error) as raised:
            client.insert_rows_json(table, [row], retry=None)
        assert raised.value.errors[0]["reason"] == reason
    assert rows(bigquery, "run_metadata") == []
    assert client.insert_rows_json(table, [row], retry=None) == []


def test_bigquery_stand_in_rejects_the_next_rows_one_by_one(bigquery):
    """reject_rows_next rejects that many valid rows with the reason and keeps the rest."""
    client = bigquery_client(PROJECT, bigquery.endpoint)
    table = f"{PROJECT}.{DATASET}.run_metadata"
    bigquery.store.reject_rows_next(2, "backendError")
    sent = [{"run_id": f"r{i}", "attempt_id": "a", "start_time": "2026-11-01T08:00:00Z"} for i in range(3)]
    errors = client.insert_rows_json(table, sent, skip_invalid_rows=True, retry=None)
    assert [(e["index"], e["errors"][0]["reason"]) for e in errors] == [(0, "backendError"),
                                                                        (1, "backendError")]
    assert [r["run_id"] for r in rows(bigquery, "run_metadata")] == ["r2"]


def test_monitoring_stand_in_refuses_the_next_series_and_keeps_the_others(monitoring):
    """refuse_next refuses that many series as a partial failure; fail_next fails whole calls."""
    from google.api_core import exceptions

    client = monitoring_client(monitoring.host)
    monitoring.store.refuse_next(1, "Injected: quota of series per resource")
    series = [MetricWriter(client, PROJECT)._series(point) for point in points(3)]
    with pytest.raises(exceptions.InvalidArgument, match=r"timeSeries\[0\]: Injected: quota"):
        client.create_time_series(name=f"projects/{PROJECT}", time_series=series, retry=None)
    assert len(monitoring.store.points(CUSTOM + "goodput_pct")) == 2
    monitoring.store.fail_next(1, grpc.StatusCode.PERMISSION_DENIED)
    with pytest.raises(exceptions.PermissionDenied):
        client.create_time_series(name=f"projects/{PROJECT}", time_series=series[:1], retry=None)


# -- BigQuery -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "reason"), [
    (HTTPStatus.SERVICE_UNAVAILABLE, None), (HTTPStatus.INTERNAL_SERVER_ERROR, None),
    (HTTPStatus.TOO_MANY_REQUESTS, None), (HTTPStatus.FORBIDDEN, "quotaExceeded"),
    (HTTPStatus.FORBIDDEN, "rateLimitExceeded"),
])
def test_bigquery_transient_errors_and_quotas_are_retried(bigquery, status, reason):
    """5xx, 429 and a quota's 403 are retried until the rows are in their table."""
    bigquery.store.fail_next(2, status, reason)
    before = bigquery.store.insert_requests
    assert bq_writer(bigquery).write({"run_metadata": [metadata("run-1")]}) == 0
    assert bigquery.store.insert_requests - before == 3
    assert [r["run_id"] for r in rows(bigquery, "run_metadata")] == ["run-1"]
    assert rows(bigquery, "dead_letter") == []


def test_bigquery_outage_past_the_deadline_dead_letters_then_hands_back(bigquery):
    """An outage longer than the retries: no exception, each row handed back once, time bounded."""
    bigquery.store.fail_next(10_000)
    unwritten: list[tuple[str, dict[str, Any], str]] = []
    started = time.monotonic()
    dead = bq_writer(bigquery, deadline_s=0.3).write(
        {"run_metadata": [metadata(f"run-{i}") for i in range(3)], "dead_letter": []},
        lambda *failure: unwritten.append(failure))
    assert time.monotonic() - started < 3.0  # two deadlines (rows, then their dead letters) and slack
    assert dead == 3 and len(unwritten) == 3
    assert {row["run_id"] for _, row, _ in unwritten} == {"run-0", "run-1", "run-2"}
    assert all(table == "dead_letter" and "Injected failure: backendError" in reason
               for table, _, reason in unwritten)
    for _, row, _ in unwritten:  # each one a valid dead_letter row, with the original row inside
        assert check_row(table_schema("dead_letter"), row, False)[1] == []
        assert row["source"] == "bigquery:run_metadata" and '"attempt_id": "a"' in row["payload"]


def test_bigquery_outage_shorter_than_the_deadline_loses_nothing(bigquery):
    """A few seconds' worth of failures within the deadline: every row ends in its table."""
    bigquery.store.fail_next(6, HTTPStatus.SERVICE_UNAVAILABLE)
    writer = bq_writer(bigquery, deadline_s=10.0)
    assert writer.write({"run_metadata": [metadata("run-1")], "disruptions": []}) == 0
    assert len(rows(bigquery, "run_metadata")) == 1


def test_bigquery_missing_table_sends_its_rows_to_dead_letter(bigquery):
    """A request refused for good (404) is not retried: its rows land in dead_letter with the reason."""
    writer = bq_writer(bigquery)
    before = bigquery.store.insert_requests
    assert writer.write({"no_such_table": [metadata("run-1")], "run_metadata": [metadata("run-2")]}) == 1
    assert bigquery.store.insert_requests - before == 3  # one each, and one for the dead letter
    (letter,) = rows(bigquery, "dead_letter")
    assert letter["source"] == "bigquery:no_such_table" and letter["run_id"] == "run-1"
    assert "Not found: Table" in letter["reason"]
    assert [r["run_id"] for r in rows(bigquery, "run_metadata")] == ["run-2"]


def test_bigquery_rows_rejected_transiently_are_retried(bigquery):
    """Per-row backendError: those rows alone are sent again (same insert ids) and land in their table."""
    bigquery.store.reject_rows_next(2, "backendError")
    assert bq_writer(bigquery).write({"run_metadata": [metadata(f"run-{i}") for i in range(3)]}) == 0
    assert sorted(r["run_id"] for r in rows(bigquery, "run_metadata")) == ["run-0", "run-1", "run-2"]
    assert rows(bigquery, "dead_letter") == []


def test_bigquery_rows_rejected_for_good_go_to_dead_letter(bigquery):
    """A per-row 'invalid', or a transient reason on every attempt, makes a dead letter; the rest is kept."""
    bigquery.store.reject_rows_next(1, "invalid")
    assert bq_writer(bigquery).write({"run_metadata": [metadata("run-0"), metadata("run-1")]}) == 1
    bigquery.store.reject_rows_next(3, "backendError")  # every one of the three attempts
    assert bq_writer(bigquery, row_attempts=3).write({"run_metadata": [metadata("run-2")]}) == 1
    assert sorted(r["run_id"] for r in rows(bigquery, "run_metadata")) == ["run-1"]
    letters = rows(bigquery, "dead_letter")
    assert [(r["run_id"], r["reason"]) for r in letters] == [
        ("run-0", "BigQuery rejected the row: Injected rejection: invalid"),
        ("run-2", "BigQuery rejected the row: Injected rejection: backendError")]


def test_bigquery_backoff_is_jittered_and_bounded(bigquery):
    """Waits are drawn at random below a ceiling that doubles up to max_backoff_s."""
    writer = bq_writer(bigquery, initial_backoff_s=1.0, max_backoff_s=8.0)
    assert (writer.initial_backoff_s, writer.max_backoff_s, writer.retry_deadline_s) == (1.0, 8.0, 5.0)
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for _ in range(20):
        waits = [wait for wait, _ in zip(backoff(1.0, 8.0), ceilings, strict=False)]
        assert all(0.0 <= wait <= ceiling for wait, ceiling in zip(waits, ceilings, strict=True))
    assert len({next(backoff(1.0, 8.0)) for _ in range(10)}) > 1


def test_bigquery_failures_never_stop_a_beam_pipeline(bigquery):
    """WriteToBigQuery with BigQuery down: the pipeline finishes and outputs the rows as dead letters."""
    bigquery.store.fail_next(10_000)
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:  # the batch replay's runner
        failed = (pipeline
                  | beam.Create([("run_metadata", metadata("run-1")), ("run_metadata", metadata("run-2"))])
                  | WriteToBigQuery(PROJECT, DATASET, bigquery.endpoint, retry_deadline_s=0.2, **QUICK)
                  | beam.Map(lambda element: (element[0], element[1]["run_id"], element[1]["source"])))
        assert_that(failed, equal_to([("dead_letter", "run-1", "bigquery:run_metadata"),
                                      ("dead_letter", "run-2", "bigquery:run_metadata")]))


def test_bigquery_inserts_a_large_bundle_in_parts(bigquery, monkeypatch):
    """A bundle is inserted every FLUSH_ROWS rows, not held whole: bounded memory on a batch runner."""
    from pipeline.beam.transforms import _InsertPerBundle

    monkeypatch.setattr(_InsertPerBundle, "FLUSH_ROWS", 2)
    before = bigquery.store.insert_requests
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        _ = (pipeline
             | beam.Create([("run_metadata", metadata(f"run-{i}")) for i in range(5)])
             | WriteToBigQuery(PROJECT, DATASET, bigquery.endpoint, retry_deadline_s=5.0, **QUICK))
    assert bigquery.store.insert_requests - before == 3
    assert sorted(r["run_id"] for r in rows(bigquery, "run_metadata")) == [f"run-{i}" for i in range(5)]


# -- Cloud Monitoring -------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_monitoring_transient_errors_and_quotas_are_retried(monitoring, code):
    """UNAVAILABLE, RESOURCE_EXHAUSTED (a 429 quota), INTERNAL, DEADLINE_EXCEEDED: retried until written."""
    monitoring.store.fail_next(2, code)
    before = monitoring.store.requests
    assert gcm_writer(monitoring).write(points(3)) == 0
    assert monitoring.store.requests - before == 3
    assert len(monitoring.store.points(CUSTOM + "goodput_pct")) == 3


def test_monitoring_outage_past_the_deadline_is_counted_and_dead_lettered(monitoring):
    """An outage longer than the deadline: no exception, every point handed back, one deadline in all."""
    monitoring.store.fail_next(10_000)
    failures: list[tuple[Point, str]] = []
    sent = points(450)  # three requests: the later ones do not wait a deadline each
    started = time.monotonic()
    writer = gcm_writer(monitoring, deadline_s=0.3)
    assert writer.write(sent, lambda *failure: failures.append(failure)) == 450
    assert time.monotonic() - started < 2.0
    assert sorted(p.labels for p, _ in failures) == sorted(p.labels for p in sent)
    assert all("Cloud Monitoring write failed" in reason for _, reason in failures)
    row = dead_letter_row(point_dead_letter(*failures[0]), NOW)
    assert check_row(table_schema("dead_letter"), {**row, "received_time": NOW.isoformat()}, False)[1] == []
    assert (row["source"], row["run_id"]) == ("monitoring:" + CUSTOM + "goodput_pct", "run-1")


def test_monitoring_permanent_errors_are_not_retried(monitoring):
    """PERMISSION_DENIED is tried once; its points are handed back with the reason."""
    monitoring.store.fail_next(1, grpc.StatusCode.PERMISSION_DENIED)
    failures: list[tuple[Point, str]] = []
    before = monitoring.store.requests
    assert gcm_writer(monitoring).write(points(2), lambda *failure: failures.append(failure)) == 2
    assert monitoring.store.requests - before == 1
    assert all("Injected failure: PERMISSION_DENIED" in reason for _, reason in failures)


def test_monitoring_partial_failure_writes_the_rest_and_hands_back_the_refused(monitoring):
    """Series refused inside a request are dead-lettered by index; the others are written."""
    monitoring.store.refuse_next(2, "Injected: too many series on this resource")
    failures: list[tuple[Point, str]] = []
    sent = points(5)
    assert gcm_writer(monitoring).write(sent, lambda *failure: failures.append(failure)) == 2
    assert [p for p, _ in failures] == sent[:2]
    assert len(monitoring.store.points(CUSTOM + "goodput_pct")) == 3


def test_monitoring_a_partial_failure_of_a_whole_request_names_ranges_the_client_reads(monitoring):
    """All 200 series of a request refused: the error names them as a range (timeSeries[0-199]),
    as the service does, so it fits gRPC's trailing metadata and the client reads it; each point
    is dead-lettered, none written."""
    from google.api_core import exceptions

    client = monitoring_client(monitoring.host)
    monitoring.store.refuse_next(200, "Injected: " + "a long reason " * 20)
    series = [MetricWriter(client, PROJECT)._series(point) for point in points(200)]
    with pytest.raises(exceptions.InvalidArgument, match=r"timeSeries\[0-199\]: Injected"):
        client.create_time_series(name=f"projects/{PROJECT}", time_series=series, retry=None)
    monitoring.store.refuse_next(200, "Injected: " + "a long reason " * 20)
    failures: list[tuple[Point, str]] = []
    assert gcm_writer(monitoring).write(points(200), lambda *failure: failures.append(failure)) == 200
    assert len(failures) == 200 and not monitoring.store.points(CUSTOM + "goodput_pct")


def test_monitoring_an_answer_the_client_cannot_read_is_dead_lettered_not_raised(monitoring):
    """An error whose details contradict its code makes the client raise ValueError, not an API
    error: the writer dead-letters the request's points and goes on with the next request."""
    monitoring.store.garble_next(1)
    failures: list[tuple[Point, str]] = []
    sent = points(250)  # two requests: the first garbled, the second written
    assert gcm_writer(monitoring).write(sent, lambda *failure: failures.append(failure)) == 200
    assert [p for p, _ in failures] == sent[:200]
    assert "doesn't match status code" in failures[0][1]
    assert len(monitoring.store.points(CUSTOM + "goodput_pct")) == 50


def test_monitoring_a_point_the_client_cannot_encode_is_dead_lettered_alone(monitoring):
    """An int beyond int64 is not sent (the client would raise); the other points are written."""
    failures: list[tuple[Point, str]] = []
    huge = dataclasses.replace(points(1)[0], metric=REFERENCE + "max_productive_steps", value=2**70)
    assert gcm_writer(monitoring).write([huge, *points(2)], lambda *failure: failures.append(failure)) == 1
    assert failures[0][0] == huge and "not a valid point" in failures[0][1]
    assert len(monitoring.store.points(CUSTOM + "goodput_pct")) == 2


def test_monitoring_failures_never_stop_a_beam_pipeline(monitoring):
    """WriteToMonitoring with the service down: the pipeline finishes and outputs dead-letter rows."""
    monitoring.store.fail_next(10_000)
    settings = MonitoringSettings(min_interval_s=0.0, latest_now=True, retry_deadline_s=0.2, **QUICK)
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:  # the batch replay's runner
        letters = (pipeline
                   | beam.Create([snapshot_at(NOW, "run-1", accelerator_type="v5p")])
                   | WriteToMonitoring(PROJECT, settings, streaming=False, endpoint=monitoring.host)
                   | beam.Map(lambda letter: (letter.run_id, letter.source.split(":")[0])))
        assert_that(letters, lambda got: _all_dead_letters_of(got, "run-1"))
    assert monitoring.store.points(REFERENCE + "goodput_time") == []


def _all_dead_letters_of(got: list[tuple[str, str]], run_id: str) -> None:
    assert got and set(got) == {(run_id, "monitoring")}, got


def test_a_replay_keeps_the_points_monitoring_refused_as_dead_letters(monitoring, tmp_path):
    """The batch pipeline with Cloud Monitoring refusing every write finishes, and the points are
    rows of the dead_letter table beside the snapshots."""
    import duckdb

    from pipeline.beam.launcher import run

    start_us = round(NOW.timestamp() * 1e6) - 600_000_000
    events = [{"seq": 0, "time_us": start_us, "job_start": {"accelerator_type": "v5p", "chip_count": 8}}]
    events += [{"seq": 1 + i, "time_us": start_us + i * 10_000_000, "step_start": {"step": i}}
               for i in range(30)]
    path, database = tmp_path / "events.jsonl", tmp_path / "goodput.duckdb"
    path.write_text(json.dumps({"schema_version": 1, "run_id": "run-1", "attempt_id": "a", "events": events}))
    monitoring.store.fail_next(10_000, grpc.StatusCode.PERMISSION_DENIED)
    assert run([f"--events={path}", f"--duckdb={database}", f"--monitoring_project={PROJECT}",
                f"--monitoring_endpoint={monitoring.host}", "--monitoring_latest_now"]) == 0
    with duckdb.connect(str(database), read_only=True) as connection:
        letters = connection.execute("SELECT source, run_id, reason FROM dead_letter").fetchall()
        snapshots = connection.execute("SELECT count(*) FROM goodput_snapshots").fetchone()
    assert snapshots and snapshots[0] > 0
    assert letters and all(source.startswith("monitoring:") and run_id == "run-1"
                           and "PERMISSION_DENIED" in reason for source, run_id, reason in letters)
    assert {source for source, _, _ in letters} >= {"monitoring:" + REFERENCE + "goodput_time"}
