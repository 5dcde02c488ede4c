"""The reference's read API over the pipeline's tables: ``emitter.goodput`` and ``emitter.monitoring``.

``GoodputCalculator`` must answer from the tables exactly what ``latest_goodput``/``latest_badput``
hold, in the reference's shapes and types, and on events where the reference is right, the same
numbers as the reference's own ``GoodputCalculator`` within 0.01 percentage points. The interval
query is the difference of cumulative snapshots at the bounds; ``GoodputMonitor`` starts nothing.
"""

from __future__ import annotations

import datetime
import inspect
import json
import logging
import multiprocessing
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
from ml_goodput_measurement.src import goodput as reference_goodput
from reference_harness import Call, TraceBuilder, record_ours, reference_log

from emitter import goodput, monitoring
from emitter.goodput import BadputType
from goodput_schemas.wire import encode_batch
from pipeline.core.events import Event
from pipeline.sinks.duckdb import DuckDBSink

REPO = Path(__file__).resolve().parent.parent
TOLERANCE_PP = 0.01
UTC = datetime.timezone.utc
T = datetime.datetime(2026, 11, 1, 8, tzinfo=UTC)


def replay(events: Path, database: Path, *options: str) -> None:
    """Runs the batch pipeline on an events file, as a user does."""
    done = subprocess.run([sys.executable, "-m", "pipeline", f"--events={events}", f"--duckdb={database}",
                           *options], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def write_events(events: Sequence[Event], path: Path) -> None:
    """Our events as an emitter file: one message per attempt."""
    by_attempt: dict[str, list[Event]] = {}
    for event in events:
        by_attempt.setdefault(event.attempt_id, []).append(event)
    with path.open("wb") as out:
        for attempt_id, attempt in by_attempt.items():
            records = [(e.seq, e.time_us, e.kind, e.body) for e in sorted(attempt, key=lambda e: e.seq)]
            out.write(encode_batch(attempt[0].run_id, attempt_id, records).data + b"\n")


def reference_result(attempts: Sequence[Sequence[Call]], cache_dir: Path) -> tuple[Any, ...]:
    """The reference's own get_job_goodput(include_badput_breakdown=True) on the calls."""
    calculator = reference_goodput.GoodputCalculator("run", "log", cloud_logger=reference_log(attempts),
                                                     cache_dir=str(cache_dir))
    return calculator.get_job_goodput(include_badput_breakdown=True)


def assert_same_as_reference(ours: tuple[Any, ...], theirs: tuple[Any, ...]) -> None:
    """Goodput, every bucket (custom events by type) and the max productive step agree."""
    assert ours[0] == pytest.approx(theirs[0], abs=TOLERANCE_PP)
    assert ours[2] == theirs[2]
    assert {b.name for b in ours[1]} == {b.name for b in theirs[1]}
    for bucket, value in theirs[1].items():
        mine = ours[1][BadputType[bucket.name]]
        if isinstance(value, dict):
            assert isinstance(mine, dict) and mine.keys() == value.keys()
            for sub, pct in value.items():
                assert mine[sub] == pytest.approx(pct, abs=TOLERANCE_PP), sub
        else:
            assert mine == pytest.approx(value, abs=TOLERANCE_PP), bucket


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DuckDB file of a simulated job (a crash, a restart, evals, saves), replayed by the pipeline."""
    folder = tmp_path_factory.mktemp("simulated")
    events = folder / "events.jsonl"
    done = subprocess.run([sys.executable, "-m", "pipeline.demo.simulated_job", "--output", str(events),
                           "--run-id", "sim", "--steps", "600", "--seed", "5"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    replay(events, folder / "goodput.duckdb")
    return folder / "goodput.duckdb"


def test_goodput_equals_the_latest_tables(simulated: Path):
    """get_job_goodput returns latest_goodput's goodput and latest_badput's percentages."""
    calculator = goodput.GoodputCalculator("sim", "goodput_sim", duckdb_path=simulated)
    goodput_pct, breakdown, max_step = calculator.get_job_goodput(include_badput_breakdown=True)
    with duckdb.connect(str(simulated), read_only=True) as connection:
        pct, step = connection.execute("SELECT goodput_pct, max_productive_step FROM latest_goodput "
                                       "WHERE run_id = 'sim' AND window_s = 0").fetchone() or (None, None)
        buckets = dict(connection.execute("SELECT badput_source, pct FROM latest_badput "
                                          "WHERE run_id = 'sim' AND window_s = 0").fetchall())
    assert isinstance(goodput_pct, float) and goodput_pct == pytest.approx(pct, abs=1e-9)
    assert isinstance(max_step, int) and max_step == step
    custom = breakdown[BadputType.CUSTOM_BADPUT_EVENTS]
    assert isinstance(custom, dict) and custom["EVAL_STEP"] > 0
    for source, value in buckets.items():
        if source.startswith("CUSTOM_BADPUT_EVENTS."):
            assert custom[source.split(".", 1)[1]] == pytest.approx(value, abs=1e-9)
        else:
            assert breakdown[BadputType[source]] == pytest.approx(value, abs=1e-9), source
    assert breakdown[BadputType.WASTED_PROGRESS_FROM_DISRUPTION] > 0


def test_breakdown_is_empty_unless_asked_for(simulated: Path):
    """As the reference: without include_badput_breakdown the breakdown is {}."""
    goodput_pct, breakdown, _ = goodput.GoodputCalculator("sim", duckdb_path=simulated).get_job_goodput()
    assert breakdown == {} and 0 < goodput_pct < 100


def test_details_are_seconds_in_the_reference_shape(simulated: Path):
    """get_job_goodput_details holds the latest snapshot's seconds under the reference's keys."""
    calculator = goodput.GoodputCalculator("sim", duckdb_path=simulated)
    details = calculator.get_job_goodput_details()
    goodput_pct, _, max_step = calculator.get_job_goodput()
    total = details["total_elapsed_time"]
    assert 100 * details["goodput_time"][goodput.GoodputType.TOTAL] / total == pytest.approx(goodput_pct)
    flat = [v for k, v in details["badput_time"].items()
            if k not in (BadputType.DATA_LOADING_ASYNC, BadputType.CUSTOM_BADPUT_EVENTS)]
    custom = sum(details["badput_time"][BadputType.CUSTOM_BADPUT_EVENTS].values())
    assert details["goodput_time"][goodput.GoodputType.TOTAL] + sum(flat) + custom == pytest.approx(total)
    assert details["max_productive_step"] == max_step and details["disruption_count"] == 1
    assert details["ideal_step_time"] > 0


def clean_run() -> TraceBuilder:
    run = TraceBuilder(seed=21)
    run.start_attempt()
    run.steps(0, 420, noise=0.1, compile_s=40, eval_every=50, save_every=100, save_s=3.0)
    run.wait(0.5)
    run.end()
    return run


def restarted_run() -> TraceBuilder:
    run = TraceBuilder(seed=22)
    run.start_attempt()
    run.steps(0, 250, noise=0.05, compile_s=30, eval_every=60)
    run.wait(1.0)  # dies mid-step
    run.wait(180)  # outage
    run.start_attempt(init_s=25, prep_s=15)
    run.steps(200, 450, noise=0.05, compile_s=30, eval_every=60)
    run.end()
    return run


@pytest.mark.parametrize("build", [clean_run, restarted_run], ids=["clean", "restarted"])
def test_goodput_matches_the_reference_calculator(build: Any, tmp_path: Path):
    """Through the emitter file and the batch pipeline, the reference's own numbers, within 0.01 pp."""
    run = build()
    write_events(record_ours(run.attempts), tmp_path / "events.jsonl")
    replay(tmp_path / "events.jsonl", tmp_path / "goodput.duckdb")
    ours = goodput.GoodputCalculator("run", "log", duckdb_path=tmp_path / "goodput.duckdb").get_job_goodput(
        include_badput_breakdown=True)
    assert_same_as_reference(ours, reference_result(run.attempts, tmp_path))


def test_unknown_run_raises_value_error(simulated: Path):
    """As the reference with no entries: a ValueError, not zeros."""
    with pytest.raises(ValueError, match="no goodput snapshot"):
        goodput.GoodputCalculator("no-such-run", duckdb_path=simulated).get_job_goodput()


def test_the_source_comes_from_the_environment(simulated: Path, monkeypatch: pytest.MonkeyPatch):
    """The reference's constructor call, unchanged, reads the file named by $GOODPUT_DUCKDB."""
    monkeypatch.delenv(goodput.BIGQUERY_DATASET_ENV, raising=False)
    monkeypatch.setenv(goodput.DUCKDB_ENV, str(simulated))
    calculator = goodput.GoodputCalculator(job_name="sim", logger_name="goodput_sim", cache_dir="/tmp")
    assert calculator.get_job_goodput()[0] > 0
    monkeypatch.delenv(goodput.DUCKDB_ENV)
    with pytest.raises(ValueError, match="exactly one"):
        goodput.GoodputCalculator("sim", "goodput_sim")


def test_importing_the_api_pulls_no_heavy_dependency():
    """A training image imports goodput and monitoring without duckdb, BigQuery or Beam."""
    code = ("import sys; from emitter import goodput, monitoring; "
            "heavy = [m for m in ('duckdb', 'apache_beam', 'google.cloud.bigquery', 'pipeline') "
            "if m in sys.modules]; assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


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


def test_interval_over_two_replays_of_a_run(tmp_path: Path):
    """Two replays, as of mid-run and at the end: the interval between is the later stretch."""
    run = restarted_run()
    write_events(record_ours(run.attempts), tmp_path / "events.jsonl")
    middle = run.now() - datetime.timedelta(seconds=200)
    replay(tmp_path / "events.jsonl", tmp_path / "goodput.duckdb", f"--as_of={middle.isoformat()}")
    replay(tmp_path / "events.jsonl", tmp_path / "goodput.duckdb")
    calculator = goodput.GoodputCalculator("run", duckdb_path=tmp_path / "goodput.duckdb")
    goodput_pct, breakdown, max_step, total_s, disruptions = calculator.get_job_goodput_interval(
        middle, run.now())
    assert total_s == pytest.approx(200.0, abs=1e-3)
    assert disruptions == 0 and max_step == calculator.get_job_goodput()[2]
    flat = sum(v for k, v in breakdown.items()
               if isinstance(v, float) and k is not BadputType.DATA_LOADING_ASYNC)
    custom = breakdown[BadputType.CUSTOM_BADPUT_EVENTS]
    assert isinstance(custom, dict)
    # The step running at the first snapshot was OTHER then and is productive now; the shrunken
    # OTHER counts 0, so the figures may exceed 100 % by up to that step's share (about 1 %).
    assert 100.0 - 1e-6 <= goodput_pct + flat + sum(custom.values()) <= 101.5
    whole = calculator.get_job_goodput_interval(run.now() - datetime.timedelta(days=1), run.now())
    assert whole[0] == pytest.approx(calculator.get_job_goodput()[0], abs=1e-9)


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


def test_elastic_calculator_always_reports_the_elastic_buckets(simulated: Path):
    """As the reference's elastic calculator: ELASTIC_* are in the breakdown, 0 when unused."""
    from emitter import goodput_elastic

    _, breakdown, _ = goodput_elastic.ElasticGoodputCalculator("sim", duckdb_path=simulated).get_job_goodput(
        include_badput_breakdown=True)
    for bucket in (BadputType.ELASTIC_SLICE_DOWN, BadputType.ELASTIC_SCALE_UP,
                   BadputType.ELASTIC_REINITIALIZATION):
        assert breakdown[bucket] == 0.0


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
