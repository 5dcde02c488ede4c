"""The Cloud Monitoring writer through the real client to the local MetricService stand-in, and a
replay that writes Monitoring only when asked."""

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

import grpc
import pytest

from pipeline.core.detect import ANOMALY_KINDS, HANG, SLOWDOWN
from pipeline.emulators.monitoring import GAUGE, MetricDescriptor, MetricStore, MonitoringEmulator
from pipeline.sinks.monitoring import (
    CUSTOM,
    MAX_SERIES_PER_REQUEST,
    REFERENCE,
    MetricWriter,
    Point,
    make_client,
    snapshot_points,
)
from support import REPO
from support.runs import run_snapshot

PROJECT = "goodput-local"


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


def test_open_anomalies_goes_back_to_0_when_an_anomaly_ends(monitoring):
    """A snapshot with a slowdown open, then one a minute later with none: the service takes an
    INT64 gauge per kind on the run's generic_task, and the slowdown's series goes from 1 to 0."""
    writer = MetricWriter(make_client(monitoring.host), PROJECT)
    during = dataclasses.replace(run_snapshot(), open_anomalies={SLOWDOWN: 1, HANG: 0})
    after = dataclasses.replace(run_snapshot(), open_anomalies={})
    assert writer.write(stamped(snapshot_points(during), NOW_S - 60)) == 0
    assert writer.write(stamped(snapshot_points(after))) == 0
    written = monitoring.store.points(CUSTOM + "open_anomalies")
    series: dict[str, list[object]] = {}
    for labels, resource, _, value in written:
        assert resource["job"] == "run-1" and resource["namespace"] == "fleet_goodput"
        series.setdefault(labels["kind"], []).append(value)
    assert series == {SLOWDOWN: [1, 0], **{kind: [0, 0] for kind in ANOMALY_KINDS if kind != SLOWDOWN}}
    descriptor = monitoring.store.get_metric_descriptor(
        f"projects/{PROJECT}/metricDescriptors/{CUSTOM}open_anomalies")
    assert (descriptor.metric_kind, descriptor.value_type) == (GAUGE, MetricDescriptor.INT64)


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


def test_a_replay_writes_monitoring_only_when_asked(tmp_path: Path):
    """Old events: nothing is written; with --monitoring_latest_now, each run's latest values,
    stamped now (the service takes nothing older than 25 h)."""
    env = dict(os.environ)
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


def test_a_write_backing_off_gives_up_as_soon_as_the_job_stops(monitoring):
    """Cloud Monitoring fails every request: a write backs off for up to its minute, but stops
    retrying within a fraction of a second once ``give_up()`` turns true (a stream stopping)."""
    monitoring.store.fail_next(100_000, grpc.StatusCode.UNAVAILABLE)
    stop_at = time.monotonic() + 1.0
    writer = MetricWriter(make_client(monitoring.host), PROJECT, initial_backoff_s=5.0,
                          give_up=lambda: time.monotonic() >= stop_at)
    failures: list[str] = []
    points = stamped(snapshot_points(run_snapshot()))
    assert writer.write(points, lambda point, reason: failures.append(reason)) == len(points)
    assert time.monotonic() - stop_at < 0.5
    assert failures and all("the job is stopping" in reason for reason in failures)
