"""The saved fleet queries (BigQuery's dialect) on DuckDB: each returns the right numbers on a
small fleet whose answers are worked out by hand below."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import duckdb
import pytest

from goodput_schemas import saved_queries
from pipeline.app.cli import main
from pipeline.app.fleet_sql import run_saved, to_duckdb
from pipeline.sinks.duckdb import DuckDBSink

UTC = datetime.timezone.utc


def t(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


def goodput(run_id: str, at: str, total: float, productive: float, chips: int, disruptions: int = 0,
            ended: bool = False, window_s: int = 0, accelerator: str | None = None,
            group: str | None = None) -> dict[str, Any]:
    return {"run_id": run_id, "snapshot_time": t(at), "window_s": window_s, "window_start": t(at),
            "window_end": t(at), "goodput_pct": 100 * productive / total if total else None,
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
        event("A", "2026-11-02 10:00:00", "checkpoint_save", '{"blocking_s": 20, "step": 1}'),
        event("A", "2026-11-02 10:30:00", "checkpoint_save", '{"blocking_s": 40, "step": 2}'),
        event("A", "2026-11-02 11:00:00", "checkpoint_save", '{"blocking_s": 30, "step": 3}'),
        event("A", "2026-11-02 11:50:00.500", "step_start"),
        # 59.8 s apart: BigQuery's TIMESTAMP_DIFF counts 59 whole seconds (DuckDB's date_diff, 60).
        event("B", "2026-11-02 10:59:59.600", "checkpoint_save", '{"blocking_s": 10, "step": 1}'),
        event("B", "2026-11-02 11:00:59.400", "checkpoint_save", '{"blocking_s": 10, "step": 2}'),
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


def test_interval_goodput_from_two_cumulative_snapshots(fleet):
    start, end = datetime.datetime(2026, 11, 2, 11), datetime.datetime(2026, 11, 2, 12)
    assert run(fleet, "interval_goodput") == [
        {"run_id": "A", "interval_start": start, "interval_end": end, "elapsed_s": 86400.0,
         "productive_s": 69300.0, "goodput_pct": 80.208},
        {"run_id": "B", "interval_start": start, "interval_end": end, "elapsed_s": 7200.0,
         "productive_s": 6480.0, "goodput_pct": 90.0},
        {"run_id": "C", "interval_start": start, "interval_end": end, "elapsed_s": 100.0,
         "productive_s": 50.0, "goodput_pct": 50.0},
    ]


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
