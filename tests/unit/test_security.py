"""Abuse: SQL is never built from user data (the scan of every source file, and the scan itself),
and a DuckDB file handed to a reader runs only what the pipeline made."""

from __future__ import annotations

import ast
import io
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from goodput_schemas import views
from pipeline.sinks.duckdb import NotOurs, not_ours, open_reader
from pipeline.sinks.duckdb_sql import view_to_duckdb
from support import REPO
from support.history import goodput_row, write_rows

# -- Cloud Monitoring: label values --------------------------------------------------------------------


# -- BigQuery and DuckDB: values ---------------------------------------------------------------------


# -- SQL is never built from user data ---------------------------------------------------------------

SCANNED = ("pipeline", "emitter", "ml_goodput_measurement", "benchmarks")
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|FROM|WHERE|VALUES|VIEW|TABLE)\b")
SQL_CALLS = frozenset({"execute", "executemany", "query", "query_and_wait", "sql", "raw_sql", "parse_one",
                       "parse"})
#: Everything that may be put into SQL text, by file: the exact source of each expression, and why
#: it is not user data. Values always go through query parameters.
ALLOWED_IN_SQL: dict[str, dict[str, str]] = {
    "pipeline/app/alerts.py": {"', '.join(_COLUMNS)": "a tuple constant of column names"},
    "pipeline/app/report.py": {"', '.join(_GOODPUT_COLUMNS)": "a tuple constant of column names",
                           "', '.join(_DISRUPTION_COLUMNS)": "a tuple constant of column names"},
    "pipeline/app/run_page.py": {"', '.join(_GOODPUT_COLUMNS)": "a tuple constant of column names",
                                 "', '.join(_DISRUPTION_COLUMNS)": "a tuple constant of column names"},
    "pipeline/sinks/duckdb.py": {
        "name": "a table or view name from goodput_schemas/",
        "', '.join(columns)": "column definitions from goodput_schemas/",
        "view_to_duckdb(query)": "a view's SQL from goodput_schemas/views/, transpiled",
        "table": "an output table name (a key of its schemas)",
        "names": "column names of the table's schema",
        "column": "a column name of a table's schema",
        "match": "the key columns of a table (goodput_schemas/table_options.json) compared",
        "partition": "the key columns of a table (goodput_schemas/table_options.json)",
        "columns": "the names and types of a seeded table's columns, from its schema",
        "kind": "a DuckDB type, mapped from a schema's type"},
    "pipeline/app/gke.py": dict.fromkeys(
        ("_LATEST_SQL.format(start='$start', end='$end')", "_LETTERS_SQL.format(start='$start')",
         "_LATEST_SQL.format(start='@start', end='@end')", "_LETTERS_SQL.format(start='@start')"),
        "a constant query given the placeholders of its parameters (DuckDB's or BigQuery's)"),
    "pipeline/sinks/raw_events.py": {"COLUMNS": "a constant list of the events table's columns",
                                     "BIGQUERY_COLUMNS": "a constant list of the events table's columns",
                                     "_LATEST_COLUMNS": "a constant list of goodput_snapshots' columns",
                                     "dataset": "a project and a dataset matched by parse_dataset"},
    "pipeline/emulators/bigquery.py": {
        "name": "a table's ids, checked when the table was created, its quotes doubled",
        "columns": "the table's field names, checked when it was created, and types mapped"},
    "pipeline/sinks/duckdb_sql.py": {
        "later": "a part of a saved query or view of goodput_schemas/, or of a query the BigQuery "
                 "stand-in was sent, re-rendered",
        "earlier": "a part of a saved query or view of goodput_schemas/, or of a query the BigQuery "
                   "stand-in was sent, re-rendered",
        "_UNIT_US[unit]": "an integer constant"},
    "ml_goodput_measurement/src/goodput.py": {
        "_RUN_OF_NAME.format(**self._tables)":
            "table references: names from _TABLES, project and dataset matched by _DATASET",
        "sql.format(**self._tables, run=run)":
            "table references as above, and run: _RUN_OF_NAME so filled in, or the literal @run_id"},
}


def _literal(node: ast.AST) -> str:
    """The constant text of a string expression (its literal parts, for f-strings and sums)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    if isinstance(node, ast.BinOp):
        return _literal(node.left) + _literal(node.right)
    return ""


def sql_interpolations(source: str) -> Iterator[tuple[int, str]]:
    """(line, expression) for everything put into SQL text in ``source``: the values of f-strings,
    ``+`` and ``%`` operands and ``.format`` arguments of SQL-looking strings, any string built that
    way passed to an execute/query call, and every ``.format`` on a string that is not a literal."""
    for node in ast.walk(ast.parse(source)):
        built: list[ast.AST] = []
        if isinstance(node, ast.JoinedStr | ast.BinOp) and SQL_WORDS.search(_literal(node)):
            built.append(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in SQL_CALLS and node.args):
            built.append(node.args[0])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
            if isinstance(node.func.value, ast.Constant):
                if SQL_WORDS.search(_literal(node.func.value)):
                    yield from ((node.lineno, ast.unparse(arg)) for arg in [*node.args, *node.keywords])
            else:
                yield node.lineno, ast.unparse(node)
        for expression in built:
            if isinstance(expression, ast.JoinedStr):
                yield from ((node.lineno, ast.unparse(v.value)) for v in expression.values
                            if isinstance(v, ast.FormattedValue))
            elif isinstance(expression, ast.BinOp) and isinstance(expression.op, ast.Add | ast.Mod):
                yield from ((node.lineno, ast.unparse(side)) for side in (expression.left, expression.right)
                            if not isinstance(side, ast.Constant | ast.JoinedStr | ast.BinOp))


def test_sql_scan_finds_user_data_put_into_sql():
    """The scan sees an interpolated value however the SQL is built."""
    source = '''
conn.execute(f"SELECT * FROM t WHERE run_id = '{run_id}'")
conn.execute("SELECT * FROM t WHERE run_id = '" + run_id + "'")
conn.query("SELECT * FROM t WHERE run_id = '%s'" % run_id)
conn.execute("SELECT * FROM t WHERE run_id = '{}'".format(run_id))
client.query_and_wait(f"{prefix} and more")
conn.execute(text.format(run_id=run_id))
conn.execute("SELECT * FROM t WHERE run_id = ?", [run_id])
'''
    found = sorted(set(sql_interpolations(source)))
    assert found == [(2, "run_id"), (3, "run_id"), (4, "run_id"), (5, "run_id"), (6, "prefix"),
                     (7, "text.format(run_id=run_id)")]


def test_no_sql_is_built_from_anything_but_our_own_names():
    """Every value put into SQL text in pipeline/, emitter/ and benchmarks/ is on the commented
    allow-list; user data goes through query parameters."""
    problems = []
    for directory in SCANNED:
        for path in sorted(p for p in (REPO / directory).rglob("*.py") if "build" not in p.parts):
            name = path.relative_to(REPO).as_posix()
            allowed = ALLOWED_IN_SQL.get(name, {})
            for line, expression in sql_interpolations(path.read_text(encoding="utf-8")):
                if expression not in allowed:
                    problems.append(f"{name}:{line}: {expression} is put into SQL text")
    assert problems == []


# -- DuckDB files: a reader runs only what the pipeline made -------------------------------------------

HIDDEN_TEXT = "nobody-may-read-4711"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file of the reader's that no output may show."""
    path = tmp_path / "secret.txt"
    path.write_text(HIDDEN_TEXT)
    return path


def planted(path: Path, secret: Path, view: str, column: str = "run_id") -> Path:
    """``path``, a file the pipeline wrote, with run r1's snapshot in it, after someone made its
    view ``view`` again with the same name and columns: each row of ours, with ``secret`` read into
    ``column``. The ownership check cannot tell it from ours."""
    write_rows(path, {"goodput_snapshots": [goodput_row("r1", 600)]})
    with duckdb.connect(str(path)) as connection:
        connection.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT o.* REPLACE (r.content AS {column}) "
                           f"FROM ({view_to_duckdb(views('main')[view])}) AS o, read_text('{secret}') AS r")
        assert not_ours(connection) is None
    return path


def test_a_reader_reaches_no_file_but_its_own_and_cannot_be_set_to(tmp_path: Path, secret: Path):
    """A connection that reads a DuckDB file can neither read, write nor attach another file, nor
    be reconfigured to."""
    with open_reader(write_rows(tmp_path / "goodput.duckdb", {})) as connection:
        for statement in (f"SELECT content FROM read_text('{secret}')",
                          f"SELECT * FROM glob('{tmp_path}/*')",
                          f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'",
                          f"ATTACH '{tmp_path / 'x.duckdb'}'"):
            with pytest.raises(duckdb.PermissionException, match="disabled"):
                connection.execute(statement)
        for setting in ("enable_external_access = true", "lock_configuration = false"):
            with pytest.raises(duckdb.InvalidInputException):
                connection.execute(f"SET {setting}")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["goodput.duckdb", "secret.txt"]


def test_a_reader_runs_the_pipelines_views_not_the_files(tmp_path: Path, secret: Path):
    """A view the file holds under one of our names is not the one a reader's queries read, named
    alone or as main.NAME."""
    path = planted(tmp_path / "goodput.duckdb", secret, "latest_goodput")
    with open_reader(path) as connection:
        for name in ("latest_goodput", "main.latest_goodput"):
            assert connection.execute(f"SELECT run_id FROM {name}").fetchall() == [("r1",)]


@pytest.mark.parametrize("command", [["query", "run_productivity"],
                                     ["query", "run_productivity", "--format", "csv"],
                                     ["query", "run_productivity", "--format", "json"], ["report"]])
def test_goodput_query_and_report_show_nothing_a_files_views_read(tmp_path: Path, secret: Path,
                                                                   command: list[str], capsys):
    """goodput query and report on a file whose view reads a local file show run r1, never that file."""
    from pipeline.app.cli import main

    path = planted(tmp_path / "goodput.duckdb", secret, "run_productivity_factors")
    report = tmp_path / "report.html"
    assert main([*command, "--duckdb", str(path), *(["--output", str(report)] if command == ["report"]
                                                    else [])]) == 0
    shown = capsys.readouterr().out + (report.read_text() if command == ["report"] else "")
    assert "r1" in shown and HIDDEN_TEXT not in shown


def test_the_replay_summary_shows_nothing_a_files_views_read(tmp_path: Path, secret: Path):
    """The summary a replay prints reads the pipeline's views, not the file's."""
    from pipeline.app.summary import print_summary

    out = io.StringIO()
    print_summary(str(planted(tmp_path / "goodput.duckdb", secret, "latest_goodput")), out)
    assert out.getvalue().splitlines()[1].startswith("r1 ") and HIDDEN_TEXT not in out.getvalue()


def test_the_replay_summary_shows_control_characters_as_escapes(tmp_path: Path):
    """A run id or badput source holding an escape sequence (written to the file by hand: the sink
    makes ids printable) is printed as its escape."""
    from pipeline.app.summary import print_summary

    path = write_rows(tmp_path / "goodput.duckdb", {})
    snapshot = goodput_row("\x1b]0;title\x07r1", 600)
    badput = {"run_id": snapshot["run_id"], "snapshot_time": snapshot["snapshot_time"], "window_s": 0,
              "badput_source": "\x1b[2JOTHER", "seconds": 6.0, "pct": 10.0}
    with duckdb.connect(str(path)) as connection:
        for table, row in (("goodput_snapshots", snapshot), ("badput_snapshots", badput)):
            names = [name for name in row if row[name] is not None]
            marks = ", ".join("?" for _ in names)
            connection.execute(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks})",
                               [row[name] for name in names])
    out = io.StringIO()
    print_summary(str(path), out)
    assert all(line.isprintable() for line in out.getvalue().splitlines())
    assert "\\x1b]0;title\\x07r1" in out.getvalue() and "\\x1b[2JOTHER 10.00%" in out.getvalue()


def test_the_demo_reads_the_pipelines_views_not_the_files(tmp_path: Path, secret: Path):
    """The demo's figures of each run come from the pipeline's views."""
    from pipeline.demo.demo import latest_cumulative, read_live

    path = planted(tmp_path / "goodput.duckdb", secret, "latest_goodput")
    live = read_live(path)
    assert set(latest_cumulative(path)) == {"r1"} and live is not None and set(live[0]) == {"r1"}


def test_the_read_api_runs_no_view_of_the_file(tmp_path: Path, secret: Path):
    """GoodputCalculator on a file whose views read a local file answers from the file's tables,
    and never runs a view of it."""
    from ml_goodput_measurement import goodput

    path = planted(tmp_path / "goodput.duckdb", secret, "latest_goodput")
    calculator = goodput.GoodputCalculator("r1", duckdb_path=str(path))
    details = calculator.get_job_goodput_details()
    assert calculator.get_job_goodput()[0] == pytest.approx(goodput_row("r1", 600)["goodput_pct"])
    assert secret.read_text() not in repr(details)


def test_the_read_api_reaches_no_file_but_its_own(tmp_path: Path, secret: Path):
    """The read API's connection to a DuckDB file can read no other file."""
    from ml_goodput_measurement import goodput

    path = write_rows(tmp_path / "goodput.duckdb", {"goodput_snapshots": [goodput_row("r1", 600)]})
    source = goodput.GoodputCalculator("r1", duckdb_path=str(path))._source
    with pytest.raises(duckdb.PermissionException, match="disabled"):
        source.rows(f"SELECT content FROM read_text('{secret}')", {})


def test_a_view_the_pipeline_cannot_make_over_the_files_tables_is_still_not_the_files(
        tmp_path: Path, secret: Path, capsys):
    """A file lacking a table our view reads, holding a view of that name that reads a local file:
    the query fails as the file lacks the table, and the file's view is never run."""
    from pipeline.app.cli import main

    path = write_rows(tmp_path / "goodput.duckdb", {"goodput_snapshots": [goodput_row("r1", 600)]})
    with duckdb.connect(str(path)) as connection:
        columns = connection.execute("DESCRIBE run_productivity_factors").fetchall()
        read = ", ".join("content AS run_id" if name == "run_id" else f"NULL::{kind} AS {name}"
                         for name, kind, *_ in columns)
        connection.execute("DROP TABLE accelerator_peaks")
        connection.execute(f"CREATE OR REPLACE VIEW run_productivity_factors AS SELECT {read} "
                           f"FROM read_text('{secret}')")
    assert main(["query", "run_productivity", "--duckdb", str(path)]) == 2
    captured = capsys.readouterr()
    assert "lacks a table or column" in captured.err and "accelerator_peaks" in captured.err
    assert HIDDEN_TEXT not in captured.out + captured.err


@pytest.mark.parametrize("reader", ["write_report", "evaluate_file", "backfill_messages", "print_summary"])
def test_every_library_reader_refuses_a_file_the_pipeline_did_not_write(tmp_path: Path, reader: str):
    """The report, the alerts, the backfill and the summary refuse a file holding a macro, which
    could stand in for a built-in function of the queries, before reading it."""
    from pipeline.app.alerts import evaluate_file
    from pipeline.app.report import write_report
    from pipeline.app.summary import print_summary
    from pipeline.sinks.raw_events import backfill_messages

    path = write_rows(tmp_path / "goodput.duckdb", {"goodput_snapshots": [goodput_row("r1", 600)]})
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE MACRO greatest(a, b) AS 0")
    read = {"write_report": lambda: write_report(path, tmp_path / "report.html"),
            "evaluate_file": lambda: evaluate_file(path),
            "backfill_messages": lambda: list(backfill_messages(str(path))),
            "print_summary": lambda: print_summary(str(path), io.StringIO())}
    with pytest.raises(NotOurs, match="the macro 'greatest'"):
        read[reader]()
    assert not (tmp_path / "report.html").exists()


# -- No credentials in the repository --------------------------------------------------------------


