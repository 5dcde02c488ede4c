"""BigQuery SQL as DuckDB SQL with BigQuery's meaning: the views of ``goodput_schemas/views/`` in a
DuckDB file, the saved fleet queries run on one (``pipeline.app.fleet_sql``), and the queries the
BigQuery stand-in answers (``pipeline.emulators.bigquery``).

The SQL is written once, for BigQuery, where the tables live in production; sqlglot transpiles it.
One construct needs more than sqlglot does: ``TIMESTAMP_DIFF`` counts *whole* units elapsed in
BigQuery (10:59 to 11:01 is 0 hours) while DuckDB's ``date_diff``, which sqlglot maps it to, counts
unit *boundaries* crossed (1 hour). It is rewritten here to microsecond arithmetic, truncated toward
zero as BigQuery does.

Importing sqlglot and transpiling the views the first time take about a quarter of a second, so
the DuckDB sink imports this module only when it creates views (in a new file, or one that lacks a
view), not whenever it opens a file; and each view is transpiled once per process.
"""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import exp

_UNIT_US = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000, "MINUTE": 60_000_000,
            "HOUR": 3_600_000_000, "DAY": 86_400_000_000}


def _whole_units(node: exp.Expr) -> exp.Expr:
    if not isinstance(node, exp.TimestampDiff):
        return node
    unit = node.text("unit").upper()
    if unit not in _UNIT_US:
        raise ValueError(f"TIMESTAMP_DIFF by {unit} is not supported for TIMESTAMP values")
    later, earlier = (side.sql("duckdb") for side in (node.this, node.expression))
    return sqlglot.parse_one(
        f"CAST(TRUNC((EPOCH_US({later}) - EPOCH_US({earlier})) / {_UNIT_US[unit]}) AS BIGINT)",
        read="duckdb")


def to_duckdb(sql: str) -> str:
    """A BigQuery query (one statement) as DuckDB SQL with BigQuery's meaning."""
    statements = [tree_to_duckdb(tree) for tree in sqlglot.parse(sql, read="bigquery") if tree is not None]
    if len(statements) != 1:
        raise ValueError(f"a saved query or view is one statement, got {len(statements)}")
    return statements[0]


@functools.cache
def view_to_duckdb(sql: str) -> str:
    """``to_duckdb`` of a view's query, transpiled once per process: the views are few, and the
    DuckDB sink creates them in every file it makes."""
    return to_duckdb(sql)


def tree_to_duckdb(tree: exp.Expr) -> str:
    """A query parsed in BigQuery's dialect as DuckDB SQL with BigQuery's meaning."""
    return tree.transform(_whole_units).sql("duckdb")
