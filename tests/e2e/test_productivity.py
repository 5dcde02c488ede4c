"""ML Productivity Goodput and capacity on a fleet worked out by hand: the run_productivity,
fleet_productivity and capacity_goodput saved queries (BigQuery's dialect, run on DuckDB), the
report's productivity section (as text and in a real browser), and ``goodput productivity`` writing
MPG to the Cloud Monitoring stand-in.

The fleet, around midnight of 2026-11-01 (D1) to 2026-11-02 (D2), UTC; its latest snapshot, and so
the time everything is counted up to, is D2 03:00:

* run-a, v5p, 8 chips, D1 22:00 to D2 02:00 (ended), 75 % goodput (an earlier snapshot said 70 %).
  MFU 0.35 and 0.45 (the 0.45 recorded twice, and a NaN): mean 0.4; its TFLOPS is not used. On
  JobSet js-a, scheduling goodput 1.0 each minute for 3 hours, then 0.6 for the last hour:
  (180 * 1.0 + 60 * 0.6) / 240 = 0.9. MPG = 0.9 * 0.75 * 0.4 = 0.27.
* run-b, v5p, 16 chips, D2 01:00 to 03:00 (running), 50 % goodput. No MFU; TFLOPS 229.5 twice (and
  an infinity): 229.5 / v5p's 459 = 0.5. On no JobSet. MPG = 0.5 * 0.5 = 0.25 (runtime, program).
* run-c, h100, 4 GPUs, D1 23:00 to D2 01:00 (ended), 80 % goodput, no metrics. On js-c, 0.5 each
  minute (and a 0.0 at 01:30, after its end). MPG = 0.5 * 0.8 = 0.4 (scheduling, runtime).

Per day, weights chips x hours within the day:

* D1 v5p: run-a 2 h * 8 = 16 chip-hours: factors 0.9, 0.75, 0.4; MPG 0.27.
* D1 h100: run-c 1 h * 4 = 4 chip-hours: 0.5, 0.8, none; MPG 0.4.
* D2 v5p: run-a 16 and run-b 2 h * 16 = 32, 48 chip-hours: scheduling 0.9 (run-a only); runtime
  (16 * 0.75 + 32 * 0.5) / 48 = 0.5833; program (16 * 0.4 + 32 * 0.5) / 48 = 0.4667; MPG
  (16 * 0.27 + 32 * 0.25) / 48 = 0.2567.
* D2 h100: run-c 1 h * 4 = 4 chip-hours, as on D1.

Capacity (imported first with 40 v5p chips, then again corrected to 30):

* v5p us-east5-a, D1 20:00 to D2 04:00, 30 chips: D1 4 h * 30 = 120 chip-hours; D2 up to 03:00,
  3 h * 30 = 90. v5p us-east5-b, D2 05:00 to 06:00: after D2 03:00, nothing yet.
* h100 us-central1-a, D1 12:00 to D2 00:00, 8 GPUs: D1 96; h100 us-east4, D2 00:00 to 06:00, 4 GPUs:
  D2 up to 03:00, 12.

* D1 v5p: used 16, productive 16 * 0.75 = 12: over paid 12 / 120 = 0.1; idle 1 - 16 / 120 = 0.8667.
* D1 h100: used 4, productive 3.2: 3.2 / 96 = 0.0333; idle 1 - 4 / 96 = 0.9583.
* D2 v5p: used 16 + 32 = 48, productive 12 + 16 = 28: 28 / 90 = 0.3111; idle 1 - 48 / 90 = 0.4667.
* D2 h100: used 4, productive 3.2: 3.2 / 12 = 0.2667; idle 1 - 4 / 12 = 0.6667.
"""

from __future__ import annotations

import datetime
import math
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest

from goodput_schemas import saved_queries
from pipeline.app import productivity
from pipeline.app.cli import main
from pipeline.app.fleet_sql import run_saved
from pipeline.app.report import write_report
from pipeline.emulators.bigquery import BigQueryEmulator
from pipeline.emulators.monitoring import MetricStore, MonitoringEmulator
from pipeline.sinks.bigquery import BigQueryWriter, create_tables, make_client
from pipeline.sinks.duckdb import DuckDBSink
from support.browser import opened
from support.gke import jobset_series
from support.history import section, table_rows

UTC = datetime.timezone.utc
D1 = datetime.datetime(2026, 11, 1, tzinfo=UTC)
D1_DAY, D2_DAY = datetime.date(2026, 11, 1), datetime.date(2026, 11, 2)
AS_OF = 27  # hours after D1 00:00: D2 03:00, the fleet's latest snapshot


def at(hours: float) -> datetime.datetime:
    return D1 + datetime.timedelta(hours=hours)


def naive(hours: float) -> datetime.datetime:
    """A time as DuckDB returns it: naive, in UTC."""
    return at(hours).replace(tzinfo=None)


def cumulative(run_id: str, accelerator: str, chips: int, start: float, end: float, goodput_pct: float,
               ended: bool, snapshot: float | None = None) -> dict[str, Any]:
    total = 3600.0 * (end - start)
    productive = total * goodput_pct / 100
    return {"run_id": run_id, "snapshot_time": at(end if snapshot is None else snapshot), "window_s": 0,
            "window_start": at(start), "window_end": at(end), "goodput_pct": goodput_pct,
            "productive_time_s": productive, "total_time_s": total, "disruptions": 0,
            "max_productive_step": 0, "chip_count": chips, "productive_chip_s": productive * chips,
            "total_chip_s": total * chips, "accelerator_type": accelerator, "location": "us-east5-a",
            "ended": ended}


def metadata(run_id: str, start: float, jobset: str | None) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-1", "start_time": at(start),
            "project": "fleet-project", "cluster": "c1", "namespace": "training", "jobset_name": jobset}


def scheduling(jobset: str, minute_ends: range, start: float, value: Any) -> list[dict[str, Any]]:
    """A point a minute of a JobSet's scheduling goodput, the minutes counted from ``start`` hours;
    ``value(minute)`` each point's value."""
    return [{"project": "fleet-project", "location": "us-east5", "cluster": "c1", "namespace": "training",
             "jobset_name": jobset, "jobset_uid": None, "metric": "scheduling_goodput",
             "start_time": at(start + m / 60), "end_time": at(start + m / 60), "value": value(m),
             "sample_count": None, "imported_at": at(30)} for m in minute_ends]


def metric(run_id: str, hours: float, step: int, name: str, value: float) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-1", "metric_time": at(hours), "step": step,
            "name": name, "value": value}


CAPACITY = """accelerator_type,location,start_time,end_time,chips
v5p,us-east5-a,2026-11-01T20:00:00Z,2026-11-02T04:00:00Z,{v5p_chips}
v5p,us-east5-b,2026-11-02T05:00:00Z,2026-11-02T06:00:00Z,64
h100,us-central1-a,2026-11-01T12:00:00Z,2026-11-02T00:00:00Z,8
h100,us-east4,2026-11-02T00:00:00+00:00,2026-11-02T06:00:00+00:00,4
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet of the module's docstring in a DuckDB file, its capacity imported with the command."""
    directory = tmp_path_factory.mktemp("productivity")
    path = directory / "fleet.duckdb"
    sink = DuckDBSink(path)
    sink.write("goodput_snapshots", [
        cumulative("run-a", "v5p", 8, 22, 24, 70.0, False), cumulative("run-a", "v5p", 8, 22, 26, 75.0, True),
        cumulative("run-b", "v5p", 16, 25, 27, 50.0, False),
        cumulative("run-c", "h100", 4, 23, 25, 80.0, True)])
    sink.write("run_metadata", [metadata("run-a", 22, "js-a"), metadata("run-b", 25, None),
                                metadata("run-c", 23, "js-c")])
    sink.write("jobset_metrics", [*scheduling("js-a", range(1, 241), 22, lambda m: 1.0 if m <= 180 else 0.6),
                                  *scheduling("js-c", range(1, 121), 23, lambda m: 0.5),
                                  *scheduling("js-c", range(150, 151), 23, lambda m: 0.0)])
    sink.write("model_metrics", [
        metric("run-a", 23, 10, "MFU", 0.35), metric("run-a", 24, 20, "MFU", 0.45),
        metric("run-a", 24, 20, "MFU", 0.45), metric("run-a", 25, 30, "MFU", math.nan),
        metric("run-a", 23, 10, "TFLOPS", 100.0),
        metric("run-b", 26, 10, "TFLOPS", 229.5), metric("run-b", 26.5, 20, "TFLOPS", 229.5),
        metric("run-b", 26.5, 20, "LOSS", 2.5), metric("run-b", 26.8, 30, "TFLOPS", math.inf)])
    sink.close()
    for chips in (40, 30):  # a mistake, then the corrected file
        csv = directory / f"capacity-{chips}.csv"
        csv.write_text(CAPACITY.format(v5p_chips=chips))
        assert main(["import", "capacity", "--csv", str(csv), "--duckdb", str(path)]) == 0
    return path


def saved(path: Path, name: str) -> list[dict[str, Any]]:
    with duckdb.connect(str(path), read_only=True) as connection:
        columns, rows = run_saved(name, connection)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def test_run_productivity_is_the_product_of_each_runs_known_factors(fleet: Path):
    """Each run's factors and MPG are the hand-worked ones; an unknown factor is NULL and left out."""
    common = {"location": "us-east5-a"}
    assert saved(fleet, "run_productivity") == [
        {"run_id": "run-a", "accelerator_type": "v5p", "chip_count": 8, **common, "run_start": naive(22),
         "run_end": naive(26), "ended": True, "scheduling_goodput": 0.9, "runtime_goodput": 0.75,
         "program_goodput": 0.4, "program_from": "MFU", "ml_productivity_goodput": 0.27,
         "known_factors": "scheduling,runtime,program"},
        {"run_id": "run-b", "accelerator_type": "v5p", "chip_count": 16, **common, "run_start": naive(25),
         "run_end": naive(27), "ended": False, "scheduling_goodput": None, "runtime_goodput": 0.5,
         "program_goodput": 0.5, "program_from": "TFLOPS", "ml_productivity_goodput": 0.25,
         "known_factors": "runtime,program"},
        {"run_id": "run-c", "accelerator_type": "h100", "chip_count": 4, **common, "run_start": naive(23),
         "run_end": naive(25), "ended": True, "scheduling_goodput": 0.5, "runtime_goodput": 0.8,
         "program_goodput": None, "program_from": None, "ml_productivity_goodput": 0.4,
         "known_factors": "scheduling,runtime"},
    ]


def test_scheduling_goodput_is_gkes_weighted_as_jobset_goodput_weights_it(fleet: Path):
    """The scheduling factor is jobset_goodput's time-weighted GKE scheduling goodput, as a fraction."""
    gke = {row["run_id"]: row["gke_scheduling_goodput_pct"] for row in saved(fleet, "jobset_goodput")}
    assert {row["run_id"]: row["scheduling_goodput"] for row in saved(fleet, "run_productivity")
            if row["run_id"] in gke} == {run: pct / 100 for run, pct in gke.items()}


def test_fleet_productivity_weights_each_run_by_its_chip_hours_within_each_day(fleet: Path):
    """Per day and accelerator type, each factor and MPG are means weighted by chips x hours in the
    day; run-a and run-c, crossing midnight, count in both days."""
    assert saved(fleet, "fleet_productivity") == [
        {"day": D1_DAY, "accelerator_type": "h100", "runs": 1, "runs_with_every_factor": 0, "chip_hours": 4.0,
         "scheduling_goodput": 0.5, "runtime_goodput": 0.8, "program_goodput": None,
         "ml_productivity_goodput": 0.4},
        {"day": D1_DAY, "accelerator_type": "v5p", "runs": 1, "runs_with_every_factor": 1, "chip_hours": 16.0,
         "scheduling_goodput": 0.9, "runtime_goodput": 0.75, "program_goodput": 0.4,
         "ml_productivity_goodput": 0.27},
        {"day": D2_DAY, "accelerator_type": "h100", "runs": 1, "runs_with_every_factor": 0, "chip_hours": 4.0,
         "scheduling_goodput": 0.5, "runtime_goodput": 0.8, "program_goodput": None,
         "ml_productivity_goodput": 0.4},
        {"day": D2_DAY, "accelerator_type": "v5p", "runs": 2, "runs_with_every_factor": 1, "chip_hours": 48.0,
         "scheduling_goodput": 0.9, "runtime_goodput": 0.5833, "program_goodput": 0.4667,
         "ml_productivity_goodput": 0.2567},
    ]


#: capacity_goodput of the fleet, worked out in the module's docstring.
CAPACITY_GOODPUT = [
    {"day": D1_DAY, "accelerator_type": "h100", "paid_chip_hours": 96.0, "used_chip_hours": 4.0,
     "productive_chip_hours": 3.2, "goodput_over_paid": 0.0333, "idle_share": 0.9583},
    {"day": D1_DAY, "accelerator_type": "v5p", "paid_chip_hours": 120.0, "used_chip_hours": 16.0,
     "productive_chip_hours": 12.0, "goodput_over_paid": 0.1, "idle_share": 0.8667},
    {"day": D2_DAY, "accelerator_type": "h100", "paid_chip_hours": 12.0, "used_chip_hours": 4.0,
     "productive_chip_hours": 3.2, "goodput_over_paid": 0.2667, "idle_share": 0.6667},
    {"day": D2_DAY, "accelerator_type": "v5p", "paid_chip_hours": 90.0, "used_chip_hours": 48.0,
     "productive_chip_hours": 28.0, "goodput_over_paid": 0.3111, "idle_share": 0.4667},
]


def test_capacity_goodput_sets_the_runs_against_the_chips_paid_for_each_day(fleet: Path):
    """Paid, used and productive chip-hours per day and accelerator type, spans clipped at midnight
    and at the latest snapshot, the corrected import counted once."""
    assert saved(fleet, "capacity_goodput") == CAPACITY_GOODPUT


@pytest.fixture(scope="module")
def report(fleet: Path) -> Path:
    output = fleet.with_name("report.html")
    write_report(fleet, output)
    return output


def test_the_report_shows_each_runs_factors_and_mpg_with_the_unknown_missing(report: Path):
    """The productivity table has the hand-worked factors and MPG of each run in percent: run-a, the
    one with every factor, in the table of comparable runs; the others, the runs losing the most
    chip-hours first (run-b loses half of its 32 chip-hours), apart, each factor it lacks "missing"
    and its MPG an upper bound."""
    page = section(report.read_text(), "productivity")
    assert table_rows(page, "productivity-runs") == [
        ["run-a", "v5p", "8", "90.00 %", "75.00 %", "40.00 %", "MFU", "27.00 %"],
    ]
    assert table_rows(page, "productivity-missing") == [
        ["run-b", "v5p", "16", "missing", "50.00 %", "50.00 %", "TFLOPS", "≤ 25.00 %"],
        ["run-c", "h100", "4", "50.00 %", "80.00 %", "missing", "—", "≤ 40.00 %"],
    ]


def test_the_report_shows_goodput_over_paid_capacity_and_the_idle_share_per_day(report: Path):
    """The capacity table has the hand-worked figures of each day and accelerator type."""
    assert table_rows(section(report.read_text(), "productivity"), "capacity-goodput") == [
        [str(row["day"]), row["accelerator_type"], f"{row['paid_chip_hours']:g}",
         f"{row['used_chip_hours']:g}", f"{row['productive_chip_hours']:g}",
         f"{100 * row['goodput_over_paid']:.2f} %",
         f"{100 * row['idle_share']:.2f} %"] for row in CAPACITY_GOODPUT]


def test_the_productivity_section_renders_in_a_headless_browser(report: Path):
    """Chromium shows the section with its capacity plot drawn and both tables' rows, and reports no
    errors."""
    with opened(report) as (page, problems):
        page.locator('nav a[href="#productivity"]').click()
        assert page.locator("#productivity").is_visible()
        box = page.locator("#productivity figure.plot svg").bounding_box()
        assert box and box["width"] > 600 and box["height"] > 100
        mpg = page.locator("#productivity-runs tbody tr td:nth-child(8), "
                           "#productivity-missing tbody tr td:nth-child(8)").all_inner_texts()
        idle = page.locator("#capacity-goodput tbody tr td:nth-child(7)").all_inner_texts()
    assert problems == []
    assert mpg == ["27.00 %", "≤ 25.00 %", "≤ 40.00 %"]
    assert idle == ["95.83 %", "86.67 %", "66.67 %", "46.67 %"]


def test_goodput_productivity_writes_each_runs_mpg_and_the_fleets_of_the_day(
        fleet: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """As of D2 03:10, every run (none ended a day ago) gets its MPG in percent, with its known
    factors, and each accelerator type the fleet's MPG of D2, stamped then."""
    now = at(AS_OF + 1 / 6)
    monkeypatch.setattr(productivity, "_now", lambda: now)
    with MonitoringEmulator(store=MetricStore(clock=now.timestamp)) as monitoring:
        code = main(["productivity", "--project", "fleet-project", "--duckdb", str(fleet),
                     "--monitoring_endpoint", monitoring.host])
        runs = monitoring.store.points(productivity.RUN_METRIC)
        fleet_points = monitoring.store.points(productivity.FLEET_METRIC)
    assert code == 0 and "3 runs and 2 accelerator types" in capsys.readouterr().out
    assert sorted((resource["job"], labels["known_factors"], labels["accelerator_type"], value)
                  for labels, resource, _, value in runs) == [
        ("run-a", "scheduling,runtime,program", "v5p", pytest.approx(27.0)),
        ("run-b", "runtime,program", "v5p", pytest.approx(25.0)),
        ("run-c", "scheduling,runtime", "h100", pytest.approx(40.0))]
    assert sorted((resource["job"], labels["accelerator_type"], value) for labels, resource, _, value
                  in fleet_points) == [("fleet", "h100", pytest.approx(40.0)),
                                       ("fleet", "v5p", pytest.approx(25.67))]
    assert {end for *_, end, _ in runs + fleet_points} == {now.timestamp()}


def stored_rows(connection: duckdb.DuckDBPyConnection, table: str) -> list[dict[str, Any]]:
    """A DuckDB table's rows, its naive UTC times made aware (as a BigQuery sink is given them)."""
    cursor = connection.execute(f"SELECT * FROM {table}")
    names = [column[0] for column in cursor.description]
    return [{name: value.replace(tzinfo=UTC) if isinstance(value, datetime.datetime) else value
             for name, value in zip(names, row, strict=True)} for row in cursor.fetchall()]


def test_the_same_fleet_in_bigquery_gives_the_same_capacity_goodput_and_points(
        fleet: Path, monkeypatch: pytest.MonkeyPatch):
    """The fleet's rows in BigQuery (the stand-in, which runs the saved queries), its capacity
    imported there with the command: capacity_goodput is the hand-worked one, and goodput
    productivity reads the same MPG from there."""
    project, dataset = "goodput-local", "goodput"
    bigquery_dataset = f"{project}:{dataset}"
    with duckdb.connect(str(fleet), read_only=True) as connection:
        tables = {table: stored_rows(connection, table)
                  for table in ("goodput_snapshots", "run_metadata", "jobset_metrics", "model_metrics")}
    now = at(AS_OF + 1 / 6)
    monkeypatch.setattr(productivity, "_now", lambda: now)
    store = MetricStore(clock=now.timestamp)
    with BigQueryEmulator() as bigquery, MonitoringEmulator(store=store) as monitoring:
        client = make_client(project, bigquery.endpoint)
        create_tables(client, project, dataset)
        assert BigQueryWriter(client, project, dataset).write(tables) == 0
        csv = fleet.with_name("capacity-30.csv")
        assert main(["import", "capacity", "--csv", str(csv), "--bigquery_dataset", bigquery_dataset,
                     "--bigquery_endpoint", bigquery.endpoint]) == 0
        query = saved_queries(f"`{project}.{dataset}`")["capacity_goodput"]
        found = [dict(row.items()) for row in client.query_and_wait(query)]
        assert main(["productivity", "--project", "fleet-project", "--bigquery_dataset", bigquery_dataset,
                     "--bigquery_endpoint", bigquery.endpoint, "--monitoring_endpoint", monitoring.host]) == 0
        written = {(resource["job"], labels["accelerator_type"], round(value, 2))
                   for metric in (productivity.RUN_METRIC, productivity.FLEET_METRIC)
                   for labels, resource, _, value in monitoring.store.points(metric)}
    assert found == CAPACITY_GOODPUT
    assert written == {("run-a", "v5p", 27.0), ("run-b", "v5p", 25.0), ("run-c", "h100", 40.0),
                       ("fleet", "v5p", 25.67), ("fleet", "h100", 40.0)}


def test_a_nan_among_gkes_points_changes_no_runs_mpg_nor_the_fleets(
        fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """The fleet's GKE points imported from the Cloud Monitoring stand-in with goodput import
    gke-metrics, and a NaN among js-a's (between two of its minutes, where a point kept would take
    half a minute's weight): the NaN is refused, and goodput productivity writes the hand-worked
    MPG of every run and of the fleet, none of them NaN."""
    path = tmp_path / "fleet.duckdb"
    shutil.copy(fleet, path)
    with duckdb.connect(str(path)) as connection:
        connection.execute("DELETE FROM jobset_metrics")
    series = {}
    for row in (*scheduling("js-a", range(1, 241), 22, lambda m: 1.0 if m <= 180 else 0.6),
                *scheduling("js-c", range(1, 121), 23, lambda m: 0.5),
                *scheduling("js-c", range(150, 151), 23, lambda m: 0.0)):
        series.setdefault(row["jobset_name"], []).append((row["end_time"].timestamp(), row["value"]))
    series["js-a"].append((at(22 + 90.5 / 60).timestamp(), math.nan))
    store = MetricStore(clock=at(AS_OF).timestamp)
    store.preload("projects/fleet-project", [
        jobset_series("scheduling_goodput", jobset, points, uid="", location="us-east5",
                      project="fleet-project") for jobset, points in series.items()])
    now = at(AS_OF + 1 / 6)
    monkeypatch.setattr(productivity, "_now", lambda: now)
    written_to = MetricStore(clock=now.timestamp)
    with MonitoringEmulator(store=store) as gke, MonitoringEmulator(store=written_to) as out:
        assert main(["import", "gke-metrics", "--project", "fleet-project", "--duckdb", str(path),
                     "--monitoring_endpoint", gke.host, "--start", at(21).isoformat(),
                     "--end", at(AS_OF).isoformat()]) == 0
        said = capsys.readouterr().out
        assert main(["productivity", "--project", "fleet-project", "--duckdb", str(path),
                     "--monitoring_endpoint", out.host]) == 0
        written = {(resource["job"], labels["accelerator_type"], round(value, 2))
                   for metric in (productivity.RUN_METRIC, productivity.FLEET_METRIC)
                   for labels, resource, _, value in out.store.points(metric)}
    assert written == {("run-a", "v5p", 27.0), ("run-b", "v5p", 25.0), ("run-c", "h100", 40.0),
                       ("fleet", "v5p", 25.67), ("fleet", "h100", 40.0)}
    assert "1 refused, e.g. kubernetes.io/jobset/scheduling_goodput" in said


def test_a_nan_left_in_the_tables_counts_as_no_point(
        fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A NaN among js-a's points in jobset_metrics, as an import that held no point to the limits
    left it: the factors view leaves it out, and goodput productivity writes the figures of the
    fleet without that point, none NaN."""
    now = at(AS_OF + 1 / 6)
    monkeypatch.setattr(productivity, "_now", lambda: now)
    written = []
    for name, value in (("nan", math.nan), ("none", None)):
        path = tmp_path / f"{name}.duckdb"
        shutil.copy(fleet, path)
        sink = DuckDBSink(path)
        sink.write("jobset_metrics", [{**scheduling("js-a", range(1, 2), 22, lambda m: math.nan)[0],
                                       "end_time": at(22 + 90.5 / 60)}])
        if value is None:  # the point not there at all
            sink.query("DELETE FROM jobset_metrics WHERE isnan(value)")
        sink.close()
        with MonitoringEmulator(store=MetricStore(clock=now.timestamp)) as monitoring:
            assert main(["productivity", "--project", "fleet-project", "--duckdb", str(path),
                         "--monitoring_endpoint", monitoring.host]) == 0
            written.append({(resource["job"], labels["accelerator_type"], value)
                            for metric in (productivity.RUN_METRIC, productivity.FLEET_METRIC)
                            for labels, resource, _, value in monitoring.store.points(metric)})
    assert written[0] == written[1]
    assert {(job, kind, round(value)) for job, kind, value in written[0]} == {
        ("run-a", "v5p", 27), ("run-b", "v5p", 25), ("run-c", "h100", 40), ("fleet", "v5p", 26),
        ("fleet", "h100", 40)}
