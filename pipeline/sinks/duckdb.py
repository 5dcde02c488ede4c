"""Writes output rows to a DuckDB file, in tables made from the JSON schemas in goodput_schemas/tables/.

Tables are created on first use (``CREATE TABLE IF NOT EXISTS``) and only ever appended to, as
in BigQuery: a later snapshot is a new row, and "latest" is a view. A row whose key (the table's
``key`` in ``goodput_schemas/table_options.json``: an event's every column, a snapshot's run,
time and window, ...) the table holds already is not written again, so a replay run twice into
one file, a stream started again over the same messages, or a bundle the runner retries leaves
every table as it was. The views are those of
``goodput_schemas/views/``, BigQuery SQL transpiled with BigQuery's meaning
(``pipeline.sinks.duckdb_sql``). The tables the fleet SQL joins for costs and peaks,
``accelerator_prices`` and ``accelerator_peaks``, are seeded from their CSV files in
``goodput_schemas/`` while empty.
Timestamps are stored as ``TIMESTAMP`` in UTC. Text is made storable as for BigQuery
(``pipeline.core.sanitize``), so both hold the same values. Every reader opens a file with
``open_reader``: read-only, reaching no other file, with the pipeline's own views rather than
the file's (a view is SQL the file brings, and may be anyone's).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from goodput_schemas import SEEDED_TABLES, table_names, table_options, table_schema, views
from pipeline.core.events import Batch
from pipeline.core.rows import EVENTS, Element, Row, by_table, event_rows
from pipeline.core.sanitize import clean_row, identifier

#: BigQuery column types as DuckDB's, and DuckDB's as Arrow's (timestamps naive, in UTC).
DUCKDB_TYPES = {"STRING": "VARCHAR", "INT64": "BIGINT", "INTEGER": "BIGINT", "FLOAT64": "DOUBLE",
                 "FLOAT": "DOUBLE", "BOOL": "BOOLEAN", "BOOLEAN": "BOOLEAN", "TIMESTAMP": "TIMESTAMP"}
ARROW_TYPES = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(),
                "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us")}


def create_table_sql(name: str, temporary: bool = False) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for output table ``name``, from its JSON schema; or ``CREATE
    TEMPORARY TABLE``, for one connection alone."""
    columns = []
    for field in table_schema(name):
        column = f'"{field["name"]}" {DUCKDB_TYPES[field["type"]]}'
        if field.get("mode") == "REQUIRED":
            column += " NOT NULL"
        columns.append(column)
    create = "CREATE TEMPORARY TABLE" if temporary else "CREATE TABLE IF NOT EXISTS"
    return f'{create} "{name}" ({", ".join(columns)})'


@functools.cache
def _columns() -> dict[str, list[tuple[str, str]]]:
    return {name: [(f["name"], DUCKDB_TYPES[f["type"]]) for f in table_schema(name)]
            for name in table_names()}


@functools.cache
def _insert_new_sql(table: str, names: tuple[str, ...]) -> str:
    """The insert of the rows of ``incoming`` whose key the table does not hold, each key once.

    Why an anti-join on every append rather than a primary key and ``INSERT OR IGNORE``: the
    key's index made a file of 5 million events three times as large (64 MB, not 22 MB); a file
    an older version wrote cannot be given one once it holds a row twice; and a file of ours
    holds no index (``not_ours``). The anti-join reads the table's key columns. Measured on 2
    busy cores, best of 5: 100,000 new events appended to a table of 1 million took 151 ms, where
    a plain insert took 78 ms and a primary key 354 ms; 100 events to a table of 5 million, 63 ms
    (plain 15 ms, primary key 35 ms): a stream appends per bundle.
    ``IS NOT DISTINCT FROM`` matches key columns that may be NULL (an anomaly's host)."""
    key = table_options(table)["key"]
    match = " AND ".join(f'held."{column}" IS NOT DISTINCT FROM incoming."{column}"' for column in key)
    columns, partition = (", ".join(f'"{name}"' for name in names) for names in (names, key))
    return (f'INSERT INTO "{table}" ({columns}) SELECT {columns} FROM incoming '
            f'WHERE NOT EXISTS (SELECT 1 FROM "{table}" AS held WHERE {match}) '
            f"QUALIFY row_number() OVER (PARTITION BY {partition}) = 1")


@functools.cache
def _arrow_schema(table: str) -> pa.Schema:
    """A table's columns as Arrow's (which takes a datetime with a time zone as its UTC time)."""
    return pa.schema([(name, ARROW_TYPES[kind]) for name, kind in _columns()[table]])


# Everything a database holds beside its tables, views and plain columns (nothing, in ours): what
# a query or an insert would run (a macro may stand in for a built-in function of the same name, a
# column's default or expression is computed, an index's on each insert) and what we never make.
_OTHER_OBJECTS_SQL = (
    "SELECT 'schema', schema_name FROM duckdb_schemas() WHERE database_name = current_database() "
    "AND NOT internal AND schema_name <> 'main' "
    "UNION ALL SELECT 'sequence', sequence_name FROM duckdb_sequences() "
    "WHERE database_name = current_database() "
    "UNION ALL SELECT 'macro', function_name FROM duckdb_functions() "
    "WHERE database_name = current_database() AND NOT internal "
    "UNION ALL SELECT 'type', type_name FROM duckdb_types() "
    "WHERE database_name = current_database() AND NOT internal "
    "UNION ALL SELECT 'index', index_name FROM duckdb_indexes() WHERE database_name = current_database() "
    "UNION ALL SELECT constraint_type || ' constraint of the table', table_name FROM duckdb_constraints() "
    "WHERE database_name = current_database() AND constraint_type <> 'NOT NULL' "
    "UNION ALL SELECT 'default or expression of the column', table_name || '.' || column_name "
    "FROM duckdb_columns() WHERE database_name = current_database() AND column_default IS NOT NULL")
_TABLES_SQL = ("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
               "AND schema_name = 'main'")
_VIEWS_SQL = ("SELECT view_name FROM duckdb_views() WHERE database_name = current_database() "
              "AND schema_name = 'main' AND NOT internal")
_COLUMNS_SQL = ("SELECT table_name, column_name, data_type FROM duckdb_columns() "
                "WHERE database_name = current_database() AND schema_name = 'main' ORDER BY column_index")


def not_ours(connection: duckdb.DuckDBPyConnection) -> str | None:
    """Why the database open on ``connection`` is not one this pipeline writes, or None when it is.

    Ours holds nothing, or only output tables and views of ours, each table with some of its
    schema's columns, of their types: a file an older version wrote lacks the columns added
    since, which the sink adds. Anything else is someone else's, and is not to be written to."""
    for kind, name in connection.execute(_OTHER_OBJECTS_SQL).fetchall():
        return f"it holds the {kind} {name!r}, which this pipeline does not make"
    tables = {name for name, in connection.execute(_TABLES_SQL).fetchall()}
    for name in sorted(tables - set(table_names())):
        return f"it holds the table {name!r}, which this pipeline does not write"
    for name in sorted({name for name, in connection.execute(_VIEWS_SQL).fetchall()} - set(views("main"))):
        return f"it holds the view {name!r}, which this pipeline does not make"
    columns = _columns()
    for table, column, kind in connection.execute(_COLUMNS_SQL).fetchall():
        if table not in tables:
            continue  # a view's
        wanted = dict(columns[table]).get(column)
        if wanted is None:
            return f"its table {table!r} has a column {column!r}, which this pipeline does not write"
        if wanted != kind:
            return f"the column {column!r} of its table {table!r} is {kind}, not {wanted}"
    return None


class NotOurs(ValueError):
    """A DuckDB file this pipeline did not write (``not_ours``): ``problem`` says what it holds."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path} is not a DuckDB file this pipeline wrote: {problem}")
        self.problem = problem


#: The configuration of every connection that only reads a file. A file brings SQL of its own (its
#: views), which could read the reader's files into what it shows: such a connection reaches no
#: file but its own, no network and no extension, and no statement it runs can change that.
READER_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False, "lock_configuration": True}

# The views defined for the connection alone (temporary ones).
_OWN_VIEWS_SQL = ("SELECT view_name FROM duckdb_views() WHERE database_name = 'temp' "
                  "AND schema_name = 'main'")


def open_reader(path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection (``READER_CONFIG``) to the DuckDB file ``path``, one this pipeline
    wrote (``NotOurs`` otherwise, ``not_ours``), with the pipeline's own views (``own_views``):
    what a query on it reads is the file's tables, through SQL of ours. ``duckdb.IOException``
    while another process writes the file."""
    connection = duckdb.connect(str(path), read_only=True, config=READER_CONFIG)
    try:
        problem = not_ours(connection)
        if problem is not None:
            raise NotOurs(path, problem)
        own_views(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def own_views(connection: duckdb.DuckDBPyConnection) -> None:
    """Defines each view of ``goodput_schemas/views/`` for ``connection`` alone, as a temporary
    view, which DuckDB resolves before the file's, named alone or as ``main.NAME``: a reader never
    runs the views a file holds. Where the file lacks a table or column a view reads (an older
    version's file), a view it lacks too is left out, and one it holds is defined over empty
    stand-ins of the tables, dropped again: a query reading it fails, naming what the file lacks,
    as the file's own view would have."""
    from pipeline.sinks.duckdb_sql import view_to_duckdb

    defined = {name for name, in connection.execute(_OWN_VIEWS_SQL).fetchall()}
    held = {name for name, in connection.execute(_VIEWS_SQL).fetchall()}
    for name, query in views("main").items():
        if name in defined:
            continue
        create = f'CREATE TEMPORARY VIEW "{name}" AS {view_to_duckdb(query)}'
        try:
            connection.execute(create)
        except (duckdb.CatalogException, duckdb.BinderException):
            if name not in held:
                continue
            try:
                for table in table_names():
                    connection.execute(create_table_sql(table, temporary=True))
                connection.execute(create)
            finally:
                for table in table_names():
                    connection.execute(f'DROP TABLE IF EXISTS temp.main."{table}"')


class DuckDBSink:
    """Appends rows to the output tables of one DuckDB file: opened on a connection of its own,
    or attached to ``host``, a connection to an in-memory database, and detached on close (a new
    connection makes a database with all its built-in functions, about ten times the cost of an
    attach; the file is free for other processes once detached, as once closed)."""

    def __init__(self, path: str | Path, host: duckdb.DuckDBPyConnection | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if host is None:
            self._connection, self._attached = duckdb.connect(str(self.path)), False
        else:
            host.execute("ATTACH ? AS goodput_output", [str(self.path)])
            host.execute("USE goodput_output")
            self._connection, self._attached = host, True
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        # A streaming pipeline opens the file for every bundle it writes: one look at the
        # catalog, rather than making every table and view again.
        found = set(self._connection.execute(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = 'main' UNION ALL SELECT view_name, NULL FROM duckdb_views() "
            "WHERE database_name = current_database() AND schema_name = 'main'").fetchall())
        wanted: set[tuple[str, str | None]] = {
            (name, column) for name, columns in _columns().items() for column, _ in columns}
        wanted |= {(name, None) for name in views("main")}
        if not found >= wanted:
            problem = not_ours(self._connection)  # before the first write to a file
            if problem is not None:
                raise NotOurs(self.path, problem)
            self._make_tables(wanted - found)

    def _make_tables(self, missing: set[tuple[str, str | None]]) -> None:
        """Creates what is missing: tables, and columns added to a table's schema since the file
        was written (as BigQuery adds them, nullable: older rows hold NULL); then the views."""
        existing = {name for name, in self._connection.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
        for name in table_names():
            if name not in existing:
                self._connection.execute(create_table_sql(name))
                continue
            for column, kind in _columns()[name]:
                if (name, column) in missing:
                    self._connection.execute(f'ALTER TABLE "{name}" ADD COLUMN "{column}" {kind}')
        self._seed()
        # The views are BigQuery SQL, as Terraform creates them; DuckDB gets them transpiled with
        # BigQuery's meaning (sqlglot is imported here, when a file needs its views, not on every open).
        from pipeline.sinks.duckdb_sql import view_to_duckdb

        for name, query in views("main").items():
            self._connection.execute(f'CREATE OR REPLACE VIEW "{name}" AS {view_to_duckdb(query)}')

    def _seed(self) -> None:
        """Fills each empty table of ``SEEDED_TABLES`` (prices, peaks) from its CSV file in
        ``goodput_schemas/``, read with the table's column types."""
        for table, path in SEEDED_TABLES.items():
            if self._connection.execute(f'SELECT count(*) FROM "{table}"').fetchone() == (0,):
                columns = ", ".join(f"'{name}': '{kind}'" for name, kind in _columns()[table])
                self._connection.execute(f'INSERT INTO "{table}" SELECT * FROM read_csv(?, header=true, '
                                         f"columns={{{columns}}})", [str(path)])

    def write(self, table: str, rows: Iterable[Row]) -> int:
        """Appends those of ``rows`` whose key ``table`` does not hold (``_insert_new_sql``);
        returns how many it appended."""
        rows = [clean_row(row) for row in rows]
        if not rows:
            return 0
        return self._insert(table, pa.Table.from_pylist(rows, schema=_arrow_schema(table)))

    def write_events(self, batches: Sequence[Batch]) -> int:
        """Appends the ``events`` rows of messages, their step starts straight from the columns,
        but for events the table holds already (the same row); returns how many it appended."""
        written = self.write(EVENTS, [row for batch in batches
                                      for row in event_rows(batch, step_columns=False)])
        stepped = [batch for batch in batches if batch.steps]
        if not stepped:
            return written
        counts = [len(batch.steps) for batch in stepped]

        def repeated(values: list[str]) -> pa.Array:  # each message's value, once per step
            indices = pa.array(np.repeat(np.arange(len(values), dtype=np.int32), counts))
            return pa.DictionaryArray.from_arrays(indices, pa.array(values, type=pa.string()))

        def joined(name: str) -> np.ndarray:
            return np.concatenate([np.frombuffer(getattr(batch, name), dtype=np.int64) for batch in stepped])

        total = sum(counts)
        return written + self._insert(EVENTS, pa.table({
            "run_id": repeated([identifier(batch.run_id) for batch in stepped]),
            "attempt_id": repeated([identifier(batch.attempt_id) for batch in stepped]),
            "seq": pa.array(joined("step_seqs")),
            "event_time": pa.array(joined("step_times"), pa.timestamp("us")),
            "kind": repeated(["step_start"] * len(stepped)), "step": pa.array(joined("steps")),
            "body": pa.nulls(total, pa.string())}))

    def _insert(self, table: str, data: pa.Table) -> int:
        """Inserts the rows of ``data`` whose key ``table`` does not hold; how many."""
        self._connection.register("incoming", data)
        try:
            inserted = self._connection.execute(_insert_new_sql(table, tuple(data.column_names))).fetchone()
        finally:
            self._connection.unregister("incoming")
        return 0 if inserted is None else int(inserted[0])

    def query(self, sql: str, parameters: list[object] | None = None) -> list[tuple[object, ...]]:
        return self._connection.execute(sql, parameters or []).fetchall()

    def close(self) -> None:
        if self._attached:
            self._connection.execute("USE memory; DETACH goodput_output")
        else:
            self._connection.close()


_APPEND_LOCK = threading.Lock()
_host: duckdb.DuckDBPyConnection | None = None  # made on the first open, then kept (under the lock)


#: How long an open waits for another process (a reader) to let go of the file, and how often it
#: tries meanwhile: a reader holds it for milliseconds, and the local stream's one thread waits.
OPEN_WAIT_S, OPEN_RETRY_S = 5.0, 0.01


@contextlib.contextmanager
def opened(path: str | Path) -> Iterator[DuckDBSink]:
    """The file opened for writing (attached to the process's host connection), under a lock
    shared by the process's threads; retries while another process holds it, for up to
    ``OPEN_WAIT_S``. Closed (detached) again on leaving."""
    global _host
    with _APPEND_LOCK:
        if _host is None:
            _host = duckdb.connect(":memory:")
        deadline = time.monotonic() + OPEN_WAIT_S
        while True:
            try:
                sink = DuckDBSink(path, _host)
            except duckdb.IOException:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(OPEN_RETRY_S)
                continue
            try:
                yield sink
            finally:
                sink.close()
            return


def append(path: str | Path, elements: Sequence[Element]) -> None:
    """Opens the file, appends the output elements' rows, closes it."""
    rows_by_table = by_table(element for element in elements if not isinstance(element[1], Batch))
    batches = [value for _, value in elements if isinstance(value, Batch)]
    with opened(path) as sink:
        for table, rows in sorted(rows_by_table.items()):
            sink.write(table, rows)
        sink.write_events(batches)
