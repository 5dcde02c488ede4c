"""A local stand-in for Cloud Monitoring: the ``google.monitoring.v3.MetricService`` gRPC API.

Cloud Monitoring has no emulator of its own, and its write rules are what a metrics sink gets
wrong: too many series in a request, points out of order or too frequent, a value type that
changes, a resource with the wrong labels or one that does not take the metric. This stand-in
keeps time series and metric descriptors in memory, speaks the real protocol and refuses what the
service refuses, so a sink is tested with the unmodified client::

    python -m pipeline.emulators.monitoring --port 8086

    client = monitoring_v3.MetricServiceClient(
        transport=MetricServiceGrpcTransport(channel=grpc.insecure_channel("127.0.0.1:8086")))

or in-process: ``with MonitoringEmulator() as emulator: ...`` with ``emulator.host`` as the
channel's address and ``emulator.store`` for assertions (``store.points(metric_type)``) and
fault injection: ``store.garble_next(n)`` (an answer the client cannot read),
``store.fail_next(n, code)`` (the next n calls fail, an outage or a quota; ``fail_reads_next``
for ListTimeSeries) and ``store.refuse_next(n, reason)`` (the next n series are refused, a
partial failure).

Served: CreateTimeSeries with the documented rules (see ``MetricStore``), including the
partial failure of the real service: the valid series of a request are written, and the error
names the others (``timeSeries[3]: ...``) and carries a ``CreateTimeSeriesSummary``.
ListTimeSeries returns the raw points of one metric type, newest first, as the service does
without aggregation: its filter is the subset of Monitoring's filter language described at
``parse_filter``, its interval ``(start, end]`` (a missing start is the end: the points at that
instant), its views FULL and HEADERS, its paging the service's (``page_size`` points, or series
with HEADERS, at most ``MAX_PAGE_SIZE``; a series can go on over two pages). An aggregation
other than ALIGN_NONE, an ``order_by`` or a filter beyond that subset is refused with
INVALID_ARGUMENT, not answered wrongly. Metric descriptors: create, get, list (by
``metric.type``), delete. Anything else answers UNIMPLEMENTED. A request over 10 MiB is refused
as Google's front end refuses it (INVALID_ARGUMENT), not with gRPC's own RESOURCE_EXHAUSTED at
4 MiB.

Google's own metrics (GKE's ``kubernetes.io/...``) are written by Google, never through
CreateTimeSeries, which refuses them as the service does: ``store.preload(name, series)`` puts
such series in the store for reads, with no write rule (any age, any order).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from typing import Any

import grpc
from google.api import metric_pb2  # type: ignore[import-untyped]
from google.cloud.monitoring_v3 import types
from google.protobuf import any_pb2, empty_pb2, timestamp_pb2
from google.rpc import status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status  # type: ignore[import-untyped]

from pipeline.emulators import (
    FRONT_END_MAX_REQUEST_BYTES,
    GRPC_SERVER_OPTIONS,
    Sized,
    emulator_parser,
    log_to_console,
    payload_too_large,
    serve_until_signalled,
    sized,
)

_LOG = logging.getLogger(__name__)
MAX_SERIES_PER_REQUEST = 200
# https://cloud.google.com/monitoring/quotas (user-defined metrics): 30 labels per descriptor, keys
# of at most 100 and values of at most 1024. The page says "string length": values are counted
# here in UTF-8 bytes, the stricter reading, so a sink that passes here passes there either way.
MAX_LABELS = 30
MAX_LABEL_KEY = 100
MAX_LABEL_VALUE = 1024
MAX_PAST_S = 25 * 3600
MAX_FUTURE_S = 5 * 60
USER_DEFINED = ("custom.googleapis.com/", "workload.googleapis.com/", "external.googleapis.com/")
PREDEFINED = ("compute.googleapis.com/workload/",)  # Google's, but written by the workloads themselves
WORKLOAD = "compute.googleapis.com/Workload"
# Monitored resource types: their required labels, and the label the service fills in itself.
RESOURCES: dict[str, tuple[frozenset[str], str | None]] = {
    WORKLOAD: (frozenset({"location", "workload_id", "replica_id"}), None),
    "global": (frozenset(), "project_id"),
    "generic_task": (frozenset({"location", "namespace", "job", "task_id"}), "project_id"),
    "generic_node": (frozenset({"location", "namespace", "node_id"}), "project_id"),
}
# User-defined metrics go only on some resource types (of those here, not the Workload); the
# predefined workload metrics only on the Workload.
USER_DEFINED_RESOURCES = frozenset({"global", "generic_task", "generic_node"})
MetricDescriptor = metric_pb2.MetricDescriptor  # a plain protobuf message, not a proto-plus one
GAUGE, CUMULATIVE = MetricDescriptor.GAUGE, MetricDescriptor.CUMULATIVE
_KIND, _TYPE = MetricDescriptor.MetricKind.Name, MetricDescriptor.ValueType.Name
_VALUE_TYPES = {"bool_value": MetricDescriptor.BOOL, "int64_value": MetricDescriptor.INT64,
                "double_value": MetricDescriptor.DOUBLE, "string_value": MetricDescriptor.STRING,
                "distribution_value": MetricDescriptor.DISTRIBUTION}
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_]*")
_NS = 1_000_000_000
#: ListTimeSeries answers at most this many points (or series, with HEADERS) a page, and as many when
#: ``page_size`` is 0 or more than it (the ``page_size`` of ListTimeSeriesRequest in the API reference).
MAX_PAGE_SIZE = 100_000
#: The functions of the filter language understood here, each a test of a value against its arguments.
_FUNCTIONS: dict[str, Callable[[str, tuple[str, ...]], bool]] = {
    "starts_with": lambda value, args: value.startswith(args[0]),
    "ends_with": lambda value, args: value.endswith(args[0]),
    "has_substring": lambda value, args: args[0] in value,
    "one_of": lambda value, args: value in args,
}
_TOKEN = re.compile(r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<word>[A-Za-z_][A-Za-z0-9_.]*)'
                    r'|(?P<symbol>!=|>=|<=|[=:<>(),-]))')
_SELECTOR = re.compile(r"(metric|resource)\.(type|labels?\.([A-Za-z_][A-Za-z0-9_]*))")
_UNDERSTOOD = ('the filters understood here are comparisons joined by AND: metric.type, resource.type, '
               'resource.labels.KEY or metric.labels.KEY = "value", starts_with("..."), ends_with("..."), '
               'has_substring("...") or one_of("...", ...)')

SeriesKey = tuple[str, str, tuple[tuple[str, str], ...], str, tuple[tuple[str, str], ...]]


class ServiceError(Exception):
    """An error as the service answers it; a failed CreateTimeSeries also carries its summary."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 summary: types.CreateTimeSeriesSummary | None = None) -> None:
        super().__init__(message)
        self.code, self.summary = code, summary


class _Refused(Exception):
    """One series of a CreateTimeSeries request that is not written."""


@dataclasses.dataclass
class _Series:
    metric: Any  # google.api.Metric
    resource: Any  # google.api.MonitoredResource
    kind: int
    value_type: int
    points: list[tuple[int, int, Any]] = dataclasses.field(default_factory=list)  # start, end (ns), value


def _invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _project(name: str) -> str:
    match = re.fullmatch(r"projects/([^/]+)", name)
    if match is None:
        raise _invalid(f"Name must be projects/PROJECT_ID, got: {name!r}")
    return match.group(1)


def _ns(stamp: timestamp_pb2.Timestamp) -> int:
    return stamp.seconds * _NS + stamp.nanos


def _stamp(ns: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ns // _NS, nanos=ns % _NS)


def _check_labels(labels: Iterable[tuple[str, str]], what: str) -> None:
    labels = list(labels)
    if len(labels) > MAX_LABELS:
        raise _Refused(f"{what} has {len(labels)} labels; at most {MAX_LABELS} are allowed")
    for key, value in labels:
        if len(key) > MAX_LABEL_KEY or not _LABEL_KEY.fullmatch(key):
            raise _Refused(f"{what} has an invalid label key {key!r}: lower-case letters, digits "
                           f"and underscores, starting with a letter, at most {MAX_LABEL_KEY} characters")
        if len(value.encode("utf-8", "surrogatepass")) > MAX_LABEL_VALUE:
            raise _Refused(f"{what} label {key!r} is longer than {MAX_LABEL_VALUE} bytes")


def _check_kind(kind: int, value_type: int, metric_type: str) -> None:
    if kind not in (GAUGE, CUMULATIVE):
        raise _Refused(f"Metric {metric_type} must be GAUGE or CUMULATIVE, not {_KIND(kind)}")
    if value_type == MetricDescriptor.VALUE_TYPE_UNSPECIFIED:
        raise _Refused(f"Metric {metric_type} needs a value type")
    if kind == CUMULATIVE and value_type in (MetricDescriptor.BOOL, MetricDescriptor.STRING):
        raise _Refused(f"A CUMULATIVE metric cannot have value type {_TYPE(value_type)}")


@dataclasses.dataclass(frozen=True)
class Condition:
    """One comparison of a filter: ``field`` (``metric.type``, ``resource.type``, or a label:
    ``resource.labels.KEY``, ``metric.labels.KEY``) against ``values`` by ``function`` (``=`` is
    ``equals``)."""

    field: str
    function: str
    values: tuple[str, ...]

    def holds(self, metric: Any, resource: Any) -> bool:
        """Whether a series (its ``google.api.Metric`` and ``MonitoredResource``) passes; a series
        without the label passes no test of it."""
        kind, _, rest = self.field.partition(".")
        described = metric if kind == "metric" else resource
        if rest == "type":
            value = described.type
        elif rest.removeprefix("labels.") in described.labels:
            value = described.labels[rest.removeprefix("labels.")]
        else:
            return False
        if self.function == "equals":
            return bool(value == self.values[0])
        return _FUNCTIONS[self.function](value, self.values)


def parse_filter(text: str) -> list[Condition]:
    """The conditions of a filter in the subset of Monitoring's filter language understood here:
    comparisons joined by AND (or by nothing, which Monitoring reads as AND), each a selector
    (``metric.type``, ``resource.type``, ``resource.labels.KEY``, ``metric.labels.KEY``; ``label``
    for ``labels`` too) ``=`` a quoted string or one of the functions ``starts_with``,
    ``ends_with``, ``has_substring``, ``one_of``. Anything else (OR, NOT, parentheses, other
    operators, selectors or functions) raises INVALID_ARGUMENT saying so, rather than being read
    otherwise than the service reads it."""
    tokens = _Tokens(text)
    conditions: list[Condition] = []
    while tokens.more():
        if conditions and tokens.peek() == ("word", "AND"):
            tokens.take()
        conditions.append(_comparison(tokens))
    return conditions


class _Tokens:
    """The tokens of a filter, (kind, text) each, read one at a time; quoted strings unquoted."""

    def __init__(self, text: str) -> None:
        self.text, self._next = text, 0
        self._tokens: list[tuple[str, str]] = []
        position = 0
        while text[position:].strip():
            match = _TOKEN.match(text, position)
            if match is None:
                raise self.invalid(f"cannot read it from {text[position:].strip()[:20]!r}")
            kind = match.lastgroup or ""
            value = match.group(kind)
            self._tokens.append((kind, re.sub(r"\\(.)", r"\1", value[1:-1]) if kind == "string" else value))
            position = match.end()

    def more(self) -> bool:
        return self._next < len(self._tokens)

    def peek(self) -> tuple[str, str]:
        return self._tokens[self._next]

    def take(self) -> tuple[str, str]:
        if not self.more():
            raise self.invalid("it ends in the middle of a comparison")
        self._next += 1
        return self._tokens[self._next - 1]

    def invalid(self, problem: str) -> ServiceError:
        return _invalid(f"Invalid filter {self.text!r}: {problem}")

    def unsupported(self, what: str) -> ServiceError:
        return _invalid(f"Filter {self.text!r} uses {what}, which this stand-in does not understand: "
                        f"{_UNDERSTOOD}")


def _comparison(tokens: _Tokens) -> Condition:
    kind, selector = tokens.take()
    field = _SELECTOR.fullmatch(selector) if kind == "word" else None
    if field is None:
        raise tokens.unsupported(repr(selector) if selector in ("OR", "NOT", "(", "-")
                                 else f"the selector {selector!r}")
    subject, detail, key = field.groups()
    name = f"{subject}.type" if detail == "type" else f"{subject}.labels.{key}"
    operator = tokens.take()
    if operator != ("symbol", "="):
        raise tokens.unsupported(f"the operator {operator[1]!r}")
    kind, value = tokens.take()
    if kind == "string":
        return Condition(name, "equals", (value,))
    if value not in _FUNCTIONS:
        raise tokens.unsupported(f"the value {value!r}")
    return Condition(name, value, _arguments(tokens, value))


def _arguments(tokens: _Tokens, function: str) -> tuple[str, ...]:
    """The quoted strings of ``function(...)``."""
    if tokens.take() != ("symbol", "("):
        raise tokens.invalid(f"{function} takes its arguments in parentheses")
    arguments: list[str] = []
    while True:
        kind, argument = tokens.take()
        if kind != "string":
            raise tokens.invalid(f"the arguments of {function} are quoted strings, got {argument!r}")
        arguments.append(argument)
        separator = tokens.take()
        if separator == ("symbol", ")"):
            break
        if separator != ("symbol", ","):
            raise tokens.invalid(f"expected , or ) in {function}(...), got {separator[1]!r}")
    if function != "one_of" and len(arguments) != 1:
        raise tokens.invalid(f"{function} takes one string")
    return tuple(arguments)


class MetricStore:
    """The stand-in's state and rules, independent of gRPC. Thread-safe.

    ``clock`` is the service's now (seconds since the epoch), against which point times are
    checked; ``min_interval_s`` is the shortest time between two points of a series. ``requests``
    counts the CreateTimeSeries calls, ``reads`` the ListTimeSeries calls of valid requests.
    """

    def __init__(self, clock: Callable[[], float] = time.time, min_interval_s: float = 5.0) -> None:
        self._clock, self._min_interval_ns = clock, round(min_interval_s * _NS)
        self._lock = threading.Lock()
        self._descriptors: dict[tuple[str, str], Any] = {}  # (project, type): MetricDescriptor
        self._series: dict[SeriesKey, _Series] = {}
        self._written: list[tuple[SeriesKey, int, Any]] = []  # every accepted point, in write order
        self._failures: list[grpc.StatusCode] = []
        self._read_failures: list[grpc.StatusCode] = []
        self._refusals: list[str] = []
        self._garbled = 0
        self.requests = 0
        self.reads = 0

    def fail_next(self, n: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        """The next ``n`` CreateTimeSeries calls fail with ``code`` and write nothing: an outage
        (UNAVAILABLE, INTERNAL), a quota (RESOURCE_EXHAUSTED), a permission (PERMISSION_DENIED)."""
        with self._lock:
            self._failures.extend([code] * n)

    def fail_reads_next(self, n: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        """The next ``n`` ListTimeSeries calls fail with ``code``."""
        with self._lock:
            self._read_failures.extend([code] * n)

    def garble_next(self, n: int) -> None:
        """The next ``n`` CreateTimeSeries calls fail with an error the client cannot read: its
        details name another code than its status (a service or proxy answering oddly)."""
        with self._lock:
            self._garbled += n

    def take_garbled(self) -> bool:
        """Whether this call is to be garbled (counted down)."""
        with self._lock:
            if not self._garbled:
                return False
            self._garbled -= 1
            return True

    def refuse_next(self, n: int, reason: str = "Injected refusal") -> None:
        """The next ``n`` series written (over any number of calls) are refused with ``reason``, the
        others of their requests written: a partial failure."""
        with self._lock:
            self._refusals.extend([reason] * n)

    def points(self, metric_type: str) -> list[tuple[dict[str, str], dict[str, str], float, Any]]:
        """The accepted points of a metric type, in write order: metric labels, resource labels,
        end time (seconds since the epoch) and value (bool, int, float, str or a Distribution)."""
        with self._lock:
            return [(dict(key[2]), dict(key[4]), end / _NS, _value(value))
                    for key, end, value in self._written if key[1] == metric_type]

    # -- time series ------------------------------------------------------------------------

    def create_time_series(self, name: str, time_series: Sequence[types.TimeSeries]) -> None:
        """Writes the valid series; raises a ``ServiceError`` naming the others, if any."""
        with self._lock:
            self.requests += 1
            if self._failures:
                code = self._failures.pop(0)
                raise ServiceError(code, f"Injected failure: {code.name}")
            project = _project(name)
            if not time_series:
                raise _invalid("At least one TimeSeries must be written")
            if len(time_series) > MAX_SERIES_PER_REQUEST:
                raise _invalid(f"Field timeSeries had an invalid value: a maximum of "
                               f"{MAX_SERIES_PER_REQUEST} TimeSeries can be written in a single request, "
                               f"got {len(time_series)}")
            now_ns = round(self._clock() * _NS)
            seen: set[SeriesKey] = set()
            refused: list[tuple[int, str, int]] = []
            for index, series in enumerate(time_series):
                pb = types.TimeSeries.pb(series)
                try:
                    if self._refusals:
                        raise _Refused(self._refusals.pop(0))
                    self._write(project, pb, now_ns, seen)
                except _Refused as reason:
                    refused.append((index, str(reason), len(pb.points)))
            if refused:
                total = sum(len(types.TimeSeries.pb(s).points) for s in time_series)
                raise _partial_failure(refused, total)

    def _write(self, project: str, ts: Any, now_ns: int, seen: set[SeriesKey]) -> None:
        metric_type = ts.metric.type
        if not metric_type.startswith(USER_DEFINED + PREDEFINED) or len(metric_type) > 200:
            raise _Refused(f"Metric type {metric_type!r} cannot be written: only custom.googleapis.com/, "
                           "workload.googleapis.com/, external.googleapis.com/ and the predefined "
                           "compute.googleapis.com/workload/ metrics can")
        _check_labels(ts.metric.labels.items(), "The metric")
        required, filled = RESOURCES.get(ts.resource.type, (None, None))
        if required is None:
            raise _Refused(f"Unknown monitored resource type {ts.resource.type!r}")
        allowed = USER_DEFINED_RESOURCES if metric_type.startswith(USER_DEFINED) else {WORKLOAD}
        if ts.resource.type not in allowed:
            raise _Refused(f"Metric {metric_type} cannot be written on monitored resource type "
                           f"{ts.resource.type}; it can on {', '.join(sorted(allowed))}")
        _check_labels(ts.resource.labels.items(), f"The monitored resource {ts.resource.type}")
        resource_labels = dict(ts.resource.labels)
        if filled is not None:
            resource_labels.setdefault(filled, project)
        if set(resource_labels) != required | ({filled} if filled else set()):
            raise _Refused(f"The labels of monitored resource {ts.resource.type} must be exactly "
                           f"{sorted(required)}, got {sorted(ts.resource.labels)}")
        if len(ts.points) != 1:
            raise _Refused(f"Only one point can be written per TimeSeries per request, got {len(ts.points)}")
        key: SeriesKey = (project, metric_type, tuple(sorted(ts.metric.labels.items())), ts.resource.type,
                          tuple(sorted(resource_labels.items())))
        if key in seen:
            raise _Refused("Duplicate TimeSeries encountered: only one point can be written per TimeSeries "
                           "per request")
        seen.add(key)
        point = ts.points[0]
        value_field = point.value.WhichOneof("value")
        if value_field is None:
            raise _Refused("The point has no value")
        value_type = _VALUE_TYPES[value_field]
        if ts.value_type and ts.value_type != value_type:
            raise _Refused(f"The TimeSeries value type {_TYPE(ts.value_type)} does not match "
                           f"its point's value, {_TYPE(value_type)}")
        descriptor = self._descriptors.get((project, metric_type))
        if descriptor is None:  # the first write creates it, as the service does
            kind = ts.metric_kind or GAUGE
            if metric_type.startswith(PREDEFINED) and kind != GAUGE:
                raise _Refused(f"Metric {metric_type} is GAUGE, not {_KIND(kind)}")
            _check_kind(kind, value_type, metric_type)
        else:
            kind = descriptor.metric_kind
            if ts.metric_kind and ts.metric_kind != kind:
                raise _Refused(f"Metric {metric_type} is {_KIND(kind)}, not {_KIND(ts.metric_kind)}")
            if value_type != descriptor.value_type:
                wanted = _TYPE(descriptor.value_type)
                raise _Refused(f"Value type for metric {metric_type} must be {wanted}, but is "
                               f"{_TYPE(value_type)}")
        if not point.interval.HasField("end_time"):
            raise _Refused("The point has no end time")
        end = _ns(point.interval.end_time)
        start = _ns(point.interval.start_time) if point.interval.HasField("start_time") else None
        if end < now_ns - MAX_PAST_S * _NS:
            raise _Refused(f"The point's end time is more than {MAX_PAST_S // 3600} hours in the past")
        if end > now_ns + MAX_FUTURE_S * _NS:
            raise _Refused(f"The point's end time is more than {MAX_FUTURE_S // 60} minutes in the future")
        series = self._series.get(key)
        previous = series.points[-1] if series and series.points else None
        if kind == GAUGE:
            if start is not None and start != end:
                raise _Refused(f"The start time must be equal to the end time for the GAUGE metric "
                               f"{metric_type}")
            start = end
        elif start is None or start >= end:
            raise _Refused(f"The start time must be before the end time for the CUMULATIVE metric "
                           f"{metric_type}")
        elif previous and start != previous[0] and start < previous[1] + _NS // 1000:
            raise _Refused("The start time of a CUMULATIVE series must not change, except when it is "
                           "reset: then the new start is after the previous point's end time")
        if previous and end <= previous[1]:
            raise _Refused("Points must be written in order. One or more of the points specified had an "
                           "older end time than the most recent point")
        if previous and end - previous[1] < self._min_interval_ns:
            raise _Refused("One or more points were written more frequently than the maximum sampling "
                           f"period configured for the metric ({self._min_interval_ns / _NS:g} s)")
        if descriptor is None:
            descriptor = MetricDescriptor(
                name=f"projects/{project}/metricDescriptors/{metric_type}", type=metric_type,
                metric_kind=kind, value_type=value_type)
            self._descriptors[(project, metric_type)] = descriptor
        if series is None:
            series = self._series[key] = _Series(_copy(ts.metric), _copy(ts.resource), kind, value_type)
            series.resource.labels.update(resource_labels)
        value = _copy(point.value)
        series.points.append((start, end, value))
        self._written.append((key, end, value))

    def preload(self, name: str, time_series: Iterable[types.TimeSeries]) -> None:
        """Adds series of metrics that only Google writes (GKE's ``kubernetes.io/...``), for reads:
        taken as given, with no write rule (points of any age, any number, in any order; a point
        at the end time of one already there replaces it; the resource's ``project_id`` filled in
        when missing). Each series names its metric kind and value type, which make the metric's
        descriptor. ``points`` does not list them, no one having written them. A ValueError says
        what is wrong with a series."""
        project = _project(name)
        with self._lock:
            for series in time_series:
                self._preload(project, types.TimeSeries.pb(series))

    def _preload(self, project: str, ts: Any) -> None:
        metric_type = ts.metric.type
        if metric_type.startswith(USER_DEFINED + PREDEFINED):
            raise ValueError(f"{metric_type} is written with CreateTimeSeries, not preloaded")
        if not ts.metric_kind or not ts.value_type:
            raise ValueError(f"a preloaded series of {metric_type} names its metric kind and value type")
        descriptor = self._descriptors.setdefault((project, metric_type), MetricDescriptor(
            name=f"projects/{project}/metricDescriptors/{metric_type}", type=metric_type,
            metric_kind=ts.metric_kind, value_type=ts.value_type, unit=ts.unit))
        if (descriptor.metric_kind, descriptor.value_type) != (ts.metric_kind, ts.value_type):
            known = f"{_KIND(descriptor.metric_kind)} {_TYPE(descriptor.value_type)}"
            raise ValueError(f"{metric_type} is {known}, not {_KIND(ts.metric_kind)} {_TYPE(ts.value_type)}")
        resource_labels = {"project_id": project, **ts.resource.labels}
        key: SeriesKey = (project, metric_type, tuple(sorted(ts.metric.labels.items())), ts.resource.type,
                          tuple(sorted(resource_labels.items())))
        added = {}
        for point in ts.points:
            if _VALUE_TYPES.get(point.value.WhichOneof("value")) != ts.value_type:
                raise ValueError(f"a point of {metric_type} is not {_TYPE(ts.value_type)}")
            end = _ns(point.interval.end_time)
            start = _ns(point.interval.start_time) if point.interval.HasField("start_time") else end
            added[end] = (start, end, _copy(point.value))
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(_copy(ts.metric), _copy(ts.resource), ts.metric_kind,
                                                 ts.value_type)
            series.resource.labels.update(resource_labels)
        by_end = {end: (start, end, value) for start, end, value in series.points} | added
        series.points = sorted(by_end.values(), key=lambda kept: kept[1])

    def list_time_series(self, request: types.ListTimeSeriesRequest) -> types.ListTimeSeriesResponse:
        """One page of the series that the filter selects with points in the interval, each with
        those points, newest first (as the service answers a query without aggregation); see the
        module's docstring for what is understood and what is refused."""
        pb = types.ListTimeSeriesRequest.pb(request)
        project = _project(pb.name)
        conditions = parse_filter(pb.filter)
        named = [c for c in conditions if c.field == "metric.type"]
        if len(named) != 1 or named[0].function != "equals":
            raise _invalid('The filter must name exactly one metric type: metric.type = "..."')
        metric_type = named[0].values[0]
        _check_raw(pb)
        if not pb.interval.HasField("end_time"):
            raise _invalid("The interval needs an end time")
        end = _ns(pb.interval.end_time)
        start = _ns(pb.interval.start_time) if pb.interval.HasField("start_time") else end
        if start > end:
            raise _invalid("The interval's start time is after its end time")
        if pb.page_size < 0:
            raise _invalid(f"page_size must be a positive number, got {pb.page_size}")
        headers_only = pb.view == types.ListTimeSeriesRequest.TimeSeriesView.HEADERS
        query = _query_id(pb)
        low = _page_offset(pb.page_token, query)
        high = low + (pb.page_size if 0 < pb.page_size <= MAX_PAGE_SIZE else MAX_PAGE_SIZE)
        # Each point is one result (each series, with HEADERS): a page is results low..high of
        # the whole answer, so that a series can go on over two pages.
        answer, position = types.ListTimeSeriesResponse.pb()(), 0
        with self._lock:
            self.reads += 1
            if self._read_failures:
                code = self._read_failures.pop(0)
                raise ServiceError(code, f"Injected failure: {code.name}")
            unit = getattr(self._descriptors.get((project, metric_type)), "unit", "")
            for key, series in self._series.items():
                if key[:2] != (project, metric_type) or not all(
                        c.holds(series.metric, series.resource) for c in conditions):
                    continue
                points = [p for p in reversed(series.points) if p[1] == end or start < p[1] <= end]
                results = min(len(points), 1) if headers_only else len(points)
                first, last = max(low - position, 0), min(high - position, results)
                if first < last:
                    answer.time_series.append(types.TimeSeries.pb()(
                        metric=series.metric, resource=series.resource, metric_kind=series.kind,
                        value_type=series.value_type, unit=unit, points=[] if headers_only else [
                            types.Point.pb()(interval=types.TimeInterval.pb()(start_time=_stamp(s),
                                                                              end_time=_stamp(e)), value=v)
                            for s, e, v in points[first:last]]))
                position += results
        if high < position:
            answer.next_page_token = _page_token(high, query)
        response: types.ListTimeSeriesResponse = types.ListTimeSeriesResponse.wrap(answer)
        return response

    # -- metric descriptors -----------------------------------------------------------------

    def create_metric_descriptor(self, name: str, descriptor: Any) -> Any:
        """Creates a user-defined metric, or updates it where its kind and value type stay (the
        service never removes labels: the new ones are added)."""
        project, metric_type = _project(name), descriptor.type
        if not metric_type.startswith(USER_DEFINED):
            raise _invalid(f"Only user-defined metric types ({', '.join(USER_DEFINED)}) can be created, "
                           f"got {metric_type!r}")
        try:
            _check_kind(descriptor.metric_kind, descriptor.value_type, metric_type)
            _check_labels(((label.key, "") for label in descriptor.labels), "The metric descriptor")
        except _Refused as reason:
            raise _invalid(str(reason)) from None
        with self._lock:
            created = _copy(descriptor)
            created.name = f"projects/{project}/metricDescriptors/{metric_type}"
            existing = self._descriptors.get((project, metric_type))
            if existing is not None:
                if (existing.metric_kind, existing.value_type) != (created.metric_kind, created.value_type):
                    raise _invalid(f"Metric {metric_type} exists as {_KIND(existing.metric_kind)} "
                                   f"{_TYPE(existing.value_type)}: its kind and value type cannot change")
                known = {label.key for label in created.labels}
                created.labels.extend(label for label in existing.labels if label.key not in known)
            self._descriptors[(project, metric_type)] = created
            return created

    def get_metric_descriptor(self, name: str) -> Any:
        with self._lock:
            return self._descriptor(name)[1]

    def list_metric_descriptors(self, name: str, filter_: str = "") -> list[Any]:
        project = _project(name)
        conditions = parse_filter(filter_)
        if any(c.field != "metric.type" for c in conditions):
            raise _invalid(f"Filter {filter_!r}: this stand-in lists metric descriptors by metric.type only")
        with self._lock:
            return [d for (p, t), d in sorted(self._descriptors.items())
                    if p == project and t.startswith(USER_DEFINED)
                    and all(c.holds(metric_pb2.Metric(type=t), None) for c in conditions)]

    def delete_metric_descriptor(self, name: str) -> None:
        """Deletes a user-defined metric with its data, as the service does."""
        with self._lock:
            key, _ = self._descriptor(name)
            if not key[1].startswith(USER_DEFINED):
                raise _invalid(f"Only user-defined metrics can be deleted, not {key[1]}")
            del self._descriptors[key]
            self._series = {k: s for k, s in self._series.items() if k[:2] != key}
            self._written = [w for w in self._written if w[0][:2] != key]

    def _descriptor(self, name: str) -> tuple[tuple[str, str], Any]:
        match = re.fullmatch(r"projects/([^/]+)/metricDescriptors/(.+)", name)
        if match is None:
            raise _invalid(f"Invalid metric descriptor name: {name!r}")
        key = (match.group(1), match.group(2))
        if key not in self._descriptors:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"Could not find descriptor for metric {key[1]!r}")
        return key, self._descriptors[key]


def _check_raw(request: Any) -> None:
    """A ListTimeSeries request asks for the raw points: no aggregation but ALIGN_NONE, no order."""
    for field in ("aggregation", "secondary_aggregation"):
        aggregation = getattr(request, field)
        if (aggregation.per_series_aligner or aggregation.cross_series_reducer or aggregation.group_by_fields
                or aggregation.HasField("alignment_period")):
            raise _invalid(f"This stand-in answers with the raw points only: leave out {field} "
                           "(or give per_series_aligner ALIGN_NONE and nothing else)")
    if request.order_by:
        raise _invalid("order_by is unsupported: it must be left blank (points come newest first)")


def _query_id(request: Any) -> str:
    """What a page token belongs to: the request but for its page size and token."""
    query = _copy(request)
    query.page_size, query.page_token = 0, ""
    return hashlib.sha256(query.SerializeToString(deterministic=True)).hexdigest()[:16]


def _page_token(offset: int, query: str) -> str:
    return base64.urlsafe_b64encode(f"{offset}:{query}".encode()).decode()


def _page_offset(token: str, query: str) -> int:
    """The results before the page a token asks for; INVALID_ARGUMENT for a token not given for
    this query."""
    if not token:
        return 0
    try:
        offset, given_for = base64.urlsafe_b64decode(token.encode()).decode().split(":")
        if given_for == query and int(offset) >= 0:
            return int(offset)
    except ValueError:  # binascii.Error and UnicodeDecodeError too
        pass
    raise _invalid(f"Invalid page token {token!r}: give the next_page_token of the same query")


def _copy(message: Any) -> Any:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _value(value: Any) -> Any:
    field = value.WhichOneof("value")
    return _copy(value.distribution_value) if field == "distribution_value" else getattr(value, field)


def _partial_failure(refused: list[tuple[int, str, int]], total_points: int) -> ServiceError:
    """The service's answer when some series were not written: INVALID_ARGUMENT naming each one,
    with a summary of the points written and refused, grouped by reason."""
    by_reason: dict[str, int] = {}
    for _, reason, count in refused:
        by_reason[reason] = by_reason.get(reason, 0) + count
    summary = types.CreateTimeSeriesSummary(
        total_point_count=total_points,
        success_point_count=total_points - sum(by_reason.values()),
        errors=[types.CreateTimeSeriesSummary.Error(
            status=status_pb2.Status(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message=reason),
            point_count=count) for reason, count in by_reason.items()])
    indexes: dict[str, list[int]] = {}
    for index, reason, _ in refused:
        indexes.setdefault(reason, []).append(index)
    named = "; ".join(f"timeSeries[{_ranges(listed)}]: {reason}" for reason, listed in indexes.items())
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"One or more TimeSeries could not be written: {named}", summary)


def _ranges(indexes: list[int]) -> str:
    """Ascending indexes as the service names them, runs as ranges: ``0-3,7``. (A message naming
    each of 200 series would not fit in gRPC's trailing metadata.)"""
    runs: list[list[int]] = []
    for index in indexes:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(f"{first}-{last}" if last > first else f"{first}" for first, last in runs)


# -- gRPC ----------------------------------------------------------------------------------------


def _handlers(store: MetricStore) -> list[grpc.GenericRpcHandler]:
    def unary(call: Callable[[Any], Any], request_type: Any, response_type: Any) -> Any:
        def handle(sized_request: Sized, context: grpc.ServicerContext) -> Any:
            # Any API's front end refuses a request over 10 MiB; a documented limit of Monitoring's
            # own on a request's size has not been found.
            if sized_request.request is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              payload_too_large(FRONT_END_MAX_REQUEST_BYTES))
            request = sized_request.request
            if request_type is types.CreateTimeSeriesRequest and store.take_garbled():
                details = status_pb2.Status(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="garbled")
                context.set_trailing_metadata((("grpc-status-details-bin", details.SerializeToString()),))
                context.abort(grpc.StatusCode.UNAVAILABLE, "Injected garbled answer")
            try:
                result = call(request)
            except ServiceError as error:
                if error.summary is None:
                    context.abort(error.code, str(error))
                detail = any_pb2.Any()
                detail.Pack(types.CreateTimeSeriesSummary.pb(error.summary))
                context.abort_with_status(rpc_status.to_status(status_pb2.Status(
                    code=error.code.value[0], message=str(error), details=[detail])))
            return empty_pb2.Empty() if result is None else result

        serializer = getattr(response_type, "serialize", None) or response_type.SerializeToString
        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=sized(request_type.deserialize, FRONT_END_MAX_REQUEST_BYTES),
            response_serializer=serializer)

    methods = {
        "CreateTimeSeries": unary(lambda r: store.create_time_series(r.name, list(r.time_series)),
                                  types.CreateTimeSeriesRequest, empty_pb2.Empty),
        "ListTimeSeries": unary(store.list_time_series, types.ListTimeSeriesRequest,
                                types.ListTimeSeriesResponse),
        "CreateMetricDescriptor": unary(lambda r: store.create_metric_descriptor(r.name, r.metric_descriptor),
                                        types.CreateMetricDescriptorRequest, MetricDescriptor),
        "GetMetricDescriptor": unary(lambda r: store.get_metric_descriptor(r.name),
                                     types.GetMetricDescriptorRequest, MetricDescriptor),
        "ListMetricDescriptors": unary(
            lambda r: types.ListMetricDescriptorsResponse(
                metric_descriptors=store.list_metric_descriptors(r.name, r.filter)),
            types.ListMetricDescriptorsRequest, types.ListMetricDescriptorsResponse),
        "DeleteMetricDescriptor": unary(lambda r: store.delete_metric_descriptor(r.name),
                                        types.DeleteMetricDescriptorRequest, empty_pb2.Empty),
    }
    return [grpc.method_handlers_generic_handler("google.monitoring.v3.MetricService", methods)]


class MonitoringEmulator:
    """The stand-in as a gRPC server on localhost; a context manager that stops it.

    Given the ``store`` of a stand-in that was stopped, a new one serves the same series: a
    service that was away for a while, not a new one.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", store: MetricStore | None = None,
                 max_workers: int = 16) -> None:
        self.store = store or MetricStore()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="monitoring-emulator"),
            options=GRPC_SERVER_OPTIONS)
        self._server.add_generic_rpc_handlers(_handlers(self.store))
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.host = f"{host}:{self.port}"

    def start(self) -> MonitoringEmulator:
        self._server.start()
        _LOG.info("Cloud Monitoring stand-in listening on %s", self.host)
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        self._server.stop(grace_s).wait()

    def __enter__(self) -> MonitoringEmulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = emulator_parser(
        "monitoring", "Run a local stand-in of Cloud Monitoring's MetricService (google.monitoring.v3 "
                      "over gRPC, in memory) that enforces the CreateTimeSeries rules and answers "
                      "ListTimeSeries with the raw points. Reach it with an insecure gRPC channel to "
                      "HOST:PORT, e.g. the pipeline's --monitoring_endpoint=HOST:PORT.", 8086)
    parser.add_argument("--min_interval_s", type=float, default=5.0,
                        help="shortest time between two points of a series (default: %(default)s)")
    args = parser.parse_args(argv)
    log_to_console()
    store = MetricStore(min_interval_s=args.min_interval_s)
    emulator = MonitoringEmulator(args.port, args.host, store).start()
    print(f"--monitoring_endpoint={emulator.host}", flush=True)
    return serve_until_signalled(emulator)


if __name__ == "__main__":
    sys.exit(main())
