"""GKE's JobSet metrics in the fleet tables, on DuckDB: the ``latest_jobset_metrics`` view holds
each point once however often it was imported, and the ``jobset_goodput`` saved query (BigQuery's
dialect) puts GKE's time-weighted goodputs beside each run's own, on rows worked out by hand."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.app.fleet_sql import run_saved
from pipeline.sinks.duckdb import DuckDBSink

UTC = datetime.timezone.utc
START = datetime.datetime(2026, 11, 2, 10, tzinfo=UTC)  # run A's start; it ends an hour later
FIRST_IMPORT, SECOND_IMPORT = START + datetime.timedelta(hours=2), START + datetime.timedelta(hours=3)


def at(minutes: float) -> datetime.datetime:
    return START + datetime.timedelta(minutes=minutes)


def point(jobset: str, metric: str, minutes: float, value: float | None, imported_at: datetime.datetime,
          uid: str | None = None, count: int | None = None) -> dict[str, Any]:
    return {"project": "fleet-project", "location": "us-central1", "cluster": "c1", "namespace": "training",
            "jobset_name": jobset, "jobset_uid": uid, "metric": metric, "start_time": at(minutes),
            "end_time": at(minutes), "value": value, "sample_count": count, "imported_at": imported_at}


def metadata(run_id: str, started: float, jobset: str | None, uid: str | None = None) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-{started}", "start_time": at(started),
            "project": "fleet-project", "cluster": "c1", "namespace": "training", "jobset_name": jobset,
            "jobset_uid": uid}


def cumulative(run_id: str, goodput_pct: float, start: float, end: float) -> dict[str, Any]:
    return {"run_id": run_id, "snapshot_time": at(end), "window_s": 0, "window_start": at(start),
            "window_end": at(end), "goodput_pct": goodput_pct, "productive_time_s": 0.0,
            "total_time_s": 60.0 * (end - start), "disruptions": 0, "max_productive_step": 0, "chip_count": 8,
            "productive_chip_s": 0.0, "total_chip_s": 0.0, "ended": False}


def scheduling_points(imported_at: datetime.datetime, at_55: float) -> list[dict[str, Any]]:
    """js-a's scheduling goodput: 0 before the run, at 10:00:30 (half its period in the run) and
    after it; 1.0 each minute to 10:30, 0.5 each minute after, none from 10:41 to 10:50."""
    minutes = [-1.0, 0.0, 0.5, *range(1, 41), *range(51, 61), 61.0]
    return [point("js-a", "scheduling_goodput", m, at_55 if m == 55 else 0.0 if m <= 0.5 or m > 60
                  else 1.0 if m <= 30 else 0.5, imported_at) for m in minutes]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run A on JobSet js-a, from 10:00 to 11:00, 80 % goodput, its earlier attempt on another
    JobSet; run B on js-b (uid b-2), 10:00 to 10:40; run C on no JobSet. js-a's points imported
    twice, the second time with 10:55's value corrected."""
    path = tmp_path_factory.mktemp("jobset") / "fleet.duckdb"
    sink = DuckDBSink(path)
    sink.write("run_metadata", [metadata("A", -60, "js-before"), metadata("A", 0, "js-a"),
                                metadata("B", 0, "js-b", "b-2"), metadata("C", 0, None)])
    sink.write("goodput_snapshots", [cumulative("A", 50.0, 0, 30), cumulative("A", 80.0, 0, 60),
                                     cumulative("B", 40.0, 0, 40), cumulative("C", 10.0, 0, 60)])
    sink.write("jobset_metrics", [
        *scheduling_points(FIRST_IMPORT, at_55=0.0), *scheduling_points(SECOND_IMPORT, at_55=0.5),
        point("js-a", "proxy_runtime_goodput", 30, 0.9, FIRST_IMPORT),
        point("js-a", "times_to_recover", 30, 120.0, FIRST_IMPORT, count=2),
        point("js-b", "scheduling_goodput", 20, 0.0, FIRST_IMPORT, uid="b-1"),  # an older JobSet's
        point("js-b", "proxy_runtime_goodput", 20, 0.6, FIRST_IMPORT, uid="b-2"),
        point("js-other", "scheduling_goodput", 20, 0.0, FIRST_IMPORT),
    ])
    sink.close()
    return path


def test_the_view_holds_each_point_once_as_last_imported(fleet):
    """Imported twice, js-a's scheduling points are in the view once each, with the later value."""
    with duckdb.connect(str(fleet), read_only=True) as connection:
        table = connection.execute("SELECT count(*) FROM jobset_metrics WHERE jobset_name = 'js-a' "
                                   "AND metric = 'scheduling_goodput'").fetchone()
        view = connection.execute("SELECT count(*), count(DISTINCT end_time) FROM latest_jobset_metrics "
                                  "WHERE jobset_name = 'js-a' AND metric = 'scheduling_goodput'").fetchone()
        corrected = connection.execute(
            "SELECT value, imported_at FROM latest_jobset_metrics WHERE jobset_name = 'js-a' "
            "AND metric = 'scheduling_goodput' AND end_time = ?", [at(55)]).fetchall()
    assert table == (2 * 54,) and view == (54, 54)
    assert corrected == [(0.5, SECOND_IMPORT.replace(tzinfo=None))]


def test_jobset_goodput_weights_each_point_by_its_period_within_the_run(fleet):
    """GKE's goodputs are time-weighted over each run's lifetime, from its latest JobSet only."""
    with duckdb.connect(str(fleet), read_only=True) as connection:
        columns, rows = run_saved("jobset_goodput", connection)
    found = [dict(zip(columns, row, strict=True)) for row in rows]
    # A: 10:00:30's point weighs 30 s (value 0), 10:01's the 30 s after it, the other 39 minutes
    # to 10:40 a minute each (value 1 to 10:30, 0.5 after), 10:51 to 11:00 a minute each (0.5):
    # 3000 s covered; (30 + 29 * 60 + 10 * 60 * 0.5 + 10 * 60 * 0.5) / 3000 = 0.79.
    # B: its scheduling point is an older JobSet's (uid b-1), its runtime point its own.
    assert found == [
        {"run_id": "A", "cluster": "c1", "namespace": "training", "jobset_name": "js-a",
         "run_start": at(0).replace(tzinfo=None), "run_end": at(60).replace(tzinfo=None), "goodput_pct": 80.0,
         "gke_scheduling_goodput_pct": 79.0, "gke_proxy_runtime_goodput_pct": 90.0,
         "scheduling_covered_s": 3000.0, "proxy_runtime_covered_s": 60.0},
        {"run_id": "B", "cluster": "c1", "namespace": "training", "jobset_name": "js-b",
         "run_start": at(0).replace(tzinfo=None), "run_end": at(40).replace(tzinfo=None), "goodput_pct": 40.0,
         "gke_scheduling_goodput_pct": None, "gke_proxy_runtime_goodput_pct": 60.0,
         "scheduling_covered_s": 0.0, "proxy_runtime_covered_s": 60.0},
    ]
