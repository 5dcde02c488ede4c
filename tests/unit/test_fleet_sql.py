"""The saved fleet queries (BigQuery's dialect) on DuckDB: each returns the right numbers on a
small fleet whose answers are worked out by hand below."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import duckdb
import pytest

from goodput_schemas import saved_queries, views
from goodput_schemas.wire import workload_run_id
from pipeline.app.cli import main
from pipeline.app.fleet_sql import run_saved
from pipeline.sinks.duckdb import DuckDBSink
from pipeline.sinks.duckdb_sql import to_duckdb

UTC = datetime.timezone.utc


def t(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


def goodput(run_id: str, at: str, total: float, productive: float, chips: int, disruptions: int = 0,
            ended: bool = False, window_s: int = 0, accelerator: str | None = None,
            group: str | None = None, end: str | None = None) -> dict[str, Any]:
    """A goodput_snapshots row as of ``at``, measuring the run's last ``total`` seconds up to its
    ``end`` (the snapshot's time while it runs)."""
    window_end = t(end or at)
    return {"run_id": run_id, "snapshot_time": t(at), "window_s": window_s,
            "window_start": window_end - datetime.timedelta(seconds=total),
            "window_end": window_end, "goodput_pct": 100 * productive / total if total else None,
            "productive_time_s": productive, "total_time_s": total, "disruptions": disruptions,
            "max_productive_step": 0, "productive_chip_s": productive * chips,
            "total_chip_s": total * chips, "chip_count": chips, "accelerator_type": accelerator,
            "run_group": group, "ended": ended}


def event(run_id: str, at: str, kind: str, body: str | None = None, seq: int = 0) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": "a1", "seq": seq, "event_time": t(at), "kind": kind,
            "step": 1 if kind == "step_start" else None, "body": body}


A_END, B_END = "2026-11-02 12:00:00", "2026-11-02 11:30:00"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run A (v5p, 100 chips, 2 disruptions, stalled, step time regressed) over two days; run B
    (v5e, 10 chips, ended) on the second day; run C without metadata or chips."""
    path = tmp_path_factory.mktemp("fleet") / "fleet.duckdb"
    sink = DuckDBSink(path)
    sink.write("goodput_snapshots", [
        goodput("A", "2026-11-01 12:00:00", 3600, 2700, 100, accelerator="v5p", group="llm"),
        goodput("A", A_END, 90000, 72000, 100, 2, accelerator="v5p", group="llm"),
        goodput("A", A_END, 300, 0, 100, window_s=300, accelerator="v5p", group="llm"),
        goodput("B", B_END, 7200, 6480, 10, ended=True, accelerator="v5e", group="llm"),
        goodput("B", B_END, 300, 300, 10, ended=True, window_s=300, accelerator="v5e", group="llm"),
        goodput("C", A_END, 100, 50, 0),
    ])
    sink.write("badput_snapshots", [
        {"run_id": run, "snapshot_time": t(at), "window_s": 0, "badput_source": source,
         "seconds": seconds, "pct": 0.0}
        for run, at, source, seconds in [
            ("A", A_END, "TRAINING_PREP", 10000), ("A", A_END, "WASTED_PROGRESS_FROM_DISRUPTION", 8000),
            ("A", A_END, "DATA_LOADING_ASYNC", 500), ("A", "2026-11-01 12:00:00", "TRAINING_PREP", 900),
            ("B", B_END, "TRAINING_PREP", 720)]])
    sink.write("disruptions", [
        {"run_id": "A", "snapshot_time": t(A_END), "disruption_index": i, "restart_time": t(A_END),
         "wasted_progress_s": 0.0, "recovery_s": recovery, "in_process": False}
        for i, recovery in enumerate((600.0, 1200.0))])
    sink.write("step_stats", [
        {"run_id": run, "snapshot_time": t(at), "steps_measured": 1000, "step_time_mean_s": p50,
         "step_time_p50_s": p50, "step_time_p90_s": p50, "step_time_p99_s": p50, "step_time_max_s": p50,
         "recent_step_time_p50_s": recent}
        for run, at, p50, recent in [("A", A_END, 1.0, 1.5), ("B", B_END, 2.0, 2.0)]])
    sink.write("events", [
        event("A", "2026-11-02 10:00:00", "checkpoint_save", '{"blocking_s": 20, "step": 1}', seq=0),
        event("A", "2026-11-02 10:30:00", "checkpoint_save", '{"blocking_s": 40, "step": 2}', seq=1),
        event("A", "2026-11-02 11:00:00", "checkpoint_save", '{"blocking_s": 30, "step": 3}', seq=2),
        event("A", "2026-11-02 11:50:00.500", "step_start", seq=3),
        # 59.8 s apart: BigQuery's TIMESTAMP_DIFF counts 59 whole seconds (DuckDB's date_diff, 60).
        event("B", "2026-11-02 10:59:59.600", "checkpoint_save", '{"blocking_s": 10, "step": 1}', seq=0),
        event("B", "2026-11-02 11:00:59.400", "checkpoint_save", '{"blocking_s": 10, "step": 2}', seq=1),
    ])
    sink.close()
    return path


def run(fleet: Path, name: str) -> list[dict[str, Any]]:
    with duckdb.connect(str(fleet), read_only=True) as connection:
        columns, rows = run_saved(name, connection)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def test_there_are_at_least_six_saved_queries_and_each_is_one_statement():
    queries = saved_queries("main")
    assert len(queries) >= 6
    for sql in queries.values():
        assert "SELECT" in to_duckdb(sql)  # one statement, or it raises


def test_timestamp_diff_counts_whole_units_as_bigquery_does():
    with duckdb.connect() as connection:
        sql = to_duckdb("SELECT TIMESTAMP_DIFF(TIMESTAMP '2026-11-01 11:01:00', "
                        "TIMESTAMP '2026-11-01 10:59:00', HOUR) AS h, "
                        "TIMESTAMP_DIFF(TIMESTAMP '2026-11-01 10:59:00', "
                        "TIMESTAMP '2026-11-01 12:01:00', HOUR) AS back")
        assert connection.execute(sql).fetchone() == (0, -1)


def test_every_view_is_made_from_its_bigquery_sql_with_bigquerys_meaning(tmp_path: Path):
    """The sink makes each view of goodput_schemas/views/ in a new file from its BigQuery SQL
    transpiled (DuckDB has neither TIMESTAMP_SUB nor SAFE_DIVIDE), and each reads."""
    sink = DuckDBSink(tmp_path / "f.duckdb")
    made = dict(sink.query("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal"))
    assert set(made) == set(views("main"))
    assert "TIMESTAMP_SUB" in views("main")["run_productivity_factors"]
    assert "TIMESTAMP_SUB" not in made["run_productivity_factors"].upper()
    for name in made:
        assert sink.query(f'SELECT count(*) FROM "{name}"') == [(0,)]
    sink.close()


def test_fleet_goodput_by_day(fleet):
    assert run(fleet, "fleet_goodput_by_day") == [
        {"day": datetime.date(2026, 11, 1), "accelerator_type": "v5p", "run_group": "llm", "runs": 1,
         "chip_hours": 100.0, "goodput_pct": 75.0},
        {"day": datetime.date(2026, 11, 2), "accelerator_type": "unknown", "run_group": "none", "runs": 1,
         "chip_hours": 0.0, "goodput_pct": None},
        {"day": datetime.date(2026, 11, 2), "accelerator_type": "v5e", "run_group": "llm", "runs": 1,
         "chip_hours": 20.0, "goodput_pct": 90.0},
        # A's second day: 8,640,000 chip-seconds elapsed, 6,930,000 productive.
        {"day": datetime.date(2026, 11, 2), "accelerator_type": "v5p", "run_group": "llm", "runs": 1,
         "chip_hours": 2400.0, "goodput_pct": 80.208},
    ]


def test_badput_ranking(fleet):
    prep, wasted = 10000 * 100 + 720 * 10, 8000 * 100
    assert run(fleet, "badput_ranking") == [
        {"position": 1, "badput_source": "TRAINING_PREP", "runs": 2, "chip_hours": round(prep / 3600, 3),
         "share_pct": round(100 * prep / (prep + wasted), 2)},
        {"position": 2, "badput_source": "WASTED_PROGRESS_FROM_DISRUPTION", "runs": 1,
         "chip_hours": round(wasted / 3600, 3), "share_pct": round(100 * wasted / (prep + wasted), 2)},
    ]


def test_disruption_rates(fleet):
    assert run(fleet, "disruption_rates") == [
        {"accelerator_type": "unknown", "runs": 1, "disruptions": 0, "chip_hours": 0.0,
         "disruptions_per_1000_chip_hours": None, "mtbf_h": None, "mttr_s": None},
        {"accelerator_type": "v5e", "runs": 1, "disruptions": 0, "chip_hours": 20.0,
         "disruptions_per_1000_chip_hours": 0.0, "mtbf_h": None, "mttr_s": None},
        {"accelerator_type": "v5p", "runs": 1, "disruptions": 2, "chip_hours": 2500.0,
         "disruptions_per_1000_chip_hours": 0.8, "mtbf_h": 12.5, "mttr_s": 900.0},
    ]


def test_lost_chip_hours_and_cost(fleet):
    assert run(fleet, "lost_chip_hours") == [
        {"run_group": "llm", "accelerator_type": "v5p", "runs": 1, "chip_hours": 2500.0,
         "lost_chip_hours": 500.0, "lost_usd": 2100.0},
        {"run_group": "llm", "accelerator_type": "v5e", "runs": 1, "chip_hours": 20.0,
         "lost_chip_hours": 2.0, "lost_usd": 2.4},
        {"run_group": "none", "accelerator_type": "unknown", "runs": 1, "chip_hours": 0.0,
         "lost_chip_hours": 0.0, "lost_usd": None},
    ]


def test_checkpoint_interval_against_young_and_daly(fleet):
    save, mtbf = 30.0, 90000 / 2
    young = math.sqrt(2 * save * mtbf)
    x = save / (2 * mtbf)
    daly = young * (1 + math.sqrt(x) / 3 + x / 9) - save
    assert run(fleet, "checkpoint_interval") == [
        {"run_id": "A", "accelerator_type": "v5p", "saves": 3, "save_s": 30.0, "interval_s": 1800.0,
         "mtbf_s": 45000.0, "young_s": round(young, 1), "daly_s": round(daly, 1),
         "interval_vs_daly": round(1800 / daly, 3)},
        # No disruption on B nor on any v5e run: no MTBF, no optimum; 59 whole seconds apart.
        {"run_id": "B", "accelerator_type": "v5e", "saves": 2, "save_s": 10.0, "interval_s": 59.0,
         "mtbf_s": None, "young_s": None, "daly_s": None, "interval_vs_daly": None},
    ]


def test_stalled_or_regressed(fleet):
    assert run(fleet, "stalled_or_regressed") == [
        {"run_id": "A", "snapshot_time": t(A_END).replace(tzinfo=None), "stalled": True,
         "regressed": True, "step_time_ratio": 1.5, "since_last_step_s": 599},
    ]


INTERVAL_START, INTERVAL_END = datetime.datetime(2026, 11, 2, 11), datetime.datetime(2026, 11, 2, 12)


@pytest.fixture(scope="module")
def interval_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet whose latest snapshot is at 12:00 on 2026-11-02: the interval is 11:00 to 12:00.
    Run P has a snapshot before the interval, N started inside it, M started a day before with its
    earlier snapshots gone, and E ended before it."""
    path = tmp_path_factory.mktemp("interval") / "fleet.duckdb"
    sink = DuckDBSink(path)
    sink.write("goodput_snapshots", [
        # P: started at 09:00, snapshotted before and inside the interval.
        goodput("P", "2026-11-02 10:00:00", 3600, 3000, 8),
        goodput("P", "2026-11-02 10:59:30", 7170, 6000, 8),
        goodput("P", "2026-11-02 11:30:00", 9000, 7500, 8),
        goodput("P", "2026-11-02 12:00:00", 10800, 9000, 8),
        goodput("P", "2026-11-02 12:00:00", 300, 300, 8, window_s=300),  # rolling: not counted
        # N: started at 11:20.
        goodput("N", "2026-11-02 11:40:00", 1200, 1000, 8),
        goodput("N", "2026-11-02 12:00:00", 2400, 1800, 8),
        # M: started at 12:00 the day before; its snapshots before 11:15 have expired.
        goodput("M", "2026-11-02 11:15:00", 83700, 60000, 8),
        goodput("M", "2026-11-02 12:00:00", 86400, 62400, 8),
        # E: ran from 08:00 to 10:30; a late message snapshotted it again at 11:10.
        goodput("E", "2026-11-02 10:30:00", 9000, 8000, 8, ended=True),
        goodput("E", "2026-11-02 11:10:00", 9000, 8000, 8, ended=True, end="2026-11-02 10:30:00"),
    ])
    sink.close()
    return path


def test_interval_goodput_counts_each_run_from_its_start_or_a_snapshot(interval_fleet):
    """Each run counts from its start inside the interval, else from its latest snapshot at or
    before the interval's start, else from its earliest snapshot inside it."""
    # P: from its 10:59:30 snapshot (7,170 s elapsed, 6,000 productive) to its 12:00 one (10,800 s,
    #    9,000): 3,630 s elapsed, the hour and the 30 s before it that counted_from shows; 3,000 s
    #    productive; 3,000 / 3,630 = 82.645 %. Neither its 10:00 nor its 11:30 snapshot counts.
    # N: from its start at 11:20 (12:00 less 2,400 s), from nothing: 2,400 s, 1,800 s, 75 %.
    # M: from its 11:15 snapshot (83,700 s, 60,000) to 12:00 (86,400 s, 62,400): 2,700 s, 2,400 s,
    #    2,400 / 2,700 = 88.889 %; not its whole 86,400 s.
    # E: its figures end at 10:30, before the interval: not listed, though snapshotted at 11:10.
    rows = run(interval_fleet, "interval_goodput")
    bounds = {"interval_start": INTERVAL_START, "interval_end": INTERVAL_END}
    assert rows == [
        {"run_id": "M", **bounds, "counted_from": datetime.datetime(2026, 11, 2, 11, 15),
         "elapsed_s": 2700.0, "productive_s": 2400.0, "goodput_pct": 88.889},
        {"run_id": "N", **bounds, "counted_from": datetime.datetime(2026, 11, 2, 11, 20),
         "elapsed_s": 2400.0, "productive_s": 1800.0, "goodput_pct": 75.0},
        {"run_id": "P", **bounds, "counted_from": datetime.datetime(2026, 11, 2, 10, 59, 30),
         "elapsed_s": 3630.0, "productive_s": 3000.0, "goodput_pct": 82.645},
    ]
    for row in rows:
        assert row["elapsed_s"] <= (INTERVAL_END - row["counted_from"]).total_seconds()


def test_goodput_query_command(fleet, capsys):
    assert main(["query", "lost_chip_hours", "--duckdb", str(fleet)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run_group", "accelerator_type", "runs", "chip_hours", "lost_chip_hours",
                                "lost_usd"]
    assert lines[2].split() == ["llm", "v5p", "1", "2500.0", "500.0", "2100.0"]
    assert lines[-1] == "(3 rows)"
    assert main(["query", "--list"]) == 0
    assert set(saved_queries("main")) <= {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert main(["query", "no_such_query", "--duckdb", str(fleet)]) == 2
    assert "no saved query" in capsys.readouterr().err




def test_goodput_query_sql_names_the_tables_in_the_dataset_given(capsys):
    """goodput query NAME --sql --dataset PROJECT.DATASET prints the query ready to run in BigQuery."""
    assert main(["query", "lost_chip_hours", "--sql", "--dataset", "my-project.goodput"]) == 0
    sql = capsys.readouterr().out
    assert sql == saved_queries("`my-project.goodput`")["lost_chip_hours"]
    assert "FROM `my-project.goodput`.goodput_snapshots" in sql and "${dataset}" not in sql
    assert main(["query", "lost_chip_hours", "--sql"]) == 2
    assert "--sql needs --dataset" in capsys.readouterr().err
    assert main(["query", "lost_chip_hours", "--dataset", "my-project.goodput"]) == 2
    assert "--dataset is for --sql" in capsys.readouterr().err


@pytest.fixture(scope="module")
def books_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run K balances in its latest snapshot (not in an earlier one); run U leaves 0.7 % of its
    elapsed time in no bucket in its latest (not in an earlier one); run L's rows were written
    before unaccounted_s existed."""
    path = tmp_path_factory.mktemp("books") / "fleet.duckdb"
    sink = DuckDBSink(path)
    sink.write("goodput_snapshots", [
        {**goodput("K", "2026-11-02 10:00:00", 3600, 3000, 8), "unaccounted_s": 5.0},
        {**goodput("K", "2026-11-02 12:00:00", 10800, 9000, 8), "unaccounted_s": 0.0},
        {**goodput("K", "2026-11-02 12:00:00", 300, 0, 8, window_s=300), "unaccounted_s": 2.0},  # rolling
        {**goodput("U", "2026-11-02 10:00:00", 3600, 3000, 8), "unaccounted_s": 0.0},
        {**goodput("U", "2026-11-02 12:00:00", 10000, 9000, 8, ended=True), "unaccounted_s": 70.0},
        goodput("L", "2026-11-02 12:00:00", 100, 50, 0),
    ])
    sink.close()
    return path


def test_unbalanced_books_lists_only_runs_whose_latest_snapshot_does_not_balance(books_fleet):
    """Only U is listed: its latest cumulative snapshot has 70 s of its 10,000 s unaccounted."""
    assert run(books_fleet, "unbalanced_books") == [
        {"run_id": "U", "snapshot_time": datetime.datetime(2026, 11, 2, 12), "ended": True,
         "elapsed_s": 10000.0, "unaccounted_s": 70.0, "unaccounted_pct": 0.7},
    ]


#: The runs of the name "llama" that two workloads gave it.
REUSED = tuple(workload_run_id("llama", uid) for uid in ("aaaaaaaa-1", "bbbbbbbb-2"))


def metadata(run_id: str, started: str, group: str) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-a", "start_time": t(started), "run_group": group,
            "run_name": run_id.split("~")[0]}


def config(run_id: str, at: str, key: str, value: str, source: str = "user") -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-a", "recorded_at": t(at), "source": source, "key": key,
            "value": value}


def metric(run_id: str, at: str, step: int | None, name: str, value: float) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-a", "metric_time": t(at), "step": step, "name": name,
            "value": value}


@pytest.fixture(scope="module")
def group_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Group "llama": runs R1 (started 08:00), R3 (09:00) and R2 (10:00, the fleet's latest), R1 and
    R2 of one name reused by two workloads; group "other": run O, started earlier."""
    path = tmp_path_factory.mktemp("groups") / "fleet.duckdb"
    sink = DuckDBSink(path)
    r1, r2, r3 = *REUSED, "R3"
    sink.write("run_metadata", [metadata(r1, "2026-11-02 08:00:00", "llama"),
                                metadata(r3, "2026-11-02 09:00:00", "llama"),
                                metadata(r2, "2026-11-02 10:00:00", "llama"),
                                metadata("O", "2026-11-02 07:00:00", "other")])
    sink.write("run_configs", [
        config(r1, "2026-11-02 08:00:00", "lr", "0.01"), config(r1, "2026-11-02 08:00:00", "seed", "1"),
        config(r1, "2026-11-02 08:00:00", "batch", "32"),
        config(r1, "2026-11-02 08:00:00", "jax", "0.4", "software"),
        # R2 recorded its learning rate twice: the later value is its config.
        config(r2, "2026-11-02 10:00:00", "lr", "0.03"), config(r2, "2026-11-02 10:05:00", "lr", "0.02"),
        config(r2, "2026-11-02 10:00:00", "seed", "1"), config(r2, "2026-11-02 10:00:00", "batch", "32"),
        config(r2, "2026-11-02 10:00:00", "jax", "0.5", "software"),
        config(r3, "2026-11-02 09:00:00", "lr", "0.01"), config(r3, "2026-11-02 09:00:00", "seed", "1"),
        config("O", "2026-11-02 07:00:00", "lr", "9"),
    ])
    sink.write("model_metrics", [
        metric(r1, "2026-11-02 08:10:00", 1, "LOSS", 2.0), metric(r1, "2026-11-02 08:20:00", 2, "LOSS", 1.0),
        metric(r1, "2026-11-02 08:20:00", 2, "LOSS", 1.0),  # a redelivered message's row
        metric(r2, "2026-11-02 10:10:00", 3, "LOSS", math.nan),
        metric(r2, "2026-11-02 10:20:00", 1, "LOSS", 3.0),
        metric(r2, "2026-11-02 10:10:00", None, "LATENCY", 5.0),
        metric(r2, "2026-11-02 10:30:00", None, "LATENCY", 7.0),
        metric("O", "2026-11-02 07:10:00", 1, "LOSS", 9.0),
    ])
    sink.write("goodput_snapshots", [
        goodput(r1, "2026-11-02 08:30:00", 1800, 1260, 8), goodput(r1, "2026-11-02 09:00:00", 3600, 2880, 8),
        goodput(r2, "2026-11-02 11:00:00", 3600, 3240, 8),
        goodput(r2, "2026-11-02 11:00:00", 300, 0, 8, window_s=300),  # rolling: not counted
    ])
    sink.close()
    return path


def test_run_group_comparison_sets_the_groups_runs_side_by_side(group_fleet):
    """The latest group's runs in start order: goodput, the user configs that differ (lr, and batch,
    which R3 lacks; not seed, nor the software configs), each metric's last value by step (R2's
    LOSS: NaN at step 3, though recorded before step 1's), else by time, and its mean."""
    r1, r2, r3 = *REUSED, "R3"
    rows = run(group_fleet, "run_group_comparison")
    assert {(row["run_group"], row["run_name"]) for row in rows} == {("llama", "llama"), ("llama", "R3")}
    cells = [(row["item"], row["name"], row["run_id"], row["value"], row["last_value"], row["last_step"],
              row["mean_value"]) for row in rows]
    nan = [cell for cell in cells if cell[4] is not None and math.isnan(cell[4])]
    assert nan == [("metric", "LOSS", r2, None, nan[0][4], 3, nan[0][6])] and math.isnan(nan[0][6])
    assert [cell for cell in cells if cell not in nan] == [
        ("goodput", "goodput_pct", r1, None, 80.0, None, None),
        ("goodput", "goodput_pct", r3, None, None, None, None),
        ("goodput", "goodput_pct", r2, None, 90.0, None, None),
        ("config", "batch", r1, "32", None, None, None),
        ("config", "batch", r3, None, None, None, None),
        ("config", "batch", r2, "32", None, None, None),
        ("config", "lr", r1, "0.01", None, None, None),
        ("config", "lr", r3, "0.01", None, None, None),
        ("config", "lr", r2, "0.02", None, None, None),
        ("metric", "LATENCY", r1, None, None, None, None),
        ("metric", "LATENCY", r3, None, None, None, None),
        ("metric", "LATENCY", r2, None, 7.0, None, 6.0),
        ("metric", "LOSS", r1, None, 1.0, 2, 1.5),
        ("metric", "LOSS", r3, None, None, None, None),
    ]
