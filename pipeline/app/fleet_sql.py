"""Fleet SQL: the saved queries in ``goodput_schemas/sql/`` (BigQuery's dialect) run on a DuckDB file.

The queries are written for BigQuery, where the tables live in production; locally and in tests
they run on the DuckDB output of the pipeline, transpiled with BigQuery's meaning
(``pipeline.sinks.duckdb_sql``), with the file's schema ``main`` as their ``${dataset}``. A query
may read the views of ``goodput_schemas/views/``: those of the pipeline, defined for the connection
alone (``pipeline.sinks.duckdb.own_views``), never the views the file holds; a query that needs
a view whose tables a file an older version wrote lacks fails as it would have.
"""

from __future__ import annotations

from typing import Any

from goodput_schemas import saved_queries
from pipeline.sinks.duckdb import own_views
from pipeline.sinks.duckdb_sql import to_duckdb

#: Where the tables of a DuckDB file the pipeline wrote are: its default schema.
DUCKDB_DATASET = "main"


def run_saved(name: str, connection: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Runs saved query ``name`` on a DuckDB connection: (column names, rows)."""
    queries = saved_queries(DUCKDB_DATASET)
    if name not in queries:
        raise KeyError(f"no saved query {name!r}; there are: {', '.join(queries)}")
    own_views(connection)
    cursor = connection.execute(to_duckdb(queries[name]))
    return [column[0] for column in cursor.description], cursor.fetchall()
