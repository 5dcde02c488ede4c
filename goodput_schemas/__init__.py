"""The event contract and table schemas (the distribution ``fleet-goodput-schemas``).

``goodput_event.proto`` is the source; ``goodput_event_pb2.py`` is generated from it with
``python -m grpc_tools.protoc -I goodput_schemas --python_out=goodput_schemas
--pyi_out=goodput_schemas goodput_schemas/goodput_event.proto`` (a test fails when it is out of
date). Its limits are in ``limits``, its wire format in ``wire``.
"""

import re
from pathlib import Path
from typing import Any

#: The directory holding the schema files.
DIRECTORY = Path(__file__).resolve().parent
#: The event contract (Pub/Sub topic schema, Protocol Buffers).
EVENT_PROTO = DIRECTORY / "goodput_event.proto"
#: BigQuery JSON schemas of the output tables, one file per table.
TABLES_DIRECTORY = DIRECTORY / "tables"
#: Each table's day partitioning field and clustering fields.
TABLE_OPTIONS = DIRECTORY / "table_options.json"
#: Fleet SQL in BigQuery's dialect, one saved query per file, with the tables' dataset as ``${dataset}``.
SQL_DIRECTORY = DIRECTORY / "sql"
#: Views over the tables, one per file: BigQuery SQL with the tables' dataset as ``${dataset}``.
VIEWS_DIRECTORY = DIRECTORY / "views"
#: Accelerator prices per chip-hour, seeded into the ``accelerator_prices`` table.
ACCELERATOR_PRICES = DIRECTORY / "accelerator_prices.csv"
#: Peak dense bf16 TFLOP/s per chip from spec sheets, seeded into the ``accelerator_peaks`` table.
ACCELERATOR_PEAKS = DIRECTORY / "accelerator_peaks.csv"
#: The tables shipped filled: each table's CSV file (a header, then rows), loaded by Terraform and
#: seeded by the sinks into the table while it is empty.
SEEDED_TABLES = {"accelerator_prices": ACCELERATOR_PRICES, "accelerator_peaks": ACCELERATOR_PEAKS}
#: A BigQuery dataset the tables are written to: a project ID (``my-project``, or
#: ``example.com:my-project``), ``:`` or ``.``, a dataset ID; nothing that could end a quoted table
#: reference in SQL.
_DATASET = re.compile(r"(?P<project>(?:[a-z][a-z0-9.-]*:)?[a-z][a-z0-9-]{4,61}[a-z0-9])[.:]"
                      r"(?P<dataset>[A-Za-z0-9_]{1,1024})")


def parse_dataset(text: str) -> tuple[str, str]:
    """``PROJECT:DATASET`` or ``PROJECT.DATASET`` as (project, dataset); ValueError otherwise."""
    match = _DATASET.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not PROJECT:DATASET or PROJECT.DATASET (a project ID, and a "
                         "dataset name of letters, digits and underscores)")
    return match["project"], match["dataset"]


def table_schema(name: str) -> list[dict[str, str]]:
    """The BigQuery JSON schema (a list of fields) of output table ``name``."""
    import json

    fields: list[dict[str, str]] = json.loads((TABLES_DIRECTORY / f"{name}.json").read_text())
    return fields


def table_options(name: str) -> dict[str, Any]:
    """``{"partition_field": ..., "cluster": [...]}`` of output table ``name``."""
    import json

    options: dict[str, Any] = json.loads(TABLE_OPTIONS.read_text())["tables"][name]
    return options


def saved_queries(dataset: str) -> dict[str, str]:
    """Every saved fleet query by name (its file's stem), in BigQuery's dialect, reading its tables
    from ``dataset`` (e.g. ```project.dataset``` in BigQuery, ``main`` in DuckDB), each parameter
    at its default (``parameters``)."""
    from goodput_schemas.parameters import fill

    return {path.stem: fill(_with_dataset(path.read_text(), dataset))
            for path in sorted(SQL_DIRECTORY.glob("*.sql"))}


def saved_query(name: str, dataset: str, values: dict[str, str] | None = None) -> str:
    """Saved query ``name`` as ``saved_queries`` has it, with the parameters in ``values`` (by
    name, as text) instead of their defaults; ``KeyError`` for a query there is not,
    ``ValueError`` for a parameter it does not have or a value not of its type."""
    from goodput_schemas.parameters import fill

    path = SQL_DIRECTORY / f"{name}.sql"
    if not path.is_file() or path.parent != SQL_DIRECTORY or name.startswith("."):
        raise KeyError(name)
    return fill(_with_dataset(path.read_text(), dataset), values)


def views(dataset: str) -> dict[str, str]:
    """Every view's query by name, reading its tables from ``dataset`` (e.g. ```project.dataset```
    in BigQuery, ``main`` in DuckDB)."""
    return {path.stem: _with_dataset(path.read_text(), dataset)
            for path in sorted(VIEWS_DIRECTORY.glob("*.sql"))}


def _with_dataset(sql: str, dataset: str) -> str:
    """``sql`` with its one template parameter, ``${dataset}``, filled in. Any other ``$`` (a JSON
    path's) stays as it is, as in Terraform's ``templatefile``, which fills the views."""
    return sql.replace("${dataset}", dataset)


def table_names() -> list[str]:
    """Every output table with a schema, sorted."""
    return sorted(path.stem for path in TABLES_DIRECTORY.glob("*.json"))
