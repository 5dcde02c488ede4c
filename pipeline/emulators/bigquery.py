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
deduplicates it for a minute. Rows are kept in memory for assertions. Queries (``jobs``) are not
served: fleet SQL runs on DuckDB.

Faults are injected through the store: ``fail_next(n, status, reason)`` fails the next n
insertAll requests as a whole (503 ``backendError``, 429 ``rateLimitExceeded``, 403
``quotaExceeded``, ...), ``reject_rows_next(n, reason)`` rejects the next n valid rows one by one
(a partial failure; ``backendError`` is transient, ``invalid`` is not), and
``slow_next(n, seconds)`` answers the next n insertAll requests that much later (a slow service).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import re
import sys
import threading
import time
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

    def rows(self, project: str, dataset: str, table: str) -> list[dict[str, Any]]:
        """The table's rows in insert order, values as Python (timestamps as aware datetimes)."""
        with self._lock:
            return list(self._rows.get((project, dataset, table), []))

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
        fields = resource.get("schema", {}).get("fields", [])
        unknown = [f.get("type") for f in fields if f.get("type") not in _CONVERT]
        if not fields or unknown:
            raise ApiError(HTTPStatus.BAD_REQUEST, "invalid",
                           f"Table {table} needs a schema of known types (got {unknown or 'none'}).")
        key = (project, dataset, table)
        with self._lock:
            if key in self._tables:
                raise ApiError(HTTPStatus.CONFLICT, "duplicate",
                               f"Already Exists: Table {project}:{dataset}.{table}")
            stored = {**resource, "id": f"{project}:{dataset}.{table}", "kind": "bigquery#table",
                      "tableReference": {"projectId": project, "datasetId": dataset, "tableId": table},
                      "type": "TABLE"}
            self._tables[key], self._rows[key], self._seen[key] = stored, [], {}
            return stored

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
        match = _PATH.match(self.path.split("?", 1)[0])
        if match is None:
            raise ApiError(HTTPStatus.NOT_FOUND, "notFound", f"Unknown path {self.path}")
        project, dataset, table = match["project"], match["dataset"], match["table"]
        store = self.store
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
            raise ApiError(HTTPStatus.NOT_IMPLEMENTED, "notImplemented",
                           f"{method} {self.path} is not served by the BigQuery emulator")
        return route()


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
        "bigquery", "Run a local stand-in of the BigQuery REST API (datasets, tables, insertAll; in "
                    "memory). Point the client at it with client_options={'api_endpoint': URL}.", 9050)
    args = parser.parse_args(argv)
    log_to_console()
    emulator = BigQueryEmulator(args.port, args.host).start()
    return serve_until_signalled(emulator)


if __name__ == "__main__":
    sys.exit(main())
