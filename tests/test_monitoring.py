"""The Cloud Monitoring sink: the reference's metrics made from a snapshot, the per-run gate that
paces each series, and writes through the real client to the local MetricService stand-in."""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import grpc
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that
from reference_harness import TraceBuilder, record_ours

from conftest import keyed_stream, streaming_options
from pipeline.beam.transforms import _GateSeries
from pipeline.core import engine
from pipeline.core.rows import snapshot_rows
from pipeline.core.snapshot import Snapshot
from pipeline.emulators.monitoring import MetricStore, MonitoringEmulator
from pipeline.sinks.monitoring import (
    CUSTOM,
    MAX_SERIES_PER_REQUEST,
    METRICS,
    OPTIONAL_LABEL,
    REFERENCE,
    MetricWriter,
    MonitoringSettings,
    Point,
    _refused_indexes,
    make_client,
    requests,
    snapshot_points,
)

REPO = Path(__file__).resolve().parent.parent
PROJECT = "goodput-local"


def run_snapshot(run_id: str = "run-1", after_s: float = 0.0, accelerator: str | None = "v5p",
                 windows: tuple[int, ...] = (300, 3600)) -> Snapshot:
    """A snapshot of a run with a restart, ``after_s`` after its last event."""
    run = TraceBuilder(seed=4)
    run.start_attempt()
    run.steps(0, 100, compile_s=10)
    run.wait(30)
    run.start_attempt()
    run.steps(80, 150)
    state = engine.RunState(run_id)
    for event in record_ours(run.attempts):
        state.add(dataclasses.replace(event, run_id=run_id))
    latest = max(a.last_event_us for a in state.attempts.values())
    snapshot = state.snapshot(latest + round(after_s * 1e6), windows)
    assert snapshot is not None
    return dataclasses.replace(snapshot, metadata={**snapshot.metadata, "accelerator_type": accelerator,
                                                   "location": "us-central2-b"})


def by_metric(points: list[Point]) -> dict[str, list[Point]]:
    grouped: dict[str, list[Point]] = {}
    for point in points:
        grouped.setdefault(point.metric.removeprefix(REFERENCE), []).append(point)
    return grouped


def test_points_are_the_references_metrics_with_its_labels():
    snapshot = run_snapshot()
    rows = list(snapshot_rows(snapshot))
    cumulative = next(r for t, r in rows if t == "goodput_snapshots" and r["window_s"] == 0)
    badput = {r["badput_source"]: r["seconds"] for t, r in rows
              if t == "badput_snapshots" and r["window_s"] == 0}
    grouped = by_metric(snapshot_points(snapshot))
    assert set(grouped) == {"goodput_time", "badput_time", "disruptions", "max_productive_steps",
                            "step_time_deviation", "total_elapsed_time", "performance",
                            "interval_goodput", "interval_badput", CUSTOM + "goodput_pct"}
    v5p = ("accelerator_type", "v5p")
    (goodput,) = grouped["goodput_time"]
    assert goodput.labels == (v5p, ("goodput_source", "TOTAL"))
    assert goodput.value == cumulative["productive_time_s"]
    assert (goodput.run_id, goodput.location) == ("run-1", "us-central2-b")
    (disruptions,) = grouped["disruptions"]
    assert (disruptions.labels, disruptions.value) == ((v5p, ("window_type", "cumulative")), 1)
    assert isinstance(disruptions.value, int)
    (elapsed,) = grouped["total_elapsed_time"]
    assert elapsed.labels == (v5p, ("window_type", "cumulative"))
    assert elapsed.value == cumulative["total_time_s"]
    (steps,) = grouped["max_productive_steps"]
    assert (steps.labels, steps.value) == ((v5p,), cumulative["max_productive_step"])
    (performance,) = grouped["performance"]  # one writer: the ideal step time, no labels
    assert (performance.labels, performance.value) == ((), cumulative["ideal_step_time_s"])
    (deviation,) = grouped["step_time_deviation"]
    assert (deviation.labels, deviation.value) == ((v5p,), cumulative["step_time_deviation_s"])
    assert {dict(p.labels)["badput_source"]: p.value for p in grouped["badput_time"]} == {
        source: seconds for source, seconds in badput.items() if source != "DATA_LOADING_ASYNC"}
    assert all(dict(p.labels).keys() == {"badput_source", "accelerator_type"} for p in grouped["badput_time"])
    interval = {dict(p.labels)["rolling_window_size"]: p for p in grouped["interval_goodput"]}
    assert set(interval) == {"300", "3600"}
    assert dict(interval["300"].labels) == {"goodput_source": "TOTAL", "accelerator_type": "v5p",
                                            "rolling_window_size": "300"}
    assert {dict(p.labels)["rolling_window_size"] for p in grouped["interval_badput"]} == {"300", "3600"}


def test_unknown_accelerator_default_location_and_cluster_name():
    snapshot = run_snapshot(accelerator=None)
    snapshot = dataclasses.replace(snapshot, metadata={**snapshot.metadata, "location": None})
    points = snapshot_points(snapshot, default_location="europe-west4", cluster_name="pool-a")
    assert {p.location for p in points} == {"europe-west4"}
    for point in points:
        labels = dict(point.labels)
        if point.metric == REFERENCE + "performance":
            assert labels == {}
        else:
            assert labels["accelerator_type"] == "UNKNOWN" and labels["cluster_name"] == "pool-a"


@pytest.mark.parametrize("cluster_name", [None, "pool-a"])
def test_metrics_declares_every_metric_written_with_its_labels(cluster_name):
    """METRICS (what dashboards and alerts may use) is exactly what the points carry."""
    snapshot = dataclasses.replace(run_snapshot(), stepping_slice_efficiency=99.0,
                                   available_slice_efficiency=98.0)
    points = snapshot_points(snapshot, cluster_name=cluster_name)
    assert {p.metric for p in points} == set(METRICS)
    for point in points:
        declared = METRICS[point.metric]
        optional = {OPTIONAL_LABEL} if cluster_name and declared else set()
        assert {key for key, _ in point.labels} == declared | optional, point.metric


def test_requests_hold_at_most_200_series_each_once_in_time_order():
    points = [Point("custom.googleapis.com/x", (("i", str(i)),), "run", "global", 1.0, 0) for i in range(450)]
    repeated = [Point("custom.googleapis.com/y", (), "run", "global", float(t), t) for t in (3, 1, 2)]
    batches = requests(points + repeated)
    assert all(len(batch) <= MAX_SERIES_PER_REQUEST for batch in batches)
    assert all(len({p.series for p in batch}) == len(batch) for batch in batches)
    assert sum(map(len, batches)) == 453 and len(batches) == 3
    assert [p.end_us for batch in batches for p in batch if p.metric.endswith("/y")] == [1, 2, 3]


def test_gate_releases_each_run_at_most_every_interval_with_its_latest_values():
    """Four snapshots of a run within 12 s and one of another run: each first snapshot at once;
    the next no sooner than 10 s after, with the latest values (the one before it, held back, is
    replaced); each release carries every series of the run once."""
    first, second, third, fourth = (run_snapshot(after_s=s) for s in (0, 5, 9, 12))
    other = run_snapshot("run-2")
    stream = (keyed_stream()
              .add_elements([(s.run_id, s) for s in (first, other)])  # released at 0 s
              .advance_processing_time(2)
              .add_elements([("run-1", second)])  # held back until 10 s
              .advance_processing_time(2)
              .add_elements([("run-1", third)])  # replaces it: released at 10 s
              .advance_processing_time(10)
              .add_elements([("run-1", fourth)])  # at 14 s: held back until 20 s
              .advance_processing_time(20))

    def check(points: list[Point]) -> None:
        released = sorted((p.run_id, p.end_us, p.value) for p in points
                          if p.metric == REFERENCE + "total_elapsed_time")
        assert released == [("run-1", 0, first.cumulative.total_s),
                            ("run-1", 10_000_000, third.cumulative.total_s),
                            ("run-1", 20_000_000, fourth.cumulative.total_s),
                            ("run-2", 0, other.cumulative.total_s)]
        series = [p.series for p in points if p.end_us == 10_000_000]
        assert len(series) == len(set(series)) == len(snapshot_points(third))

    # The clock says 0 throughout; processing time moves the timers: a release held back is
    # stamped when its run's interval allows.
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        points = (pipeline
                  | stream
                  | beam.ParDo(_GateSeries(MonitoringSettings(), streaming=True, clock=lambda: 0.0)))
        assert_that(points, check)


@pytest.fixture
def monitoring() -> Iterator[MonitoringEmulator]:
    with MonitoringEmulator(store=MetricStore(clock=lambda: NOW_S)) as started:
        yield started


NOW_S = datetime.datetime(2026, 11, 1, 9, tzinfo=datetime.timezone.utc).timestamp()


def stamped(points: list[Point], at_s: float = NOW_S) -> list[Point]:
    return [dataclasses.replace(p, end_us=round(at_s * 1e6)) for p in points]


def test_writer_writes_every_series_through_the_real_client(monitoring):
    points = stamped(snapshot_points(run_snapshot()))
    writer = MetricWriter(make_client(monitoring.host), PROJECT)
    assert writer.write(points) == 0
    written = monitoring.store.points(REFERENCE + "goodput_time")
    assert len(written) == 1
    labels, resource, end_s, value = written[0]
    assert labels == {"goodput_source": "TOTAL", "accelerator_type": "v5p"}
    assert resource == {"location": "us-central2-b", "workload_id": "run-1", "replica_id": "0"}
    assert (end_s, value) == (NOW_S, next(p.value for p in points if p.metric == REFERENCE + "goodput_time"))
    (disruptions,) = monitoring.store.points(REFERENCE + "disruptions")
    assert disruptions[3] == 1 and isinstance(disruptions[3], int)
    (goodput_pct,) = monitoring.store.points(CUSTOM + "goodput_pct")  # user-defined: not on the Workload
    assert goodput_pct[1] == {"location": "us-central2-b", "namespace": "fleet_goodput", "job": "run-1",
                              "task_id": "0", "project_id": PROJECT.removeprefix("projects/")}


def test_writer_splits_requests_and_retries_transient_errors(monitoring):
    points = stamped([p for i in range(3) for p in snapshot_points(run_snapshot(f"run-{i}", windows=()))]
                     + [Point(CUSTOM + "goodput_pct", (("accelerator_type", f"a{i}"),), "run-x", "global",
                              1.0) for i in range(400)])
    monitoring.store.fail_next(1, grpc.StatusCode.UNAVAILABLE)
    before = monitoring.store.requests
    assert MetricWriter(make_client(monitoring.host), PROJECT).write(points) == 0
    assert monitoring.store.requests - before == 1 + math.ceil(len(points) / MAX_SERIES_PER_REQUEST)
    assert sum(p[1]["job"] == "run-x" for p in monitoring.store.points(CUSTOM + "goodput_pct")) == 400


def test_writer_logs_each_refused_series_and_keeps_the_rest(monitoring, caplog):
    fresh = stamped(snapshot_points(run_snapshot("fresh", windows=())))
    old = stamped(snapshot_points(run_snapshot("old", windows=())), NOW_S - 26 * 3600)
    writer = MetricWriter(make_client(monitoring.host), PROJECT)
    assert writer.write(fresh + old) == len(old)
    assert {r[1]["workload_id"] for r in monitoring.store.points(REFERENCE + "goodput_time")} == {"fresh"}
    assert f"Cloud Monitoring refused {REFERENCE}goodput_time" in caplog.text and "of run old" in caplog.text


@pytest.mark.parametrize(("message", "expected"), [
    ("Field timeSeries[3].points[0] is invalid", [3]),
    ("timeSeries[0-2]: points written more often than the sampling period", [0, 1, 2]),
    ("timeSeries[1,4-5] refused; timeSeries[9] refused", [1, 4, 5, 9]),
    ("timeSeries[8-400]: beyond the request", [8, 9]),
    ("Internal error", list(range(10))),
])
def test_a_partial_failure_names_the_refused_series(message, expected):
    assert _refused_indexes(message, 10) == expected


def test_a_replay_writes_monitoring_only_when_asked(tmp_path: Path):
    """Old events: nothing is written; with --monitoring_latest_now, each run's latest values,
    stamped now (the service takes nothing older than 25 h)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    events = tmp_path / "events.jsonl"
    subprocess.run([sys.executable, "-m", "pipeline.demo.simulated_job", "--output", str(events),
                    "--steps", "300"],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
    with MonitoringEmulator() as monitoring:
        for latest_now in (False, True):
            started = time.time()
            subprocess.run(
                [sys.executable, "-m", "pipeline", f"--events={events}", f"--monitoring_project={PROJECT}",
                 f"--monitoring_endpoint={monitoring.host}", *(["--monitoring_latest_now"] * latest_now)],
                cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
            written = monitoring.store.points(REFERENCE + "total_elapsed_time")
            if not latest_now:
                assert written == []
        (labels, resource, end_s, value), = written
        assert started <= end_s <= time.time() and value > 0
        assert resource["workload_id"] == "demo-llm-run" and labels["accelerator_type"] == "v5p"
