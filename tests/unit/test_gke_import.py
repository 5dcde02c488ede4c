"""``goodput import gke-metrics`` without a service: its command line refuses mistakes in one
line, and a time series becomes rows as the jobset_metrics table wants them."""

from __future__ import annotations

import datetime
from pathlib import Path

import duckdb
import pytest
from google.api import distribution_pb2
from google.cloud.monitoring_v3 import types

from pipeline.app.cli import main
from pipeline.app.gke import point_rows, series_filter

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
    rows = list(point_rows(series, "times_to_recover", "my-project", IMPORTED))
    assert [(row["value"], row["sample_count"]) for row in rows] == [(15.0, 3), (None, 0)]
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
    points = point_rows(series, "scheduling_goodput", "my-project", IMPORTED)
    assert write_duckdb(str(path), JOBSET_METRICS, points) == 1
    with duckdb.connect(str(path), read_only=True) as connection:
        rows = connection.execute("SELECT project, metric, value, sample_count "
                                  "FROM jobset_metrics").fetchall()
    assert rows == [("my-project", "scheduling_goodput", 0.75, None)]
