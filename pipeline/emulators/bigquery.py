"""A local stand-in for the BigQuery REST API: datasets, tables and streaming inserts.

The real client reaches it with an endpoint and anonymous credentials::

    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    client = bigquery.Client(project="goodput-local", credentials=AnonymousCredentials(),
                             client_options=ClientOptions(api_endpoint="http://127.0.0.1:9050"))

Started with ``python -m pipeline.emulators.bigquery --port 9050``, or in-process with
``BigQueryEmulator``. It serves ``datasets.get/insert``, ``tables.get/insert`` and
``tabledata.insertAll``, and applies the rules of ``insertAll`` that a sink must cope with: the
table must exist; every row is checked against the table's schema (unknown fields, missing
required fields, values of the wrong type); without ``skipInvalidRows`` one invalid row stops the
whole request (the others get the reason ``stopped``), with it the valid rows are kept; at most
50,000 rows and 10 MiB per request; STRING values must be valid UTF-8; a row's ``insertId``
deduplicates it for a minute. Rows are kept in memory for assertions.

Queries are served as the client's ``query_and_wait`` makes them: ``jobs.query``, then, for a
result of more than one page, ``jobs.get`` and ``jobs.getQueryResults`` with page tokens. A query
is GoogleSQL, one SELECT, with named parameters (scalars and arrays); it runs on DuckDB over the
tables' rows after sqlglot transpiles it (``pipeline.sinks.duckdb_sql``), every table named with its
dataset (or the request's default dataset). Rows come back in the API's form (every value a
string, timestamps as microseconds when the client asks for ``useInt64Timestamp``), at most
``maxResults`` rows and about 10 MB per page. A table may be a view (``view.query``, GoogleSQL, as
Terraform and ``--bigquery_create_tables`` make the views of ``goodput_schemas/views/``): its query
is checked when it is created as a query is (every table it reads must exist), a query reads it
as the subquery it stands for, and rows go only to tables. A table that does not exist, an
unknown parameter or SQL that does not parse is refused as BigQuery refuses it (404 ``notFound``,
400 ``invalidQuery``).

Faults are injected through the store: ``fail_next(n, status, reason)`` fails the next n
insertAll requests as a whole (503 ``backendError``, 429 ``rateLimitExceeded``, 403
``quotaExceeded``, ...), ``reject_rows_next(n, reason)`` rejects the next n valid rows one by one
(a partial failure; ``backendError`` is transient, ``invalid`` is not), and
``slow_next(n, seconds)`` answers the next n insertAll requests that much later (a slow service).
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import json
import logging
import math
import re
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pipeline.emulators import (
    FRONT_END_MAX_REQUEST_BYTES,
    emulator_parser,
    log_to_console,
    payload_too_large,
    serve_until_signalled,
)

_LOG = logging.getLogger(__name__)
MAX_ROWS = 50_000
#: insertAll's "HTTP request size limit: 10 MB" is enforced by the front end at 10 MiB.
MAX_REQUEST_BYTES = FRONT_END_MAX_REQUEST_BYTES
DEDUP_S = 60.0
_PATH = re.compile(r"^/bigquery/v2/projects/(?P<project>[^/]+)/datasets(?:/(?P<dataset>[^/]+)"
                   r"(?P<tables>/tables(?:/(?P<table>[^/]+)(?P<insert>/insertAll)?)?)?)?$")
_JOB_PATH = re.compile(r"^/bigquery/v2/projects/(?P<project>[^/]+)/(?P<kind>queries|jobs)"
                       r"(?:/(?P<job>[^/]+))?$")
#: A page of query results holds at most this much (the API's limit is about 10 MB).
MAX_PAGE_BYTES = 10 * 1000 * 1000
LOCATION = "US"
KEPT_RESULTS = 1000  # the results of the latest queries, for their later pages


class ApiError(Exception):
    """An error as the API reports it: HTTP status, reason and message."""

    def __init__(self, status: HTTPStatus, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason

    def body(self) -> dict[str, Any]:
        return {"error": {"code": int(self.status), "message": str(self),
                          "errors": [{"reason": self.reason, "message": str(self)}],
                          "status": self.status.name}}


def _timestamp(value: Any) -> datetime.datetime:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
    moment = datetime.datetime.fromisoformat(str(value).replace(" UTC", "+00:00").replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return int(value)


def _float(value: Any) -> float:
    if isinstance(value, (bool, dict, list)):
        raise ValueError(value)
    return float(value)  # also "NaN", "Infinity", "-Infinity"


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(value)


def _string(value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise ValueError(value)
    text = value if isinstance(value, str) else json.dumps(value)
    text.encode("utf-8")  # a lone surrogate (a JSON escape of half a character) is not UTF-8
    return text


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "STRING": _string, "INT64": _integer, "INTEGER": _integer, "FLOAT64": _float, "FLOAT": _float,
    "BOOL": _boolean, "BOOLEAN": _boolean, "TIMESTAMP": _timestamp}


def check_row(schema: list[dict[str, Any]], row: Any,
              ignore_unknown: bool) -> tuple[dict[str, Any], list[str]]:
    """The row's values converted to Python per ``schema``, and what is wrong with it."""
    if not isinstance(row, dict):
        return {}, ["The row is not a JSON object."]
    fields = {field["name"]: field for field in schema}
    problems = [f"no such field: {name}." for name in row if name not in fields and not ignore_unknown]
    values: dict[str, Any] = {}
    for name, field in fields.items():
        value = row.get(name)
        if value is None:
            if field.get("mode") == "REQUIRED":
                problems.append(f"Missing required field: {name}.")
            values[name] = None
            continue
        try:
            values[name] = _CONVERT[field["type"]](value)
        except (ValueError, TypeError, OverflowError):  # UnicodeEncodeError is a ValueError
            problems.append(f"Cannot convert value to {field['type'].lower()}: {json.dumps(value)} "
                            f"(field {name}).")
    return values, problems


class BigQueryStore:
    """Datasets, tables and their rows, with insertAll's rules. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._datasets: dict[tuple[str, str], dict[str, Any]] = {}
        self._tables: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self._seen: dict[tuple[str, str, str], dict[str, float]] = {}
        self._failures: list[tuple[HTTPStatus, str]] = []
        self._row_rejections: list[str] = []
        self._delays: list[float] = []
        self.insert_requests = 0
        self._queries = _Queries(self)

    def fail_next(self, count: int, status: HTTPStatus = HTTPStatus.SERVICE_UNAVAILABLE,
                  reason: str | None = None) -> None:
        """The next ``count`` insertAll requests fail with ``status`` and change nothing. The
        reason defaults to what BigQuery answers with the status: ``backendError`` for a 5xx,
        ``rateLimitExceeded`` for 429, ``quotaExceeded`` for 403, ``invalid`` otherwise."""
        if reason is None:
            reason = ("backendError" if status >= 500 else "rateLimitExceeded" if status == 429
                      else "quotaExceeded" if status == 403 else "invalid")
        with self._lock:
            self._failures.extend([(status, reason)] * count)

    def reject_rows_next(self, count: int, reason: str = "backendError") -> None:
        """The next ``count`` valid rows inserted are rejected one by one with ``reason`` (the
        others of their requests are kept): a partial failure."""
        with self._lock:
            self._row_rejections.extend([reason] * count)

    def slow_next(self, count: int, seconds: float) -> None:
        """The next ``count`` insertAll requests are answered ``seconds`` late, as they were
        going to be (other requests are answered meanwhile)."""
        with self._lock:
            self._delays.extend([seconds] * count)

    def rows(self, project: str, dataset: str, table: str, start: int = 0) -> list[dict[str, Any]]:
        """The table's rows in insert order from ``start``, values as Python (timestamps as aware
        datetimes)."""
        with self._lock:
            return self._rows.get((project, dataset, table), [])[start:]

    def create_dataset(self, project: str, resource: dict[str, Any]) -> dict[str, Any]:
        dataset = resource.get("datasetReference", {}).get("datasetId", "")
        if not re.fullmatch(r"[A-Za-z0-9_]{1,1024}", dataset):
            raise ApiError(HTTPStatus.BAD_REQUEST, "invalid", f"Invalid dataset ID \"{dataset}\".")
        with self._lock:
            if (project, dataset) in self._datasets:
                raise ApiError(HTTPStatus.CONFLICT, "duplicate",
                               f"Already Exists: Dataset {project}:{dataset}")
            stored = {**resource, "id": f"{project}:{dataset}", "kind": "bigquery#dataset",
                      "datasetReference": {"projectId": project, "datasetId": dataset}}
            self._datasets[(project, dataset)] = stored
            return stored

    def get_dataset(self, project: str, dataset: str) -> dict[str, Any]:
        with self._lock:
            if (project, dataset) not in self._datasets:
                raise ApiError(HTTPStatus.NOT_FOUND, "notFound", f"Not found: Dataset {project}:{dataset}")
            return self._datasets[(project, dataset)]

    def create_table(self, project: str, dataset: str, resource: dict[str, Any]) -> dict[str, Any]:
        self.get_dataset(project, dataset)
        table = resource.get("tableReference", {}).get("tableId", "")
        view = resource.get("view")
        fields = resource.get("schema", {}).get("fields", [])
        unknown = [f.get("type") for f in fields if f.get("type") not in _CONVERT]
        if view is None and (not fields or unknown):
            raise ApiError(HTTPStatus.BAD_REQUEST, "invalid",
                           f"Table {table} needs a schema of known types (got {unknown or 'none'}).")
        if not re.fullmatch(r"[\w-]{1,1024}", table):
            raise ApiError(HTTPStatus.BAD_REQUEST, "invalid", f"Invalid table ID \"{table}\".")
        if view is not None:
            self._check_view(project, view)
        for field in fields:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,299}", str(field.get("name"))):
                raise ApiError(HTTPStatus.BAD_REQUEST, "invalid",
                               f"Invalid field name \"{field.get('name')}\". Fields must contain only "
                               "letters, numbers, and underscores, start with a letter or underscore, "
                               "and be at most 300 characters long.")
        key = (project, dataset, table)
        with self._lock:
            if key in self._tables:
                raise ApiError(HTTPStatus.CONFLICT, "duplicate",
                               f"Already Exists: Table {project}:{dataset}.{table}")
            stored = {**resource, "id": f"{project}:{dataset}.{table}", "kind": "bigquery#table",
                      "tableReference": {"projectId": project, "datasetId": dataset, "tableId": table},
                      "type": "TABLE" if view is None else "VIEW"}
            self._tables[key], self._rows[key], self._seen[key] = stored, [], {}
            return stored

    def _check_view(self, project: str, view: Any) -> None:
        """A view's definition, refused as a query is refused when it is not one this stand-in runs
        (the API takes a view's query as legacy SQL unless told otherwise)."""
        if not isinstance(view, dict) or not isinstance(view.get("query"), str):
            raise ApiError(HTTPStatus.BAD_REQUEST, "invalid", "A view needs its query (view.query).")
        if view.get("useLegacySql", True) is not False:
            raise _invalid_query("The BigQuery emulator's views are GoogleSQL only "
                                 "(view.useLegacySql: false).")
        self._queries.translate_view(view["query"], project)

    def get_table(self, project: str, dataset: str, table: str) -> dict[str, Any]:
        with self._lock:
            if (project, dataset, table) not in self._tables:
                raise ApiError(HTTPStatus.NOT_FOUND, "notFound",
                               f"Not found: Table {project}:{dataset}.{table}")
            return self._tables[(project, dataset, table)]

    def insert_all(self, project: str, dataset: str, table: str, request: dict[str, Any]) -> dict[str, Any]:
        """tabledata.insertAll: the response body, with ``insertErrors`` when rows failed."""
        key = (project, dataset, table)
        with self._lock:
            delay_s = self._delays.pop(0) if self._delays else 0.0
        time.sleep(delay_s)
        with self._lock:
            self.insert_requests += 1
            if self._failures:
                status, reason = self._failures.pop(0)
                raise ApiError(status, reason, f"Injected failure: {reason}")
            if key not in self._tables:
                raise ApiError(HTTPStatus.NOT_FOUND, "notFound",
                               f"Not found: Table {project}:{dataset}.{table}")
            if self._tables[key]["type"] == "VIEW":
                raise ApiError(HTTPStatus.BAD_REQUEST, "invalid",
                               f"{project}:{dataset}.{table} is a view: rows are inserted into tables only.")
            rows = request.get("rows") or []
            if len(rows) > MAX_ROWS:
                raise ApiError(HTTPStatus.BAD_REQUEST, "invalid", "too many rows present in the request, "
                               f"limit: {MAX_ROWS} row count: {len(rows)}.")
            schema = self._tables[key]["schema"]["fields"]
            checked = [check_row(schema, entry.get("json") if isinstance(entry, dict) else None,
                                 bool(request.get("ignoreUnknownValues"))) for entry in rows]
            rejected: dict[int, str] = {}
            for index, (_, problems) in enumerate(checked):
                if not problems and self._row_rejections:
                    rejected[index] = self._row_rejections.pop(0)
            errors: list[dict[str, Any]] = [
                {"index": i, "errors": [{"reason": "invalid", "location": "", "message": problem}
                                        for problem in problems]}
                for i, (_, problems) in enumerate(checked) if problems]
            errors += [{"index": i, "errors": [{"reason": reason, "location": "",
                                                "message": f"Injected rejection: {reason}"}]}
                       for i, reason in rejected.items()]
            errors.sort(key=lambda e: e["index"])
            if errors and not request.get("skipInvalidRows"):
                failed = {error["index"] for error in errors}
                errors += [{"index": i, "errors": [{"reason": "stopped", "location": "", "message": ""}]}
                           for i in range(len(rows)) if i not in failed]
                return {"kind": "bigquery#tableDataInsertAllResponse",
                        "insertErrors": sorted(errors, key=lambda e: e["index"])}
            now, seen = self._clock(), self._seen[key]
            for expired in [k for k, at in seen.items() if now - at > DEDUP_S]:
                del seen[expired]
            for index, (entry, (values, problems)) in enumerate(zip(rows, checked, strict=True)):
                insert_id = entry.get("insertId")
                if problems or index in rejected or (insert_id and insert_id in seen):
                    continue
                if insert_id:
                    seen[insert_id] = now
                self._rows[key].append(values)
            response: dict[str, Any] = {"kind": "bigquery#tableDataInsertAllResponse"}
            if errors:
                response["insertErrors"] = errors
            return response


_RESULT_TYPES = {"VARCHAR": "STRING", "BIGINT": "INTEGER", "INTEGER": "INTEGER", "SMALLINT": "INTEGER",
                 "TINYINT": "INTEGER", "HUGEINT": "INTEGER", "UBIGINT": "INTEGER", "UINTEGER": "INTEGER",
                 "DOUBLE": "FLOAT", "FLOAT": "FLOAT", "BOOLEAN": "BOOLEAN", "DATE": "DATE",
                 "TIMESTAMP WITH TIME ZONE": "TIMESTAMP", "TIMESTAMP": "TIMESTAMP"}
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _invalid_query(message: str) -> ApiError:
    return ApiError(HTTPStatus.BAD_REQUEST, "invalidQuery", message)


class _Queries:
    """Queries on a store's tables, run on an in-memory DuckDB database that gets each table's
    new rows before a query reads it; results kept by job id for their later pages."""

    def __init__(self, store: BigQueryStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._connection: Any = None
        self._copied: dict[tuple[str, str, str], int] = {}
        self._results: dict[tuple[str, str], dict[str, Any]] = {}

    def query(self, project: str, request: dict[str, Any]) -> dict[str, Any]:
        """jobs.query: the job's first page of results."""
        if request.get("useLegacySql", True) is not False:
            raise _invalid_query("The BigQuery emulator runs GoogleSQL only (useLegacySql: false).")
        if request.get("dryRun") or request.get("parameterMode", "NAMED") != "NAMED":
            raise ApiError(HTTPStatus.NOT_IMPLEMENTED, "notImplemented",
                           "The BigQuery emulator runs queries with named parameters, not dry runs.")
        default = request.get("defaultDataset") or {}
        sql, tables = self._translate(str(request.get("query") or ""), project,
                                      (default.get("projectId") or project, default.get("datasetId")),
                                      request.get("queryParameters") or [])
        import duckdb

        with self._lock:
            try:
                self._copy_new_rows(tables)
                cursor = self._connection.execute(sql)
                described, rows = cursor.description, cursor.fetchall()
            except duckdb.Error as error:
                raise _invalid_query(str(error).splitlines()[0]) from None
        fields = [{"name": name, "type": self._result_type(str(kind)), "mode": "NULLABLE"}
                  for name, kind, *_ in described]
        job = f"job_{uuid.uuid4().hex}"
        with self._lock:
            self._results[(project, job)] = {"sql": request.get("query"), "fields": fields, "rows": rows}
            while len(self._results) > KEPT_RESULTS:
                del self._results[next(iter(self._results))]
        use_int64 = bool((request.get("formatOptions") or {}).get("useInt64Timestamp"))
        return {**self.results(project, job, 0, int(request.get("maxResults", -1)), use_int64),
                "kind": "bigquery#queryResponse"}

    def results(self, project: str, job: str, start: int, max_results: int,
                use_int64_timestamp: bool) -> dict[str, Any]:
        """jobs.getQueryResults: the page of rows from ``start``, at most ``max_results`` (all if
        negative) and about ``MAX_PAGE_BYTES``, with a page token for the next, if any."""
        result = self._result(project, job)
        rows, fields = result["rows"], result["fields"]
        page: list[dict[str, Any]] = []
        size, end = 0, start
        for row in itertools.islice(rows, start, None if max_results < 0 else start + max_results):
            encoded = {"f": [{"v": _api_value(value, field["type"], use_int64_timestamp)}
                             for value, field in zip(row, fields, strict=True)]}
            size += len(json.dumps(encoded))
            if page and size > MAX_PAGE_BYTES:
                break
            page.append(encoded)
            end += 1
        response: dict[str, Any] = {
            "kind": "bigquery#getQueryResultsResponse", "jobReference": self._reference(project, job),
            "schema": {"fields": fields}, "totalRows": str(len(rows)), "jobComplete": True,
            "cacheHit": False}
        if page:
            response["rows"] = page
        if end < len(rows) and max_results != 0:
            response["pageToken"] = str(end)
        return response

    def job(self, project: str, job: str) -> dict[str, Any]:
        """jobs.get: a query job that is done."""
        result = self._result(project, job)
        return {"kind": "bigquery#job", "id": f"{project}:{LOCATION}.{job}",
                "jobReference": self._reference(project, job),
                "configuration": {"jobType": "QUERY",
                                  "query": {"query": result["sql"], "useLegacySql": False}},
                "status": {"state": "DONE"},
                "statistics": {"query": {"statementType": "SELECT"}}}

    def _result(self, project: str, job: str) -> dict[str, Any]:
        with self._lock:
            if (project, job) not in self._results:
                raise ApiError(HTTPStatus.NOT_FOUND, "notFound", f"Not found: Job {project}:{LOCATION}.{job}")
            return self._results[(project, job)]

    @staticmethod
    def _reference(project: str, job: str) -> dict[str, str]:
        return {"projectId": project, "jobId": job, "location": LOCATION}

    @staticmethod
    def _result_type(duckdb_type: str) -> str:
        kind = _RESULT_TYPES.get(duckdb_type) or ("FLOAT" if duckdb_type.startswith("DECIMAL") else None)
        if kind is None:
            raise ApiError(HTTPStatus.NOT_IMPLEMENTED, "notImplemented",
                           f"The BigQuery emulator does not return values of type {duckdb_type}.")
        return kind

    def translate_view(self, sql: str, project: str) -> None:
        """Checks a view's query as a query's is checked: it parses, and every table it reads
        exists; a view reads no default dataset."""
        self._translate(sql, project, (project, None), [])

    def _translate(self, sql: str, project: str, default: tuple[str, str | None],
                   parameters: list[dict[str, Any]]) -> tuple[str, list[tuple[str, str, str]]]:
        """The query as DuckDB SQL over this database's tables, and the tables it reads."""
        from sqlglot import exp

        from pipeline.sinks.duckdb_sql import tree_to_duckdb

        tree = self._parse(sql)
        values = {given.get("name"): given for given in parameters}
        for parameter in list(tree.find_all(exp.Parameter)):
            if parameter.name not in values:
                raise _invalid_query(f"Query parameter '{parameter.name}' not found")
            parameter.replace(_literal(values[parameter.name]))
        tables = self._resolve(tree, project, default)
        return tree_to_duckdb(tree), tables

    @staticmethod
    def _parse(sql: str) -> Any:
        """One SELECT statement in BigQuery's dialect, parsed; refused as BigQuery refuses it."""
        import sqlglot
        from sqlglot import exp

        try:
            statements = [tree for tree in sqlglot.parse(sql, read="bigquery") if tree is not None]
        except sqlglot.errors.SqlglotError as error:
            raise _invalid_query(f"Syntax error: {str(error).splitlines()[0]}") from None
        if len(statements) != 1 or not isinstance(statements[0], exp.Query):
            raise ApiError(HTTPStatus.NOT_IMPLEMENTED, "notImplemented",
                           "The BigQuery emulator runs one SELECT statement per query.")
        return statements[0]

    def _resolve(self, tree: Any, project: str,
                 default: tuple[str, str | None]) -> list[tuple[str, str, str]]:
        """Names each table ``tree`` reads as this database does, and puts each view it reads in
        its place as the subquery it stands for; the tables read, through views too."""
        from sqlglot import exp

        common = {cte.alias for cte in tree.find_all(exp.CTE)}
        tables = []
        for node in list(tree.find_all(exp.Table)):
            if not node.db and node.name in common:
                continue
            dataset = node.db or default[1]
            if not dataset:
                raise _invalid_query(f'Table "{node.name}" must be qualified with a dataset '
                                     "(e.g. dataset.table).")
            key = (node.catalog or (default[0] if not node.db else project), dataset, node.name)
            stored = self._store.get_table(*key)  # notFound as BigQuery says it
            if stored["type"] == "VIEW":  # a view reads no default dataset
                view = self._parse(stored["view"]["query"])
                tables += self._resolve(view, key[0], (key[0], None))
                alias = node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(node.name))
                node.replace(exp.Subquery(this=view, alias=alias))
                continue
            tables.append(key)
            node.set("catalog", None)
            node.set("db", None)
            node.set("this", exp.to_identifier(".".join(key), quoted=True))
        return tables

    def _copy_new_rows(self, tables: list[tuple[str, str, str]]) -> None:
        """Gives each table of ``tables`` the rows inserted since a query last read it."""
        import duckdb
        import pyarrow

        if self._connection is None:
            self._connection = duckdb.connect(":memory:")
            self._connection.execute("SET TimeZone = 'UTC'")
        for key in dict.fromkeys(tables):
            fields = self._store.get_table(*key)["schema"]["fields"]
            name = ".".join(key).replace('"', '""')
            if key not in self._copied:
                columns = ", ".join(f'"{f["name"]}" {_column_types(f["type"])[0]}' for f in fields)
                self._connection.execute(f'CREATE TABLE "{name}" ({columns})')
                self._copied[key] = 0
            rows = self._store.rows(*key, start=self._copied[key])
            if rows:
                arrow = pyarrow.Table.from_pylist(
                    rows, schema=pyarrow.schema([(f["name"], _column_types(f["type"])[1]) for f in fields]))
                self._connection.register("new_rows", arrow)
                self._connection.execute(f'INSERT INTO "{name}" SELECT * FROM new_rows')
                self._connection.unregister("new_rows")
                self._copied[key] += len(rows)


def _column_types(kind: str) -> tuple[str, Any]:
    """A BigQuery column type as the pipeline's DuckDB file stores it, and as Arrow's, but with
    time zones: the store keeps timestamps aware."""
    import pyarrow

    from pipeline.sinks.duckdb import ARROW_TYPES, DUCKDB_TYPES

    if DUCKDB_TYPES[kind] == "TIMESTAMP":
        return "TIMESTAMPTZ", pyarrow.timestamp("us", tz="UTC")
    return DUCKDB_TYPES[kind], ARROW_TYPES[DUCKDB_TYPES[kind]]


def _literal(parameter: dict[str, Any]) -> Any:
    """A named query parameter (``queryParameters[]``) as a SQL literal."""
    from sqlglot import exp

    kind = parameter.get("parameterType") or {}
    value = parameter.get("parameterValue") or {}
    if kind.get("type") == "ARRAY":
        element = {"parameterType": kind.get("arrayType") or {}}
        return exp.Array(expressions=[_literal({**element, "parameterValue": item})
                                      for item in value.get("arrayValues") or []])
    scalar = value.get("value")
    if scalar is None:
        return exp.Null()
    try:
        match kind.get("type"):
            case "STRING":
                return exp.Literal.string(str(scalar))
            case "INT64" | "INTEGER":
                return exp.Literal.number(_integer(scalar))
            case "FLOAT64" | "FLOAT":
                return exp.Literal.number(_float(scalar))
            case "BOOL" | "BOOLEAN":
                return exp.Boolean(this=_boolean(scalar))
            case "TIMESTAMP":
                return exp.cast(exp.Literal.string(_timestamp(scalar).isoformat()), "TIMESTAMPTZ")
    except (ValueError, TypeError):
        raise _invalid_query(f"Invalid value for query parameter {parameter.get('name')}: "
                             f"{scalar!r}") from None
    raise ApiError(HTTPStatus.NOT_IMPLEMENTED, "notImplemented",
                   f"The BigQuery emulator does not take query parameters of type {kind.get('type')}.")


def _api_value(value: Any, kind: str, use_int64_timestamp: bool) -> Any:
    """A result value as the API returns it: a string (or null)."""
    if value is None:
        return None
    if kind == "TIMESTAMP":
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)
        micros = (moment - _EPOCH) // datetime.timedelta(microseconds=1)
        return str(micros) if use_int64_timestamp else f"{micros / 1e6:.6f}"
    if kind == "BOOLEAN":
        return "true" if value else "false"
    if kind == "FLOAT":
        number = float(value) if isinstance(value, decimal.Decimal) else value
        return {math.inf: "Infinity", -math.inf: "-Infinity"}.get(number, "NaN" if math.isnan(number)
                                                                    else repr(float(number)))
    if kind == "DATE":
        return value.isoformat()
    return str(value)


class _Handler(BaseHTTPRequestHandler):
    store: BigQueryStore

    def log_message(self, format: str, *args: Any) -> None:
        _LOG.debug("bigquery emulator: " + format, *args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        try:
            status, body = HTTPStatus.OK, self._route(method)
        except ApiError as error:
            status, body = error.status, error.body()
        payload = json.dumps(body, default=_json_default).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _route(self, method: str) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BYTES:
            self.rfile.read(length)
            raise ApiError(HTTPStatus.BAD_REQUEST, "badRequest", payload_too_large(MAX_REQUEST_BYTES))
        raw = self.rfile.read(length) if length else b""
        try:
            request = json.loads(raw) if raw else {}
        except ValueError:
            raise ApiError(HTTPStatus.BAD_REQUEST, "parseError", "The request is not valid JSON.") from None
        path, _, query_string = self.path.partition("?")
        store = self.store
        job_match = _JOB_PATH.match(path)
        if job_match is not None:
            return self._job_route(method, job_match, request, urllib.parse.parse_qs(query_string))
        match = _PATH.match(path)
        if match is None:
            raise ApiError(HTTPStatus.NOT_FOUND, "notFound", f"Unknown path {self.path}")
        project, dataset, table = match["project"], match["dataset"], match["table"]
        routes: dict[tuple[str, ...], Callable[[], dict[str, Any]]] = {
            ("POST", "datasets"): lambda: store.create_dataset(project, request),
            ("GET", "dataset"): lambda: store.get_dataset(project, dataset),
            ("POST", "tables"): lambda: store.create_table(project, dataset, request),
            ("GET", "table"): lambda: store.get_table(project, dataset, table),
            ("POST", "insertAll"): lambda: store.insert_all(project, dataset, table, request),
        }
        level = ("insertAll" if match["insert"] else "table" if table else "tables" if match["tables"]
                 else "dataset" if dataset else "datasets")
        route = routes.get((method, level))
        if route is None:
            raise self._not_served(method)
        return route()

    def _job_route(self, method: str, match: re.Match[str], request: dict[str, Any],
                   parameters: dict[str, list[str]]) -> dict[str, Any]:
        project, job = match["project"], match["job"]
        queries = self.store._queries
        if (method, match["kind"], job is None) == ("POST", "queries", True):
            return queries.query(project, request)
        if method == "GET" and job is not None:
            if match["kind"] == "jobs":
                return queries.job(project, job)
            first = parameters.get
            return queries.results(
                project, job, int((first("startIndex") or first("pageToken") or ["0"])[0]),
                int(first("maxResults", ["-1"])[0]),
                first("formatOptions.useInt64Timestamp", ["false"])[0].lower() == "true")
        raise self._not_served(method)

    def _not_served(self, method: str) -> ApiError:
        return ApiError(HTTPStatus.NOT_IMPLEMENTED, "notImplemented",
                        f"{method} {self.path} is not served by the BigQuery emulator")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    raise TypeError(type(value))


class BigQueryEmulator:
    """The stand-in as an HTTP server on localhost; a context manager that stops it."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", store: BigQueryStore | None = None) -> None:
        self.store = store or BigQueryStore()
        handler = type("Handler", (_Handler,), {"store": self.store})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="bigquery-emulator",
                                        daemon=True)

    def start(self) -> BigQueryEmulator:
        self._thread.start()
        _LOG.info("BigQuery emulator listening on %s", self.endpoint)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> BigQueryEmulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = emulator_parser(
        "bigquery", "Run a local stand-in of the BigQuery REST API (datasets, tables, insertAll, and "
                    "queries run on DuckDB; in memory). Point the client at it with "
                    "client_options={'api_endpoint': URL}.", 9050)
    args = parser.parse_args(argv)
    log_to_console()
    emulator = BigQueryEmulator(args.port, args.host).start()
    return serve_until_signalled(emulator)


if __name__ == "__main__":
    sys.exit(main())
