"""Writes output rows to BigQuery with streaming inserts, failed rows to the dead-letter table.

Why the BigQuery client in a DoFn rather than Beam's ``WriteToBigQuery``: its Storage Write API
method needs a Java expansion service and its file loads need Cloud Storage, so of its methods
only streaming inserts would do, and those we can make at least as well here, with what this
pipeline needs besides: a row BigQuery rejects becomes a ``dead_letter`` row (the same table as
every other rejected input, with the row and BigQuery's reason) instead of a separate output to
wire up; insert ids are derived from the row, so a retried bundle is deduplicated by BigQuery;
requests stay under the API's size limits; and the endpoint can be a local stand-in
(``pipeline.emulators.bigquery``). The volume is small: snapshots, not events, except the raw
events table, which ``--no_raw_events`` leaves out.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import json
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

from goodput_schemas import ACCELERATOR_PRICES, table_names, table_options, table_schema
from pipeline.rows import DEAD_LETTER, Row

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


def parse_dataset(text: str) -> tuple[str, str]:
    """``PROJECT:DATASET`` or ``PROJECT.DATASET`` as (project, dataset)."""
    project, separator, dataset = text.replace(":", ".", 1).partition(".")
    if not (project and separator and dataset) or "." in dataset:
        raise ValueError(f"a BigQuery dataset is PROJECT:DATASET, got {text!r}")
    return project, dataset


def create_tables(client: Any, project: str, dataset: str) -> None:
    """Creates the dataset and every output table that does not exist yet, as Terraform does:
    schemas from ``schemas/tables/``, day partitioning and clustering from ``table_options``; a
    new ``accelerator_prices`` table is seeded from ``schemas/accelerator_prices.csv``."""
    from google.api_core.exceptions import NotFound
    from google.cloud import bigquery

    client.create_dataset(bigquery.Dataset(f"{project}.{dataset}"), exists_ok=True)
    for name in table_names():
        reference = f"{project}.{dataset}.{name}"
        try:
            client.get_table(reference)
            continue
        except NotFound:
            pass
        table = bigquery.Table(reference, schema=[
            bigquery.SchemaField.from_api_repr(field) for field in table_schema(name)])
        options = table_options(name)
        if options["partition_field"]:
            table.time_partitioning = bigquery.TimePartitioning(field=options["partition_field"])
        table.clustering_fields = options["cluster"]
        client.create_table(table)
        if name == "accelerator_prices":
            with ACCELERATOR_PRICES.open(newline="") as prices:
                rows = [{**row, "usd_per_chip_hour": float(row["usd_per_chip_hour"])}
                        for row in csv.DictReader(prices)]
            if errors := client.insert_rows_json(reference, rows):
                raise RuntimeError(f"could not seed {reference}: {errors}")


def to_json(row: Row) -> dict[str, Any]:
    """A row as insertAll's JSON: timestamps as RFC 3339 strings, non-finite floats as strings."""
    out: dict[str, Any] = {}
    for name, value in row.items():
        if isinstance(value, datetime.datetime):
            value = value.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        elif isinstance(value, float) and not math.isfinite(value):
            value = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        out[name] = value
    return out


def insert_id(table: str, row: dict[str, Any]) -> str:
    """The same row gives the same id, so BigQuery drops a retried insert of it."""
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


class BigQueryWriter:
    """Appends rows to the output tables of one dataset; rejected rows go to ``dead_letter``.

    Transient errors (5xx, rate limits) are retried with exponential backoff by the client for up
    to ``retry_deadline_s``; after that, or on any other error of a whole request (a missing
    table, a bad request), ``write`` raises, so that the runner retries the bundle: no row is
    dropped. Rows BigQuery rejects one by one are written to ``dead_letter`` instead.
    """

    def __init__(self, client: Any, project: str, dataset: str, retry_deadline_s: float = 120.0) -> None:
        from google.cloud.bigquery import DEFAULT_RETRY

        self.client = client
        self.project, self.dataset = project, dataset
        self.retry = DEFAULT_RETRY.with_deadline(retry_deadline_s)

    def write(self, rows_by_table: dict[str, list[Row]]) -> int:
        """Inserts every row; returns how many BigQuery rejected (now in ``dead_letter``)."""
        rejected: list[Row] = []
        for table, rows in sorted(rows_by_table.items()):
            rejected += self._insert(table, [to_json(row) for row in rows])
        if rejected:
            still = self._insert(DEAD_LETTER, [to_json(row) for row in rejected])
            if still:
                raise RuntimeError(f"BigQuery rejected {len(still)} dead-letter rows: {still[:3]}")
        return len(rejected)

    def _insert(self, table: str, rows: list[dict[str, Any]]) -> list[Row]:
        """Inserts rows into ``table``; the dead-letter rows of those BigQuery rejected."""
        rejected: list[Row] = []
        reference = f"{self.project}.{self.dataset}.{table}"
        for chunk in chunks(rows):
            errors = self.client.insert_rows_json(
                reference, chunk, row_ids=[insert_id(table, row) for row in chunk],
                skip_invalid_rows=True, retry=self.retry)
            for error in errors:
                row = chunk[error["index"]]
                reasons = "; ".join(e.get("message") or e.get("reason", "") for e in error["errors"])
                _LOG.warning("BigQuery rejected a row of %s: %s", table, reasons)
                rejected.append({
                    "received_time": datetime.datetime.now(datetime.timezone.utc),
                    "source": f"bigquery:{table}", "run_id": _text(row.get("run_id")),
                    "reason": f"BigQuery rejected the row: {reasons}",
                    "payload": json.dumps(row, sort_keys=True, default=str)})
        return rejected


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
