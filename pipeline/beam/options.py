"""Command-line options of the pipeline (a ``PipelineOptions`` subclass), and the checks that
turn a mistake in them into one line saying what is wrong, before anything runs."""

from __future__ import annotations

import argparse
import datetime
import difflib
import math
import os
import re
from collections.abc import Sequence
from typing import NoReturn

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, _BeamArgumentParser

from goodput_schemas import parse_dataset
from goodput_schemas.limits import MAX_DURATION_S, MAX_TIME_US, MIN_TIME_US
from pipeline.app.checks import UsageError
from pipeline.core.snapshot import DEFAULT_WINDOWS_S

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def parse_as_of(text: str) -> int:
    """An ISO 8601 time (a naive one is UTC) as microseconds since the epoch, within the years
    events may have (2000 to 2200)."""
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2026-11-01T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    time_us = (moment - _EPOCH) // datetime.timedelta(microseconds=1)
    if not MIN_TIME_US <= time_us < MAX_TIME_US:
        raise argparse.ArgumentTypeError(f"{text!r} is outside the years events may have (2000 to 2200)")
    return time_us


def parse_windows(text: str) -> tuple[int, ...]:
    """A comma-separated list of distinct positive window sizes in whole seconds."""
    try:
        windows = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"windows must be whole seconds, e.g. 60,300, got {text!r}") from None
    if any(not 0 < w <= MAX_DURATION_S for w in windows):
        raise argparse.ArgumentTypeError(
            f"windows must be from 1 to {MAX_DURATION_S:.0f} seconds (2000 to 2200), got {text!r}")
    if len(set(windows)) < len(windows):
        raise argparse.ArgumentTypeError(f"a window is given twice in {text!r}")
    return windows


def parse_status_interval(text: str) -> float:
    """Seconds between status lines: 0 (never), or a number of seconds ``parse_seconds`` takes."""
    try:
        if float(text) == 0:
            return 0.0
    except ValueError:
        pass
    return parse_seconds(text)


def parse_seconds(text: str) -> float:
    """A positive, finite number of seconds, at most the span of times events may have."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_DURATION_S):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0, at most {MAX_DURATION_S:.0f} (the years 2000 to "
            f"2200), got {text!r}")
    return seconds


def parse_cadence(text: str) -> float:
    """Seconds between a replay's snapshots of a run: a positive number of seconds, at least 1."""
    seconds = parse_seconds(text)
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 second, got {text!r}")
    return seconds


def parse_slowdown(text: str) -> float:
    """A slowdown as a fraction above 0, at most 10 (11 times slower)."""
    return _bounded(text, "a slowdown fraction", 0.0, 10.0)


def parse_factor(text: str) -> float:
    """A factor above 0, at most 1,000,000."""
    return _bounded(text, "a factor", 0.0, 1e6)


def parse_whole_seconds(text: str) -> int:
    """A whole number of seconds above 0, at most a day (the straggler settings' buckets are
    whole seconds)."""
    return _whole_seconds(text, 1)


def parse_settle_seconds(text: str) -> int:
    """A whole number of seconds, 0 or more, at most a day."""
    return _whole_seconds(text, 0)


def _whole_seconds(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if not low <= value <= 86_400:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of seconds from {low} to 86400, got {text!r}")
    return value


def _bounded(text: str, what: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if not (math.isfinite(value) and low < value <= high):
        raise argparse.ArgumentTypeError(f"must be {what} above {low:g}, at most {high:g}, got {text!r}")
    return value


MIN_POINT_INTERVAL_S = 5.0  # Cloud Monitoring takes one point per series per 5 s at most


def parse_point_interval(text: str) -> float:
    """Seconds between two points of a series: at least what Cloud Monitoring accepts."""
    seconds = parse_seconds(text)
    if seconds < MIN_POINT_INTERVAL_S:
        raise argparse.ArgumentTypeError(
            f"Cloud Monitoring takes at most one point per series every {MIN_POINT_INTERVAL_S:g} s, "
            f"got {text!r}")
    return seconds


def parse_exclusion(text: str) -> tuple[int, int]:
    """START/END, two ISO 8601 times, as (start_us, end_us)."""
    start, separator, end = text.partition("/")
    if not separator:
        raise argparse.ArgumentTypeError(f"an exclusion is START/END, two ISO 8601 times, got {text!r}")
    interval = parse_as_of(start), parse_as_of(end)
    if interval[1] <= interval[0]:
        raise argparse.ArgumentTypeError(f"an exclusion must end after it starts, got {text!r}")
    return interval


class GoodputOptions(PipelineOptions):
    """Options of the goodput pipeline; Beam's own options (``--runner`` ...) come with it."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--events", action="append", default=None, metavar="FILE",
                            help="an emitter file (one JSON message per line; a gzip-compressed file and a "
                                 "leading UTF-8 byte order mark are read as well); repeat for more")
        parser.add_argument("--from_duckdb", action="append", default=None, metavar="FILE",
                            help="a backfill: replay the raw events table of a DuckDB file the "
                                 "pipeline wrote (rebuilds every table from it); repeat for more")
        parser.add_argument("--duckdb", default=None, metavar="FILE",
                            help="DuckDB file the output tables are appended to: a new file, or one this "
                                 "pipeline wrote (any other is refused, untouched)")
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
        parser.add_argument("--monitoring_max_lag_s", type=parse_seconds, default=600.0, metavar="S",
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
        parser.add_argument("--no_restore", action="store_true",
                            help="streaming: do not restore runs from the raw events table. By "
                                 "default, the first message of a run the stream holds no state "
                                 "for (after a restart, a relaunch, or once it forgot the run "
                                 "--gc_after_s after its last message) is added to the run's "
                                 "history from the raw events table of --duckdb, or else of "
                                 "--bigquery_dataset (two queries per run), and at the start the "
                                 "runs with events no snapshot counts are restored and reported")
        parser.add_argument("--as_of", type=parse_as_of, default=None, metavar="ISO8601",
                            help="snapshot time (default: the latest event time in the input)")
        parser.add_argument("--snapshot_every_s", type=parse_cadence, default=None, metavar="S",
                            help="batch replay: also snapshot each run every S seconds of its own "
                                 "time (at multiples of S since the epoch, so runs line up), from "
                                 "its first event to its last (or to --as_of), each with the "
                                 "figures a replay --as_of that time writes and each anomaly row "
                                 "once, as the stream writes them: a report of the replay draws "
                                 "goodput over time. The latest snapshot of each run is the one "
                                 "written without it (e.g. 300; at least 1)")
        parser.add_argument("--subscription", default=None, metavar="projects/P/subscriptions/S",
                            help="streaming: the Pub/Sub subscription to read (with --streaming)")
        parser.add_argument("--status_interval_s", type=parse_status_interval, default=30.0, metavar="S",
                            help="streaming on this machine: print a status line on stderr (messages "
                                 "read, runs held, snapshots, dead letters) this often; 0: never "
                                 "(default: %(default)s)")
        parser.add_argument("--log_level", type=str.upper, default=None,
                            choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                            help="on this machine: log the pipeline's steps from this level on, on "
                                 "stderr; INFO adds each run the stream restores and what it read "
                                 "(on Dataflow: Beam's --default_sdk_harness_log_level) "
                                 "(default: WARNING)")
        parser.add_argument("--snapshot_interval_s", type=parse_seconds, default=30.0, metavar="S",
                            help="streaming: snapshot each active run this often (processing "
                                 "time); a Dataflow drain waits at most this long for the pending "
                                 "snapshots; a local stop (SIGINT or SIGTERM) takes at most this "
                                 "+ 2 s, plus --monitoring_min_interval_s when writing Cloud "
                                 "Monitoring, unless what was read takes longer to write (it says "
                                 "so) (default: %(default)s)")
        parser.add_argument("--silence_s", type=parse_seconds, default=300.0, metavar="S",
                            help="streaming: a run is stalled once the pipeline has read "
                                 "everything published this long after its last message (or its "
                                 "hang threshold, if sooner: see --hang_min_s) and nothing of the "
                                 "run came; judged on Pub/Sub publish times, so a pipeline that "
                                 "is behind is not a run that hangs. It gets a snapshot showing "
                                 "the lost time, and another every snapshot interval of publish "
                                 "time while it stays silent, up to --gc_after_s "
                                 "(default: %(default)s)")
        parser.add_argument("--gc_after_s", type=parse_seconds, default=3600.0, metavar="S",
                            help="streaming: this long after a run's last message (publish "
                                 "time), ended or not, stop reporting it and forget it: every "
                                 "state cell and timer of it is cleared, and a run that speaks "
                                 "again is restored; DuckDB's run ids are read again every half "
                                 "of it (default: %(default)s)")
        parser.add_argument("--min_slowdown", type=parse_slowdown, default=0.10, metavar="FRACTION",
                            help="the smallest step-time slowdown looked for, against the run's "
                                 "baseline: 0.10 is 10 %% slower (default: %(default)s)")
        parser.add_argument("--hang_min_s", type=parse_seconds, default=60.0, metavar="S",
                            help="a run is hung after no step for max(this, --hang_factor x its "
                                 "baseline step time) (default: %(default)s)")
        parser.add_argument("--hang_factor", type=parse_factor, default=10.0, metavar="X",
                            help="see --hang_min_s (default: %(default)s)")
        parser.add_argument("--straggler_min_s", type=parse_whole_seconds, default=300, metavar="S",
                            help="a host is a straggler when its steps (emitter.HostStepTimer) are "
                                 "at least 3/4 of --min_slowdown slower than its peers' for this "
                                 "long (default: %(default)s)")
        parser.add_argument("--host_bucket_s", type=parse_whole_seconds, default=60, metavar="S",
                            help="hosts are compared per this many seconds of their step summaries: "
                                 "at least the interval HostStepTimer sends them at (default: "
                                 "%(default)s)")
        parser.add_argument("--host_settle_s", type=parse_settle_seconds, default=30, metavar="S",
                            help="a bucket of host summaries is scored this long after it ends, "
                                 "when its hosts' summaries have arrived; a later one is counted "
                                 "as late and left out (default: %(default)s)")
        parser.add_argument("--exclude", type=parse_exclusion, action="append", default=None,
                            metavar="START/END",
                            help="leave this interval (ISO 8601 times) out of elapsed time and "
                                 "every bucket, e.g. a capacity stock-out; repeat for more")
        parser.add_argument("--windows", type=parse_windows, default=DEFAULT_WINDOWS_S,
                            metavar="S,S,...",
                            help="rolling windows in seconds (default: %(default)s)")


#: Runners that run the pipeline in this process: options none of Beam's classes know are
#: refused on them. Others (Dataflow) hand unknown options on to the service, as Beam does.
LOCAL_RUNNERS = frozenset({"DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
                           "FnApiRunner", "PrismRunner"})
_STREAM_ONLY = ("subscription", "snapshot_interval_s", "silence_s", "gc_after_s", "no_restore",
                "status_interval_s")
_BATCH_ONLY = ("events", "from_duckdb", "as_of", "exclude", "snapshot_every_s")
_NEEDS = {"bigquery_dataset": ("bigquery_endpoint", "bigquery_create_tables"),
          "monitoring_project": ("monitoring_min_interval_s", "monitoring_max_lag_s", "monitoring_latest_now",
                                 "monitoring_location", "monitoring_cluster_name")}
#: Options the pipeline no longer takes, and what to do instead. The stream imported GKE's JobSet
#: metrics on a processing-time timer that re-armed itself, which on Dataflow holds the watermark:
#: a drain never ended. The import is a scheduled command now, as MPG is.
_REMOVED = dict.fromkeys(
    ("gke_metrics_project", "gke_metrics_interval_s"),
    "the stream no longer imports GKE's JobSet metrics: run goodput import gke-metrics --project P "
    "(with --duckdb or --bigquery_dataset) on a schedule instead, as the Terraform module does with "
    "gke_metrics_project")
_SUBSCRIPTION = re.compile(r"projects/[^/\s]+/subscriptions/[^/\s]+")


class _Parser(_BeamArgumentParser):
    """Beam's parser, whose mistakes are raised rather than printed with the usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def help_parser(prog: str) -> argparse.ArgumentParser:
    """The parser of ``--help``: this pipeline's options."""
    parser = argparse.ArgumentParser(
        prog=prog, description="The goodput pipeline: a batch replay of emitter files (--events) or "
                               "of a raw events table (--from_duckdb), or the stream (--streaming "
                               "--subscription); output to DuckDB, BigQuery and Cloud Monitoring.",
        epilog="Beam's own options (--runner, --project, --region, --temp_location, ...) are "
               "taken as well. A mistake is one line on stderr and exit code 2, before anything "
               "is read or written. The local stream stops on SIGINT or SIGTERM within the time "
               "it prints (see --snapshot_interval_s), every message it read written; a second "
               "signal stops it at once.")
    GoodputOptions._add_argparse_args(parser)
    return parser


def _given(argv: Sequence[str], name: str) -> bool:
    return any(arg == f"--{name}" or arg.startswith(f"--{name}=") for arg in argv)


def parse_command_line(argv: Sequence[str]) -> GoodputOptions:
    """The options of ``argv``, checked on their own and together (the files they name are
    checked by ``check_files``); a mistake raises ``UsageError``."""
    for name, instead in _REMOVED.items():
        if _given(argv, name):
            raise UsageError(f"--{name} was removed: {instead}")
    parser = _Parser(allow_abbrev=False, add_help=False)
    for cls in {str(cls): cls for cls in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # as Beam's get_all_options does
    known, unknown = parser.parse_known_args(list(argv))
    runner = known.runner
    if runner is not None and runner not in LOCAL_RUNNERS:
        from apache_beam.runners.runner import create_runner

        try:
            create_runner(runner)
        except (ValueError, ImportError):
            raise UsageError(f"--runner={runner} is not a runner Beam knows (e.g. DirectRunner, "
                             "BundleBasedDirectRunner, DataflowRunner)") from None
    if unknown and (runner is None or runner in LOCAL_RUNNERS):
        first = unknown[0]
        if not first.startswith("-"):
            raise UsageError(f"unexpected argument {first!r}: options are --NAME=VALUE, "
                             "e.g. --events=FILE")
        known_names = [option for action in parser._actions for option in action.option_strings]
        close = difflib.get_close_matches(first.split("=", 1)[0], known_names, n=1)
        raise UsageError(f"unknown option {first.split('=', 1)[0]}"
                         + (f": did you mean {close[0]}?" if close else " (see --help)"))
    options = GoodputOptions(list(argv))
    check_combination(options, argv)
    return options


def check_combination(options: GoodputOptions, argv: Sequence[str]) -> None:
    """Options that make no sense together, or that would be ignored; ``UsageError`` names them."""
    goodput = options.view_as(GoodputOptions)
    streaming = options.view_as(StandardOptions).streaming
    mode, other = ("the stream (--streaming)", _BATCH_ONLY) if streaming else ("a batch replay", _STREAM_ONLY)
    for name in other:
        if _given(argv, name):
            hint = ("add --streaming to read a subscription" if name == "subscription"
                    else "it applies to the stream (--streaming)" if not streaming
                    else "it applies to a batch replay (without --streaming)")
            raise UsageError(f"--{name} has no effect in {mode}: {hint}")
    for needed, names in _NEEDS.items():
        for name in names:
            if _given(argv, name) and not getattr(goodput, needed):
                raise UsageError(f"--{name} needs --{needed}")
    if _given(argv, "monitoring_endpoint") and not goodput.monitoring_project:
        raise UsageError("--monitoring_endpoint needs --monitoring_project")
    if streaming and not goodput.subscription:
        raise UsageError("--streaming needs --subscription=projects/P/subscriptions/S")
    if not streaming and not (goodput.events or goodput.from_duckdb):
        raise UsageError("--events=FILE or --from_duckdb=FILE is required (see --help)")
    if goodput.subscription and not _SUBSCRIPTION.fullmatch(goodput.subscription):
        topic = "/topics/" in goodput.subscription
        raise UsageError(f"--subscription={goodput.subscription} is "
                         + ("a topic; the pipeline reads a subscription of it: " if topic else "not ")
                         + "projects/P/subscriptions/S")
    if goodput.bigquery_dataset:
        try:
            parse_dataset(goodput.bigquery_dataset)
        except ValueError as error:
            raise UsageError(f"--bigquery_dataset: {error}") from None
    if goodput.bigquery_endpoint and not goodput.bigquery_endpoint.startswith(("http://", "https://")):
        raise UsageError(f"--bigquery_endpoint={goodput.bigquery_endpoint} is not a URL: "
                         "e.g. http://127.0.0.1:9050")
    if goodput.monitoring_endpoint and not re.fullmatch(r"[^\s/]+:\d{1,5}", goodput.monitoring_endpoint):
        raise UsageError(f"--monitoring_endpoint={goodput.monitoring_endpoint} is not HOST:PORT, "
                         "e.g. 127.0.0.1:8086")
    if not (goodput.duckdb or goodput.bigquery_dataset or goodput.monitoring_project):
        raise UsageError("no output: give --duckdb=FILE, --bigquery_dataset=PROJECT:DATASET or "
                         "--monitoring_project=PROJECT (or more than one)")


def check_files(options: GoodputOptions) -> None:
    """The files the options name, looked at (DuckDB files read-only) before anything is read
    or written: ``UsageError`` says what is wrong with the first one that will not do."""
    from pipeline.app.checks import check_duckdb_input, check_duckdb_output, check_events_file

    goodput = options.view_as(GoodputOptions)
    for path in goodput.events or ():
        check_events_file(path)
    for path in goodput.from_duckdb or ():
        if goodput.duckdb and os.path.realpath(path) == os.path.realpath(goodput.duckdb):
            raise UsageError(f"--from_duckdb={path} is also the output: write the backfill to another "
                             "--duckdb file")
        check_not_emitter_file(path)
        check_duckdb_input(path)
    if goodput.duckdb:
        check_duckdb_output(goodput.duckdb)


#: Where a DuckDB file says what it is: its bytes 8 to 12.
_DUCKDB_MAGIC = (8, b"DUCK")


def check_not_emitter_file(path: str) -> None:
    """A ``--from_duckdb`` file that is not a DuckDB file is refused in one line that names the
    option for what it is (DuckDB's own answer to a ``.json`` path is a "Catalog Error"); a path
    that cannot be read is left to ``check_duckdb_input`` to name."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except OSError:
        return
    at, magic = _DUCKDB_MAGIC
    if not head or head[at:at + len(magic)] == magic:
        return
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if head.startswith(b"\x1f\x8b") or text.startswith(b"{"):
        raise UsageError(f"--from_duckdb={path} is not a DuckDB file but looks like an emitter "
                         f"file (JSON lines): replay it with --events={path}")
    raise UsageError(f"--from_duckdb={path} is not a DuckDB file: name a DuckDB file this pipeline wrote "
                     "(emitter files are replayed with --events=FILE)")
