"""``goodput import gke-metrics`` without a service: its command line refuses mistakes in one
line, and a time series becomes rows as the jobset_metrics table wants them."""

from __future__ import annotations

import datetime
import math
from pathlib import Path

import duckdb
import pytest
from google.api import distribution_pb2
from google.cloud.monitoring_v3 import types

from goodput_schemas.limits import MAX_DURATION_S
from pipeline.app.cli import main
from pipeline.app.gke import point_rows, series_filter, series_key

IMPORTED = datetime.datetime(2026, 11, 1, 9, tzinfo=datetime.timezone.utc)


def exit_code(*options: str) -> int | str | None:
    """The exit code of ``goodput import gke-metrics --project my-project OPTIONS``: returned, or
    argparse's (it exits)."""
    try:
        return main(["import", "gke-metrics", "--project", "my-project", *options])
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize(("options", "said"), [
    ([], "no output: give --duckdb=FILE or --bigquery_dataset"),
    (["--duckdb", "g.duckdb", "--start", "2026-11-01T10:00:00Z", "--end", "2026-11-01T09:00:00Z"],
     "--start (2026-11-01T10:00:00+00:00) must be before --end"),
    (["--duckdb", "g.duckdb", "--start", "yesterday"], "not an ISO 8601 time: 'yesterday'"),
    (["--duckdb", "g.duckdb", "--monitoring_endpoint", "http://127.0.0.1:8086"], "is not HOST:PORT"),
    (["--duckdb", "g.duckdb", "--bigquery_endpoint", "http://127.0.0.1:9050"],
     "--bigquery_endpoint needs --bigquery_dataset"),
    (["--bigquery_dataset", "nodataset"], "--bigquery_dataset: 'nodataset' is not PROJECT:DATASET"),
    (["--duckdb", "notes.txt"], "--duckdb=notes.txt is not a DuckDB file"),
], ids=["no-output", "start-after-end", "bad-time", "endpoint-url", "endpoint-alone", "bad-dataset",
        "not-duckdb"])
def test_mistakes_are_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch, options, said):
    """Each mistake is named in one line on stderr, exit code 2, before anything is read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine\n")
    assert exit_code(*options) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and said in lines[0], lines
    assert lines[0].startswith("goodput import gke-metrics: ")
    assert (tmp_path / "notes.txt").read_text() == "mine\n" and not (tmp_path / "g.duckdb").exists()


def test_a_project_that_is_no_project_id_is_refused(capsys):
    """--project takes a project id, not a resource name."""
    assert main(["import", "gke-metrics", "--project", "projects/my-project", "--duckdb", "g.duckdb"]) == 2
    assert "is not a Google Cloud project id" in capsys.readouterr().err


def test_the_filter_quotes_what_it_is_given():
    """A cluster or namespace is a quoted string in the filter, whatever it holds."""
    assert series_filter("kubernetes.io/jobset/uptime", 'a"b', "c\\d") == (
        'metric.type = "kubernetes.io/jobset/uptime" AND resource.type = "k8s_entity" AND '
        'resource.labels.cluster_name = "a\\"b" AND resource.labels.entity_namespace = "c\\\\d"')


def test_a_point_is_a_row_and_a_distribution_its_mean_and_count():
    """Labels become columns (an empty one NULL); a distribution's mean is the value, NULL if empty."""
    series = types.TimeSeries.pb()()
    series.resource.type = "k8s_entity"
    series.resource.labels.update({"location": "us-central1", "cluster_name": "c1", "entity_name": "js",
                                   "entity_namespace": "ns", "entity_uid": ""})
    for seconds, count in ((60, 3), (120, 0)):
        point = series.points.add()
        point.interval.end_time.FromSeconds(1_790_000_000 + seconds)
        point.value.distribution_value.CopyFrom(distribution_pb2.Distribution(count=count, mean=5.0 * count))
    rows, refused = point_rows(series, "times_to_recover", "my-project", IMPORTED)
    assert [(row["value"], row["sample_count"]) for row in rows] == [(15.0, 3), (None, 0)] and refused == []
    assert {key: rows[0][key] for key in ("project", "location", "cluster", "namespace", "jobset_name",
                                          "jobset_uid", "metric")} == {
        "project": "my-project", "location": "us-central1", "cluster": "c1", "namespace": "ns",
        "jobset_name": "js", "jobset_uid": None, "metric": "times_to_recover"}
    assert rows[0]["start_time"] == rows[0]["end_time"] == datetime.datetime.fromtimestamp(
        1_790_000_060, datetime.timezone.utc)


def test_rows_fit_the_table(tmp_path: Path):
    """What point_rows makes, the DuckDB sink takes into jobset_metrics as it is."""
    from pipeline.app.gke import JOBSET_METRICS
    from pipeline.app.outputs import write_duckdb

    series = types.TimeSeries.pb()()
    point = series.points.add()
    point.interval.end_time.FromSeconds(1_790_000_000)
    point.value.double_value = 0.75
    path = tmp_path / "g.duckdb"
    points, _ = point_rows(series, "scheduling_goodput", "my-project", IMPORTED)
    assert write_duckdb(str(path), JOBSET_METRICS, points) == 1
    with duckdb.connect(str(path), read_only=True) as connection:
        rows = connection.execute("SELECT project, metric, value, sample_count "
                                  "FROM jobset_metrics").fetchall()
    assert rows == [("my-project", "scheduling_goodput", 0.75, None)]


def jobset(metric_points: list[tuple[int, object]], **labels: str) -> object:
    """A ``k8s_entity`` series of JobSet js: (end time in seconds after 1_790_000_000, value) per
    point, a value a float, an int or, for a distribution, (count, mean)."""
    series = types.TimeSeries.pb()()
    series.resource.type = "k8s_entity"
    series.resource.labels.update({"location": "us-central1", "cluster_name": "c1", "entity_name": "js",
                                   "entity_namespace": "ns", "entity_uid": "u1", **labels})
    for seconds, value in metric_points:
        point = series.points.add()
        point.interval.end_time.FromSeconds(1_790_000_000 + seconds)
        if isinstance(value, tuple):
            count, mean = value
            point.value.distribution_value.CopyFrom(distribution_pb2.Distribution(count=count, mean=mean))
        elif isinstance(value, int):
            point.value.int64_value = value
        else:
            point.value.double_value = value
    return series


@pytest.mark.parametrize(("metric", "value", "reason"), [
    ("scheduling_goodput", math.nan, "scheduling_goodput must be a fraction in 0..1, got nan"),
    ("proxy_runtime_goodput", 1.5, "proxy_runtime_goodput must be a fraction in 0..1, got 1.5"),
    ("scheduling_goodput", -0.1, "scheduling_goodput must be a fraction in 0..1, got -0.1"),
    ("scheduling_goodput", 5, "scheduling_goodput must be a fraction in 0..1, got 5.0"),
    ("uptime", -60.0, f"uptime must be seconds in 0..MAX_DURATION_S ({MAX_DURATION_S:.0f}), got -60.0"),
    ("uptime", math.inf, "uptime must be seconds in 0..MAX_DURATION_S"),
    ("uptime", 1e300, "uptime must be seconds in 0..MAX_DURATION_S"),
    ("times_to_recover", (3, math.nan), "times_to_recover must be seconds in 0..MAX_DURATION_S"),
    ("times_between_interruptions", (-2, 60.0), "a distribution's count must be in 0..MAX_COUNT"),
], ids=["nan", "above-one", "negative-fraction", "int-fraction", "negative-uptime", "infinite",
        "huge", "nan-mean", "negative-count"])
def test_a_value_past_the_limits_is_refused_and_its_neighbours_kept(metric: str, value: object, reason: str):
    """A value an event could not hold is refused with its reason and where it was read; the points
    of the series before and after it are rows."""
    good = (1, 60.0) if isinstance(value, tuple) else 0.5
    series = jobset([(60, good), (120, value), (180, good)])
    rows, refused = point_rows(series, metric, "my-project", IMPORTED)
    assert [row["end_time"].timestamp() for row in rows] == [1_790_000_060, 1_790_000_180]
    (point,) = refused
    assert point.letter.reason.startswith(f"kubernetes.io/jobset/{metric}: {reason}")
    assert point.letter.source == f"monitoring:kubernetes.io/jobset/{metric}"
    assert (point.series, point.end_us) == (series_key(rows[0]), 1_790_000_120 * 1_000_000)
    assert '"entity_name": "js"' in point.letter.payload


def test_a_point_at_an_impossible_time_is_refused_not_a_traceback():
    """A start time past the year 9999 (no datetime holds it), one before 2000, or after the end
    time is refused with its reason."""
    series = jobset([(60, 0.5), (120, 0.5), (180, 0.5), (240, 0.5)])
    series.points[0].interval.start_time.seconds = 400_000_000_000
    series.points[1].interval.start_time.FromSeconds(1)
    series.points[2].interval.start_time.FromSeconds(1_790_000_200)
    rows, refused = point_rows(series, "uptime", "my-project", IMPORTED)
    assert [row["end_time"].timestamp() for row in rows] == [1_790_000_240]
    assert [point.letter.reason.removeprefix("kubernetes.io/jobset/uptime: ") for point in refused] == [
        "start_time (400000000000 s after 1970) is outside 2000-01-01..2200-01-01 UTC",
        "start_time (1 s after 1970) is outside 2000-01-01..2200-01-01 UTC",
        "start_time is after end_time"]


def test_a_label_that_is_no_name_refuses_its_series():
    """A resource label an event could not hold as a name (a control character, past
    MAX_TEXT_LENGTH) refuses the series' points."""
    rows, refused = point_rows(jobset([(60, 0.5)], entity_name="js\x07"), "uptime", "p", IMPORTED)
    assert rows == [] and "the entity_name label must be printable" in refused[0].letter.reason
    rows, refused = point_rows(jobset([(60, 0.5)], cluster_name="c" * 257), "uptime", "p", IMPORTED)
    assert rows == [] and "the cluster_name label is 257 characters" in refused[0].letter.reason
