"""Cloud Monitoring: the reference's metrics for every run, made from its snapshots.

Compatibility first: the metric types (``compute.googleapis.com/workload/...``), the
``compute.googleapis.com/Workload`` resource with its labels (``location``, ``workload_id`` = the
run id, ``replica_id`` = "0"), the metric labels and the units are the reference's, so dashboards
and alerts built on it keep working. Its one collision is fixed: the reference writes
``performance`` from two workers, the ideal step time and, every 10 s, the step-time deviation;
here ``performance`` is only the ideal step time (the deviation has its own
``step_time_deviation``). What is new is under ``custom.googleapis.com/fleet_goodput/``, on the
``generic_task`` resource (``job`` = the run id): Cloud Monitoring takes user-defined metrics only
on a few resource types, and the Workload is not one of them. They are ``goodput_pct``, the
cumulative goodput in percent, and ``open_anomalies``, an INT64 gauge per ``kind`` of anomaly
(``pipeline.core.detect.ANOMALY_KINDS``): how many anomalies of that kind are open in the run as of
the snapshot. It is written for every kind at every snapshot, 0 when none is open, so that a
series falls back to 0 when an anomaly ends and an alert on it closes. Beside them, and not
from the stream (its snapshots know only runtime goodput), ``goodput productivity``
(``pipeline.app.productivity``) writes ML Productivity Goodput from the tables:
``ml_productivity_goodput_pct`` per run and ``fleet_ml_productivity_goodput_pct`` per accelerator
type (``job`` = ``fleet``). Their descriptors are made by the service from their first points, as
for any user-defined metric written without one.

The write rules are Cloud Monitoring's: at most 200 series per request, one point per series per
request, points of a series in order and no more often than every ``min_interval_s`` (the
pipeline gates each run's series; see ``pipeline.beam.transforms.WriteToMonitoring``), transient
errors retried with backoff. A point the service refuses is a dead letter; one whose request
still fails is a dead letter too on the local runner, and fails the work item on Dataflow, whose
retry writes it (see ``MetricWriter``). Points are stamped when written, as the reference stamps
them; points older than 25 h are refused by the service, so a replay of old events writes only
when asked to, and then the latest values, stamped now.

What a job sends reaches Cloud Monitoring only as label values, never as label keys: each metric
has the fixed labels of ``METRICS`` (and ``cluster_name``), and a point with any other key is not
sent. Values (the run id, the location, the accelerator type, custom badput names) are made
printable and cut to the service's 1024 bytes (``pipeline.core.sanitize``), and a run's custom badput
types beyond ``MAX_CUSTOM_BADPUT_SERIES`` are summed into one series, so that a job cannot make
an unbounded number of series.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from pipeline.core.detect import ANOMALY_KINDS
from pipeline.core.events import DeadLetter
from pipeline.core.sanitize import label_value
from pipeline.core.snapshot import CUSTOM_PREFIX, DATA_LOADING_ASYNC, Snapshot
from pipeline.sinks.retries import WriteFailed, backoff, call_with_retries, never

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
#: The metrics ``goodput productivity`` writes from the tables (the stream does not), with their labels.
PRODUCTIVITY_METRICS: dict[str, frozenset[str]] = {
    CUSTOM + "ml_productivity_goodput_pct": frozenset({"accelerator_type", "known_factors"}),
    CUSTOM + "fleet_ml_productivity_goodput_pct": frozenset({"accelerator_type"})}
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
} | {CUSTOM + "goodput_pct": frozenset({"accelerator_type"}),
     CUSTOM + "open_anomalies": frozenset({"kind", "accelerator_type"})} | PRODUCTIVITY_METRICS
OPTIONAL_LABEL = "cluster_name"


def resource_of(metric: str) -> tuple[str, frozenset[str]]:
    """The monitored resource type a metric is written on, and that resource's labels."""
    return (GENERIC_TASK, GENERIC_TASK_LABELS) if metric.startswith(CUSTOM) else (WORKLOAD, WORKLOAD_LABELS)
UNKNOWN_ACCELERATOR = "UNKNOWN"  # the reference's value when the accelerator type is not known
#: A run's custom badput types written as series of their own (the largest); the rest are summed
#: into ``OTHER_CUSTOM_BADPUT``, so a job naming thousands of types makes a bounded number of series.
MAX_CUSTOM_BADPUT_SERIES = 20
OTHER_CUSTOM_BADPUT = CUSTOM_PREFIX + "OTHER"


@dataclasses.dataclass(frozen=True)
class MonitoringSettings:
    """How points are made and paced (see ``pipeline.beam.options`` for each)."""

    min_interval_s: float = 10.0
    max_lag_s: float = 600.0
    latest_now: bool = False
    location: str = "global"
    cluster_name: str | None = None
    #: Retries of a failed write (see ``MetricWriter``).
    retry_deadline_s: float = 60.0
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 10.0


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


def snapshot_points(snapshot: Snapshot, default_location: str = "global",
                    cluster_name: str | None = None) -> list[Point]:
    """The points of a run's snapshot: the reference's metrics with its labels, and ours under
    ``custom.googleapis.com/``."""
    metadata = snapshot.metadata
    run_id = label_value(snapshot.run_id)
    location = label_value(metadata.get("location") or default_location)
    accelerator = ("accelerator_type", label_value(metadata.get("accelerator_type") or UNKNOWN_ACCELERATOR))
    extra = (("cluster_name", label_value(cluster_name)),) if cluster_name else ()
    points: list[Point] = []

    def add(metric: str, value: float | int | None, *labels: tuple[str, str]) -> None:
        if value is not None:
            metric_labels = tuple(sorted((*labels, *extra))) if labels else ()
            points.append(Point(metric, metric_labels, run_id, location, value))

    cumulative = snapshot.cumulative
    cumulative_window = ("window_type", "cumulative")
    add(REFERENCE + "goodput_time", float(cumulative.productive_s), ("goodput_source", "TOTAL"), accelerator)
    add(REFERENCE + "total_elapsed_time", float(cumulative.total_s), accelerator, cumulative_window)
    add(REFERENCE + "disruptions", int(cumulative.disruptions), accelerator, cumulative_window)
    add(REFERENCE + "max_productive_steps", int(snapshot.max_productive_step), accelerator)
    add(REFERENCE + "step_time_deviation", snapshot.step_time_deviation_s, accelerator)
    add(REFERENCE + "performance", float(snapshot.ideal_step_time_s or 0.0))
    for name, value in (("stepping_slice_efficiency", snapshot.stepping_slice_efficiency),
                        ("available_slice_efficiency", snapshot.available_slice_efficiency)):
        add(REFERENCE + name, value, accelerator, ("window_type", "CUMULATIVE"), ("rolling_window_size", "0"))
    add(CUSTOM + "goodput_pct", cumulative.goodput_pct, accelerator)
    for kind in ANOMALY_KINDS:
        add(CUSTOM + "open_anomalies", int(snapshot.open_anomalies.get(kind, 0)), ("kind", kind), accelerator)
    windows = [(0, cumulative), *zip(snapshot.window_sizes_s, snapshot.windows, strict=True)]
    badput = [_Badput(window_s, source, seconds, figures.badput_pct(source))
              for window_s, figures in windows if figures is not None
              for source, seconds in sorted(figures.badput_s.items()) if source != DATA_LOADING_ASYNC]
    for item in _bounded_custom_badput(badput):
        source = ("badput_source", label_value(item.source))
        if item.window_s == 0:
            add(REFERENCE + "badput_time", float(item.seconds), source, accelerator)
        else:
            add(REFERENCE + "interval_badput", item.pct, source, accelerator,
                ("rolling_window_size", str(item.window_s)))
    for window_s, figures in sorted(windows, key=lambda w: w[0]):
        if window_s > 0 and figures is not None:
            add(REFERENCE + "interval_goodput", figures.goodput_pct, ("goodput_source", "TOTAL"),
                accelerator, ("rolling_window_size", str(window_s)))
    return points


@dataclasses.dataclass(frozen=True)
class _Badput:
    """A badput bucket of one window of a snapshot."""

    window_s: int  # 0 for cumulative
    source: str
    seconds: float
    pct: float | None


def _bounded_custom_badput(badput: list[_Badput]) -> list[_Badput]:
    """The badput with at most ``MAX_CUSTOM_BADPUT_SERIES`` custom types: those with the most
    cumulative seconds (then by name); the others summed into ``OTHER_CUSTOM_BADPUT`` per window."""
    custom = {item.source for item in badput if item.source.startswith(CUSTOM_PREFIX)}
    if len(custom) <= MAX_CUSTOM_BADPUT_SERIES:
        return badput
    seconds = {item.source: item.seconds for item in badput if item.window_s == 0}
    candidates = custom - {OTHER_CUSTOM_BADPUT}  # a type named OTHER joins the sum
    kept = set(sorted(candidates, key=lambda name: (-(seconds.get(name) or 0.0), name))[
        :MAX_CUSTOM_BADPUT_SERIES])
    bounded: list[_Badput] = []
    other: dict[int, _Badput] = {}
    for item in badput:
        if item.source not in custom or item.source in kept:
            bounded.append(item)
            continue
        total = other.get(item.window_s) or _Badput(item.window_s, OTHER_CUSTOM_BADPUT, 0.0, None)
        other[item.window_s] = dataclasses.replace(
            total, seconds=total.seconds + (item.seconds or 0.0),
            pct=total.pct if item.pct is None else (total.pct or 0.0) + item.pct)
    return bounded + [other[window_s] for window_s in sorted(other)]


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


#: Called with each point that could not be written and why.
OnFailure = Callable[[Point, str], None]


def _retryable(error: Exception) -> bool:
    """UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, RESOURCE_EXHAUSTED (a quota)."""
    from google.api_core import exceptions

    return isinstance(error, (exceptions.ServiceUnavailable, exceptions.DeadlineExceeded,
                              exceptions.InternalServerError, exceptions.ResourceExhausted))


class MetricWriter:
    """Writes points with ``CreateTimeSeries``, within the service's rules.

    Transient errors (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, RESOURCE_EXHAUSTED: a quota) are
    retried with exponential backoff and full jitter, from ``initial_backoff_s`` up to
    ``max_backoff_s`` between tries, for at most ``retry_deadline_s`` per ``write`` in all: a long
    outage costs a bundle that much time once, not once per request; and not at all once
    ``give_up()`` is true (a job that is stopping). A request waits up to ``request_timeout_s`` for
    its answer; once the job is stopping, no later than the stop's bound
    (``pipeline.sinks.retries.stop_requests_by``), and none is made past it. A point the service
    refuses (logged with its series), or one that cannot be sent (a label this pipeline does not
    write, a value beyond int64), is counted and handed to ``on_failure``, which the pipeline turns
    into a dead-letter row. A point whose request failed for good (an outage past the deadline, a
    permission, an answer the client cannot read) is, by default (the local runner, where a
    failed bundle stops the pipeline), handed on the same way, and the write never raises for it:
    Monitoring is telemetry, and the run's next snapshot writes the series again (BigQuery is the
    record).

    With ``raise_failures`` (a runner that retries a failed work item: Dataflow) such a failure
    raises ``WriteFailed`` at once instead, and the runner's retry writes the points. That retry
    sends again the points of the requests this try wrote, stamped with the same end time (or
    stamped anew, moments later, when the gate that stamps them runs again in the retried work
    item), and the service refuses them: "Points must be written in order" (a series' point at or
    before its latest) or "more frequently than the maximum sampling period". Neither is a failure
    or a dead letter in this mode: each run's series has one writer, which stamps its points in
    order and ``min_interval_s`` apart (``WriteToMonitoring``), so a refusal of either kind means
    the series already holds this try's point or a later one, and another try could not write it
    anyway. They are logged and counted apart (``already_written``). Telling a point written by an
    earlier try from one that never was would cost a ListTimeSeries per series; on the local
    runner, which retries nothing, they remain dead letters.
    """

    def __init__(self, client: Any, project: str, retry_deadline_s: float = 60.0,
                 initial_backoff_s: float = 0.5, max_backoff_s: float = 10.0,
                 request_timeout_s: float = 30.0, give_up: Callable[[], bool] = never,
                 raise_failures: bool = False) -> None:
        self.client, self.project = client, project
        self.retry_deadline_s, self.request_timeout_s = retry_deadline_s, request_timeout_s
        self.initial_backoff_s, self.max_backoff_s = initial_backoff_s, max_backoff_s
        self.give_up = give_up
        self.raise_failures = raise_failures
        #: Points refused because their series already held this one or a later one (with
        #: ``raise_failures`` only; see the class docstring), over this writer's life.
        self.already_written = 0

    def write(self, points: Iterable[Point], on_failure: OnFailure | None = None) -> int:
        """Writes every point; returns how many were not written (each logged and handed to
        ``on_failure``). With ``raise_failures``, raises ``WriteFailed`` for a request that failed
        for good."""
        from google.api_core import exceptions
        from google.cloud import monitoring_v3

        deadline = time.monotonic() + self.retry_deadline_s
        failed = 0

        def fail(point: Point, reason: str) -> None:
            nonlocal failed
            failed += 1
            if on_failure is not None:
                on_failure(point, reason)

        allowed: list[Point] = []
        for point in points:
            problem = _label_problem(point)
            if problem is None:
                allowed.append(point)
            else:
                _LOG.warning("Not writing %s: %s", point.describe(), problem)
                fail(point, problem)
        for batch in requests(allowed):
            series, sent = [], []
            for point in batch:
                try:
                    series.append(self._series(point))
                    sent.append(point)
                except (ValueError, TypeError, OverflowError) as error:  # e.g. an int beyond int64
                    _LOG.warning("Not writing %s: %s", point.describe(), error)
                    fail(point, f"not a valid point: {error}")
            if not series:
                continue
            try:
                made = monitoring_v3.CreateTimeSeriesRequest.pb()(name=f"projects/{self.project}",
                                                                  time_series=series)
                request = monitoring_v3.CreateTimeSeriesRequest.wrap(made)
                call_with_retries(
                    functools.partial(self.client.create_time_series, request=request, retry=None),
                    _retryable, deadline, backoff(self.initial_backoff_s, self.max_backoff_s),
                    self.give_up, self.request_timeout_s)
            except exceptions.InvalidArgument as error:  # the valid series of the request are kept
                message = str(error.message)
                written = _already_written_indexes(message, len(sent)) if self.raise_failures else set()
                if written:
                    self.already_written += len(written)
                    _LOG.info("Cloud Monitoring already holds %d points of this write or later ones "
                              "(a retried work item); first: %s", len(written), sent[min(written)].describe())
                for index in _refused_indexes(message, len(sent)):
                    if index not in written:
                        _LOG.warning("Cloud Monitoring refused %s: %s", sent[index].describe(), message)
                        fail(sent[index], f"Cloud Monitoring refused the point: {message}")
            except Exception as error:  # RetryError (the deadline passed), and an answer the
                # client cannot read (an error whose details contradict its code)
                _LOG.warning("Cloud Monitoring write of %d series failed: %s; first: %s", len(sent),
                             error, sent[0].describe())
                if self.raise_failures:
                    raise WriteFailed(f"Cloud Monitoring write of {len(sent)} series failed: "
                                      f"{error}") from error
                for point in sent:
                    fail(point, f"Cloud Monitoring write failed: {error}")
        return failed

    def _series(self, point: Point) -> Any:
        """The point as a ``TimeSeries`` protocol buffer, made directly (a proto-plus message
        costs several times more to make, for each of a snapshot's dozens of points)."""
        from google.cloud import monitoring_v3

        labels = {key: label_value(value) for key, value in point.labels}
        resource_type = resource_of(point.metric)[0]
        run_id, location = label_value(point.run_id), label_value(point.location)
        if resource_type == WORKLOAD:
            resource = {"location": location, "workload_id": run_id, "replica_id": "0"}
        else:
            resource = {"location": location, "namespace": NAMESPACE, "job": run_id, "task_id": "0"}
        seconds, micros = divmod(point.end_us, 1_000_000)
        value = ({"int64_value": point.value} if isinstance(point.value, int)
                 else {"double_value": point.value})
        return monitoring_v3.TimeSeries.pb()(
            metric={"type": point.metric, "labels": labels},
            resource={"type": resource_type, "labels": resource},
            points=[{"interval": {"end_time": {"seconds": seconds, "nanos": micros * 1_000}},
                     "value": value}])


def _label_problem(point: Point) -> str | None:
    """Why the point may not be written as it is: a metric this pipeline does not write, or a
    label key that is not one of its metric's (user data never becomes a label key)."""
    labels = METRICS.get(point.metric)
    if labels is None:
        return f"{point.metric} is not a metric this pipeline writes"
    unknown = sorted({key for key, _ in point.labels} - labels - {OPTIONAL_LABEL})
    if unknown:
        return f"label keys {unknown} are not labels of {point.metric}"
    return None


def point_dead_letter(point: Point, reason: str) -> DeadLetter:
    """The dead letter of a point that was not written: the point as JSON and the reason."""
    end = datetime.datetime.fromtimestamp(point.end_us / 1e6, datetime.timezone.utc)
    payload = {"metric": point.metric, "labels": dict(point.labels), "run_id": point.run_id,
               "location": point.location, "value": point.value, "end_time": end.isoformat()}
    return DeadLetter(json.dumps(payload, sort_keys=True, default=str), reason, f"monitoring:{point.metric}",
                      point.run_id)


#: What Cloud Monitoring says of a point when its series already holds one at or after its end time,
#: or less than the metric's sampling period before it.
_SERIES_AHEAD = ("must be written in order", "more frequently than the maximum sampling period")


def _already_written_indexes(message: str, size: int) -> set[int]:
    """The series a partial failure refuses because each already holds this point or a later
    one (``_SERIES_AHEAD``). The message names the refused series by reason, in parts joined by
    "; " (the service: ``REASON: RESOURCE timeSeries[3]: METRIC``; the stand-in:
    ``timeSeries[3]: REASON``); a message that names none is about every series."""
    named = "timeSeries[" in message
    found: set[int] = set()
    for part in message.split("; ") if named else [message]:
        if (not named or "timeSeries[" in part) and any(text in part for text in _SERIES_AHEAD):
            found.update(_refused_indexes(part, size))
    return found


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
