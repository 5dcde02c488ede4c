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

Reading a range again appends its points again: the ``latest_jobset_metrics`` view holds each
point once, by series and end time, as last imported, on BigQuery and DuckDB alike (BigQuery's
insert ids only drop a retried insert within minutes, never a re-import hours later)::

    goodput import gke-metrics --project P --duckdb goodput.duckdb           # the last 2 hours
    goodput import gke-metrics --project P --cluster C --start 2026-11-01T00:00:00Z \\
        --end 2026-11-02T00:00:00Z --bigquery_dataset P:goodput

The same reading runs in the stream with ``--gke_metrics_project`` (``pipeline.beam.gke``).
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
from pipeline.app.checks import OneLineParser, UsageError
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
            payload = json.dumps({"resource": dict(labels), "point": _text(point)})
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


def read_all(client: Any, project: str, start_us: int, end_us: int, cluster: str | None = None,
             namespace: str | None = None,
             imported_at: datetime.datetime | None = None) -> tuple[list[Row], list[Refused]]:
    """``read_metric`` of every metric of ``METRICS``, with one ``imported_at``."""
    imported_at = imported_at or datetime.datetime.now(datetime.timezone.utc)
    rows: list[Row] = []
    refused: list[Refused] = []
    for metric in METRICS:
        made, refusals = read_metric(client, project, metric, start_us, end_us, cluster, namespace,
                                     imported_at)
        rows += made
        refused += refusals
    return rows, refused


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
        "GKE writes a point up to an hour after it samples it: the default range, the last 2\n"
        "hours, takes that in. Importing a range again appends its points again; the view\n"
        "latest_jobset_metrics holds each point once. A point an event could not hold (a NaN, a\n"
        "goodput outside 0..1, a negative or huge number of seconds, a time outside the years\n"
        "2000 to 2200) is refused, said on its metric's line and appended to the dead_letter\n"
        "table with its reason. Credentials are the application default ones\n"
        "(monitoring.timeSeries.list on the project). Exit status: 0 if any point was imported,\n"
        "1 if none was or a service failed, 2 for a usage error.")
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
              "check --project, --cluster and --namespace", file=out)
        return 1
    command = "goodput import gke-metrics"
    if rows:
        code = write_rows(args, JOBSET_METRICS, rows, f"{len(rows)} points from {where}", command, out)
    else:
        print(f"no point from {where} was imported: each was refused", file=out)
        code = 1
    if refused:  # kept where the stream keeps them, each with its reason
        letters = [dead_letter_row(point.letter, imported_at) for point in refused]
        code = max(code, write_rows(args, DEAD_LETTER, letters, f"{len(refused)} refused points", command,
                                    out))
    return code


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``goodput import gke-metrics``: see ``--help``."""
    return run(build_parser().parse_args(argv), out)


if __name__ == "__main__":
    sys.exit(main())
