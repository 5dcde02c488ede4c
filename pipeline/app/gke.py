"""``goodput import gke-metrics``: GKE's JobSet signals, read from Cloud Monitoring, as rows of the
``jobset_metrics`` table beside the runs' own snapshots.

GKE publishes for each JobSet, on the ``k8s_entity`` monitored resource (GKE's system metrics
list, "kubernetes.io/jobset/"), every metric a GAUGE sampled every 60 s:

* ``scheduling_goodput`` (DOUBLE, unit 1, Preview since 2026-05): the fraction of time all the
  JobSet's pods were ready to run;
* ``proxy_runtime_goodput`` (DOUBLE, 1, Preview since 2026-05): the fraction of time all its
  accelerators were busy (duty cycle over 10 %), GKE's estimate of runtime goodput;
* ``times_between_interruptions`` (DISTRIBUTION, s): each sample one uptime between two
  interruptions (the first after provisioning included);
* ``times_to_recover`` (DISTRIBUTION, s): each sample one recovery from a downtime;
* ``uptime`` (DOUBLE, s): how long the JobSet has been available.

A point is visible up to an hour after it was sampled, and none says anything of steps: these
are the infrastructure's view of a JobSet, where a run's snapshots are the job's own. The last
three are written only for a JobSet with one accelerator replicated job. The goodputs are read
as the fraction of the sample period before each point, as GKE's dashboards read them
(``avg_over_time``).

Each point read becomes one row (``point_rows``): the resource's labels as columns, the value,
and for a distribution its mean and its number of samples. A point is held to the limits an
event's values are (``point_problem``): a goodput is a fraction in 0..1, any other value seconds
in 0..MAX_DURATION_S, its times in the years 2000 to 2200 and its labels names as an event's are.
A point that breaks them (a NaN, a goodput of 5, a negative uptime) is refused, said and kept as a
``dead_letter`` row with its reason, and the others are imported: one JobSet's bad point never
reaches a figure that it would make NaN or wrong, its own run's or the fleet's.

It is made to run on a schedule (the Terraform module runs it every ``gke_metrics_schedule``, in a
Cloud Run job), each run reading the last ``LOOKBACK_S`` again, since a point comes up to an hour
late. So that the table grows by what is new rather than by a lookback a run, each output (the
DuckDB file, the BigQuery dataset) is read first (``imported``): of each series, only the points
after the latest one the output holds in the range are appended, and a refused point only if its
dead letter is not there yet. Cloud Monitoring takes a series' points only in time order, so a
point older than one already read never shows up later. What is read first is one row per series
and the range's JobSet dead letters, however long the range. Where rows of a range were appended
twice all the same (by two imports at once, or by versions that appended every point read), the
``latest_jobset_metrics`` view holds each point once, by series and end time, as last imported, on
BigQuery and DuckDB alike::

    goodput import gke-metrics --project P --duckdb goodput.duckdb           # the last 2 hours
    goodput import gke-metrics --project P --cluster C --start 2026-11-01T00:00:00Z \\
        --end 2026-11-02T00:00:00Z --bigquery_dataset P:goodput
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from goodput_schemas.limits import MAX_COUNT, MAX_DURATION_S, MAX_TIME_US, MIN_TIME_US, text_problem
from pipeline.app.checks import MONITORING_INSTEAD, OneLineParser, UsageError, check_credentials
from pipeline.app.outputs import (
    MONITORING_ENDPOINT_HELP,
    add_output_options,
    check_monitoring_endpoint,
    check_outputs,
    first_line,
    time_argument,
    time_us,
    write_rows,
)
from pipeline.core.events import DeadLetter
from pipeline.core.rows import DEAD_LETTER, Row, dead_letter_row, timestamp

#: The table the points go to.
JOBSET_METRICS = "jobset_metrics"
#: GKE's JobSet metrics, by the short name the table's ``metric`` column holds.
METRICS = {name: f"kubernetes.io/jobset/{name}" for name in (
    "scheduling_goodput", "proxy_runtime_goodput", "times_between_interruptions", "times_to_recover",
    "uptime")}
#: GKE's goodputs, fractions of the sample period; the other metrics are seconds.
FRACTIONS = frozenset({"scheduling_goodput", "proxy_runtime_goodput"})
#: The monitored resource of every JobSet metric.
RESOURCE_TYPE = "k8s_entity"
#: The ``k8s_entity`` label holding the JobSet's namespace. Its other labels (``project_id``,
#: ``location``, ``cluster_name``, ``entity_name``, ``entity_uid``) appear in GKE's own documents and
#: queries; this one only in a schema Google publishes beside its GKE tools, not in the monitored
#: resources list: it is the one guess here, and ``--namespace`` filters on it.
NAMESPACE_LABEL = "entity_namespace"
#: Each column of a series and the ``k8s_entity`` label it is read from.
LABEL_COLUMNS = {"location": "location", "cluster": "cluster_name", "namespace": NAMESPACE_LABEL,
                 "jobset_name": "entity_name", "jobset_uid": "entity_uid"}
#: What an import reads by default: the last 2 hours, since GKE's points come up to an hour late.
LOOKBACK_S = 2 * 3600
#: Points asked for per page: a page of distributions stays far under gRPC's 4 MiB default answer.
PAGE_SIZE = 10_000
#: The latest point of each series an output holds in a range (``{start}`` and ``{end}``, the
#: range's bounds, are a query's parameters): one row per series, however long the range.
_LATEST_SQL = ("SELECT project, location, cluster, namespace, jobset_name, jobset_uid, metric, "
               "MAX(end_time) FROM jobset_metrics WHERE end_time > {start} AND end_time <= {end} "
               "GROUP BY project, location, cluster, namespace, jobset_name, jobset_uid, metric")
#: The dead letters of refused points that may be read again in a range: a point is refused when
#: it is read, after its end time, so after the range's start.
_LETTERS_SQL = ("SELECT source, payload FROM dead_letter WHERE received_time > {start} "
                "AND source LIKE 'monitoring:kubernetes.io/jobset/%'")
#: A Google Cloud project id (``example.com:`` before it for a domain-scoped project).
_PROJECT = re.compile(r"(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")


def series_filter(metric_type: str, cluster: str | None = None, namespace: str | None = None) -> str:
    """The Monitoring filter of one metric's series, of one cluster and namespace if given."""
    clauses = [f"metric.type = {_quoted(metric_type)}", f"resource.type = {_quoted(RESOURCE_TYPE)}"]
    if cluster is not None:
        clauses.append(f"resource.labels.cluster_name = {_quoted(cluster)}")
    if namespace is not None:
        clauses.append(f"resource.labels.{NAMESPACE_LABEL} = {_quoted(namespace)}")
    return " AND ".join(clauses)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclasses.dataclass(frozen=True)
class Refused:
    """A point that was not imported: its series (``series_key``), its end time in microseconds
    since the epoch, and its dead letter (the point as read, and why)."""

    series: tuple[Any, ...]
    end_us: int
    letter: DeadLetter


def point_rows(ts: Any, metric: str, project: str,
               imported_at: datetime.datetime) -> tuple[list[Row], list[Refused]]:
    """The rows of the points of one time series (a ``google.monitoring.v3.TimeSeries`` protobuf)
    of ``metric`` (a short name) read in ``project``, and the points refused (``point_problem``,
    or a label that is no name): a label GKE leaves empty (``entity_uid`` when it did not find
    the uid) is NULL."""
    labels = ts.resource.labels
    series_row = {column: labels.get(label) or None for column, label in LABEL_COLUMNS.items()}
    series_row.update(project=labels.get("project_id") or project, metric=metric, imported_at=imported_at)
    series = series_key(series_row)
    names = (text_problem(f"the {label} label", labels.get(label, "")) for label in (*LABEL_COLUMNS.values(),
                                                                                     "project_id"))
    label_problem = next(filter(None, names), None)
    rows: list[Row] = []
    refused: list[Refused] = []
    for point in ts.points:
        problem = label_problem or point_problem(point, metric)
        end_us = _us(point.interval.end_time)
        if problem is not None:
            # Keys sorted: the same point read again has the same payload (``Imported.new``).
            payload = json.dumps({"resource": dict(labels), "point": _text(point)}, sort_keys=True)
            refused.append(Refused(series, end_us, DeadLetter(payload, f"{METRICS[metric]}: {problem}",
                                                              f"monitoring:{METRICS[metric]}")))
            continue
        start_us = _us(point.interval.start_time) if point.interval.HasField("start_time") else end_us
        value, count = _value(point.value)
        rows.append({**series_row, "start_time": timestamp(start_us), "end_time": timestamp(end_us),
                     "value": value, "sample_count": count})
    return rows, refused


def point_problem(point: Any, metric: str) -> str | None:
    """Why a point (a ``google.monitoring.v3.Point`` protobuf) of ``metric`` (a short name) may
    not be imported, or None. It is held to the limits of the event contract, as an event's
    values are: its times in the years 2000 to 2200 and its start not after its end; a goodput a
    fraction in 0..1, any other value seconds in 0..MAX_DURATION_S (a NaN or an infinity in
    neither); a distribution of 0..MAX_COUNT samples."""
    end_us = _us(point.interval.end_time)
    start_us = _us(point.interval.start_time) if point.interval.HasField("start_time") else end_us
    for name, moment_us in (("end_time", end_us), ("start_time", start_us)):
        if not MIN_TIME_US <= moment_us < MAX_TIME_US:
            return f"{name} ({moment_us // 1_000_000} s after 1970) is outside 2000-01-01..2200-01-01 UTC"
    if start_us > end_us:
        return "start_time is after end_time"
    value, count = _value(point.value)
    if count is not None and not 0 <= count <= MAX_COUNT:
        return f"a distribution's count must be in 0..MAX_COUNT (2**53-1), got {count}"
    high, what = ((1.0, "a fraction in 0..1") if metric in FRACTIONS
                  else (MAX_DURATION_S, f"seconds in 0..MAX_DURATION_S ({MAX_DURATION_S:.0f})"))
    if value is not None and not 0 <= value <= high:  # a NaN fails it too
        return f"{metric} must be {what}, got {value!r}"
    return None


def _us(stamp: Any) -> int:
    return int(stamp.seconds * 1_000_000 + stamp.nanos // 1000)


def _text(point: Any) -> str:
    """A point as protobuf text, which writes any time and value (JSON's format takes neither a
    time outside the years 1 to 9999 nor a NaN)."""
    from google.protobuf import text_format

    return str(text_format.MessageToString(point, as_one_line=True))


def _value(value: Any) -> tuple[float | None, int | None]:
    """A point's value and, for a distribution, its number of samples (its value their mean)."""
    field = value.WhichOneof("value")
    if field == "distribution_value":
        distribution = value.distribution_value
        return (distribution.mean if distribution.count else None), distribution.count
    return (float(getattr(value, field)) if field in ("double_value", "int64_value") else None,
            None)


def series_key(row: Row) -> tuple[Any, ...]:
    """What names a row's series: the columns ``latest_jobset_metrics`` tells points apart by,
    but for ``end_time``."""
    return tuple(row[name] for name in ("project", "location", "cluster", "namespace", "jobset_name",
                                         "jobset_uid", "metric"))


def read_metric(client: Any, project: str, metric: str, start_us: int, end_us: int,
                cluster: str | None = None, namespace: str | None = None,
                imported_at: datetime.datetime | None = None) -> tuple[list[Row], list[Refused]]:
    """``point_rows`` of every point of one metric (a short name) in ``project`` with an end
    time in (``start_us``, ``end_us``], read with ``client`` (a ``MetricServiceClient``), every
    page. ``imported_at`` defaults to now. Raises the client's ``GoogleAPIError`` if a page fails."""
    from google.cloud import monitoring_v3

    imported_at = imported_at or datetime.datetime.now(datetime.timezone.utc)
    pages = client.list_time_series(request=monitoring_v3.ListTimeSeriesRequest(
        name=f"projects/{project}", filter=series_filter(METRICS[metric], cluster, namespace),
        interval=monitoring_v3.TimeInterval(start_time=timestamp(start_us), end_time=timestamp(end_us)),
        view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL, page_size=PAGE_SIZE))
    rows: list[Row] = []
    refused: list[Refused] = []
    for series in pages:
        made, refusals = point_rows(monitoring_v3.TimeSeries.pb(series), metric, project, imported_at)
        rows += made
        refused += refusals
    return rows, refused


@dataclasses.dataclass(frozen=True)
class Imported:
    """What one output (a DuckDB file, a BigQuery dataset) holds of a range already: the end time
    of each series' latest point (by ``series_key``), and the refused points' dead letters, as
    (source, payload)."""

    latest: dict[tuple[Any, ...], datetime.datetime]
    letters: frozenset[tuple[str, str]]

    def new(self, rows: list[Row], refused: list[Refused]) -> tuple[list[Row], list[Refused]]:
        """Of the rows and refused points read, those the output lacks: a row after the latest
        point of its series, a refused point whose dead letter is not there."""
        fresh = [row for row in rows
                 if series_key(row) not in self.latest or row["end_time"] > self.latest[series_key(row)]]
        unseen = [point for point in refused
                  if (point.letter.source, point.letter.payload) not in self.letters]
        return fresh, unseen


def imported(args: argparse.Namespace, start_us: int, end_us: int) -> Imported:
    """What the one output ``args`` names (``--duckdb`` or ``--bigquery_dataset``) holds of the
    range (``start_us``, ``end_us``]: nothing where the file, the dataset or a table does not
    exist yet. Reading BigQuery may raise ``google.api_core.exceptions.GoogleAPIError``."""
    if args.duckdb:
        latest, letters = _duckdb_imported(args.duckdb, start_us, end_us)
    else:
        latest, letters = _bigquery_imported(args.bigquery_dataset, args.bigquery_endpoint, start_us, end_us)
    return Imported({tuple(row[:-1]): _utc(row[-1]) for row in latest},
                    frozenset((source, payload) for source, payload in letters))


def _utc(moment: datetime.datetime) -> datetime.datetime:
    """A time from a table, naive (DuckDB's, in UTC) or aware (BigQuery's), as an aware one."""
    return moment.replace(tzinfo=datetime.timezone.utc) if moment.tzinfo is None else moment


def _duckdb_imported(path: str, start_us: int, end_us: int) -> tuple[list[Any], list[Any]]:
    import os

    import duckdb

    from pipeline.app.checks import read_only

    if not os.path.lexists(path):
        return [], []
    bounds = {"start": timestamp(start_us).replace(tzinfo=None),  # DuckDB's times are naive, in UTC
              "end": timestamp(end_us).replace(tzinfo=None)}
    with read_only(path) as connection:
        try:
            latest = connection.execute(_LATEST_SQL.format(start="$start", end="$end"), bounds).fetchall()
            letters = connection.execute(_LETTERS_SQL.format(start="$start"),
                                         {"start": bounds["start"]}).fetchall()
        except duckdb.CatalogException:  # a file of none of these tables yet
            return [], []
    return latest, letters


def _bigquery_imported(dataset: str, endpoint: str | None, start_us: int,
                       end_us: int) -> tuple[list[Any], list[Any]]:
    from google.api_core.exceptions import NotFound
    from google.cloud import bigquery

    from goodput_schemas import parse_dataset
    from pipeline.sinks.bigquery import make_client

    project, name = parse_dataset(dataset)
    client = make_client(project, endpoint)
    start, end = (bigquery.ScalarQueryParameter(bound, "TIMESTAMP", timestamp(us))
                  for bound, us in (("start", start_us), ("end", end_us)))

    def query(sql: str, *parameters: Any) -> list[Any]:
        config = bigquery.QueryJobConfig(default_dataset=f"{project}.{name}", query_parameters=parameters)
        return [tuple(row) for row in client.query_and_wait(sql, job_config=config)]

    try:
        return (query(_LATEST_SQL.format(start="@start", end="@end"), start, end),
                query(_LETTERS_SQL.format(start="@start"), start))
    except NotFound:  # no dataset or table yet: --bigquery_create_tables makes them
        return [], []


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The arguments of ``goodput import gke-metrics``, on ``parser`` if given."""
    parser = parser or OneLineParser(prog="goodput import gke-metrics")
    parser.description = (
        "Imports GKE's JobSet metrics (kubernetes.io/jobset/: scheduling_goodput,\n"
        "proxy_runtime_goodput, times_between_interruptions, times_to_recover, uptime) from Cloud\n"
        "Monitoring into the jobset_metrics table, one row per point.")
    parser.epilog = (
        "example:\n"
        "  goodput import gke-metrics --project my-project --duckdb goodput.duckdb\n"
        "  goodput query jobset_goodput --duckdb goodput.duckdb\n\n"
        "Made to run on a schedule (the Terraform module's gke_metrics_schedule): GKE writes a\n"
        "point up to an hour after it samples it, so each run reads the last 2 hours by default,\n"
        "and appends of each series only the points after the latest one the output holds, so a\n"
        "run appends what is new and nothing twice; the view latest_jobset_metrics holds each\n"
        "point once in any case. A point an event could not hold (a NaN, a goodput outside 0..1, a\n"
        "negative or huge number of seconds, a time outside the years 2000 to 2200) is refused,\n"
        "said on its metric's line and appended to the dead_letter table with its reason, once.\n"
        "Credentials are the application default ones: monitoring.timeSeries.list on --project;\n"
        "on BigQuery, a query job reading jobset_metrics and dead_letter, and inserts into them.\n"
        "Exit status: 0 once every point was read and what was new appended (none found is 0:\n"
        "no JobSet may have run), 1 if a service failed or BigQuery refused rows, 2 for a usage\n"
        "error.")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--project", required=True, metavar="PROJECT",
                        help="the Google Cloud project of the GKE clusters")
    parser.add_argument("--start", type=time_argument, metavar="ISO8601",
                        help=f"points after this time (default: {LOOKBACK_S // 3600} hours before --end)")
    parser.add_argument("--end", type=time_argument, metavar="ISO8601",
                        help="points up to this time (default: now)")
    parser.add_argument("--cluster", metavar="NAME", help="only this cluster's JobSets")
    parser.add_argument("--namespace", metavar="NAME", help="only JobSets of this Kubernetes namespace")
    parser.add_argument("--monitoring_endpoint", metavar="HOST:PORT", help=MONITORING_ENDPOINT_HELP)
    add_output_options(parser)
    return parser


def _check(args: argparse.Namespace) -> tuple[int, int]:
    """The import's range (start_us, end_us) once the arguments hold together; ``UsageError``
    otherwise. The DuckDB file is looked at read-only."""
    if not _PROJECT.fullmatch(args.project):
        raise UsageError(f"--project={args.project} is not a Google Cloud project id, e.g. my-project")
    check_monitoring_endpoint(args)
    check_outputs(args)
    end_us = args.end if args.end is not None else time_us(datetime.datetime.now(datetime.timezone.utc))
    start_us = args.start if args.start is not None else end_us - LOOKBACK_S * 1_000_000
    if start_us >= end_us:
        raise UsageError(f"--start ({timestamp(start_us).isoformat()}) must be before --end "
                         f"({timestamp(end_us).isoformat()})")
    if not args.monitoring_endpoint:
        check_credentials(f"reading GKE's metrics of --project={args.project}", MONITORING_INSTEAD)
    return start_us, end_us


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Runs an import for parsed arguments, a line per metric as it is read; see ``--help``."""
    from google.api_core import exceptions

    from pipeline.sinks.monitoring import make_client

    out = out or sys.stdout
    try:
        start_us, end_us = _check(args)
    except UsageError as error:
        print(f"goodput import gke-metrics: {error}", file=sys.stderr)
        return 2
    client = make_client(args.monitoring_endpoint)
    imported_at = datetime.datetime.now(datetime.timezone.utc)
    rows: list[Row] = []
    refused: list[Refused] = []
    for metric in METRICS:
        try:
            read, refusals = read_metric(client, args.project, metric, start_us, end_us, args.cluster,
                                         args.namespace, imported_at)
        except exceptions.GoogleAPIError as error:
            print(f"goodput import gke-metrics: reading {METRICS[metric]} of projects/{args.project} failed: "
                  f"{first_line(error)}", file=sys.stderr)
            return 1
        said = f"; {len(refusals)} refused, e.g. {refusals[0].letter.reason}" if refusals else ""
        series = len({series_key(row) for row in read})
        print(f"{metric}: {len(read)} points of {series} series{said}", file=out)
        rows += read
        refused += refusals
    where = f"{timestamp(start_us).isoformat()} to {timestamp(end_us).isoformat()}"
    if not rows and not refused:
        print(f"no point from {where}: GKE writes these metrics only for JobSets, up to an hour late; "
              "if JobSets ran, check --project, --cluster and --namespace", file=out)
        return 0
    code = 0
    for output in _outputs(args):
        try:
            fresh, unseen = imported(output, start_us, end_us).new(rows, refused)
        except UsageError as error:
            print(f"goodput import gke-metrics: {error}", file=sys.stderr)
            return 2
        except exceptions.GoogleAPIError as error:
            print(f"goodput import gke-metrics: reading what {output.bigquery_dataset} holds failed: "
                  f"{first_line(error)}; nothing was appended there", file=sys.stderr)
            code = 1
            continue
        code = max(code, _append(output, fresh, unseen, len(rows), where, imported_at, out))
    return code


def _outputs(args: argparse.Namespace) -> list[argparse.Namespace]:
    """The arguments once for each output given, naming that output alone: each is read and
    appended to on its own, so each gets what it lacks."""
    outputs = []
    if args.duckdb:
        outputs.append(argparse.Namespace(**{**vars(args), "bigquery_dataset": None}))
    if args.bigquery_dataset:
        outputs.append(argparse.Namespace(**{**vars(args), "duckdb": None}))
    return outputs


def _append(output: argparse.Namespace, fresh: list[Row], unseen: list[Refused], read: int, where: str,
            imported_at: datetime.datetime, out: TextIO) -> int:
    """Appends the new rows and dead letters to the one output ``output`` names, saying how many of
    the ``read`` points it held already; ``write_rows``' exit code."""
    command = "goodput import gke-metrics"
    target = output.duckdb or output.bigquery_dataset
    if read > len(fresh):
        print(f"{read - len(fresh)} points from {where} are in {target} already: left out", file=out)
    code = 0
    if fresh:
        code = write_rows(output, JOBSET_METRICS, fresh, f"{len(fresh)} points from {where}", command, out)
    if unseen:  # kept as the stream's dead letters are, each with its reason
        letters = [dead_letter_row(point.letter, imported_at) for point in unseen]
        code = max(code, write_rows(output, DEAD_LETTER, letters, f"{len(unseen)} refused points", command,
                                    out))
    return code


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``goodput import gke-metrics``: see ``--help``."""
    return run(build_parser().parse_args(argv), out)


if __name__ == "__main__":
    sys.exit(main())
