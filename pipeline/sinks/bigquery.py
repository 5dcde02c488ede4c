"""Writes output rows to BigQuery with streaming inserts, failed rows to the dead-letter table.

Why the BigQuery client in a DoFn rather than Beam's ``WriteToBigQuery``: its Storage Write API
method needs a Java expansion service and its file loads need Cloud Storage, so of its methods
only streaming inserts would do, and those we can make at least as well here, with what this
pipeline needs besides: a row BigQuery rejects becomes a ``dead_letter`` row (the same table as
every other rejected input, with the row and BigQuery's reason) instead of a separate output to
wire up; insert ids are derived from the row, so a retried bundle is deduplicated by BigQuery
(see ``BigQueryWriter`` for how long); requests stay under the API's size limits; and the
endpoint can be a local stand-in (``pipeline.emulators.bigquery``). The volume is small:
snapshots, not events, except the raw events table, which ``--no_raw_events`` leaves out.

What a job sends is made storable before it is sent (``pipeline.core.sanitize``): valid UTF-8, ids
printable and at most 2048 bytes, JSON and raw payloads at most 512 KiB, so that no row can make
a request BigQuery refuses as a whole.
"""

from __future__ import annotations

import csv
import datetime
import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from goodput_schemas import SEEDED_TABLES, table_names, table_options, table_schema, views
from pipeline.core.events import DeadLetter
from pipeline.core.rows import DEAD_LETTER, Row, dead_letter_row
from pipeline.core.sanitize import clean_row
from pipeline.sinks.retries import WriteFailed, backoff, call_with_retries, never, pause

_LOG = logging.getLogger(__name__)
MAX_ROWS_PER_REQUEST = 500  # BigQuery's recommendation for insertAll
MAX_BYTES_PER_REQUEST = 5 * 1024 * 1024  # half the 10 MB limit: room for the envelope


def make_client(project: str, endpoint: str | None = None) -> Any:
    """A BigQuery client; with ``endpoint`` (a local stand-in), anonymous credentials."""
    from google.cloud import bigquery

    if endpoint is None:
        return bigquery.Client(project=project)
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    return bigquery.Client(project=project, credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                           client_options=ClientOptions(api_endpoint=endpoint))


def create_tables(client: Any, project: str, dataset: str) -> None:
    """Creates the dataset and every output table and view that does not exist yet, as Terraform
    does: schemas from ``goodput_schemas/tables/``, day partitioning and clustering from
    ``table_options``; a new table of ``SEEDED_TABLES`` (``accelerator_prices``,
    ``accelerator_peaks``) is seeded from its CSV file in ``goodput_schemas/``; then the views of
    ``goodput_schemas/views/`` (the saved queries read some), once the tables they read exist."""
    from google.api_core.exceptions import NotFound
    from google.cloud import bigquery

    def exists(reference: str) -> bool:
        try:
            client.get_table(reference)
            return True
        except NotFound:
            return False

    client.create_dataset(bigquery.Dataset(f"{project}.{dataset}"), exists_ok=True)
    for name in table_names():
        reference = f"{project}.{dataset}.{name}"
        if exists(reference):
            continue
        table = bigquery.Table(reference, schema=[
            bigquery.SchemaField.from_api_repr(field) for field in table_schema(name)])
        options = table_options(name)
        if options["partition_field"]:
            table.time_partitioning = bigquery.TimePartitioning(field=options["partition_field"])
        table.clustering_fields = options["cluster"]
        client.create_table(table)
        if name in SEEDED_TABLES:
            _seed(client, reference, name)
    for name, query in views(f"`{project}.{dataset}`").items():
        reference = f"{project}.{dataset}.{name}"
        if exists(reference):
            continue
        view = bigquery.Table(reference)
        view.view_query = query
        client.create_table(view)


def _seed(client: Any, reference: str, name: str) -> None:
    """Inserts the rows of a seeded table's CSV file, its FLOAT64 columns as numbers."""
    numbers = {field["name"] for field in table_schema(name) if field["type"] in ("FLOAT64", "FLOAT")}
    with SEEDED_TABLES[name].open(newline="") as seed:
        rows = [{column: float(value) if column in numbers else value for column, value in row.items()}
                for row in csv.DictReader(seed)]
    if errors := client.insert_rows_json(reference, rows):
        raise RuntimeError(f"could not seed {reference}: {errors}")


def to_json(row: Row) -> dict[str, Any]:
    """A row as insertAll's JSON: timestamps as RFC 3339 strings, non-finite floats as strings,
    text made storable (``pipeline.core.sanitize.clean_row``)."""
    out: dict[str, Any] = {}
    for name, value in clean_row(row).items():
        if isinstance(value, datetime.datetime):
            value = value.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        elif isinstance(value, float) and not math.isfinite(value):
            value = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        out[name] = value
    return out


def insert_id(table: str, row: dict[str, Any]) -> str:
    """The same row gives the same id, so BigQuery drops a retried insert of it. A dead letter's
    ``received_time`` is when it was made, which a retried work item does again: its id leaves
    that out, so the retry of a rejected row or message is the same dead letter."""
    if table == DEAD_LETTER:
        row = {name: value for name, value in row.items() if name != "received_time"}
    return hashlib.sha256(json.dumps([table, row], sort_keys=True).encode()).hexdigest()[:32]


def chunks(rows: Sequence[dict[str, Any]]) -> Iterable[list[dict[str, Any]]]:
    """Consecutive runs of rows within the per-request row and size limits."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for row in rows:
        row_size = len(json.dumps(row)) + 64
        if chunk and (len(chunk) >= MAX_ROWS_PER_REQUEST or size + row_size > MAX_BYTES_PER_REQUEST):
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += row_size
    if chunk:
        yield chunk


#: Per-row error reasons worth another try (the row itself is fine): the rest are the row's fault.
TRANSIENT_ROW_REASONS = frozenset({"backendError", "internalError", "timeout", "rateLimitExceeded",
                                   "stopped"})
#: Called with each row that could be written neither to its table nor to ``dead_letter``: the
#: table, the row, why.
OnUnwritten = Callable[[str, Row, str], None]


def _retryable(error: Exception) -> bool:
    """The client's own test (5xx, ``rateLimitExceeded``, connection errors), and quota errors: a
    streaming-insert quota is a rate, answered with 403 ``quotaExceeded`` or 429."""
    from google.api_core import exceptions
    from google.cloud.bigquery.retry import DEFAULT_RETRY

    if DEFAULT_RETRY._predicate(error) or isinstance(error, exceptions.TooManyRequests):
        return True
    reasons = [e.get("reason") for e in getattr(error, "errors", None) or [] if isinstance(e, dict)]
    return "quotaExceeded" in reasons


class BigQueryWriter:
    """Appends rows to the output tables of one dataset; rows BigQuery rejects for their content
    go to ``dead_letter``.

    A request that fails transiently (5xx, rate limits, quotas, a lost connection) is retried with
    exponential backoff and full jitter, from ``initial_backoff_s`` up to ``max_backoff_s``, for
    at most ``retry_deadline_s`` per ``write`` in all (a long outage costs a bundle that much once),
    and no more once ``give_up()`` is true (a job that is stopping). A request waits up to
    ``request_timeout_s`` for its answer; once the job is stopping, no later than the stop's bound
    (``pipeline.sinks.retries.stop_requests_by``), and none is made past it.
    Rows BigQuery rejects one by one for a transient reason are tried again, ``row_attempts``
    times in all. A row rejected for its content becomes a ``dead_letter`` row with the row and
    BigQuery's reason. What is still not written after that depends on who retries:

    - By default (the local runner, where a failed bundle stops the pipeline) the write never
      raises for BigQuery: a row whose request failed for good (a missing table, a bad request, an
      outage past the deadline, a stop) or that stayed rejected for a transient reason is a
      ``dead_letter`` row too.
    - With ``raise_failures`` (a runner that retries a failed work item: Dataflow), such a
      failure raises ``WriteFailed`` at once, and the runner's retry writes the rows; no further
      request is made, so what this try wrote stays as little as it can be. The retry sends
      the rows this try wrote again, with the same insert ids: BigQuery drops those it has seen
      within its de-duplication window, "at least one minute" (best effort; the stand-in keeps
      ids for exactly a minute). So a work item that fails while BigQuery is away longer than
      that may write the rows of its requests before the outage twice; none is ever lost.

    A row that cannot be written to ``dead_letter`` either (in either way, one BigQuery rejects
    for its content) is logged, counted and handed to ``on_unwritten``.
    """

    def __init__(self, client: Any, project: str, dataset: str, retry_deadline_s: float = 120.0,
                 initial_backoff_s: float = 1.0, max_backoff_s: float = 32.0, row_attempts: int = 3,
                 request_timeout_s: float = 60.0, give_up: Callable[[], bool] = never,
                 raise_failures: bool = False) -> None:
        self.client = client
        self.project, self.dataset = project, dataset
        self.retry_deadline_s, self.request_timeout_s = retry_deadline_s, request_timeout_s
        self.initial_backoff_s, self.max_backoff_s = initial_backoff_s, max_backoff_s
        self.row_attempts = row_attempts
        self.give_up = give_up
        self.raise_failures = raise_failures

    def write(self, rows_by_table: dict[str, list[Row]], on_unwritten: OnUnwritten | None = None) -> int:
        """Inserts every row; returns how many went to ``dead_letter`` instead of their table.
        With ``raise_failures``, raises ``WriteFailed`` for what it could not write."""
        deadline = time.monotonic() + self.retry_deadline_s
        letters: list[Row] = []
        for table, rows in sorted(rows_by_table.items()):
            for row, reason in self._insert(table, [to_json(row) for row in rows], deadline):
                letters.append(_dead_letter(table, row, reason))
        if letters:
            # The dead letters get a deadline of their own: they are the rows' last way in.
            unwritten = self._insert(DEAD_LETTER, [to_json(row) for row in letters],
                                     time.monotonic() + self.retry_deadline_s)
            for row, reason in unwritten:
                _LOG.error("Could not write a dead-letter row of run %s to BigQuery: %s", row.get("run_id"),
                           reason)
                if on_unwritten is not None:
                    on_unwritten(DEAD_LETTER, row, reason)
        return len(letters)

    def _insert(self, table: str, rows: list[dict[str, Any]], deadline: float
                ) -> list[tuple[dict[str, Any], str]]:
        """Inserts rows into ``table``; the rows not written, each with the reason (with
        ``raise_failures``, only those rejected for their content: the rest raise)."""
        from google.api_core import exceptions

        failed: list[tuple[dict[str, Any], str]] = []
        reference = f"{self.project}.{self.dataset}.{table}"
        for chunk in chunks(rows):
            pending, pauses = chunk, backoff(self.initial_backoff_s, self.max_backoff_s)
            for attempt in range(1, self.row_attempts + 1):
                try:
                    errors = call_with_retries(
                        functools.partial(self.client.insert_rows_json, reference, pending,
                                          row_ids=[insert_id(table, row) for row in pending],
                                          skip_invalid_rows=True, retry=None),
                        _retryable, deadline, pauses, self.give_up, self.request_timeout_s)
                except exceptions.GoogleAPIError as error:  # RetryError too: a deadline or bound passed
                    _LOG.warning("BigQuery insert of %d rows into %s failed: %s", len(pending), table, error)
                    if self.raise_failures:
                        raise WriteFailed(f"BigQuery insert of {len(pending)} rows into {table} failed: "
                                          f"{error}") from error
                    failed += [(row, f"BigQuery insert into {table} failed: {error}") for row in pending]
                    break
                retry_rows, last = [], (attempt == self.row_attempts or time.monotonic() >= deadline
                                        or self.give_up())
                for row_error in errors:
                    row = pending[row_error["index"]]
                    reasons = {e.get("reason") for e in row_error["errors"]}
                    transient = reasons <= TRANSIENT_ROW_REASONS
                    if transient and not last:
                        retry_rows.append(row)
                        continue
                    text = "; ".join(e.get("message") or e.get("reason", "") for e in row_error["errors"])
                    _LOG.warning("BigQuery rejected a row of %s: %s", table, text)
                    if transient and self.raise_failures:
                        raise WriteFailed(f"BigQuery rejected a row of {table} for a transient reason "
                                          f"on each of {attempt} tries: {text}")
                    failed.append((row, f"BigQuery rejected the row: {text}"))
                if not retry_rows:
                    break
                pending = retry_rows
                pause(min(next(pauses), max(0.0, deadline - time.monotonic())), self.give_up)
        return failed


def _dead_letter(table: str, row: dict[str, Any], reason: str) -> Row:
    """The ``dead_letter`` row of a row BigQuery did not take: the row as JSON, and why."""
    run_id = row.get("run_id")
    return dead_letter_row(DeadLetter(json.dumps(row, sort_keys=True, default=str), reason,
                                      f"bigquery:{table}", run_id if isinstance(run_id, str) else ""))
