"""The local Cloud Monitoring stand-in, driven by the real google-cloud-monitoring client: what
it accepts is read back, and each documented write rule refuses what the service refuses."""

from __future__ import annotations

import datetime
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.api import metric_pb2
from google.api_core import exceptions
from google.cloud import monitoring_v3

from pipeline.emulators.monitoring import MetricStore, MonitoringEmulator
from pipeline.sinks.monitoring import _refused_indexes, make_client
from support.clock import ManualClock

PROJECT = "projects/local"
CUSTOM = "custom.googleapis.com/test/value"
WORKLOAD, TASK = "compute.googleapis.com/Workload", "generic_task"
GOODPUT_TIME = "compute.googleapis.com/workload/goodput_time"
RESOURCE_LABELS = {WORKLOAD: {"location": "us-central2-b", "workload_id": "run-1", "replica_id": "0"},
                   TASK: {"location": "us-central2-b", "namespace": "fleet", "job": "run-1", "task_id": "0"}}
NOW = datetime.datetime(2026, 11, 1, 9, tzinfo=datetime.timezone.utc).timestamp()
Descriptor = metric_pb2.MetricDescriptor


@pytest.fixture
def clock() -> ManualClock:
    """The stand-in's clock, moved on by the test."""
    return ManualClock(NOW)


@pytest.fixture
def emulator(clock: ManualClock) -> Iterator[MonitoringEmulator]:
    with MonitoringEmulator(store=MetricStore(clock=clock)) as running:
        yield running


@pytest.fixture
def client(emulator: MonitoringEmulator) -> Iterator[Any]:
    client = make_client(emulator.host)  # the pipeline's own, as its writer and importer make it
    yield client
    client.transport.close()


def stamp(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def series(metric: str = CUSTOM, value: Any = 1.0, end: float = NOW, start: float | None = None,
           labels: dict[str, str] | None = None, resource: dict[str, str] | None = None,
           resource_type: str = TASK, points: int = 1, kind: int = 0) -> Any:
    ts = monitoring_v3.TimeSeries(metric_kind=kind)
    ts.metric.type = metric
    ts.metric.labels.update(labels or {})
    ts.resource.type = resource_type
    ts.resource.labels.update(RESOURCE_LABELS[resource_type] if resource is None else resource)
    field = {bool: "bool_value", int: "int64_value", float: "double_value", str: "string_value"}[type(value)]
    interval = monitoring_v3.TimeInterval(end_time=stamp(end))
    if start is not None:
        interval.start_time = stamp(start)
    ts.points = [monitoring_v3.Point(interval=interval, value=monitoring_v3.TypedValue(**{field: value}))
                 for _ in range(points)]
    return ts


def write(client: Any, *time_series: Any) -> None:
    client.create_time_series(name=PROJECT, time_series=list(time_series), retry=None)


def refused(client: Any, *time_series: Any) -> tuple[str, Any]:
    """The message of a refused write and the CreateTimeSeriesSummary it carries."""
    with pytest.raises(exceptions.InvalidArgument) as raised:
        write(client, *time_series)
    summaries = [d for d in raised.value.details
                 if d.Is(monitoring_v3.CreateTimeSeriesSummary.pb().DESCRIPTOR)]
    summary = None
    if summaries:
        summary = monitoring_v3.CreateTimeSeriesSummary.pb()()
        summaries[0].Unpack(summary)
    return str(raised.value.message), summary


def read(client: Any, metric: str = CUSTOM, start: float = NOW - 3600, end: float = NOW,
         resource_type: str | None = None) -> list[Any]:
    query = f'metric.type = "{metric}"' + (f' AND resource.type = "{resource_type}"' if resource_type else "")
    return list(client.list_time_series(request={
        "name": PROJECT, "filter": query,
        "interval": monitoring_v3.TimeInterval(start_time=stamp(start), end_time=stamp(end))}))


def test_accepted_points_are_read_back_newest_first(client, emulator):
    write(client, series(value=1.0, end=NOW - 20, labels={"source": "a"}))
    write(client, series(value=2.0, end=NOW - 10, labels={"source": "a"}))
    write(client, series(value=3.0, end=NOW, labels={"source": "a"}))
    (found,) = read(client)
    assert dict(found.metric.labels) == {"source": "a"}
    assert found.resource.type == TASK
    assert dict(found.resource.labels) == {**RESOURCE_LABELS[TASK], "project_id": PROJECT.split("/")[1]}
    assert found.metric_kind == Descriptor.GAUGE and found.value_type == Descriptor.DOUBLE
    assert [p.value.double_value for p in found.points] == [3.0, 2.0, 1.0]
    assert [p.interval.end_time.timestamp() for p in found.points] == [NOW, NOW - 10, NOW - 20]
    assert [p[2:] for p in emulator.store.points(CUSTOM)] == [(NOW - 20, 1.0), (NOW - 10, 2.0), (NOW, 3.0)]
    assert emulator.store.requests == 3
    (recent,) = read(client, start=NOW - 15)  # (start, end]: the two newest
    assert [p.value.double_value for p in recent.points] == [3.0, 2.0]
    assert read(client, resource_type="global") == []
    assert len(read(client, resource_type=TASK)) == 1
    assert read(client, metric=CUSTOM + "_other") == []


def test_more_than_200_series_refuse_the_whole_request(client, emulator):
    many = [series(labels={"i": str(i)}) for i in range(201)]
    message, _ = refused(client, *many)
    assert "200" in message
    assert emulator.store.points(CUSTOM) == []
    write(client, *many[:200])
    assert len(emulator.store.points(CUSTOM)) == 200


def test_one_point_per_series_per_request(client, emulator):
    message, _ = refused(client, series(points=2))
    assert "timeSeries[0]" in message and "one point" in message
    message, _ = refused(client, series(value=1.0), series(value=2.0))
    assert "timeSeries[1]" in message and "timeSeries[0]" not in message and "Duplicate" in message
    assert [p[3] for p in emulator.store.points(CUSTOM)] == [1.0]  # the first one is kept


def test_points_too_old_or_too_far_in_the_future_are_refused(client, emulator, clock):
    day = 25 * 3600
    message, _ = refused(client, series(end=NOW - day - 1))
    assert "25 hours in the past" in message
    message, _ = refused(client, series(end=NOW + 301))
    assert "5 minutes in the future" in message
    write(client, series(end=NOW - day + 1, labels={"i": "old"}), series(end=NOW + 299, labels={"i": "new"}))
    assert [p[2] for p in emulator.store.points(CUSTOM)] == [NOW - day + 1, NOW + 299]
    clock.now += 2  # the same time is now too old
    message, _ = refused(client, series(end=NOW - day + 1, labels={"i": "later"}))
    assert "25 hours in the past" in message


def test_points_of_a_series_are_written_in_order(client, emulator):
    write(client, series(value=1.0, end=NOW))
    message, _ = refused(client, series(value=2.0, end=NOW - 10))
    assert "in order" in message
    message, _ = refused(client, series(value=3.0, end=NOW))  # the same end time is not newer
    assert "in order" in message
    write(client, series(value=4.0, end=NOW - 10, labels={"other": "series"}))  # per series
    assert [p[3] for p in emulator.store.points(CUSTOM)] == [1.0, 4.0]


def test_points_of_a_series_at_most_every_min_interval(client, emulator):
    write(client, series(value=1.0, end=NOW - 10))
    message, _ = refused(client, series(value=2.0, end=NOW - 6))
    assert "more frequently" in message
    write(client, series(value=3.0, end=NOW - 5))  # 5 s after: allowed
    assert [p[3] for p in emulator.store.points(CUSTOM)] == [1.0, 3.0]
    stricter = MetricStore(clock=lambda: NOW, min_interval_s=10.0)
    stricter.create_time_series(PROJECT, [series(end=NOW - 10)])
    with pytest.raises(Exception, match="more frequently"):
        stricter.create_time_series(PROJECT, [series(end=NOW - 1)])


def test_a_gauge_start_time_must_be_its_end_time(client, emulator):
    message, _ = refused(client, series(start=NOW - 1, end=NOW))
    assert "start time must be equal to the end time" in message
    write(client, series(start=NOW, end=NOW))
    assert len(emulator.store.points(CUSTOM)) == 1


def test_the_first_write_fixes_the_value_type(client, emulator):
    write(client, series(value=1.5, end=NOW - 10))
    message, _ = refused(client, series(value=2, end=NOW))
    assert "must be DOUBLE, but is INT64" in message
    message, _ = refused(client, series(value=2, labels={"other": "series"}))  # fixed for the metric type
    assert "must be DOUBLE" in message
    descriptor = client.get_metric_descriptor(name=f"{PROJECT}/metricDescriptors/{CUSTOM}")
    assert (descriptor.metric_kind, descriptor.value_type) == (Descriptor.GAUGE, Descriptor.DOUBLE)
    write(client, series(metric=CUSTOM + "_int", value=7))
    (point,) = emulator.store.points(CUSTOM + "_int")
    assert point[3] == 7 and isinstance(point[3], int)


def test_monitored_resource_labels_must_match_its_type(client, emulator):
    for labels in ({"location": "l", "workload_id": "w"},
                   {"location": "l", "workload_id": "w", "replica_id": "0", "zone": "z"}):
        message, _ = refused(client, series(metric=GOODPUT_TIME, resource_type=WORKLOAD, resource=labels))
        assert "compute.googleapis.com/Workload must be exactly" in message
    message, _ = refused(client, series(resource_type="gce_thing", resource={}))
    assert "Unknown monitored resource type" in message
    message, _ = refused(client, series(resource_type="global", resource={"zone": "z"}))
    assert "global must be exactly" in message
    write(client, series(resource_type="global", resource={}))  # the service fills in project_id
    assert emulator.store.points(CUSTOM)[0][1] == {"project_id": "local"}
    (found,) = read(client, resource_type="global")
    assert dict(found.resource.labels) == {"project_id": "local"}


def test_only_user_defined_and_workload_metrics_are_writable(client, emulator):
    message, _ = refused(client, series(metric="compute.googleapis.com/instance/cpu/utilization"))
    assert "cannot be written" in message
    message, _ = refused(client, series(metric="example.com/metric"))
    assert "cannot be written" in message
    write(client, series(metric=GOODPUT_TIME, resource_type=WORKLOAD),
          series(metric="workload.googleapis.com/app/requests"))
    assert len(emulator.store.points(GOODPUT_TIME)) == 1
    message, _ = refused(client, series(metric="compute.googleapis.com/workload/disruptions", start=NOW - 60,
                                        value=1, kind=Descriptor.CUMULATIVE, resource_type=WORKLOAD))
    assert "is GAUGE" in message


def test_user_defined_metrics_go_on_their_resources_and_workload_metrics_on_the_workload(client, emulator):
    message, _ = refused(client, series(resource_type=WORKLOAD))
    assert f"{CUSTOM} cannot be written on monitored resource type {WORKLOAD}" in message
    message, _ = refused(client, series(metric=GOODPUT_TIME))
    assert f"{GOODPUT_TIME} cannot be written on monitored resource type generic_task" in message
    write(client, series(resource_type="global", resource={}),
          series(metric=GOODPUT_TIME, resource_type=WORKLOAD))
    assert len(emulator.store.points(CUSTOM)) == len(emulator.store.points(GOODPUT_TIME)) == 1


def test_metric_label_limits(client, emulator):
    message, _ = refused(client, series(labels={f"l{i}": "v" for i in range(31)}))
    assert "at most 30" in message
    message, _ = refused(client, series(labels={"k" * 101: "v"}))
    assert "invalid label key" in message
    message, _ = refused(client, series(labels={"Bad-Key": "v"}))
    assert "invalid label key" in message
    message, _ = refused(client, series(labels={"k": "v" * 1025}))
    assert "longer than 1024" in message
    widest = {f"l{i}": "v" for i in range(29)} | {"k" * 100: "v" * 1024}
    write(client, series(labels=widest))
    assert emulator.store.points(CUSTOM)[0][0] == widest


def test_a_valid_request_larger_than_gRPCs_default_receive_size_is_written(client, emulator):
    """200 series with 30 labels of 1,024 bytes each, over 4 MiB in all: the service takes it, and
    so does the stand-in (not gRPC's RESOURCE_EXHAUSTED, which a sink retries as a quota error)."""
    many = [series(labels={"i": f"{i:0>1024}", **{f"l{k}": "v" * 1024 for k in range(29)}})
            for i in range(200)]
    size = monitoring_v3.CreateTimeSeriesRequest.pb(
        monitoring_v3.CreateTimeSeriesRequest(name=PROJECT, time_series=many)).ByteSize()
    assert size > 4 * 1024 * 1024
    write(client, *many)
    assert len(emulator.store.points(CUSTOM)) == 200


def test_a_request_over_ten_mebibytes_is_refused_by_the_front_end(client, emulator):
    """A request over 10 MiB is INVALID_ARGUMENT in the front end's words, and nothing is written."""
    too_long = series(labels={"big": "v" * (10 * 1024 * 1024)})
    message, summary = refused(client, too_long)
    assert message == "Request payload size exceeds the limit: 10485760 bytes."
    assert summary is None
    assert emulator.store.points(CUSTOM) == []


def test_partial_failure_keeps_the_valid_series_and_names_the_others(client, emulator):
    batch = [series(labels={"i": str(i)}) for i in range(10)]
    batch[3] = series(labels={"i": "3"}, end=NOW - 26 * 3600)
    batch[7] = series(labels={"i": "7"}, resource={"location": "l"})
    message, summary = refused(client, *batch)
    assert message.startswith("One or more TimeSeries could not be written: timeSeries[3]: ")
    assert "; timeSeries[7]: " in message
    assert _refused_indexes(message, len(batch)) == [3, 7]  # what the sink reads from it
    assert sorted(int(p[0]["i"]) for p in emulator.store.points(CUSTOM)) == [0, 1, 2, 4, 5, 6, 8, 9]
    assert summary is not None
    assert (summary.total_point_count, summary.success_point_count) == (10, 8)
    assert sorted(e.point_count for e in summary.errors) == [1, 1]
    assert {e.status.code for e in summary.errors} == {grpc.StatusCode.INVALID_ARGUMENT.value[0]}
    assert any("25 hours" in e.status.message for e in summary.errors)


def test_injected_failures_are_seen_by_the_client_and_write_nothing(client, emulator):
    emulator.store.fail_next(2)
    emulator.store.fail_next(1, grpc.StatusCode.RESOURCE_EXHAUSTED)
    unavailable, exhausted = exceptions.ServiceUnavailable, exceptions.ResourceExhausted
    for expected in (unavailable, unavailable, exhausted):
        with pytest.raises(expected):
            write(client, series())
    assert emulator.store.points(CUSTOM) == []
    write(client, series())
    assert len(emulator.store.points(CUSTOM)) == 1
    assert emulator.store.requests == 4


def test_a_custom_cumulative_metric_follows_its_descriptor(client, emulator):
    name = f"{PROJECT}/metricDescriptors/{CUSTOM}"
    created = client.create_metric_descriptor(name=PROJECT, metric_descriptor=Descriptor(
        type=CUSTOM, metric_kind=Descriptor.CUMULATIVE, value_type=Descriptor.INT64,
        labels=[{"key": "source"}]))
    assert created.name == name
    assert client.get_metric_descriptor(name=name).metric_kind == Descriptor.CUMULATIVE
    listed = client.list_metric_descriptors(
        request={"name": PROJECT, "filter": 'metric.type = starts_with("custom.googleapis.com/")'})
    assert [d.type for d in listed] == [CUSTOM]
    start = NOW - 3600
    assert "start time must be before" in refused(client, series(value=1, end=NOW - 100))[0]
    assert "start time must be before" in refused(client, series(value=1, start=NOW - 100, end=NOW - 100))[0]
    assert "must be INT64, but is DOUBLE" in refused(client, series(value=1.0, start=start, end=NOW - 100))[0]
    assert "is CUMULATIVE, not GAUGE" in refused(client, series(value=1, start=start, end=NOW - 100,
                                                                kind=Descriptor.GAUGE))[0]
    write(client, series(value=1, start=start, end=NOW - 100))
    assert "must not change" in refused(client, series(value=2, start=start + 1, end=NOW - 50))[0]
    write(client, series(value=2, start=start, end=NOW - 50))
    write(client, series(value=0, start=NOW - 40, end=NOW - 30))  # a reset: starts after the last end
    (found,) = read(client)
    assert [(p.value.int64_value, p.interval.start_time.timestamp()) for p in found.points] == [
        (0, NOW - 40), (2, start), (1, start)]
    client.delete_metric_descriptor(name=name)
    with pytest.raises(exceptions.NotFound):
        client.get_metric_descriptor(name=name)
    assert emulator.store.points(CUSTOM) == []  # deleting a metric deletes its data


def test_metric_descriptors_that_the_service_refuses(client):
    def create(**fields: Any) -> None:
        client.create_metric_descriptor(name=PROJECT, metric_descriptor=Descriptor(**{
            "type": CUSTOM, "metric_kind": Descriptor.GAUGE, "value_type": Descriptor.DOUBLE, **fields}))

    for fields in ({"metric_kind": Descriptor.DELTA}, {"type": "compute.googleapis.com/workload/x"},
                   {"metric_kind": Descriptor.CUMULATIVE, "value_type": Descriptor.STRING},
                   {"value_type": Descriptor.VALUE_TYPE_UNSPECIFIED}):
        with pytest.raises(exceptions.InvalidArgument):
            create(**fields)
    create(labels=[{"key": "a"}])
    create(labels=[{"key": "b"}])  # an update: labels are added, never removed
    descriptor = client.get_metric_descriptor(name=f"{PROJECT}/metricDescriptors/{CUSTOM}")
    assert sorted(label.key for label in descriptor.labels) == ["a", "b"]
    with pytest.raises(exceptions.InvalidArgument, match="cannot change"):
        create(value_type=Descriptor.INT64)


def test_requests_must_name_a_project_and_queries_a_metric_type(client, emulator):
    for name in ("local", "projects/local/extra", ""):
        with pytest.raises(exceptions.InvalidArgument):
            client.create_time_series(name=name, time_series=[series()], retry=None)
    with pytest.raises(exceptions.InvalidArgument):
        list(client.list_time_series(request={"name": PROJECT, "filter": 'resource.type = "global"',
                                              "interval": monitoring_v3.TimeInterval(end_time=stamp(NOW))}))
    assert emulator.store.points(CUSTOM) == []


def test_command_line_help():
    result = subprocess.run([sys.executable, "-m", "pipeline.emulators.monitoring", "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    assert "--port" in result.stdout and "MetricService" in result.stdout
