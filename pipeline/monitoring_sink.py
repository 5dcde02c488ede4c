"""Cloud Monitoring: the reference's metrics for every run, made from the output rows.

Compatibility first: the metric types (``compute.googleapis.com/workload/...``), the
``compute.googleapis.com/Workload`` resource with its labels (``location``, ``workload_id`` = the
run id, ``replica_id`` = "0"), the metric labels and the units are the reference's, so dashboards
and alerts built on it keep working. Its one collision is fixed: the reference writes
``performance`` from two workers, the ideal step time and, every 10 s, the step-time deviation;
here ``performance`` is only the ideal step time (the deviation has its own
``step_time_deviation``). What is new is under ``custom.googleapis.com/fleet_goodput/``, on the
``generic_task`` resource (``job`` = the run id): Cloud Monitoring takes user-defined metrics only
on a few resource types, and the Workload is not one of them.

The write rules are Cloud Monitoring's: at most 200 series per request, one point per series per
request, points of a series in order and no more often than every ``min_interval_s`` (the
pipeline gates each run's series; see ``pipeline.transforms.WriteToMonitoring``), transient
errors retried with backoff. Points are stamped when written, as the reference stamps them;
points older than 25 h are refused by the service, so a replay of old events writes only when
asked to, and then the latest values, stamped now.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from pipeline.engine import DATA_LOADING_ASYNC
from pipeline.rows import BADPUT, GOODPUT, Row

_LOG = logging.getLogger(__name__)
WORKLOAD = "compute.googleapis.com/Workload"
REFERENCE = "compute.googleapis.com/workload/"
CUSTOM = "custom.googleapis.com/fleet_goodput/"
MAX_SERIES_PER_REQUEST = 200
GENERIC_TASK = "generic_task"
NAMESPACE = "fleet_goodput"  # the generic_task namespace of the custom metrics
#: The resources' labels (``project_id`` is filled in by the service).
WORKLOAD_LABELS = frozenset({"project_id", "location", "workload_id", "replica_id"})
GENERIC_TASK_LABELS = frozenset({"project_id", "location", "namespace", "job", "task_id"})
#: Every metric written, with its labels; each metric with labels may also carry ``cluster_name``.
METRICS: dict[str, frozenset[str]] = {
    REFERENCE + name: frozenset(labels) for name, labels in {
        "goodput_time": {"goodput_source", "accelerator_type"},
        "badput_time": {"badput_source", "accelerator_type"},
        "total_elapsed_time": {"accelerator_type", "window_type"},
        "disruptions": {"accelerator_type", "window_type"},
        "max_productive_steps": {"accelerator_type"},
        "step_time_deviation": {"accelerator_type"},
        "performance": set(),
        "stepping_slice_efficiency": {"accelerator_type", "window_type", "rolling_window_size"},
        "available_slice_efficiency": {"accelerator_type", "window_type", "rolling_window_size"},
        "interval_goodput": {"goodput_source", "accelerator_type", "rolling_window_size"},
        "interval_badput": {"badput_source", "accelerator_type", "rolling_window_size"},
    }.items()
} | {CUSTOM + "goodput_pct": frozenset({"accelerator_type"})}
OPTIONAL_LABEL = "cluster_name"


def resource_of(metric: str) -> tuple[str, frozenset[str]]:
    """The monitored resource type a metric is written on, and that resource's labels."""
    return (GENERIC_TASK, GENERIC_TASK_LABELS) if metric.startswith(CUSTOM) else (WORKLOAD, WORKLOAD_LABELS)
UNKNOWN_ACCELERATOR = "UNKNOWN"  # the reference's value when the accelerator type is not known


@dataclasses.dataclass(frozen=True)
class MonitoringSettings:
    """How points are made and paced (see ``pipeline.options`` for each)."""

    min_interval_s: float = 10.0
    max_lag_s: float = 600.0
    latest_now: bool = False
    location: str = "global"
    cluster_name: str | None = None
    settle_s: float = 1.0


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of one series: the metric, its labels, the run's resource, the value."""

    metric: str
    labels: tuple[tuple[str, str], ...]
    run_id: str
    location: str
    value: float | int
    end_us: int = 0

    @property
    def series(self) -> tuple[str, tuple[tuple[str, str], ...], str, str]:
        return self.metric, self.labels, self.run_id, self.location

    def describe(self) -> str:
        labels = ",".join(f"{k}={v}" for k, v in self.labels)
        return f"{self.metric}{{{labels}}} of run {self.run_id}"


def snapshot_points(rows: Sequence[tuple[str, Row]], default_location: str = "global",
                    cluster_name: str | None = None) -> list[Point]:
    """The points of the latest snapshot among ``rows`` (one run's): the reference's metrics with
    its labels, and ours under ``custom.googleapis.com/``."""
    goodput = [row for table, row in rows if table == GOODPUT]
    if not goodput:
        return []
    latest = max(row["snapshot_time"] for row in goodput)
    windows = {row["window_s"]: row for row in goodput if row["snapshot_time"] == latest}
    badput = [row for table, row in rows if table == BADPUT and row["snapshot_time"] == latest
              and row["badput_source"] != DATA_LOADING_ASYNC]
    first = next(iter(windows.values()))
    run_id, location = first["run_id"], first.get("location") or default_location
    accelerator = ("accelerator_type", first.get("accelerator_type") or UNKNOWN_ACCELERATOR)
    extra = (("cluster_name", cluster_name),) if cluster_name else ()
    points: list[Point] = []

    def add(metric: str, value: float | int | None, *labels: tuple[str, str]) -> None:
        if value is not None:
            metric_labels = tuple(sorted((*labels, *extra))) if labels else ()
            points.append(Point(metric, metric_labels, run_id, location, value))

    cumulative = windows.get(0)
    if cumulative is not None:
        add(REFERENCE + "goodput_time", float(cumulative["productive_time_s"]), ("goodput_source", "TOTAL"),
            accelerator)
        add(REFERENCE + "total_elapsed_time", float(cumulative["total_time_s"]), accelerator,
            ("window_type", "cumulative"))
        add(REFERENCE + "disruptions", int(cumulative["disruptions"]), accelerator,
            ("window_type", "cumulative"))
        add(REFERENCE + "max_productive_steps", int(cumulative["max_productive_step"]), accelerator)
        add(REFERENCE + "step_time_deviation", cumulative.get("step_time_deviation_s"), accelerator)
        add(REFERENCE + "performance", float(cumulative.get("ideal_step_time_s") or 0.0))
        for name in ("stepping_slice_efficiency", "available_slice_efficiency"):
            add(REFERENCE + name, cumulative.get(name), accelerator, ("window_type", "CUMULATIVE"),
                ("rolling_window_size", "0"))
        add(CUSTOM + "goodput_pct", cumulative.get("goodput_pct"), accelerator)
    for row in badput:
        source = ("badput_source", row["badput_source"])
        if row["window_s"] == 0:
            add(REFERENCE + "badput_time", float(row["seconds"]), source, accelerator)
        else:
            add(REFERENCE + "interval_badput", row["pct"], source, accelerator,
                ("rolling_window_size", str(row["window_s"])))
    for window_s, row in sorted(windows.items()):
        if window_s > 0:
            add(REFERENCE + "interval_goodput", row.get("goodput_pct"), ("goodput_source", "TOTAL"),
                accelerator, ("rolling_window_size", str(window_s)))
    return points


def requests(points: Iterable[Point]) -> list[list[Point]]:
    """Points in requests of at most 200, sent in order: a series at most once per request and
    its points in time order across requests. Series with the most points are placed first, so
    the others fill the room beside them."""
    by_series: dict[tuple[Any, ...], list[Point]] = {}
    for point in points:
        by_series.setdefault(point.series, []).append(point)
    batches: list[list[Point]] = []
    for series_points in sorted(by_series.values(), key=len, reverse=True):
        index = -1
        for point in sorted(series_points, key=lambda p: p.end_us):
            index = next((i for i in range(index + 1, len(batches))
                          if len(batches[i]) < MAX_SERIES_PER_REQUEST), len(batches))
            if index == len(batches):
                batches.append([])
            batches[index].append(point)
    return batches


def make_client(endpoint: str | None = None) -> Any:
    """A MetricServiceClient; with ``endpoint`` (HOST:PORT of a local stand-in), an insecure
    channel, the only way the client reaches a server without TLS."""
    from google.cloud import monitoring_v3

    if endpoint is None:
        return monitoring_v3.MetricServiceClient()
    import grpc
    from google.cloud.monitoring_v3.services.metric_service.transports import MetricServiceGrpcTransport

    return monitoring_v3.MetricServiceClient(
        transport=MetricServiceGrpcTransport(channel=grpc.insecure_channel(endpoint)))


class MetricWriter:
    """Writes points with ``CreateTimeSeries``, within the service's rules.

    Transient errors are retried with exponential backoff for up to ``retry_deadline_s``. A
    series the service refuses is logged with its name and counted; Monitoring is telemetry, so
    the next snapshot's point supersedes it rather than the pipeline stopping (BigQuery is the
    record).
    """

    def __init__(self, client: Any, project: str, retry_deadline_s: float = 60.0) -> None:
        from google.api_core import exceptions, retry

        self.client, self.project = client, project
        self.retry = retry.Retry(
            predicate=retry.if_exception_type(exceptions.ServiceUnavailable, exceptions.DeadlineExceeded,
                                              exceptions.InternalServerError,
                                              exceptions.ResourceExhausted),
            initial=0.5, maximum=10.0, multiplier=2.0, timeout=retry_deadline_s)

    def write(self, points: Iterable[Point]) -> int:
        """Writes every point; returns how many the service refused (logged)."""
        from google.api_core import exceptions

        failed = 0
        for batch in requests(points):
            try:
                self.client.create_time_series(name=f"projects/{self.project}",
                                               time_series=[self._series(p) for p in batch], retry=self.retry)
            except exceptions.InvalidArgument as error:  # the valid series of the request are kept
                refused = _refused_indexes(str(error.message), len(batch))
                for index in refused:
                    _LOG.warning("Cloud Monitoring refused %s: %s", batch[index].describe(), error.message)
                failed += len(refused)
            except exceptions.GoogleAPICallError as error:
                _LOG.warning("Cloud Monitoring write of %d series failed: %s; first: %s", len(batch),
                             error, batch[0].describe())
                failed += len(batch)
        return failed

    def _series(self, point: Point) -> Any:
        from google.cloud import monitoring_v3

        series = monitoring_v3.TimeSeries()
        series.metric.type = point.metric
        series.metric.labels.update(dict(point.labels))
        series.resource.type = resource_of(point.metric)[0]
        if series.resource.type == WORKLOAD:
            series.resource.labels.update({"location": point.location, "workload_id": point.run_id,
                                           "replica_id": "0"})
        else:
            series.resource.labels.update({"location": point.location, "namespace": NAMESPACE,
                                           "job": point.run_id, "task_id": "0"})
        end = datetime.datetime.fromtimestamp(point.end_us / 1e6, datetime.timezone.utc)
        value = (monitoring_v3.TypedValue(int64_value=point.value) if isinstance(point.value, int)
                 else monitoring_v3.TypedValue(double_value=point.value))
        series.points = [monitoring_v3.Point(interval=monitoring_v3.TimeInterval(end_time=end), value=value)]
        return series


def _refused_indexes(message: str, size: int) -> list[int]:
    """The series a partial failure names (``timeSeries[3]``, ``timeSeries[0-199]``,
    ``timeSeries[2,5-7]``); all of them if it names none."""
    named: set[int] = set()
    for listed in re.findall(r"timeSeries\[([\d,\s-]+)\]", message):
        for item in filter(None, (part.strip() for part in listed.split(","))):
            first, _, last = item.partition("-")
            if first.isdigit() and (not last or last.isdigit()):
                named.update(range(int(first), min(int(last or first), size - 1) + 1))
    return sorted(named) or list(range(size))
