"""Command-line options of the pipeline (a ``PipelineOptions`` subclass)."""

from __future__ import annotations

import argparse
import datetime

from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.core.snapshot import DEFAULT_WINDOWS_S


def parse_as_of(text: str) -> int:
    """An ISO 8601 time (a naive one is UTC) as microseconds since the epoch."""
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return (moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)) // datetime.timedelta(
        microseconds=1)


def parse_windows(text: str) -> tuple[int, ...]:
    """A comma-separated list of positive window sizes in seconds."""
    try:
        windows = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"windows must be integers of seconds, got {text!r}") from None
    if any(w <= 0 for w in windows):
        raise argparse.ArgumentTypeError(f"windows must be positive, got {text!r}")
    return windows


MIN_POINT_INTERVAL_S = 5.0  # Cloud Monitoring takes one point per series per 5 s at most


def parse_point_interval(text: str) -> float:
    """Seconds between two points of a series: at least what Cloud Monitoring accepts."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not seconds >= MIN_POINT_INTERVAL_S:
        raise argparse.ArgumentTypeError(
            f"Cloud Monitoring takes at most one point per series every {MIN_POINT_INTERVAL_S:g} s, "
            f"got {text!r}")
    return seconds


def parse_exclusion(text: str) -> tuple[int, int]:
    """START/END, two ISO 8601 times, as (start_us, end_us)."""
    start, separator, end = text.partition("/")
    if not separator:
        raise argparse.ArgumentTypeError(f"an exclusion is START/END, got {text!r}")
    interval = parse_as_of(start), parse_as_of(end)
    if interval[1] <= interval[0]:
        raise argparse.ArgumentTypeError(f"an exclusion must end after it starts, got {text!r}")
    return interval


class GoodputOptions(PipelineOptions):
    """Options of the goodput pipeline; Beam's own options (``--runner`` ...) come with it."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--events", action="append", default=None, metavar="FILE",
                            help="an emitter file (one JSON message per line); repeat for more")
        parser.add_argument("--from_duckdb", action="append", default=None, metavar="FILE",
                            help="a backfill: replay the raw events table of a DuckDB file the "
                                 "pipeline wrote (rebuilds every table from it); repeat for more")
        parser.add_argument("--duckdb", default=None, metavar="FILE",
                            help="DuckDB file the output tables are appended to; a stream started "
                                 "on a file it wrote before restores each run from its raw events "
                                 "table when the run speaks again")
        parser.add_argument("--bigquery_dataset", default=None, metavar="PROJECT:DATASET",
                            help="BigQuery dataset the output tables are appended to")
        parser.add_argument("--bigquery_endpoint", default=None, metavar="URL",
                            help="BigQuery API endpoint, e.g. a local stand-in "
                                 "(python -m pipeline.emulators.bigquery); anonymous credentials")
        parser.add_argument("--bigquery_create_tables", action="store_true",
                            help="create the dataset and any missing output table first "
                                 "(in production Terraform creates them)")
        parser.add_argument("--monitoring_project", default=None, metavar="PROJECT",
                            help="write the reference's Cloud Monitoring metrics of every run to "
                                 "this project")
        parser.add_argument("--monitoring_endpoint", default=None, metavar="HOST:PORT",
                            help="Cloud Monitoring endpoint over an insecure channel, e.g. a local "
                                 "stand-in (python -m pipeline.emulators.monitoring)")
        parser.add_argument("--monitoring_min_interval_s", type=parse_point_interval, default=10.0,
                            metavar="S", help="at most one point per series this often, at least 5 "
                                              "(default: %(default)s)")
        parser.add_argument("--monitoring_max_lag_s", type=float, default=600.0, metavar="S",
                            help="a snapshot older than this is history: not written to Cloud "
                                 "Monitoring (default: %(default)s)")
        parser.add_argument("--monitoring_latest_now", action="store_true",
                            help="write each run's latest values, stamped now, even when they are "
                                 "history (a batch replay writes nothing to Monitoring without it)")
        parser.add_argument("--monitoring_location", default="global", metavar="LOCATION",
                            help="the Workload resource's location for runs whose metadata has none "
                                 "(default: %(default)s)")
        parser.add_argument("--monitoring_cluster_name", default=None, metavar="NAME",
                            help="add the reference's optional cluster_name label to every metric "
                                 "with labels")
        parser.add_argument("--no_raw_events", action="store_true",
                            help="leave out the raw events table (snapshots, run metadata and dead "
                                 "letters are still written)")
        parser.add_argument("--as_of", type=parse_as_of, default=None, metavar="ISO8601",
                            help="snapshot time (default: the latest event time in the input)")
        parser.add_argument("--subscription", default=None, metavar="projects/P/subscriptions/S",
                            help="streaming: the Pub/Sub subscription to read (with --streaming)")
        parser.add_argument("--snapshot_interval_s", type=float, default=30.0, metavar="S",
                            help="streaming: snapshot each active run this often (default: %(default)s)")
        parser.add_argument("--silence_s", type=float, default=300.0, metavar="S",
                            help="streaming: a run with no event for this long is stalled: it gets "
                                 "a snapshot showing the lost time, and another every snapshot "
                                 "interval while it stays silent, up to --gc_after_s "
                                 "(default: %(default)s)")
        parser.add_argument("--gc_after_s", type=float, default=3600.0, metavar="S",
                            help="streaming: forget a run that has ended this long after its last "
                                 "message; stop reporting a silent run this long after its last event "
                                 "(default: %(default)s)")
        parser.add_argument("--exclude", type=parse_exclusion, action="append", default=None,
                            metavar="START/END",
                            help="leave this interval (ISO 8601 times) out of elapsed time and "
                                 "every bucket, e.g. a capacity stock-out; repeat for more")
        parser.add_argument("--windows", type=parse_windows, default=DEFAULT_WINDOWS_S,
                            metavar="S,S,...",
                            help="rolling windows in seconds (default: %(default)s)")
