"""Fleet SQL: the saved queries in ``goodput_schemas/sql/`` (BigQuery's dialect) run on a DuckDB file.

The queries are written for BigQuery, where the tables live in production; locally and in tests
they run on the DuckDB output of the pipeline, transpiled with BigQuery's meaning
(``pipeline.sinks.duckdb_sql``), with the file's schema ``main`` as their ``${dataset}``. A query
may read the views of ``goodput_schemas/views/``: those of the pipeline, defined for the connection
alone (``pipeline.sinks.duckdb.own_views``), never the views the file holds; a query that needs
a view whose tables a file an older version wrote lacks fails as it would have. A query's
parameters (``goodput_schemas.parameters``) are filled in before it is transpiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from goodput_schemas import saved_queries, saved_query
from pipeline.sinks.duckdb import own_views
from pipeline.sinks.duckdb_sql import to_duckdb

#: Where the tables of a DuckDB file the pipeline wrote are: its default schema.
DUCKDB_DATASET = "main"


def run_saved(name: str, connection: Any, values: Mapping[str, str] | None = None
              ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Runs saved query ``name`` on a DuckDB connection, with the parameters in ``values`` (by
    name, as text; ``goodput_schemas.parameters``) instead of their defaults: (column names,
    rows). ``KeyError`` for a query there is not; ``ValueError`` for a parameter it lacks or a
    value not of its type."""
    try:
        sql = saved_query(name, DUCKDB_DATASET, dict(values or {}))
    except KeyError:
        known = ", ".join(saved_queries(DUCKDB_DATASET))
        raise KeyError(f"no saved query {name!r}; there are: {known}") from None
    own_views(connection)
    cursor = connection.execute(to_duckdb(sql))
    return [column[0] for column in cursor.description], cursor.fetchall()
