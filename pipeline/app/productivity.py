"""``goodput productivity``: ML Productivity Goodput (MPG) in Cloud Monitoring, per run and for the
fleet, from the tables.

MPG is scheduling goodput x runtime goodput x program goodput. The stream knows only the middle
factor: scheduling goodput is GKE's, imported from Cloud Monitoring up to an hour late (``goodput
import gke-metrics``), and program goodput is the mean of a run's MFU (or TFLOPS over its chips'
peak) over its whole life, which the engine does not keep (its per-run state stays bounded). So
MPG is written by this command, from the ``run_productivity`` and ``fleet_productivity`` saved
queries run on the tables (a DuckDB file, or the BigQuery dataset), with points stamped now: run it
after each import, e.g. hourly::

    goodput import gke-metrics --project P --bigquery_dataset P:goodput
    goodput productivity --project P --bigquery_dataset P:goodput

A deployment of ``terraform/`` runs it on ``productivity_schedule`` (hourly by default), in a Cloud
Run job that Cloud Scheduler starts, as it starts the GKE import's (``gke_metrics_project``).

It writes, on the ``generic_task`` resource as the pipeline's other custom metrics:

* ``custom.googleapis.com/fleet_goodput/ml_productivity_goodput_pct``: each run's MPG in percent
  (``job`` = the run id), labelled with its accelerator type and ``known_factors`` (the factors
  its MPG is the product of, e.g. ``runtime,program``); for each run not ended, or ended within
  ``RECENT_S``, whose MPG is known;
* ``custom.googleapis.com/fleet_goodput/fleet_ml_productivity_goodput_pct``: the fleet's
  chip-weighted MPG of the current day (UTC) so far, per accelerator type (``job`` = ``fleet``).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from pipeline.app.checks import (
    BIGQUERY_INSTEAD,
    MONITORING_INSTEAD,
    OneLineParser,
    UsageError,
    check_credentials,
)
from pipeline.app.outputs import (
    BIGQUERY_ENDPOINT_HELP,
    MONITORING_ENDPOINT_HELP,
    check_dataset,
    check_monitoring_endpoint,
)
from pipeline.sinks.monitoring import CUSTOM, UNKNOWN_ACCELERATOR, Point

#: Each run's MPG, and the fleet's per accelerator type.
RUN_METRIC = CUSTOM + "ml_productivity_goodput_pct"
FLEET_METRIC = CUSTOM + "fleet_ml_productivity_goodput_pct"
#: The ``job`` of the fleet's series.
FLEET_JOB = "fleet"
#: How long after its end a run's MPG is still written: a day and an hour, so that a daily run of
#: this command writes every run's final figure at least once.
RECENT_S = 25 * 3600
#: The saved queries read.
RUN_QUERY, FLEET_QUERY = "run_productivity", "fleet_productivity"

Rows = list[dict[str, Any]]


def productivity_points(runs: Iterable[dict[str, Any]], fleet: Iterable[dict[str, Any]],
                        now: datetime.datetime, location: str = "global") -> tuple[list[Point], list[str]]:
    """The points of ``run_productivity`` and ``fleet_productivity`` rows as of ``now`` (aware,
    UTC), stamped ``now``; ``location`` is the resource's where a run has none, and the fleet's.

    And the figures not made points, one line each: MPG is a fraction, and one that is not in
    0..1 (a NaN, or a product of factors past 1, as an MFU recorded in percent gives) is said
    rather than written, so no dashboard or alert reads it as a percentage."""
    end_us = round(now.timestamp() * 1_000_000)
    recent = now - datetime.timedelta(seconds=RECENT_S)
    points = []
    refused = []
    for row in runs:
        mpg = row["ml_productivity_goodput"]
        if mpg is None or (row["ended"] and _utc(row["run_end"]) < recent):
            continue
        if not 0 <= mpg <= 1:  # a NaN fails it too
            refused.append(f"run {row['run_id']}: ML Productivity Goodput {mpg!r} is not a fraction in 0..1 "
                           f"(its factors: {row['known_factors']})")
            continue
        labels = (("accelerator_type", row["accelerator_type"] or UNKNOWN_ACCELERATOR),
                  ("known_factors", row["known_factors"]))
        points.append(Point(RUN_METRIC, labels, row["run_id"], row["location"] or location, 100.0 * mpg,
                            end_us))
    today = now.astimezone(datetime.timezone.utc).date()
    for row in fleet:
        mpg = row["ml_productivity_goodput"]
        if row["day"] != today or mpg is None:
            continue
        if not 0 <= mpg <= 1:
            refused.append(f"the fleet's {row['accelerator_type']}: ML Productivity Goodput {mpg!r} is not a "
                           "fraction in 0..1")
            continue
        points.append(Point(FLEET_METRIC, (("accelerator_type", row["accelerator_type"]),), FLEET_JOB,
                            location, 100.0 * mpg, end_us))
    return points, refused


def _utc(moment: datetime.datetime) -> datetime.datetime:
    """A time from a table, naive (DuckDB's, in UTC) or aware (BigQuery's), as an aware one."""
    return moment.replace(tzinfo=datetime.timezone.utc) if moment.tzinfo is None else moment


def read_duckdb(path: str) -> tuple[Rows, Rows]:
    """The rows of ``run_productivity`` and ``fleet_productivity`` on a DuckDB file."""
    import duckdb

    from pipeline.app.checks import read_only
    from pipeline.app.fleet_sql import run_saved

    with read_only(path) as connection:
        try:
            runs, fleet = (_dicts(*run_saved(name, connection)) for name in (RUN_QUERY, FLEET_QUERY))
        except (duckdb.CatalogException, duckdb.BinderException) as error:
            raise UsageError(f"{path} lacks a table or column MPG needs ({str(error).splitlines()[0]}); "
                             "write it with python -m pipeline --duckdb first") from None
    return runs, fleet


def _dicts(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Rows:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def read_bigquery(dataset: str, endpoint: str | None = None) -> tuple[Rows, Rows]:
    """The rows of ``run_productivity`` and ``fleet_productivity`` on a BigQuery dataset
    (``PROJECT:DATASET``), each query run there."""
    from goodput_schemas import parse_dataset, saved_queries
    from pipeline.sinks.bigquery import make_client

    project, name = parse_dataset(dataset)
    client = make_client(project, endpoint)
    queries = saved_queries(f"`{project}.{name}`")
    runs, fleet = ([dict(row.items()) for row in client.query_and_wait(queries[query])]
                   for query in (RUN_QUERY, FLEET_QUERY))
    return runs, fleet


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``goodput productivity``."""
    parser = OneLineParser(
        prog="goodput productivity", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Writes ML Productivity Goodput (scheduling x runtime x program goodput) of each\n"
                    "run and of the fleet to Cloud Monitoring, computed from the tables by the saved\n"
                    "queries run_productivity and fleet_productivity.",
        epilog="example (hourly, after goodput import gke-metrics):\n"
               "  goodput productivity --project my-project --bigquery_dataset my-project:goodput\n\n"
               f"Runs not ended, or ended in the last {RECENT_S // 3600} hours, get a point of\n"
               f"{RUN_METRIC.removeprefix(CUSTOM)}; each accelerator type one of\n"
               f"{FLEET_METRIC.removeprefix(CUSTOM)} for the day so far (UTC). Points are stamped\n"
               "now. An MPG that is not a fraction in 0..1 (a NaN, or past 1 from an MFU recorded\n"
               "in percent) is said, not written.\n"
               "Credentials are the application default ones (monitoring.timeSeries.create on\n"
               "the project). Exit status: 0 if every point was written, 1 if a point or a query\n"
               "failed, 2 for a usage error.")
    parser.add_argument("--project", required=True, metavar="PROJECT",
                        help="the Google Cloud project to write the metrics to")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--duckdb", metavar="FILE", help="the DuckDB file the pipeline wrote")
    source.add_argument("--bigquery_dataset", metavar="PROJECT:DATASET",
                        help="the BigQuery dataset of the tables")
    parser.add_argument("--bigquery_endpoint", metavar="URL", help=BIGQUERY_ENDPOINT_HELP)
    parser.add_argument("--monitoring_endpoint", metavar="HOST:PORT", help=MONITORING_ENDPOINT_HELP)
    parser.add_argument("--location", default="global",
                        help="the resource location of the fleet's series, and of runs that name none "
                             "(default: %(default)s)")
    return parser


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Reads MPG from the tables and writes it; see ``--help``."""
    from google.api_core import exceptions

    from pipeline.sinks.monitoring import MetricWriter, make_client

    out = out or sys.stdout
    try:
        check_monitoring_endpoint(args)
        check_dataset(args)
        if args.duckdb:
            runs, fleet = read_duckdb(args.duckdb)
        else:
            if not args.bigquery_endpoint:
                check_credentials(f"--bigquery_dataset={args.bigquery_dataset}", BIGQUERY_INSTEAD)
            try:
                runs, fleet = read_bigquery(args.bigquery_dataset, args.bigquery_endpoint)
            except exceptions.GoogleAPIError as error:
                print(f"goodput productivity: querying {args.bigquery_dataset} failed: {error}",
                      file=sys.stderr)
                return 1
        if not args.monitoring_endpoint:
            check_credentials(f"writing to Cloud Monitoring of --project={args.project}", MONITORING_INSTEAD)
    except UsageError as error:
        print(f"goodput productivity: {error}", file=sys.stderr)
        return 2
    points, refused = productivity_points(runs, fleet, _now(), args.location)
    failed = MetricWriter(make_client(args.monitoring_endpoint), args.project).write(points)
    written = [point for point in points if point.metric == RUN_METRIC]
    print(f"{len(written)} runs and {len(points) - len(written)} accelerator types of the fleet: "
          f"{len(points) - failed} points written to projects/{args.project}", file=out)
    for figure in refused:
        print(f"goodput productivity: {figure}: not written", file=sys.stderr)
    if failed:
        print(f"goodput productivity: {failed} points were not written (see the log for why)",
              file=sys.stderr)
    return 1 if failed or refused else 0


def _now() -> datetime.datetime:
    """The time the points are stamped with, and the day of the fleet's (tests set their own)."""
    return datetime.datetime.now(datetime.timezone.utc)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``goodput productivity``: see ``--help``."""
    return run(build_parser().parse_args(argv), out)


if __name__ == "__main__":
    sys.exit(main())
