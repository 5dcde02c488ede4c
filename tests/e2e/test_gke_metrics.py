"""GKE's JobSet metrics end to end: the Cloud Monitoring stand-in serves them to the real
google-cloud-monitoring client as ListTimeSeries does (filters, interval, views, paging, refusals),
and ``goodput import gke-metrics`` reads them with that client into DuckDB and BigQuery, run after
run as a scheduler runs it, appending each point once."""

from __future__ import annotations

import datetime
import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import grpc
import pytest
from google.api_core import exceptions
from google.cloud import monitoring_v3

from pipeline.app.checks import UsageError
from pipeline.app.cli import main
from pipeline.app.gke import METRICS
from pipeline.beam.options import parse_command_line
from pipeline.emulators.bigquery import BigQueryEmulator
from pipeline.emulators.monitoring import MAX_PAGE_SIZE, MetricStore, MonitoringEmulator
from pipeline.sinks.monitoring import make_client
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


def test_an_overlapping_import_appends_only_what_is_new(emulator, tmp_path):
    """Of a range that overlaps one imported, only the points after each series' latest are
    appended: the table holds each point once, as latest_jobset_metrics does."""
    path = tmp_path / "goodput.duckdb"
    first = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW - 3600), "--end", iso(NOW - 1200))
    second = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW - 2400), "--end", iso(NOW))
    assert first[0] == second[0] == 0
    overlap = 20 * 3 + 2  # js-a's 3 metrics a minute, its 2 one-off points
    assert f"{overlap} points from {iso(NOW - 2400)} to {iso(NOW)} are in {path} already" in second[1]
    every = 60 * 3 + 20 + 2
    assert table(path, "SELECT count(*) FROM jobset_metrics") == [(every,)]
    assert table(path, "SELECT count(*) FROM latest_jobset_metrics") == [(every,)]
    assert table(path, "SELECT count(DISTINCT imported_at) FROM jobset_metrics WHERE end_time > "
                       f"'{stamp(NOW - 1200).replace(tzinfo=None)}'") == [(1,)]


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


def test_an_import_that_finds_nothing_says_so_and_exits_0(emulator, tmp_path):
    """A range with no point writes nothing and says where to look; a scheduled run while no
    JobSet runs has not failed, so it exits with 0."""
    path = tmp_path / "goodput.duckdb"
    code, out = import_gke(emulator, "--duckdb", str(path), "--start", iso(NOW + 60), "--end", iso(NOW + 120))
    assert code == 0
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


# -- run on a schedule --------------------------------------------------------------------------
#
# A scheduler runs the import with its default range, the 2 hours before now: each run reads what
# the runs before it read, and appends only what is new. These are the stream's import's cases
# (it read every interval the same way, until it left the stream); the table must end as its
# output did: each point once, each refused point one dead letter.

#: The time of the first scheduled run; the points below are dated after it.
T0 = NOW - 6 * 3600


def scheduled(emulator: MonitoringEmulator, path: Path, *runs_s: float) -> list[tuple[int, str]]:
    """Runs of the import into ``path`` at ``runs_s`` seconds after T0, each on its default range."""
    return [import_gke(emulator, "--duckdb", str(path), "--end", iso(T0 + at)) for at in runs_s]


@pytest.fixture
def hourly() -> Iterator[MonitoringEmulator]:
    """js-a's scheduling goodput each minute from 60 s to 1800 s after T0, and its times to
    recover once, at 900 s."""
    store = MetricStore(clock=lambda: NOW)
    store.preload(NAME, [
        jobset_series("scheduling_goodput", "js-a", [(T0 + 60.0 * m, 0.5) for m in range(1, 31)]),
        jobset_series("times_to_recover", "js-a", [(T0 + 900.0, (1, 75.0))])])
    with MonitoringEmulator(store=store) as running:
        yield running


def lookback(run_s: float) -> str:
    """The range a run at ``run_s`` seconds after T0 reads, as its lines say it."""
    return f"from {iso(T0 + run_s - 7200)} to {iso(T0 + run_s)}"


def points(path: Path) -> list[tuple[Any, ...]]:
    """(metric, seconds after T0, value) of every row of jobset_metrics."""
    return table(path, "SELECT metric, epoch(end_time) - epoch(TIMESTAMP "
                       f"'{stamp(T0).replace(tzinfo=None)}'), value FROM jobset_metrics ORDER BY ALL")


def test_runs_every_10_minutes_append_each_point_once(hourly, tmp_path):
    """Runs at 0, 600, 1200, 1800 and 2400 s each read the 2 hours before them: each point is
    appended once, by the first run after it, and the last run appends nothing."""
    path = tmp_path / "goodput.duckdb"
    runs = scheduled(hourly, path, 0, 600, 1200, 1800, 2400)
    assert [code for code, _ in runs] == [0] * 5
    assert points(path) == sorted([("scheduling_goodput", 60.0 * m, 0.5) for m in range(1, 31)]
                                  + [("times_to_recover", 900.0, 75.0)])
    assert table(path, "SELECT count(DISTINCT imported_at) FROM jobset_metrics") == [(3,)]  # 600 .. 1800 s
    assert f"31 points {lookback(2400)} are in {path} already" in runs[-1][1]
    assert "appended" not in runs[-1][1]


def test_a_second_run_appends_nothing_new(hourly, tmp_path):
    """The same run twice: the second reads every point again and appends none."""
    path = tmp_path / "goodput.duckdb"
    first, second = scheduled(hourly, path, 1800, 1800)
    assert first[0] == second[0] == 0
    assert table(path, "SELECT count(*) FROM jobset_metrics") == [(31,)]
    assert "appended" not in second[1]


def test_a_failed_read_is_made_up_by_the_next_run(hourly, tmp_path):
    """The run at 600 s fails reading (PERMISSION_DENIED: the client does not retry it), appends
    nothing and exits 1; the run at 1200 s takes in its points with its own."""
    path = tmp_path / "goodput.duckdb"
    hourly.store.fail_reads_next(1, grpc.StatusCode.PERMISSION_DENIED)
    failed, made_up = scheduled(hourly, path, 600, 1200)
    assert (failed[0], made_up[0]) == (1, 0)
    assert points(path) == sorted([("scheduling_goodput", 60.0 * m, 0.5) for m in range(1, 21)]
                                  + [("times_to_recover", 900.0, 75.0)])


def test_a_refused_point_is_one_dead_letter_however_many_runs_read_it(hourly, tmp_path):
    """js-b's latest point, a NaN, is one dead letter with its reason, though each run reads it
    again; the points before it are rows."""
    hourly.store.preload(NAME, [jobset_series(
        "scheduling_goodput", "js-b", [(T0 + 60.0, 0.5), (T0 + 120.0, 0.5), (T0 + 180.0, math.nan)])])
    path = tmp_path / "goodput.duckdb"
    runs = scheduled(hourly, path, 600, 1200, 1800)
    assert [code for code, _ in runs] == [0] * 3
    assert table(path, "SELECT reason FROM dead_letter") == [
        ("kubernetes.io/jobset/scheduling_goodput: scheduling_goodput must be a fraction in 0..1, got nan",)]
    assert table(path, "SELECT epoch(end_time) - epoch(TIMESTAMP "
                       f"'{stamp(T0).replace(tzinfo=None)}') FROM jobset_metrics "
                       "WHERE jobset_name = 'js-b' ORDER BY 1") == [(60.0,), (120.0,)]


def test_a_later_point_and_a_series_that_shows_up_late_are_appended(hourly, tmp_path):
    """After a run, a later point of js-a and a new series whose points are an hour old: the next
    run appends those four points and nothing else."""
    path = tmp_path / "goodput.duckdb"
    scheduled(hourly, path, 1800)
    hourly.store.preload(NAME, [
        jobset_series("scheduling_goodput", "js-a", [(T0 + 1860.0, 0.8)]),
        jobset_series("scheduling_goodput", "js-late", [(T0 + 60.0 * m, 0.7) for m in range(1, 4)])])
    code, out = scheduled(hourly, path, 2400)[0]
    assert code == 0
    assert out.splitlines()[-1] == f"4 points {lookback(2400)} appended to {path}"
    assert table(path, "SELECT jobset_name, count(*) FROM jobset_metrics GROUP BY ALL ORDER BY 1") == [
        ("js-a", 32), ("js-late", 3)]


def test_each_output_gets_what_it_lacks(hourly, tmp_path):
    """A DuckDB file that holds the points already and a new BigQuery dataset, in one run: the
    file gets nothing, the dataset every point; a second run adds nothing to either."""
    path = tmp_path / "goodput.duckdb"
    scheduled(hourly, path, 1800)
    with BigQueryEmulator() as bigquery:
        both = ("--duckdb", str(path), "--bigquery_dataset", "goodput-local:goodput", "--bigquery_endpoint",
                bigquery.endpoint, "--bigquery_create_tables", "--end", iso(T0 + 1800))
        first, second = import_gke(hourly, *both), import_gke(hourly, *both)
        rows = bigquery.store.rows("goodput-local", "goodput", "jobset_metrics")
    assert first[0] == second[0] == 0
    assert f"31 points {lookback(1800)} inserted into goodput-local:goodput" in first[1]
    assert "appended" not in first[1] and "inserted" not in second[1]
    assert len(rows) == 31 and table(path, "SELECT count(*) FROM jobset_metrics") == [(31,)]


@pytest.mark.parametrize("option", ["--gke_metrics_project=p-1234", "--gke_metrics_interval_s=300"])
@pytest.mark.parametrize("runner", ["BundleBasedDirectRunner", "DataflowRunner"])
def test_the_streams_gke_options_are_refused_naming_the_scheduled_import(option, runner):
    """The stream no longer imports GKE's metrics: its old options are a usage error that says what
    to run instead, on every runner (Dataflow's would otherwise take an unknown option)."""
    with pytest.raises(UsageError, match=r"was removed: .* run goodput import gke-metrics --project P"):
        parse_command_line(["--streaming", f"--runner={runner}", "--subscription=projects/p/subscriptions/s",
                            "--bigquery_dataset=p-1234:goodput", option])
