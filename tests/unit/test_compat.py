"""The reference's read API over hand-made tables: ``emitter.goodput`` and ``emitter.monitoring``.

The interval query is the difference of cumulative snapshots at the bounds; ``GoodputMonitor``
starts nothing; the signatures and enums are the reference's."""

from __future__ import annotations

import datetime
import inspect
import json
import logging
import multiprocessing
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
from ml_goodput_measurement.src import goodput as reference_goodput

from emitter import goodput, monitoring
from emitter.goodput import BadputType
from pipeline.sinks.duckdb import DuckDBSink

UTC = datetime.timezone.utc
T = datetime.datetime(2026, 11, 1, 8, tzinfo=UTC)


# -- the interval query ---------------------------------------------------------------------------


def snapshot(database: DuckDBSink, seconds: float, productive_s: float, total_s: float, disruptions: int,
             max_step: int, badput_s: dict[str, float]) -> None:
    """Writes one cumulative snapshot of run "hand" at T + seconds."""
    at = T + datetime.timedelta(seconds=seconds)
    database.write("goodput_snapshots", [{
        "run_id": "hand", "snapshot_time": at, "window_s": 0, "window_start": T, "window_end": at,
        "goodput_pct": 100 * productive_s / total_s, "productive_time_s": productive_s,
        "total_time_s": total_s, "disruptions": disruptions, "max_productive_step": max_step,
        "last_step": max_step, "chip_count": 0, "productive_chip_s": 0.0, "total_chip_s": 0.0,
        "ended": False}])
    database.write("badput_snapshots", [
        {"run_id": "hand", "snapshot_time": at, "window_s": 0, "badput_source": source, "seconds": value,
         "pct": 100 * value / total_s} for source, value in badput_s.items()])


@pytest.fixture
def hand(tmp_path: Path) -> Path:
    """Snapshots at T+100 s, T+200 s and T+300 s of a run that started at T."""
    path = tmp_path / "hand.duckdb"
    database = DuckDBSink(path)
    snapshot(database, 100, 50, 100, 0, 40, {"TPU_INITIALIZATION": 30, "OTHER": 20})
    snapshot(database, 200, 120, 200, 1, 90,
             {"TPU_INITIALIZATION": 30, "OTHER": 10, "CUSTOM_BADPUT_EVENTS.EVAL": 15,
              "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 25})
    snapshot(database, 300, 200, 300, 1, 130,
             {"TPU_INITIALIZATION": 30, "OTHER": 20, "CUSTOM_BADPUT_EVENTS.EVAL": 25,
              "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 25})
    database.close()
    return path


def at(seconds: float) -> datetime.datetime:
    return T + datetime.timedelta(seconds=seconds)


def test_interval_is_the_difference_of_the_snapshots_at_the_bounds(hand: Path):
    """[T+150, T+250] uses the snapshots at T+100 and T+200: 70 of 100 s productive."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    goodput_pct, breakdown, max_step, total_s, disruptions = calculator.get_job_goodput_interval(
        at(150), at(250))
    assert (goodput_pct, max_step, total_s, disruptions) == (pytest.approx(70.0), 90, 100.0, 1)
    assert breakdown[BadputType.CUSTOM_BADPUT_EVENTS] == {"EVAL": pytest.approx(15.0)}
    assert breakdown[BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == pytest.approx(25.0)
    assert breakdown[BadputType.TPU_INITIALIZATION] == 0.0
    assert breakdown[BadputType.OTHER] == 0.0  # shrank from 20 to 10 s: clamped, as the reference does


def test_interval_bounds_on_snapshots_are_exact(hand: Path):
    """A bound at a snapshot time uses that snapshot: [T+200, T+300] is 80 of 100 s."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    goodput_pct, breakdown, max_step, total_s, disruptions = calculator.get_job_goodput_interval(
        at(200), at(300))
    assert (goodput_pct, max_step, total_s, disruptions) == (pytest.approx(80.0), 130, 100.0, 0)
    assert breakdown[BadputType.OTHER] == pytest.approx(10.0)
    assert breakdown[BadputType.CUSTOM_BADPUT_EVENTS] == {"EVAL": pytest.approx(10.0)}


def test_interval_from_before_the_run_counts_from_its_start(hand: Path):
    """With no snapshot before the interval, the run counts from its start: 120 of 200 s."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    goodput_pct, _, _, total_s, disruptions = calculator.get_job_goodput_interval(at(-50), at(250))
    assert (goodput_pct, total_s, disruptions) == (pytest.approx(60.0), 200.0, 1)


def test_interval_without_data_raises_value_error(hand: Path):
    """As the reference: an interval with nothing to measure raises ValueError."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    with pytest.raises(ValueError, match="no goodput snapshot"):
        calculator.get_job_goodput_interval(at(-50), at(50))
    with pytest.raises(ValueError, match="no elapsed time"):
        calculator.get_job_goodput_interval(at(210), at(290))  # one snapshot for both bounds
    with pytest.raises(ValueError, match="timezone-aware"):
        calculator.get_job_goodput_interval(at(0).replace(tzinfo=None), at(250))


# -- BigQuery ---------------------------------------------------------------------------------------


# DuckDB's column types as the BigQuery API names them in a query response's schema.
BIGQUERY_TYPES = {"VARCHAR": "STRING", "BIGINT": "INTEGER", "DOUBLE": "FLOAT", "BOOLEAN": "BOOLEAN",
                  "TIMESTAMP": "TIMESTAMP"}


class QueryStandIn(BaseHTTPRequestHandler):
    """Serves BigQuery's ``jobs.query`` over a DuckDB file, for the real client.

    The project's BigQuery stand-in serves tables and insertAll, not queries, so this one answers
    the one request ``Client.query_and_wait`` sends: the SQL must parse as BigQuery's dialect
    (sqlglot transpiles it), every value must arrive as a typed query parameter, and the rows go
    back in the API's format for the client to convert.
    """

    database: Path
    requests: list[dict[str, Any]]
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(request)
        parameters = {p["name"]: self._value(p["parameterType"]["type"], p["parameterValue"]["value"])
                      for p in request.get("queryParameters", [])}
        sql = re.sub(r"`[a-z0-9-]+\.[a-z0-9_]+\.([a-z_]+)`", r"\1", request["query"])
        with duckdb.connect(str(self.database), read_only=True) as connection:
            local = sqlglot.transpile(sql, read="bigquery", write="duckdb")[0]
            cursor = connection.execute(local, parameters)
            fields = [{"name": d[0], "type": BIGQUERY_TYPES[str(d[1])], "mode": "NULLABLE"}
                      for d in cursor.description]
            rows = [{"f": [{"v": self._cell(v)} for v in row]} for row in cursor.fetchall()]
        body = json.dumps({"kind": "bigquery#queryResponse", "jobComplete": True, "rows": rows,
                           "totalRows": str(len(rows)), "schema": {"fields": fields}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    @staticmethod
    def _value(kind: str, text: str) -> Any:
        if kind == "TIMESTAMP":
            return datetime.datetime.fromisoformat(text).astimezone(UTC).replace(tzinfo=None)
        return {"INT64": int, "FLOAT64": float, "STRING": str}[kind](text)

    @staticmethod
    def _cell(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, datetime.datetime):  # useInt64Timestamp: microseconds
            return str((value.replace(tzinfo=UTC) - datetime.datetime(1970, 1, 1, tzinfo=UTC))
                       // datetime.timedelta(microseconds=1))
        return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.fixture
def bigquery_client(hand: Path) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """The real BigQuery client, pointed at a jobs.query stand-in over the hand-written snapshots."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    requests: list[dict[str, Any]] = []
    handler = type("Handler", (QueryStandIn,), {"database": hand, "requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield bigquery.Client(project="goodput-local", credentials=AnonymousCredentials(),
                              client_options=ClientOptions(
                                  api_endpoint=f"http://127.0.0.1:{server.server_address[1]}")), requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_bigquery_dataset_is_read_with_parameterized_queries(hand: Path, bigquery_client: Any):
    """Through the real client, the same answers from BigQuery as from DuckDB, every value a parameter."""
    client, requests = bigquery_client
    calculator = goodput.GoodputCalculator("hand", bigquery_dataset="goodput-local.goodput",
                                           bigquery_client=client)
    local = goodput.GoodputCalculator("hand", duckdb_path=hand)
    assert calculator.get_job_goodput(True) == local.get_job_goodput(True)
    assert calculator.get_job_goodput_interval(at(150), at(250)) == local.get_job_goodput_interval(
        at(150), at(250))
    assert calculator.get_job_goodput_details() == local.get_job_goodput_details()
    for request in requests:
        assert "`goodput-local.goodput." in request["query"] and "hand" not in request["query"]
        assert request["useLegacySql"] is False
        assert {"name": "run_id", "parameterType": {"type": "STRING"},
                "parameterValue": {"value": "hand"}} in request["queryParameters"]
    hostile = goodput.GoodputCalculator("x' OR '1'='1", bigquery_dataset="goodput-local:goodput",
                                        bigquery_client=client)
    with pytest.raises(ValueError, match="no goodput snapshot"):
        hostile.get_job_goodput()
    with pytest.raises(ValueError, match=r"PROJECT\.DATASET"):
        goodput.GoodputCalculator("hand", bigquery_dataset="p.d`; DROP TABLE x; --")


# -- the monitor ------------------------------------------------------------------------------------


def test_monitor_calls_are_harmless_and_log_once(caplog: pytest.LogCaptureFixture, capsys: Any):
    """Every start and stop returns at once, starts no process or thread, and one INFO line says why."""
    threads = threading.active_count()
    monitor = monitoring.GoodputMonitor(
        job_name="run", logger_name="goodput_run", tensorboard_dir="/nonexistent/tb", upload_interval=30,
        monitoring_enabled=True, include_badput_breakdown=True, include_step_deviation=True,
        configured_ideal_step_time=1.5, gcp_options=monitoring.GCPOptions(project_id="p"))
    with caplog.at_level(logging.INFO, logger="emitter.monitoring"):
        monitor.start_goodput_uploader()
        monitor.start_step_deviation_uploader()
        monitor.start_rolling_window_goodput_uploader([60, 300])
        monitor.stop_rolling_window_goodput_uploader()
        monitor.stop_step_deviation_uploader(skip_final_flush=True)
        monitor.stop_goodput_uploader()
    assert threading.active_count() == threads and multiprocessing.active_children() == []
    messages = [r for r in caplog.records if r.name == "emitter.monitoring"]
    assert len(messages) == 1 and "central" in messages[0].getMessage()
    assert capsys.readouterr() == ("", "")
    assert not Path("/nonexistent/tb").exists()


def test_elastic_monitor_takes_the_reference_arguments(caplog: pytest.LogCaptureFixture):
    """The elastic monitor accepts its reference signature and starts nothing either."""
    monitor = monitoring.ElasticGoodputMonitor("run", "goodput_run", "/nonexistent/tb", 30,
                                               monitoring_enabled=True, include_slice_efficiency=True)
    with caplog.at_level(logging.INFO, logger="emitter.monitoring"):
        monitor.start_goodput_uploader()
        monitor.stop_goodput_uploader()
    assert monitor.pathway_enabled and monitor.include_slice_efficiency
    assert len([r for r in caplog.records if r.name == "emitter.monitoring"]) == 1


# -- the swap is one import -------------------------------------------------------------------------


def parameters(function: Any) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


@pytest.mark.parametrize("dotted", [
    "goodput.GoodputCalculator.get_job_goodput",
    "goodput.GoodputCalculator.get_job_goodput_interval",
    "goodput.GoodputRecorder.record_step_start_time",
    "goodput_elastic.ElasticGoodputRecorder.record_elastic_slice_counts",
    "monitoring.GoodputMonitor.__init__",
    "monitoring.GoodputMonitor.start_rolling_window_goodput_uploader",
    "monitoring.GoodputMonitor.stop_goodput_uploader",
    "monitoring_elastic.ElasticGoodputMonitor.__init__",
    "goodput_utils.GCPOptions.__init__",
])
def test_signatures_are_the_references(dotted: str):
    """The entry points a user calls take the reference's parameters, in its order."""
    import importlib

    def resolve(package: str) -> Any:
        module, *attributes = dotted.split(".")
        value: Any = importlib.import_module(f"{package}.{module}")
        for attribute in attributes:
            value = getattr(value, attribute)
        return value

    assert parameters(resolve("emitter")) == parameters(resolve("ml_goodput_measurement.src"))


def test_calculator_takes_the_reference_constructor_arguments_first():
    """GoodputCalculator's positional parameters are the reference's; where to read comes after."""
    theirs = parameters(reference_goodput.GoodputCalculator.__init__)
    assert parameters(goodput.GoodputCalculator.__init__)[:len(theirs)] == theirs


def test_enums_have_the_references_names_and_values():
    """BadputType and GoodputType: the same members with the same values."""
    from ml_goodput_measurement.src import goodput_utils as reference_utils

    from emitter import goodput_utils

    for ours, theirs in ((goodput_utils.BadputType, reference_utils.BadputType),
                         (goodput_utils.GoodputType, reference_utils.GoodputType)):
        assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]


def test_reads_a_file_this_process_is_writing(tmp_path: Path):
    """A calculator in the process that holds the DuckDB file open (a sink) still reads it."""
    sink = DuckDBSink(tmp_path / "open.duckdb")
    try:
        snapshot(sink, 100, 50, 100, 0, 40, {"OTHER": 50})
        goodput_pct, _, max_step = goodput.GoodputCalculator(
            "hand", duckdb_path=tmp_path / "open.duckdb").get_job_goodput()
    finally:
        sink.close()
    assert (goodput_pct, max_step) == (pytest.approx(50.0), 40)
