"""Fleet SQL: the saved queries in ``goodput_schemas/sql/`` (BigQuery's dialect) run on a DuckDB file.

The queries are written for BigQuery, where the tables live in production; locally and in tests
they run on the DuckDB output of the pipeline after sqlglot transpiles them, with the file's
schema ``main`` as their ``${dataset}``. One construct needs more than sqlglot does:
``TIMESTAMP_DIFF`` counts *whole* units elapsed in BigQuery (10:59 to 11:01 is 0 hours) while
DuckDB's ``date_diff``, which sqlglot maps it to, counts unit *boundaries* crossed (1 hour). It is
rewritten here to microsecond arithmetic, truncated toward zero as BigQuery does.
"""

from __future__ import annotations

from typing import Any

import sqlglot
from sqlglot import exp

from goodput_schemas import saved_queries

#: Where the tables of a DuckDB file the pipeline wrote are: its default schema.
DUCKDB_DATASET = "main"

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
    """A BigQuery query as DuckDB SQL with BigQuery's meaning."""
    statements = [tree_to_duckdb(tree) for tree in sqlglot.parse(sql, read="bigquery") if tree is not None]
    if len(statements) != 1:
        raise ValueError(f"a saved query is one statement, got {len(statements)}")
    return statements[0]


def tree_to_duckdb(tree: exp.Expr) -> str:
    """A query parsed in BigQuery's dialect as DuckDB SQL with BigQuery's meaning."""
    return tree.transform(_whole_units).sql("duckdb")


def run_saved(name: str, connection: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Runs saved query ``name`` on a DuckDB connection: (column names, rows)."""
    queries = saved_queries(DUCKDB_DATASET)
    if name not in queries:
        raise KeyError(f"no saved query {name!r}; there are: {', '.join(queries)}")
    cursor = connection.execute(to_duckdb(queries[name]))
    return [column[0] for column in cursor.description], cursor.fetchall()
