"""Fleet SQL: the saved queries in ``goodput_schemas/sql/`` (BigQuery's dialect) run on a DuckDB file.

The queries are written for BigQuery, where the tables live in production; locally and in tests
they run on the DuckDB output of the pipeline, transpiled with BigQuery's meaning
(``pipeline.sinks.duckdb_sql``), with the file's schema ``main`` as their ``${dataset}``. A query
may read the views of ``goodput_schemas/views/``, which the DuckDB sink creates in the file; a file
an older version wrote, opened read-only, may lack a view added since, which is then defined for the
connection alone (a temporary view).
"""

from __future__ import annotations

from typing import Any

from goodput_schemas import saved_queries, views
from pipeline.sinks.duckdb_sql import to_duckdb, view_to_duckdb

#: Where the tables of a DuckDB file the pipeline wrote are: its default schema.
DUCKDB_DATASET = "main"

# The file's views, and those defined for the connection before.
_VIEWS_SQL = ("SELECT view_name FROM duckdb_views() WHERE database_name IN (current_database(), 'temp') "
              "AND schema_name = 'main' AND NOT internal")


def run_saved(name: str, connection: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Runs saved query ``name`` on a DuckDB connection: (column names, rows)."""
    queries = saved_queries(DUCKDB_DATASET)
    if name not in queries:
        raise KeyError(f"no saved query {name!r}; there are: {', '.join(queries)}")
    _define_missing_views(connection)
    cursor = connection.execute(to_duckdb(queries[name]))
    return [column[0] for column in cursor.description], cursor.fetchall()


def _define_missing_views(connection: Any) -> None:
    """Each view the file lacks as a temporary view of ``connection``, where the tables it reads
    are there (a query that needs one that is not fails as it would have)."""
    import duckdb

    found = {view for view, in connection.execute(_VIEWS_SQL).fetchall()}
    for view, query in views(DUCKDB_DATASET).items():
        if view in found:
            continue
        try:
            connection.execute(f'CREATE TEMPORARY VIEW "{view}" AS {view_to_duckdb(query)}')
        except (duckdb.CatalogException, duckdb.BinderException):  # it lacks a table or column too
            continue
