"""GKE's JobSet metrics end to end: the Cloud Monitoring stand-in serves them to the real
google-cloud-monitoring client as ListTimeSeries does (filters, interval, views, paging, refusals),
and ``goodput import gke-metrics`` reads them with that client into DuckDB and BigQuery."""

from __future__ import annotations

import datetime
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from google.api_core import exceptions
from google.cloud import monitoring_v3
from google.pubsub_v1.types import pubsub as pubsub_types

from pipeline.app.cli import main
from pipeline.app.gke import METRICS
from pipeline.emulators.bigquery import BigQueryEmulator
from pipeline.emulators.monitoring import MAX_PAGE_SIZE, MetricStore, MonitoringEmulator
from pipeline.emulators.pubsub import PubSubEmulator
from pipeline.sinks.monitoring import make_client
from support import REPO
from support.gke import DOUBLE, GAUGE, PROJECT, jobset_series, stamp

NOW = datetime.datetime(2026, 11, 1, 9, tzinfo=datetime.timezone.utc).timestamp()
NAME = f"projects/{PROJECT}"
SCHEDULING, UPTIME = METRICS["scheduling_goodput"], METRICS["uptime"]
FULL, HEADERS = (monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL,
                 monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.HEADERS)


def minutes(first: int, last: int, value: Any) -> list[tuple[float, Any]]:
    """A point a minute, ``first`` to ``last`` minutes before NOW, each of ``value``."""
    return [(NOW - 60 * m, value) for m in range(first, last - 1, -1)]


@pytest.fixture
def store() -> MetricStore:
    """JobSet js-a (cluster c1, namespace training) with an hour of every metric, and js-b (c2,
    research) with 20 minutes of scheduling goodput."""
    store = MetricStore(clock=lambda: NOW)
    store.preload(NAME, [
        jobset_series("scheduling_goodput", "js-a", minutes(59, 0, 0.9)),
        jobset_series("proxy_runtime_goodput", "js-a", minutes(59, 0, 0.8)),
        jobset_series("uptime", "js-a", [(NOW - 60 * m, 3600.0 - 60 * m) for m in range(59, -1, -1)]),
        jobset_series("times_between_interruptions", "js-a", [(NOW - 1800, (1, 3600.0))]),
        jobset_series("times_to_recover", "js-a", [(NOW - 1800, (2, 90.0))]),
        jobset_series("scheduling_goodput", "js-b", minutes(19, 0, 0.5), cluster="c2", namespace="research",
                      uid=""),
    ])
    return store


@pytest.fixture
def emulator(store: MetricStore) -> Iterator[MonitoringEmulator]:
    with MonitoringEmulator(store=store) as running:
        yield running


@pytest.fixture
def client(emulator: MonitoringEmulator) -> Iterator[Any]:
    client = make_client(emulator.host)  # the pipeline's own, as its writer and importer make it
    yield client
    client.transport.close()


def listed(client: Any, query: str, start: float = NOW - 3600, end: float = NOW, **request: Any) -> list[Any]:
    return list(client.list_time_series(request={
        "name": NAME, "filter": query, "view": FULL, **request,
        "interval": monitoring_v3.TimeInterval(start_time=stamp(start), end_time=stamp(end))}))


def jobsets(series: list[Any]) -> list[str]:
    return sorted(s.resource.labels["entity_name"] for s in series)


def test_preloaded_series_are_read_back_newest_first_with_their_resource(client):
    """GKE's series come back as Google wrote them: k8s_entity labels, kind, value type, unit."""
    (found,) = listed(client, f'metric.type = "{UPTIME}"')
    assert found.resource.type == "k8s_entity"
    assert dict(found.resource.labels) == {
        "project_id": PROJECT, "location": "us-central1", "cluster_name": "c1", "entity_type": "jobset",
        "entity_namespace": "training", "entity_name": "js-a", "entity_uid": "uid-1"}
    assert (found.metric_kind, found.value_type, found.unit) == (GAUGE, DOUBLE, "s")
    points = list(found.points)
    assert len(points) == 60
    assert [(p.interval.end_time.timestamp(), p.value.double_value) for p in points[:2]] == [
        (NOW, 3600.0), (NOW - 60, 3540.0)]
    descriptor = client.get_metric_descriptor(name=f"{NAME}/metricDescriptors/{UPTIME}")
    assert descriptor.unit == "s"


def test_users_cannot_write_gke_metrics(client, store):
    """CreateTimeSeries refuses GKE's metric types, as the service does; preload takes no user's."""
    series = jobset_series("uptime", "js-c", [(NOW, 1.0)])
    with pytest.raises(exceptions.InvalidArgument, match="cannot be written"):
        client.create_time_series(name=NAME, time_series=[series], retry=None)
    custom = jobset_series("uptime", "js-c", [(NOW, 1.0)])
    custom.metric.type = "custom.googleapis.com/jobset/uptime"
    with pytest.raises(ValueError, match="CreateTimeSeries"):
        store.preload(NAME, [custom])
    assert jobsets(listed(client, f'metric.type = "{UPTIME}"')) == ["js-a"]


@pytest.mark.parametrize(("query", "expected"), [
    (f'metric.type = "{SCHEDULING}"', ["js-a", "js-b"]),
    (f'metric.type = "{SCHEDULING}" AND resource.labels.cluster_name = "c2"', ["js-b"]),
    (f'metric.type = "{SCHEDULING}" resource.label.entity_namespace = "training"', ["js-a"]),
    (f'metric.type="{SCHEDULING}" AND resource.type = "k8s_entity" AND '
     'resource.labels.entity_name = one_of("js-a", "js-z")', ["js-a"]),
    (f'metric.type = "{SCHEDULING}" AND resource.labels.cluster_name = starts_with("c")', ["js-a", "js-b"]),
    (f'metric.type = "{SCHEDULING}" AND resource.labels.entity_name = ends_with("-b")', ["js-b"]),
    (f'metric.type = "{SCHEDULING}" AND resource.labels.entity_uid = has_substring("uid")', ["js-a"]),
    (f'metric.type = "{SCHEDULING}" AND resource.type = "k8s_pod"', []),
    (f'metric.type = "{SCHEDULING}" AND metric.labels.node_name = "n1"', []),  # a label it lacks
], ids=["type", "and", "implicit-and", "one_of", "starts_with", "ends_with", "has_substring",
        "resource-type", "missing-label"])
def test_filters_select_series(client, query, expected):
    """Each comparison of the filter holds for each series returned, and only for those."""
    assert jobsets(listed(client, query)) == expected


def test_the_interval_is_half_open_and_a_lone_end_time_is_an_instant(client):
    """Points after the start time up to and including the end time; with no start, those at the end."""
    (found,) = listed(client, f'metric.type = "{UPTIME}"', start=NOW - 180, end=NOW - 60)
    assert [p.interval.end_time.timestamp() for p in found.points] == [NOW - 60, NOW - 120]
    instant = list(client.list_time_series(request={
        "name": NAME, "filter": f'metric.type = "{UPTIME}"',
        "interval": monitoring_v3.TimeInterval(end_time=stamp(NOW - 120))}))
    assert [p.interval.end_time.timestamp() for s in instant for p in s.points] == [NOW - 120]
    assert listed(client, f'metric.type = "{UPTIME}"', start=NOW + 1, end=NOW + 60) == []


def test_pages_hold_page_size_points_and_a_series_goes_on_over_pages(client):
    """With FULL, page_size counts points; the client's pager reads every page."""
    pages = list(client.list_time_series(request={
        "name": NAME, "filter": f'metric.type = "{SCHEDULING}"', "page_size": 7,
        "interval": monitoring_v3.TimeInterval(start_time=stamp(NOW - 3600), end_time=stamp(NOW))}).pages)
    sizes = [sum(len(s.points) for s in page.time_series) for page in pages]
    assert sizes == [7] * 11 + [3]  # 60 + 20 points
    assert all(page.next_page_token for page in pages[:-1]) and not pages[-1].next_page_token
    whole: dict[str, list[float]] = {}
    for page in pages:
        for series in page.time_series:
            whole.setdefault(series.resource.labels["entity_name"], []).extend(
                p.interval.end_time.timestamp() for p in series.points)
    assert whole == {"js-a": [end for end, _ in reversed(minutes(59, 0, None))],
                     "js-b": [end for end, _ in reversed(minutes(19, 0, None))]}


def test_headers_pages_count_series_and_hold_no_points(client):
    """With HEADERS, page_size counts series, and none carries its points."""
    pages = list(client.list_time_series(request={
        "name": NAME, "filter": f'metric.type = "{SCHEDULING}"', "view": HEADERS, "page_size": 1,
        "interval": monitoring_v3.TimeInterval(start_time=stamp(NOW - 3600), end_time=stamp(NOW))}).pages)
    assert [[s.resource.labels["entity_name"] for s in page.time_series] for page in pages] == [["js-a"],
                                                                                             ["js-b"]]
    assert all(not s.points for page in pages for s in page.time_series)


def test_a_page_holds_at_most_100000_points():
    """A page_size of 0, or over the limit, is the limit, as in the service."""
    store = MetricStore(clock=lambda: NOW)
    series = monitoring_v3.TimeSeries.pb(jobset_series("uptime", "js-a", []))
    for second in range(MAX_PAGE_SIZE + 1):
        point = series.points.add()
        point.interval.end_time.FromSeconds(int(NOW) - second)
        point.value.double_value = float(second)
    store.preload(NAME, [monitoring_v3.TimeSeries.wrap(series)])
    for page_size in (0, MAX_PAGE_SIZE + 1):
        request = monitoring_v3.ListTimeSeriesRequest(
            name=NAME, filter=f'metric.type = "{UPTIME}"', page_size=page_size,
            interval=monitoring_v3.TimeInterval(start_time=stamp(NOW - 10**6), end_time=stamp(NOW)))
        first = store.list_time_series(request)
        assert len(first.time_series[0].points) == MAX_PAGE_SIZE
        request.page_token = first.next_page_token
        rest = store.list_time_series(request)
        assert [p.value.double_value for p in rest.time_series[0].points] == [float(MAX_PAGE_SIZE)]
        assert rest.next_page_token == ""


@pytest.mark.parametrize(("request_fields", "refusal"), [
    ({"filter": f'metric.type = "{SCHEDULING}" OR metric.type = "{UPTIME}"'}, "'OR'"),
    ({"filter": f'NOT metric.type = "{SCHEDULING}"'}, "'NOT'"),
    ({"filter": f'(metric.type = "{SCHEDULING}")'}, "'\\('"),
    ({"filter": f'metric.type = "{SCHEDULING}" AND resource.labels.cluster_name != "c1"'}, "operator '!='"),
    ({"filter": f'metric.type = "{SCHEDULING}" AND project = "p"'}, "selector 'project'"),
    ({"filter": f'metric.type = "{SCHEDULING}" AND resource.labels.cluster_name = '
                'monitoring.regex.full_match("c.*")'}, "monitoring.regex.full_match"),
    ({"filter": f'metric.type = "{SCHEDULING}'}, "Invalid filter"),
    ({"filter": 'metric.type = starts_with("kubernetes.io/jobset/")'}, "exactly one metric type"),
    ({"filter": 'resource.type = "k8s_entity"'}, "exactly one metric type"),
    ({"aggregation": {"alignment_period": {"seconds": 60}, "per_series_aligner": 12}}, "raw points"),
    ({"aggregation": {"cross_series_reducer": 4}}, "raw points"),
    ({"order_by": "metric.type"}, "order_by"),
    ({"page_size": -1}, "positive"),
    ({"page_token": "not-a-token"}, "page token"),
], ids=["or", "not", "parentheses", "not-equal", "project", "regex", "unterminated", "prefix-type",
        "no-type", "aligned", "reduced", "order", "negative-page", "bad-token"])
def test_what_the_stand_in_does_not_serve_is_refused_saying_why(client, request_fields, refusal):
    """A filter beyond the subset, an aggregation, an order or a bad page is INVALID_ARGUMENT."""
    request = {"name": NAME, "filter": f'metric.type = "{SCHEDULING}"',
               "interval": monitoring_v3.TimeInterval(start_time=stamp(NOW - 3600), end_time=stamp(NOW)),
               **request_fields}
    with pytest.raises(exceptions.InvalidArgument, match=refusal):
        list(client.list_time_series(request=request, retry=None))


def test_align_none_is_the_raw_points_and_a_token_serves_only_its_query(client):
    """An aggregation of ALIGN_NONE alone reads as none; a page token of another query is refused."""
    assert len(listed(client, f'metric.type = "{UPTIME}"', aggregation={"per_series_aligner": 0})) == 1
    page = client.list_time_series(request={
        "name": NAME, "filter": f'metric.type = "{SCHEDULING}"', "page_size": 5,
        "interval": monitoring_v3.TimeInterval(start_time=stamp(NOW - 3600), end_time=stamp(NOW))})
    token = next(iter(page.pages)).next_page_token
    with pytest.raises(exceptions.InvalidArgument, match="page token"):
        listed(client, f'metric.type = "{UPTIME}"', page_token=token)


# -- goodput import gke-metrics ---------------------------------------------------------------


def iso(seconds: float) -> str:
    return stamp(seconds).isoformat()


def import_gke(emulator: MonitoringEmulator, *options: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["import", "gke-metrics", "--project", PROJECT, "--monitoring_endpoint", emulator.host,
                 *options], out=out)
    return code, out.getvalue()


def table(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(path), read_only=True) as connection:
        return connection.execute(sql).fetchall()


def test_an_import_writes_a_row_per_point(emulator, tmp_path):
    """Every point of every metric in the range is a row, a distribution as its mean and count."""
    path = tmp_path / "goodput.duckdb"
    code, out = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW - 1800), "--end", iso(NOW))
    assert code == 0
    assert out.splitlines()[:5] == [
        "scheduling_goodput: 50 points of 2 series", "proxy_runtime_goodput: 30 points of 1 series",
        "times_between_interruptions: 0 points of 0 series", "times_to_recover: 0 points of 0 series",
        "uptime: 30 points of 1 series"]  # NOW - 1800 itself is outside: (start, end]
    assert table(path, "SELECT count(*) FROM jobset_metrics") == [(110,)]
    assert table(path, "SELECT project, location, cluster, namespace, jobset_name, jobset_uid, value "
                       "FROM jobset_metrics WHERE metric = 'scheduling_goodput' AND end_time = "
                       f"'{stamp(NOW).replace(tzinfo=None)}' ORDER BY jobset_name") == [
        (PROJECT, "us-central1", "c1", "training", "js-a", "uid-1", 0.9),
        (PROJECT, "us-central1", "c2", "research", "js-b", None, 0.5)]  # GKE left its uid empty
    code, _ = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW - 1801),
                         "--end", iso(NOW - 1799))
    assert code == 0
    assert table(path, "SELECT metric, value, sample_count, start_time = end_time FROM jobset_metrics "
                       "WHERE metric LIKE 'times%' ORDER BY metric") == [
        ("times_between_interruptions", 3600.0, 1, True), ("times_to_recover", 90.0, 2, True)]


def test_importing_overlapping_ranges_twice_counts_each_point_once(emulator, tmp_path):
    """The overlap's points are appended twice; latest_jobset_metrics holds each once."""
    path = tmp_path / "goodput.duckdb"
    first = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW - 3600), "--end", iso(NOW - 1200))
    second = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW - 2400), "--end", iso(NOW))
    assert first[0] == second[0] == 0
    overlap = table(path, "SELECT count(*) FROM jobset_metrics WHERE end_time > "
                          f"'{stamp(NOW - 2400).replace(tzinfo=None)}' AND end_time <= "
                          f"'{stamp(NOW - 1200).replace(tzinfo=None)}' GROUP BY imported_at")
    assert sorted(count for count, in overlap) == [20 * 3 + 2] * 2  # js-a's 3 metrics, 2 one-off points
    every = 60 * 3 + 20 + 2
    assert table(path, "SELECT count(*) FROM jobset_metrics") == [(every + 62,)]
    assert table(path, "SELECT count(*) FROM latest_jobset_metrics") == [(every,)]


def test_cluster_and_namespace_filters(emulator, tmp_path):
    """--cluster and --namespace import only that cluster's, that namespace's JobSets."""
    path = tmp_path / "goodput.duckdb"
    assert import_gke(emulator, "--duckdb", str(path), "--cluster", "c2", "--start", iso(NOW - 3600),
                      "--end", iso(NOW))[0] == 0
    assert table(path, "SELECT DISTINCT jobset_name FROM jobset_metrics") == [("js-b",)]
    assert import_gke(emulator, "--duckdb", str(path), "--namespace", "training", "--start", iso(NOW - 3600),
                      "--end", iso(NOW))[0] == 0
    assert table(path, "SELECT jobset_name, count(*) FROM jobset_metrics GROUP BY ALL ORDER BY 1") == [
        ("js-a", 182), ("js-b", 20)]


def test_an_import_that_finds_nothing_says_so_and_exits_1(emulator, tmp_path):
    """A range with no point writes nothing, says where to look, and exits with 1."""
    path = tmp_path / "goodput.duckdb"
    code, out = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW + 60), "--end", iso(NOW + 120))
    assert code == 1
    assert "no point from" in out and "up to an hour late" in out
    assert not path.exists()


def test_a_point_past_the_limits_is_refused_and_the_others_imported(store, emulator, tmp_path):
    """A NaN among js-a's scheduling goodputs is refused, said on its metric's line and kept in
    dead_letter with its reason; every other point is a row, none of them NaN, and the exit code is 0."""
    store.preload(NAME, [jobset_series("scheduling_goodput", "js-a", [(NOW - 90, float("nan"))])])
    path = tmp_path / "goodput.duckdb"
    code, out = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW - 1800), "--end", iso(NOW))
    assert code == 0
    assert out.splitlines()[0] == (
        "scheduling_goodput: 50 points of 2 series; 1 refused, e.g. kubernetes.io/jobset/scheduling_goodput: "
        "scheduling_goodput must be a fraction in 0..1, got nan")
    assert out.splitlines()[-1] == f"1 refused points appended to {path}"
    assert table(path, "SELECT count(*), count(*) FILTER (isnan(value)) FROM jobset_metrics") == [(110, 0)]
    ((source, reason, payload),) = table(path, "SELECT source, reason, payload FROM dead_letter")
    assert (source, reason) == (
        "monitoring:kubernetes.io/jobset/scheduling_goodput",
        "kubernetes.io/jobset/scheduling_goodput: scheduling_goodput must be a fraction in 0..1, got nan")
    assert '"entity_name": "js-a"' in payload and "double_value: nan" in payload


def test_an_import_into_bigquery(emulator, tmp_path):
    """The rows go to BigQuery's jobset_metrics table, through the BigQuery stand-in."""
    with BigQueryEmulator() as bigquery:
        code, out = import_gke(emulator, "--bigquery_dataset", "goodput-local:goodput", "--bigquery_endpoint",
                               bigquery.endpoint, "--bigquery_create_tables", "--start", iso(NOW - 120),
                               "--end", iso(NOW))
        rows = bigquery.store.rows("goodput-local", "goodput", "jobset_metrics")
    assert code == 0
    assert out.splitlines()[-1].startswith("8 points from ")
    latest = [(row["jobset_name"], row["metric"]) for row in rows if row["end_time"].timestamp() == NOW]
    assert sorted(latest) == [("js-a", "proxy_runtime_goodput"), ("js-a", "scheduling_goodput"),
                              ("js-a", "uptime"), ("js-b", "scheduling_goodput")]


# -- the stream's import ----------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], stream: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert stream.poll() is None, stream.communicate()[0]
        assert time.monotonic() < deadline, "the stream did not import in time"
        time.sleep(0.2)


def counts(path: Path) -> tuple[int, int]:
    """Rows of jobset_metrics and of latest_jobset_metrics, or (0, 0) while the file is written."""
    try:
        with duckdb.connect(str(path), read_only=True) as connection:
            ((rows,),) = connection.execute("SELECT count(*) FROM jobset_metrics").fetchall()
            ((points,),) = connection.execute("SELECT count(*) FROM latest_jobset_metrics").fetchall()
    except (duckdb.IOException, duckdb.CatalogException):
        return 0, 0
    return rows, points


def test_the_stream_imports_every_interval_each_point_once(tmp_path):
    """With --gke_metrics_project the stream reads every second and appends only what is new: a
    later point of a series, and a series that shows up late with points an hour old; stopped,
    its table holds each point once."""
    now = time.time()
    store = MetricStore()
    first = [(now - 60 * m, 0.9) for m in range(5)]
    store.preload(NAME, [jobset_series("scheduling_goodput", "js-a", first)])
    path = tmp_path / "goodput.duckdb"
    subscription = "projects/goodput-local/subscriptions/pipeline"
    with PubSubEmulator() as pubsub, MonitoringEmulator(store=store) as monitoring:
        pubsub.broker.create_topic(pubsub_types.Topic(name="projects/goodput-local/topics/goodput"))
        pubsub.broker.create_subscription(pubsub_types.Subscription(
            name=subscription, topic="projects/goodput-local/topics/goodput"))
        stream = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "--streaming", "--runner=BundleBasedDirectRunner",
             f"--subscription={subscription}", f"--duckdb={path}", f"--gke_metrics_project={PROJECT}",
             "--gke_metrics_interval_s=1", f"--monitoring_endpoint={monitoring.host}"],
            cwd=REPO, env={**os.environ, "PUBSUB_EMULATOR_HOST": pubsub.host}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(lambda: counts(path) == (5, 5), stream)
            hour_ago = [(now - 3600 + 60 * m, 0.7) for m in range(3)]
            store.preload(NAME, [jobset_series("scheduling_goodput", "js-a", [(time.time(), 0.8)]),
                                 jobset_series("scheduling_goodput", "js-late", hour_ago)])
            wait_for(lambda: counts(path) == (9, 9), stream)
            reads = store.reads
            wait_for(lambda: store.reads >= reads + 2 * len(METRICS), stream)  # two more, nothing new
        finally:
            stream.send_signal(signal.SIGINT)
            output, _ = stream.communicate(timeout=60)
    assert stream.returncode == 0, output
    assert counts(path) == (9, 9)
