"""Abuse: SQL is never built from user data (the scan of every source file, and the scan itself)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from support import REPO

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
    "pipeline/sinks/duckdb.py": {
        "name": "a table or view name from goodput_schemas/",
        "', '.join(columns)": "column definitions from goodput_schemas/",
        "view_to_duckdb(query)": "a view's SQL from goodput_schemas/views/, transpiled",
        "table": "an output table name (a key of its schemas)",
        "names": "column names of the table's schema",
        "column": "a column name of a table's schema",
        "columns": "the names and types of a seeded table's columns, from its schema",
        "kind": "a DuckDB type, mapped from a schema's type"},
    "pipeline/sinks/raw_events.py": {"COLUMNS": "a constant list of the events table's columns",
                                     "BIGQUERY_COLUMNS": "a constant list of the events table's columns",
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
    "pipeline/app/fleet_sql.py": {"view": "a view name from goodput_schemas/views/",
                                  "view_to_duckdb(query)": "a view's SQL from goodput_schemas/views/, "
                                                           "transpiled"},
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


# -- No credentials in the repository --------------------------------------------------------------


