"""ML Productivity Goodput: the accelerator peaks shipped with the schemas, the edge cases of the
run_productivity query, and the Cloud Monitoring points ``goodput productivity`` makes of its rows.
(A whole fleet worked out by hand is in tests/e2e/test_productivity.py.)"""

from __future__ import annotations

import csv
import datetime
import math
from pathlib import Path
from typing import Any

import duckdb
import pytest

from goodput_schemas import ACCELERATOR_PEAKS, SEEDED_TABLES
from pipeline.app.fleet_sql import run_saved
from pipeline.app.productivity import FLEET_JOB, FLEET_METRIC, RUN_METRIC, productivity_points
from pipeline.sinks.duckdb import DuckDBSink
from pipeline.sinks.monitoring import PRODUCTIVITY_METRICS

UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 11, 2, 12, tzinfo=UTC)


def test_the_peaks_cover_the_common_accelerators_each_with_its_source():
    """v4, v5e, v5p, v6e and the A100, H100, H200 and B200 GPUs each have a positive peak and a note."""
    with ACCELERATOR_PEAKS.open(newline="") as peaks:
        rows = {row["accelerator_type"]: row for row in csv.DictReader(peaks)}
    assert set(rows) >= {"v4", "v5e", "v5p", "v6e", "a100", "h100", "h200", "b200"}
    assert all(float(row["bf16_tflops_per_chip"]) > 0 and row["note"] for row in rows.values())
    assert SEEDED_TABLES["accelerator_peaks"] == ACCELERATOR_PEAKS


def test_a_new_duckdb_file_holds_the_peaks_once(tmp_path: Path):
    """The sink seeds the peaks into a new file, and not again when it opens the file again."""
    with ACCELERATOR_PEAKS.open(newline="") as peaks:
        expected = sorted((row["accelerator_type"], float(row["bf16_tflops_per_chip"]), row["note"])
                          for row in csv.DictReader(peaks))
    for _ in range(2):
        sink = DuckDBSink(tmp_path / "f.duckdb")
        assert sorted(sink.query("SELECT * FROM accelerator_peaks")) == expected
        sink.close()


def snapshot(run_id: str, accelerator: str, goodput_pct: float | None, total_s: float) -> dict[str, Any]:
    start = NOW - datetime.timedelta(seconds=total_s)
    return {"run_id": run_id, "snapshot_time": NOW, "window_s": 0, "window_start": start, "window_end": NOW,
            "goodput_pct": goodput_pct, "productive_time_s": total_s * (goodput_pct or 0) / 100,
            "total_time_s": total_s, "disruptions": 0, "max_productive_step": 0, "chip_count": 8,
            "productive_chip_s": 0.0, "total_chip_s": 0.0, "accelerator_type": accelerator, "ended": False}


def metric(run_id: str, name: str, value: float, seconds: int) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": "a", "metric_time": NOW - datetime.timedelta(seconds=seconds),
            "step": seconds, "name": name, "value": value}


def test_a_factor_with_nothing_to_go_on_is_null(tmp_path: Path):
    """TFLOPS of an accelerator without a peak gives no program goodput; an MFU that is only NaN
    leaves the TFLOPS to count; a run with no elapsed time and nothing else has no MPG at all."""
    sink = DuckDBSink(tmp_path / "f.duckdb")
    sink.write("goodput_snapshots", [snapshot("no-peak", "tpu-next", 60.0, 600),
                                     snapshot("nan-mfu", "v6e", 50.0, 600),
                                     snapshot("nothing", "v6e", None, 0)])
    sink.write("model_metrics", [metric("no-peak", "TFLOPS", 300.0, 10),
                                 metric("nan-mfu", "MFU", math.nan, 10),
                                 metric("nan-mfu", "TFLOPS", 459.0, 10),
                                 metric("nan-mfu", "TFLOPS", -math.inf, 20)])
    columns, rows = run_saved("run_productivity", sink._connection)
    sink.close()
    found = {row[0]: dict(zip(columns, row, strict=True)) for row in rows}
    factors = ("scheduling_goodput", "runtime_goodput", "program_goodput", "program_from",
               "ml_productivity_goodput", "known_factors")
    assert {run: tuple(row[name] for name in factors) for run, row in found.items()} == {
        "nan-mfu": (None, 0.5, 0.5, "TFLOPS", 0.25, "runtime,program"),
        "no-peak": (None, 0.6, None, None, 0.6, "runtime"),
        "nothing": (None, None, None, None, None, None)}


def test_a_metric_that_cannot_be_a_fraction_is_left_out_and_types_match_in_any_case(tmp_path: Path):
    """An MFU recorded in percent, negative TFLOPS and TFLOPS above the accelerator's peak are left
    out of program goodput (so no MPG passes 1); a run's type in capitals finds its peak."""
    sink = DuckDBSink(tmp_path / "f.duckdb")
    sink.write("goodput_snapshots", [snapshot("percent", "v6e", 50.0, 600),
                                     snapshot("negative", "v6e", 50.0, 600),
                                     snapshot("above-peak", "v6e", 50.0, 600),
                                     snapshot("capitals", "V6E", 50.0, 600)])
    sink.write("model_metrics", [metric("percent", "MFU", 45.0, 10), metric("percent", "MFU", 0.4, 20),
                                 metric("negative", "TFLOPS", -918.0, 10),
                                 metric("above-peak", "TFLOPS", 9180.0, 10),
                                 metric("capitals", "TFLOPS", 459.0, 10)])
    columns, rows = run_saved("run_productivity", sink._connection)
    sink.close()
    found = {row[0]: dict(zip(columns, row, strict=True)) for row in rows}
    assert {run: (row["program_goodput"], row["program_from"]) for run, row in found.items()} == {
        "percent": (pytest.approx(0.4), "MFU"), "negative": (None, None), "above-peak": (None, None),
        "capitals": (0.5, "TFLOPS")}
    assert all(row["ml_productivity_goodput"] <= 1 for row in found.values())


def test_a_file_written_before_the_factors_view_still_gives_both_queries(tmp_path: Path):
    """A file without the view run_productivity_factors (an older version's), opened read-only,
    gives run_productivity and fleet_productivity the rows a file with it gives."""
    sink = DuckDBSink(tmp_path / "f.duckdb")
    sink.write("goodput_snapshots", [snapshot("a", "v6e", 50.0, 600), snapshot("b", "v5p", 80.0, 7200)])
    sink.write("model_metrics", [metric("a", "MFU", 0.4, 10)])
    sink.close()
    expected = {}
    with duckdb.connect(str(tmp_path / "f.duckdb")) as connection:
        for name in ("run_productivity", "fleet_productivity"):
            expected[name] = run_saved(name, connection)
        connection.execute("DROP VIEW run_productivity_factors")
    with duckdb.connect(str(tmp_path / "f.duckdb"), read_only=True) as connection:
        for name in ("run_productivity", "fleet_productivity", "run_productivity"):
            assert run_saved(name, connection) == expected[name]
    assert len(expected["run_productivity"][1]) == 2


def run_row(run_id: str, mpg: float | None, ended: bool = False, end_hours_ago: float = 0.0,
            location: str | None = "us-east5-a") -> dict[str, Any]:
    return {"run_id": run_id, "accelerator_type": "v5p", "location": location, "ended": ended,
            "run_end": (NOW - datetime.timedelta(hours=end_hours_ago)).replace(tzinfo=None),
            "ml_productivity_goodput": mpg, "known_factors": None if mpg is None else "runtime,program"}


def test_runs_running_or_ended_within_a_day_get_their_mpg_in_percent():
    """A run ended more than 25 hours ago, or with no MPG, gets no point; the others theirs, on their
    location or the default one, stamped now."""
    points, _ = productivity_points([run_row("running", 0.25), run_row("ended-24h", 0.5, True, 24),
                                  run_row("ended-26h", 0.5, True, 26), run_row("unknown", None),
                                  run_row("nowhere", 0.125, location=None)], [], NOW, location="global")
    assert [(p.metric, p.run_id, p.location, p.value, p.end_us) for p in points] == [
        (RUN_METRIC, "running", "us-east5-a", 25.0, NOW.timestamp() * 1e6),
        (RUN_METRIC, "ended-24h", "us-east5-a", 50.0, NOW.timestamp() * 1e6),
        (RUN_METRIC, "nowhere", "global", 12.5, NOW.timestamp() * 1e6)]
    assert points[0].labels == (("accelerator_type", "v5p"), ("known_factors", "runtime,program"))


def test_the_fleet_gets_todays_mpg_per_accelerator_type():
    """Only the rows of the current day (UTC) become the fleet's points, one per accelerator type."""
    fleet = [{"day": datetime.date(2026, 11, 1), "accelerator_type": "v5p", "ml_productivity_goodput": 0.3},
             {"day": datetime.date(2026, 11, 2), "accelerator_type": "v5p", "ml_productivity_goodput": 0.2},
             {"day": datetime.date(2026, 11, 2), "accelerator_type": "h100", "ml_productivity_goodput": None}]
    (point,), _ = productivity_points([], fleet, NOW, location="us")
    assert (point.metric, point.run_id, point.location, point.labels, point.value) == (
        FLEET_METRIC, FLEET_JOB, "us", (("accelerator_type", "v5p"),), 20.0)


def test_an_mpg_that_is_no_fraction_is_said_not_written():
    """A run's or the fleet's MPG that is NaN, past 1 or below 0 becomes no point but a line saying
    so; the figures beside it are written."""
    fleet = [{"day": NOW.date(), "accelerator_type": "v5p", "ml_productivity_goodput": math.nan},
             {"day": NOW.date(), "accelerator_type": "h100", "ml_productivity_goodput": 0.2}]
    points, refused = productivity_points([run_row("nan", math.nan), run_row("percent", 30.0),
                                           run_row("negative", -0.1), run_row("fine", 0.25)], fleet, NOW)
    assert [(point.run_id, point.value) for point in points] == [("fine", 25.0), (FLEET_JOB, 20.0)]
    assert refused == [
        "run nan: ML Productivity Goodput nan is not a fraction in 0..1 (its factors: runtime,program)",
        "run percent: ML Productivity Goodput 30.0 is not a fraction in 0..1 (its factors: runtime,program)",
        "run negative: ML Productivity Goodput -0.1 is not a fraction in 0..1 (its factors: runtime,program)",
        "the fleet's v5p: ML Productivity Goodput nan is not a fraction in 0..1"]


@pytest.mark.parametrize("metric_type", sorted(PRODUCTIVITY_METRICS))
def test_each_point_carries_exactly_its_metrics_declared_labels(metric_type: str):
    """PRODUCTIVITY_METRICS (what dashboards may use) is what the points carry."""
    fleet = [{"day": NOW.date(), "accelerator_type": "v5p", "ml_productivity_goodput": 0.2}]
    points = [p for p in productivity_points([run_row("r", 0.2)], fleet, NOW)[0] if p.metric == metric_type]
    assert points and all({key for key, _ in p.labels} == PRODUCTIVITY_METRICS[metric_type] for p in points)


@pytest.mark.parametrize(("arguments", "problem"), [
    (["--duckdb", "{missing}"], "no such file: --duckdb="),
    (["--duckdb", "{old}"], "lacks a table or column MPG needs"),
    (["--duckdb", "{old}", "--monitoring_endpoint", "http://127.0.0.1:8086"], "is not HOST:PORT"),
    (["--duckdb", "{old}", "--bigquery_endpoint", "http://x"], "--bigquery_endpoint needs"),
    (["--bigquery_dataset", "nodataset"], "--bigquery_dataset: 'nodataset' is not"),
])
def test_a_usage_mistake_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        arguments: list[str], problem: str):
    """A command line that does not hold together, or a file without the tables MPG is computed
    from, is one line and exit code 2, before anything is written."""
    from pipeline.app.cli import main

    old = tmp_path / "old.duckdb"
    DuckDBSink(old).close()
    with duckdb.connect(str(old)) as connection:
        connection.execute("DROP TABLE accelerator_peaks")
    paths = {"missing": tmp_path / "missing.duckdb", "old": old}
    assert main(["productivity", "--project", "p-1234", *(a.format(**paths) for a in arguments)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("goodput productivity: ") and problem in line
