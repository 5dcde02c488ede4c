"""``goodput query`` with ``--limit`` and ``--param``, ``goodput sql``, and ``goodput --version``,
on a real DuckDB file the sink wrote."""

from __future__ import annotations

import datetime
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from goodput_schemas import SQL_DIRECTORY, saved_queries, saved_query
from goodput_schemas.parameters import fill, parameters
from pipeline.app.cli import TABLE_LIMIT, main
from pipeline.sinks.duckdb import DuckDBSink

UTC = datetime.timezone.utc
END = datetime.datetime(2026, 11, 2, 12, tzinfo=UTC)
RUNS = 120


def snapshot(index: int, at: datetime.datetime, total_s: float) -> dict[str, Any]:
    """A cumulative goodput_snapshots row of run ``r{index}`` (8 chips, half productive), leaving
    ``index`` hundredths of a second unaccounted."""
    return {"run_id": f"r{index:03}", "snapshot_time": at, "window_s": 0,
            "window_start": at - datetime.timedelta(seconds=total_s), "window_end": at,
            "goodput_pct": 50.0, "productive_time_s": total_s / 2, "total_time_s": total_s,
            "disruptions": 0, "max_productive_step": 0, "productive_chip_s": total_s * 4,
            "total_chip_s": total_s * 8, "chip_count": 8, "accelerator_type": "v5p",
            "run_group": f"g{index % 3}", "ended": False, "unaccounted_s": index / 100}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 runs of three groups, each snapshotted at 12:00 and, a day and two days before, at
    12:00 too (the snapshots of 2026-10-31, -11-01 and -11-02)."""
    path = tmp_path_factory.mktemp("query") / "fleet.duckdb"
    sink = DuckDBSink(path)
    sink.write("goodput_snapshots", [snapshot(i, END - datetime.timedelta(days=days), 3600.0 * (3 - days))
                                     for i in range(RUNS) for days in (2, 1, 0)])
    sink.close()
    return path


def test_a_table_is_cut_at_its_default_and_says_how_many_rows_were_left_out(fleet, capsys):
    """Without --limit a table shows TABLE_LIMIT rows and a last line naming the rest and --limit 0."""
    assert main(["query", "unbalanced_books", "--duckdb", str(fleet)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + TABLE_LIMIT + 1
    assert lines[-1] == (f"({TABLE_LIMIT} of {RUNS - 1} rows shown; {RUNS - 1 - TABLE_LIMIT} left out: "
                         "--limit 0 shows all, --format csv writes all)")


def test_csv_writes_every_row_unless_limited_and_says_so_on_stderr(fleet, capsys):
    """CSV has every row by default; with --limit, the cut is said on stderr, not in the data."""
    assert main(["query", "unbalanced_books", "--duckdb", str(fleet), "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + RUNS - 1
    assert main(["query", "unbalanced_books", "--duckdb", str(fleet), "--format", "csv", "--limit", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1:] == ["r119,2026-11-02 12:00:00,False,10800.0,1.19,0.011",
                                             "r118,2026-11-02 12:00:00,False,10800.0,1.18,0.011",
                                             "r117,2026-11-02 12:00:00,False,10800.0,1.17,0.011"]
    assert captured.err == f"goodput query: wrote 3 of {RUNS - 1} rows (--limit 3; --limit 0 for all)\n"


def test_limit_zero_shows_every_row_in_a_table(fleet, capsys):
    """--limit 0 is every row, and the last line counts them."""
    assert main(["query", "unbalanced_books", "--duckdb", str(fleet), "--limit", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"({RUNS - 1} rows)"


def test_a_parameter_changes_what_the_query_counts(fleet, capsys):
    """--param min_unaccounted_s=1.1 lists only the runs with more than 1.1 s unaccounted."""
    assert main(["query", "unbalanced_books", "--duckdb", str(fleet), "--format", "json",
                 "--param", "min_unaccounted_s=1.1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["run_id"] for row in rows] == [f"r{i}" for i in range(119, 110, -1)]


def test_a_string_parameter_chooses_the_run_group(fleet, capsys):
    """run_group_comparison compares the group given, whatever group started last."""
    def groups(*param: str) -> set[str]:
        assert main(["query", "run_group_comparison", "--duckdb", str(fleet), "--format", "json",
                     *param]) == 0
        return {json.loads(line)["run_group"] for line in capsys.readouterr().out.splitlines()}

    sink = DuckDBSink(fleet)
    sink.write("run_metadata", [{"run_id": f"r{i:03}", "attempt_id": "a", "run_group": f"g{i % 3}",
                                 "start_time": END - datetime.timedelta(seconds=RUNS - i)}
                                for i in range(RUNS)])
    sink.close()
    assert groups() == {"g2"}  # r119 started last
    assert groups("--param", "run_group=g0") == {"g0"}
    assert groups("--param", "run_group=it's none") == set()


def test_days_keeps_the_last_days_of_the_fleet(fleet, capsys):
    """fleet_goodput_by_day --param days=2 keeps the two days up to the latest snapshot's."""
    def days(*param: str) -> list[str]:
        assert main(["query", "fleet_goodput_by_day", "--duckdb", str(fleet), "--format", "csv", *param]) == 0
        return sorted({line.split(",")[0] for line in capsys.readouterr().out.splitlines()[1:]})

    assert days() == ["2026-10-31", "2026-11-01", "2026-11-02"]
    assert days("--param", "days=2") == ["2026-11-01", "2026-11-02"]
    assert days("--param", "days=NULL") == ["2026-10-31", "2026-11-01", "2026-11-02"]


@pytest.mark.parametrize(("param", "error"), [
    ("nope=1", "goodput query: --param: no parameter 'nope' (this query's parameters: min_unaccounted_s)"),
    ("min_unaccounted_s=abc", "goodput query: --param: min_unaccounted_s is a number, got 'abc'"),
    ("min_unaccounted_s=inf", "goodput query: --param: min_unaccounted_s is a finite number, got 'inf'"),
])
def test_a_wrong_parameter_is_one_line_naming_the_valid_ones(fleet, capsys, param, error):
    """An unknown parameter or a value not of its type is one line on stderr, exit code 2."""
    assert main(["query", "unbalanced_books", "--duckdb", str(fleet), "--param", param]) == 2
    assert capsys.readouterr().err == error + "\n"


def test_the_printed_bigquery_sql_has_the_value_given_written_in(capsys):
    """--sql --param writes the literal into the SQL printed for BigQuery; no @name is left."""
    assert main(["query", "interval_goodput", "--sql", "--dataset", "my-project.goodput",
                 "--param", "interval-hours=6"]) == 0
    sql = capsys.readouterr().out
    assert "INTERVAL 6 HOUR" in sql and "@interval_hours" not in sql.split("WITH", 1)[1]
    assert sql == saved_query("interval_goodput", "`my-project.goodput`", {"interval_hours": "6"})


def test_every_saved_query_declares_what_it_uses_and_its_defaults_fill_it():
    """Each query's parameters are declared, and saved_queries has none of them left unfilled."""
    declared = {path.stem: parameters(path.read_text()) for path in SQL_DIRECTORY.glob("*.sql")}
    assert {name for name, found in declared.items() if found} >= {
        "interval_goodput", "run_group_comparison", "stalled_or_regressed", "unbalanced_books",
        "fleet_goodput_by_day"}
    for name, sql in saved_queries("main").items():
        for parameter in declared[name]:
            assert f"@{parameter}" not in sql.split("\nWITH", 1)[-1].split("\nSELECT", 1)[-1], name


def test_a_string_value_is_one_bigquery_literal_whatever_it_holds():
    """Quotes, backslashes and line breaks in a value cannot end its literal."""
    sql = "-- @name STRING = NULL: a name\nSELECT @name AS name\n"
    assert fill(sql) == "-- @name STRING = NULL: a name\nSELECT CAST(NULL AS STRING) AS name\n"
    assert fill(sql, {"name": "a'b\\c\nd"}).endswith("SELECT 'a\\'b\\\\c\\nd' AS name\n")
    with pytest.raises(ValueError, match="uses @other without declaring it"):
        parameters("-- @name STRING = NULL: a name\nSELECT @name, @other\n")


def test_sql_runs_one_query_that_reads(fleet, capsys):
    """goodput sql runs a SELECT on the file, with the pipeline's views, in any --format."""
    assert main(["sql", "SELECT run_group, COUNT(*) AS runs FROM latest_goodput GROUP BY 1 ORDER BY 1",
                 "--duckdb", str(fleet), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["run_group,runs", "g0,40", "g1,40", "g2,40"]


def test_sql_takes_bigquerys_dialect(fleet, capsys):
    """--dialect bigquery transpiles as the saved queries are, ${dataset} being the file's tables."""
    query = "SELECT SAFE_DIVIDE(1, 0) AS d, COUNTIF(ended) AS e FROM ${dataset}.goodput_snapshots"
    assert main(["sql", query, "--duckdb", str(fleet), "--dialect", "bigquery", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"d": None, "e": 0}


@pytest.mark.parametrize(("query", "error"), [
    ("CREATE TABLE x AS SELECT 1", "CREATE is not run here: only one query that reads (a select, "
                                   "with ..., explain), the file being opened read-only"),
    ("SELECT 1; DROP TABLE events", "one query at a time, got 2 statements"),
    ("SELECT * FROM read_csv('/etc/hostname')", "Permission Error: Cannot access file"),
    ("SELEC 1", 'Parser Error: syntax error at or near "SELEC"'),
    ("SELECT nope FROM goodput_snapshots", "Binder Error: Referenced column \"nope\" not found"),
])
def test_sql_refuses_what_does_not_only_read_the_file_in_one_line(fleet, capsys, query, error):
    """A write, a second statement, a file outside, an SQL mistake: one line, exit code 2, the file
    unchanged."""
    before = fleet.read_bytes()
    assert main(["sql", query, "--duckdb", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"goodput sql: {error}") and err.count("\n") == 1
    assert fleet.read_bytes() == before


def test_version_is_the_installed_distributions(capsys):
    """goodput --version prints the version of the installed fleet-goodput."""
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"goodput {version('fleet-goodput')}\n"
