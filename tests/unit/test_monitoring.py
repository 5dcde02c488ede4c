"""The Cloud Monitoring points of a snapshot: the reference's metrics with its labels, ours beside
them, and requests within the service's rules."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.core.detect import ANOMALY_KINDS, HANG, SLOWDOWN, STRAGGLER
from pipeline.core.rows import snapshot_rows
from pipeline.sinks.monitoring import (
    CUSTOM,
    MAX_SERIES_PER_REQUEST,
    METRICS,
    OPTIONAL_LABEL,
    PRODUCTIVITY_METRICS,
    REFERENCE,
    Point,
    _already_written_indexes,
    _refused_indexes,
    requests,
    snapshot_points,
)
from support.runs import run_snapshot


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
                            "interval_goodput", "interval_badput", CUSTOM + "goodput_pct",
                            CUSTOM + "open_anomalies"}
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


def open_anomalies(points: list[Point]) -> dict[str, int | float]:
    """The ``open_anomalies`` points' values by their ``kind`` label."""
    return {dict(p.labels)["kind"]: p.value for p in points if p.metric == CUSTOM + "open_anomalies"}


def test_open_anomalies_is_a_point_per_kind_with_the_snapshots_count():
    """Each kind gets an int64 point with the snapshot's count of open anomalies of that kind."""
    snapshot = dataclasses.replace(run_snapshot(), open_anomalies={SLOWDOWN: 1, HANG: 0, STRAGGLER: 2})
    points = [p for p in snapshot_points(snapshot) if p.metric == CUSTOM + "open_anomalies"]
    assert open_anomalies(points) == {SLOWDOWN: 1, HANG: 0, STRAGGLER: 2}
    assert all(isinstance(p.value, int) for p in points)
    v5p = ("accelerator_type", "v5p")
    assert {p.labels for p in points} == {(v5p, ("kind", kind)) for kind in ANOMALY_KINDS}
    assert {(p.run_id, p.location) for p in points} == {("run-1", "us-central2-b")}


def test_open_anomalies_falls_back_to_0_for_every_kind():
    """A snapshot with no anomaly open writes 0 for every kind, so a series returns to 0 when its
    anomaly ends; a kind the snapshot does not name is 0 too."""
    snapshot = dataclasses.replace(run_snapshot(), open_anomalies={HANG: 0})
    assert open_anomalies(snapshot_points(snapshot)) == dict.fromkeys(ANOMALY_KINDS, 0)


@pytest.mark.parametrize("cluster_name", [None, "pool-a"])
def test_metrics_declares_every_metric_written_with_its_labels(cluster_name):
    """METRICS (what dashboards and alerts may use) is exactly what the points carry, beside what
    goodput productivity writes (PRODUCTIVITY_METRICS, checked in test_productivity)."""
    snapshot = dataclasses.replace(run_snapshot(), stepping_slice_efficiency=99.0,
                                   available_slice_efficiency=98.0)
    points = snapshot_points(snapshot, cluster_name=cluster_name)
    assert {p.metric for p in points} == set(METRICS) - set(PRODUCTIVITY_METRICS)
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


@pytest.mark.parametrize(("message", "expected"), [
    ("Field timeSeries[3].points[0] is invalid", [3]),
    ("timeSeries[0-2]: points written more often than the sampling period", [0, 1, 2]),
    ("timeSeries[1,4-5] refused; timeSeries[9] refused", [1, 4, 5, 9]),
    ("timeSeries[8-400]: beyond the request", [8, 9]),
    ("Internal error", list(range(10))),
])
def test_a_partial_failure_names_the_refused_series(message, expected):
    assert _refused_indexes(message, 10) == expected


ORDER = ("Points must be written in order. One or more of the points specified had an older start time "
         "than the most recent point.")
FREQUENT = ("One or more points were written more frequently than the maximum sampling period configured "
            "for the metric.")


@pytest.mark.parametrize(("message", "expected"), [
    # the service's form: REASON: RESOURCE timeSeries[i]: METRIC, parts joined by "; "
    (f"One or more TimeSeries could not be written: {ORDER}: global{{}} timeSeries[3]: "
     "custom.googleapis.com/x{k:v}; Field timeSeries[5] had an invalid value: bad.: timeSeries[5]; "
     f"{FREQUENT}: timeSeries[7-8]", {3, 7, 8}),
    # the stand-in's: timeSeries[i]: REASON
    (f"One or more TimeSeries could not be written: timeSeries[0-1]: {ORDER}; timeSeries[2]: Injected",
     {0, 1}),
    (ORDER, set(range(10))),  # one that names no series is about all of them
    ("timeSeries[4]: The point's end time is more than 25 hours in the past", set()),
])
def test_a_partial_failure_names_the_series_that_already_hold_a_later_point(message, expected):
    """Only the series refused for their order or their rate are read as already written."""
    assert _already_written_indexes(message, 10) == expected


