"""What the commands that fill the tables from outside the stream share (``goodput import capacity``,
``goodput import gke-metrics``), some of it with ``goodput productivity``: the options of where rows
go (a DuckDB file, a BigQuery dataset, or both), their checks, the writing of the rows, the Cloud
Monitoring endpoint, and ISO 8601 times on the command line.

One definition each, so that an option reads, is checked and fails the same way in every command.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from collections.abc import Iterable
from typing import TextIO

from goodput_schemas.limits import MAX_TIME_US, MIN_TIME_US
from pipeline.app.checks import UsageError
from pipeline.core.rows import Row, timestamp

#: The help of ``--bigquery_endpoint``, which reads a dataset as well as writes one.
BIGQUERY_ENDPOINT_HELP = ("BigQuery API endpoint, e.g. a local stand-in (goodput emulator bigquery); "
                          "anonymous credentials")
#: The help of ``--monitoring_endpoint``.
MONITORING_ENDPOINT_HELP = ("Cloud Monitoring endpoint over an insecure channel, e.g. a local stand-in "
                            "(goodput emulator monitoring)")


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--duckdb``, ``--bigquery_dataset``, ``--bigquery_endpoint`` and ``--bigquery_create_tables``:
    where a command appends its rows, at least one of the two (``check_outputs``)."""
    parser.add_argument("--duckdb", metavar="FILE",
                        help="DuckDB file to append the rows to: a new file, or one the pipeline wrote")
    parser.add_argument("--bigquery_dataset", metavar="PROJECT:DATASET",
                        help="BigQuery dataset to append the rows to")
    parser.add_argument("--bigquery_endpoint", metavar="URL", help=BIGQUERY_ENDPOINT_HELP)
    parser.add_argument("--bigquery_create_tables", action="store_true",
                        help="create the dataset and any missing table first (in production Terraform "
                             "creates them)")


def check_outputs(args: argparse.Namespace) -> None:
    """``UsageError`` unless the options of ``add_output_options`` name an output and hold together;
    the DuckDB file is looked at read-only, and credentials are looked for where BigQuery needs
    them."""
    from pipeline.app.checks import BIGQUERY_INSTEAD, check_credentials, check_duckdb_output

    if not (args.duckdb or args.bigquery_dataset):
        raise UsageError("no output: give --duckdb=FILE or --bigquery_dataset=PROJECT:DATASET (or both)")
    check_dataset(args)
    if args.duckdb:
        check_duckdb_output(args.duckdb)
    if args.bigquery_dataset and not args.bigquery_endpoint:
        check_credentials(f"--bigquery_dataset={args.bigquery_dataset}", BIGQUERY_INSTEAD)


def check_dataset(args: argparse.Namespace) -> None:
    """``UsageError`` if a BigQuery option is given without ``--bigquery_dataset``, or that is not
    ``PROJECT:DATASET``."""
    from goodput_schemas import parse_dataset

    for option in ("bigquery_endpoint", "bigquery_create_tables"):
        if getattr(args, option, None) and not args.bigquery_dataset:
            raise UsageError(f"--{option} needs --bigquery_dataset")
    if args.bigquery_dataset:
        try:
            parse_dataset(args.bigquery_dataset)
        except ValueError as error:
            raise UsageError(f"--bigquery_dataset: {error}") from None


def check_monitoring_endpoint(args: argparse.Namespace) -> None:
    """``UsageError`` unless ``--monitoring_endpoint``, if given, is ``HOST:PORT`` (a URL is not)."""
    if args.monitoring_endpoint and not re.fullmatch(r"[^\s/]+:\d{1,5}", args.monitoring_endpoint):
        raise UsageError(f"--monitoring_endpoint={args.monitoring_endpoint} is not HOST:PORT, "
                         "e.g. 127.0.0.1:8086")


def write_rows(args: argparse.Namespace, table: str, rows: list[Row], what: str, command: str,
               out: TextIO) -> int:
    """Appends rows to ``table`` of every output given, saying on ``out`` where ``what`` went
    (the rows in words, their number first, e.g. ``2 spans (288.0 chip-hours)``); 1, with the reason
    on standard error after ``command``'s name, if BigQuery failed or kept some as dead letters."""
    from google.api_core import exceptions

    if args.duckdb:
        write_duckdb(args.duckdb, table, rows)
        print(f"{what} appended to {args.duckdb}", file=out)
    if args.bigquery_dataset:
        try:
            letters = write_bigquery(args.bigquery_dataset, table, rows, args.bigquery_endpoint,
                                     args.bigquery_create_tables)
        except exceptions.GoogleAPIError as error:
            print(f"{command}: writing to {args.bigquery_dataset} failed: {first_line(error)}",
                  file=sys.stderr)
            return 1
        inserted = f"{len(rows) - letters} of {what}" if letters else what
        print(f"{inserted} inserted into {args.bigquery_dataset}", file=out)
        if letters:
            print(f"{command}: {letters} rows went to the dead_letter table instead, with BigQuery's "
                  "reasons; import them again once they are fixed", file=sys.stderr)
            return 1
    return 0


def write_duckdb(path: str, table: str, rows: Iterable[Row]) -> int:
    """Appends rows to a table of a DuckDB file; how many."""
    from pipeline.sinks.duckdb import opened

    with opened(path) as sink:
        return sink.write(table, rows)


def write_bigquery(dataset: str, table: str, rows: list[Row], endpoint: str | None = None,
                   create: bool = False) -> int:
    """Inserts rows into a table of a BigQuery dataset (``PROJECT:DATASET``), creating the tables
    first with ``create``; how many went to ``dead_letter`` instead."""
    from goodput_schemas import parse_dataset
    from pipeline.sinks.bigquery import BigQueryWriter, create_tables, make_client

    project, name = parse_dataset(dataset)
    client = make_client(project, endpoint)
    if create:
        create_tables(client, project, name)
    return BigQueryWriter(client, project, name).write({table: rows})


def first_line(error: BaseException) -> str:
    """An error in one line (a Google API error's message goes on with its details)."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def parse_time(text: str) -> datetime.datetime:
    """An ISO 8601 time (a naive one is UTC), in UTC, in the years the event contract allows;
    ``ValueError`` saying why not."""
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO 8601 time: {text!r} (e.g. 2026-11-01T00:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    if not MIN_TIME_US <= time_us(moment) < MAX_TIME_US:
        raise ValueError(f"{text!r} is outside the years 2000 to 2200")
    return moment.astimezone(datetime.timezone.utc)


def time_argument(text: str) -> int:
    """``parse_time`` as an argparse ``type``: microseconds since the epoch."""
    try:
        return time_us(parse_time(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def time_us(moment: datetime.datetime) -> int:
    """An aware time as microseconds since the epoch."""
    return (moment - timestamp(0)) // datetime.timedelta(microseconds=1)
