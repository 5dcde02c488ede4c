"""The sinks on a runner that retries a failed work item (Dataflow, ``fail_work_items``): what
BigQuery or Cloud Monitoring cannot write fails the bundle, and the retry (the same elements, a
fresh DoFn) writes each row and each point once; only what a service refuses for its content is
a dead letter. Faults are injected into the local stand-ins, which the real client libraries talk
to. The bundles run on the batch replay's runner, where a failed bundle fails the pipeline: the
test sees the failure the Dataflow runner would retry, then runs the work item again. On the local
runner the sinks never raise (tests/e2e/test_sinks.py, tests/e2e/test_stream_stop_sinks.py)."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import apache_beam as beam
import grpc
import pytest
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from goodput_schemas import SEEDED_TABLES, table_names
from pipeline.beam.transforms import WriteToBigQuery, WriteToMonitoring
from pipeline.core.events import DeadLetter
from pipeline.core.rows import DEAD_LETTER, dead_letter_row, snapshot_rows
from pipeline.emulators.bigquery import DEDUP_S, ApiError, BigQueryEmulator, BigQueryStore
from pipeline.emulators.monitoring import MetricStore, MonitoringEmulator, ServiceError
from pipeline.sinks.bigquery import BigQueryWriter, create_tables
from pipeline.sinks.bigquery import make_client as bigquery_client
from pipeline.sinks.monitoring import (
    CUSTOM,
    METRICS,
    MetricWriter,
    MonitoringSettings,
    Point,
    snapshot_points,
)
from pipeline.sinks.monitoring import make_client as monitoring_client
from pipeline.sinks.retries import WriteFailed
from support.runs import snapshot_at

PROJECT, DATASET = "goodput-local", "goodput"
UTC = datetime.timezone.utc
NOW = datetime.datetime.now(UTC).replace(microsecond=0)
#: The sinks' retries, shortened: an outage "past the retries" is a fraction of a second here.
RETRIES = {"retry_deadline_s": 0.3, "initial_backoff_s": 0.01, "max_backoff_s": 0.05}


class _Outage:
    """An outage of a stand-in that begins once it has answered ``served`` more writes and lasts
    until ``recover()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served_until_down: int | None = None

    def begin_after(self, served: int) -> None:
        with self._lock:
            self._served_until_down = served

    def recover(self) -> None:
        with self._lock:
            self._served_until_down = None

    def down(self) -> bool:
        """Whether this write is refused (counting down the ones served before the outage)."""
        with self._lock:
            if self._served_until_down is None:
                return False
            if self._served_until_down == 0:
                return True
            self._served_until_down -= 1
            return False


class OutageBigQueryStore(BigQueryStore):
    """The BigQuery stand-in, whose insertAll answers 503 ``backendError`` during the outage."""

    def __init__(self) -> None:
        super().__init__()
        self.outage = _Outage()

    def insert_all(self, project: str, dataset: str, table: str, request: dict[str, Any]) -> dict[str, Any]:
        if self.outage.down():
            raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "backendError", "Injected outage")
        return super().insert_all(project, dataset, table, request)


class OutageMetricStore(MetricStore):
    """The Cloud Monitoring stand-in, whose CreateTimeSeries answers UNAVAILABLE during the outage."""

    def __init__(self, min_interval_s: float) -> None:
        super().__init__(min_interval_s=min_interval_s)
        self.outage = _Outage()

    def create_time_series(self, name: str, time_series: Any) -> None:
        if self.outage.down():
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "Injected outage")
        super().create_time_series(name, time_series)


def started_bigquery(store: BigQueryStore) -> BigQueryEmulator:
    emulator = BigQueryEmulator(store=store).start()
    create_tables(bigquery_client(PROJECT, emulator.endpoint), PROJECT, DATASET)
    return emulator


@pytest.fixture
def bigquery() -> Iterator[BigQueryEmulator]:
    emulator = started_bigquery(OutageBigQueryStore())
    yield emulator
    emulator.stop()


@pytest.fixture
def reference() -> Iterator[BigQueryEmulator]:
    """A second BigQuery with no outage: the tables the same elements make when nothing fails."""
    emulator = started_bigquery(BigQueryStore())
    yield emulator
    emulator.stop()


def outage(emulator: BigQueryEmulator | MonitoringEmulator) -> _Outage:
    store = emulator.store
    assert isinstance(store, (OutageBigQueryStore, OutageMetricStore))
    return store.outage


def tables(emulator: BigQueryEmulator) -> dict[str, list[str]]:
    """Every output table's rows (not the seeded tables'), as sorted text; a dead letter without
    its received time (when it was made, which a retry does again)."""
    return {name: sorted(repr(sorted((k, v) for k, v in row.items() if k != "received_time"))
                         for row in emulator.store.rows(PROJECT, DATASET, name))
            for name in table_names() if name not in SEEDED_TABLES}


def work_item() -> list[tuple[str, dict[str, Any]]]:
    """One work item's rows: three runs' metadata and snapshots (four tables, the first of them,
    ``badput_snapshots``, one insert) and a rejected message."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for run_id in ("run-0", "run-1", "run-2"):
        metadata = {"run_id": run_id, "attempt_id": "a", "start_time": NOW, "chip_count": 8}
        rows.append(("run_metadata", metadata))
        rows += snapshot_rows(snapshot_at(NOW, run_id, {"OTHER": 10.0}, windows_s=(60,)))
    letter = DeadLetter('{"not": "an event"}', "no events", "pubsub:message-1", "run-0")
    return [*rows, (DEAD_LETTER, dead_letter_row(letter))]


def write_rows(emulator: BigQueryEmulator, elements: list[tuple[str, dict[str, Any]]],
               fail_work_items: bool) -> None:
    """Runs ``WriteToBigQuery`` once over ``elements``, as one try of a work item (a fresh DoFn)."""
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        _ = (pipeline
             | beam.Create(elements)
             | WriteToBigQuery(PROJECT, DATASET, emulator.endpoint, fail_work_items=fail_work_items,
                               **RETRIES))


# -- BigQuery ------------------------------------------------------------------------------------

def test_an_outage_past_the_retries_fails_the_bundle_and_its_retry_writes_each_row_once(bigquery, reference):
    """BigQuery goes away after the work item's first insert and stays away past the sink's
    retries: the bundle fails (no row is dead-lettered or lost); once BigQuery is back, the retry
    writes the tables a write with no outage writes, the rows of that first insert not twice."""
    elements = work_item()
    write_rows(reference, elements, fail_work_items=True)
    expected = tables(reference)
    outage(bigquery).begin_after(1)
    with pytest.raises(WriteFailed, match="Injected outage"):
        write_rows(bigquery, elements, fail_work_items=True)
    first_try = {name: rows for name, rows in tables(bigquery).items() if rows}
    assert len(first_try) == 1 and all(rows == expected[name] for name, rows in first_try.items())
    assert tables(bigquery)[DEAD_LETTER] == []  # the outage made no dead letter
    outage(bigquery).recover()
    write_rows(bigquery, elements, fail_work_items=True)
    assert tables(bigquery) == expected


def test_a_work_item_that_keeps_failing_writes_nothing_twice_when_retried_again(bigquery, reference):
    """Tries that fail again and again while BigQuery stays away, then one after it is back: every
    row once."""
    elements = work_item()
    write_rows(reference, elements, fail_work_items=True)
    outage(bigquery).begin_after(2)
    for _ in range(3):
        with pytest.raises(WriteFailed):
            write_rows(bigquery, elements, fail_work_items=True)
    outage(bigquery).recover()
    write_rows(bigquery, elements, fail_work_items=True)
    assert tables(bigquery) == tables(reference)


@pytest.mark.parametrize("fail_work_items", [False, True])
def test_a_row_rejected_for_its_content_is_a_dead_letter_on_either_runner(bigquery, fail_work_items):
    """A row BigQuery rejects for its content goes to dead_letter with BigQuery's reason, the
    bundle succeeds, and its neighbour is written: the local runner and Dataflow alike."""
    good = {"run_id": "run-1", "attempt_id": "a", "start_time": NOW, "chip_count": 8}
    bad = {"run_id": "run-2", "attempt_id": "a", "start_time": NOW, "chip_count": "eight"}
    write_rows(bigquery, [("run_metadata", good), ("run_metadata", bad)], fail_work_items)
    assert [row["run_id"] for row in bigquery.store.rows(PROJECT, DATASET, "run_metadata")] == ["run-1"]
    (letter,) = bigquery.store.rows(PROJECT, DATASET, DEAD_LETTER)
    assert (letter["source"], letter["run_id"]) == ("bigquery:run_metadata", "run-2")
    assert "Cannot convert value to int64" in letter["reason"]


def test_a_retried_work_item_writes_its_dead_letter_once(bigquery):
    """BigQuery rejects a row for its content, then goes away before its dead letter is written:
    the bundle fails; the retry rejects the row again and writes one dead letter, not two (a dead
    letter's insert id leaves out when it was made)."""
    good = {"run_id": "run-1", "attempt_id": "a", "start_time": NOW, "chip_count": 8}
    bad = {"run_id": "run-2", "attempt_id": "a", "start_time": NOW, "chip_count": "eight"}
    outage(bigquery).begin_after(1)
    with pytest.raises(WriteFailed, match="into dead_letter"):
        write_rows(bigquery, [("run_metadata", good), ("run_metadata", bad)], fail_work_items=True)
    outage(bigquery).recover()
    for _ in range(2):  # the retry, and one more: a dead letter made anew each time
        write_rows(bigquery, [("run_metadata", good), ("run_metadata", bad)], fail_work_items=True)
    assert [row["run_id"] for row in bigquery.store.rows(PROJECT, DATASET, "run_metadata")] == ["run-1"]
    assert [row["run_id"] for row in bigquery.store.rows(PROJECT, DATASET, DEAD_LETTER)] == ["run-2"]


def test_rows_rejected_for_a_transient_reason_on_every_try_fail_the_work_item(bigquery):
    """A per-row backendError on each of the writer's tries is no reason to dead-letter the row
    where the work item is retried: the write raises, and nothing is in dead_letter."""
    bigquery.store.reject_rows_next(3, "backendError")
    writer = BigQueryWriter(bigquery_client(PROJECT, bigquery.endpoint), PROJECT, DATASET, row_attempts=3,
                            raise_failures=True, **RETRIES)
    row = {"run_id": "run-1", "attempt_id": "a", "start_time": NOW}
    with pytest.raises(WriteFailed, match="transient reason"):
        writer.write({"run_metadata": [row]})
    assert bigquery.store.rows(PROJECT, DATASET, DEAD_LETTER) == []
    assert writer.write({"run_metadata": [row]}) == 0
    assert [r["run_id"] for r in bigquery.store.rows(PROJECT, DATASET, "run_metadata")] == ["run-1"]


def test_a_missing_table_fails_the_work_item_rather_than_dead_letter_its_rows(bigquery):
    """A request refused for good that is no row's fault (a table Terraform has not made yet)
    fails the work item, which is retried until the table exists; nothing goes to dead_letter."""
    writer = BigQueryWriter(bigquery_client(PROJECT, bigquery.endpoint), PROJECT, DATASET,
                            raise_failures=True, **RETRIES)
    with pytest.raises(WriteFailed, match="Not found: Table"):
        writer.write({"no_such_table": [{"run_id": "run-1"}]})
    assert bigquery.store.rows(PROJECT, DATASET, DEAD_LETTER) == []


def test_a_retry_within_bigquerys_dedup_window_duplicates_nothing():
    """BigQuery drops a row whose insert id it saw within its window (the stand-in: DEDUP_S, a
    minute, BigQuery's documented least): a retry a moment before the window ends adds nothing; one
    after it would add the rows again (the limit ``BigQueryWriter`` states)."""
    now = [0.0]
    store = BigQueryStore(clock=lambda: now[0])
    emulator = started_bigquery(store)
    try:
        writer = BigQueryWriter(bigquery_client(PROJECT, emulator.endpoint), PROJECT, DATASET,
                                raise_failures=True, **RETRIES)
        rows = {"goodput_snapshots": [row for table, row in snapshot_rows(snapshot_at(NOW, "run-1"))
                                      if table == "goodput_snapshots"]}
        writer.write(rows)
        now[0] = DEDUP_S - 1.0
        writer.write(rows)
        assert len(store.rows(PROJECT, DATASET, "goodput_snapshots")) == len(rows["goodput_snapshots"])
        now[0] = 2 * DEDUP_S + 1.0
        writer.write(rows)
        assert len(store.rows(PROJECT, DATASET, "goodput_snapshots")) == 2 * len(rows["goodput_snapshots"])
    finally:
        emulator.stop()


# -- Cloud Monitoring ------------------------------------------------------------------------------

@pytest.fixture
def monitoring() -> Iterator[MonitoringEmulator]:
    """The stand-in with no sampling period of its own: a point sent again with its end time is
    refused only for being out of order."""
    with MonitoringEmulator(store=OutageMetricStore(min_interval_s=0.0)) as started:
        yield started


def points(count: int) -> list[Point]:
    """``count`` series of one metric, stamped now."""
    end_us = round(NOW.timestamp() * 1e6)
    return [Point(CUSTOM + "goodput_pct", (("accelerator_type", f"acc-{i}"),), "run-1", "global", 50.0,
                  end_us) for i in range(count)]


def metric_writer(emulator: MonitoringEmulator) -> MetricWriter:
    return MetricWriter(monitoring_client(emulator.host), PROJECT, raise_failures=True, **RETRIES)


def test_monitoring_outage_past_the_retries_fails_the_write_and_its_retry_writes_each_point_once(monitoring):
    """Cloud Monitoring goes away after the first of three requests: the write raises and
    dead-letters nothing; once it is back, a fresh writer sends the same points again, and those
    of the first request, refused as out of order, are counted as written, not as failures."""
    sent = points(450)
    failures: list[tuple[Point, str]] = []
    outage(monitoring).begin_after(1)
    with pytest.raises(WriteFailed, match="Injected outage"):
        metric_writer(monitoring).write(sent, lambda *failure: failures.append(failure))
    assert len(monitoring.store.points(CUSTOM + "goodput_pct")) == 200 and failures == []
    outage(monitoring).recover()
    retry = metric_writer(monitoring)
    assert retry.write(sent, lambda *failure: failures.append(failure)) == 0
    assert failures == [] and retry.already_written == 200
    written = monitoring.store.points(CUSTOM + "goodput_pct")
    assert sorted(labels["accelerator_type"] for labels, _, _, _ in written) == sorted(
        f"acc-{i}" for i in range(450))


def test_monitoring_refusals_for_content_stay_dead_letters_where_work_items_are_retried(monitoring):
    """A series the service refuses for another reason than its order is a dead letter in this
    mode too; the rest are written."""
    monitoring.store.refuse_next(1, "Injected: too many series on this resource")
    failures: list[tuple[Point, str]] = []
    sent = points(3)
    assert metric_writer(monitoring).write(sent, lambda *failure: failures.append(failure)) == 1
    assert [point for point, _ in failures] == sent[:1]


def test_write_to_monitoring_fails_the_bundle_and_its_retry_writes_each_series_once():
    """WriteToMonitoring on Dataflow with the service away after its first request: the bundle
    fails; the retry, whose gate stamps the points anew moments later, finds the series of the
    first request ahead of it (refused as too frequent) and writes the others: one point per
    series, no dead letter."""
    snapshots = [snapshot_at(NOW, f"run-{i}", accelerator_type="v5p") for i in range(30)]  # 2 requests
    settings = MonitoringSettings(min_interval_s=0.0, latest_now=True, **RETRIES)
    store = OutageMetricStore(min_interval_s=3600.0)  # any retry within the hour is too frequent

    def write(emulator: MonitoringEmulator) -> None:
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
            letters = (pipeline
                       | beam.Create(snapshots)
                       | WriteToMonitoring(PROJECT, settings, streaming=False, endpoint=emulator.host,
                                           fail_work_items=True))
            assert_that(letters, equal_to([]))

    with MonitoringEmulator(store=store) as emulator:
        store.outage.begin_after(1)
        with pytest.raises(WriteFailed, match="Injected outage"):
            write(emulator)
        first_try = len(written_series(store))
        store.outage.recover()
        write(emulator)
        series = written_series(store)
    assert 0 < first_try < len(series)  # the first try wrote some series, not all
    assert len(series) == len(set(series)) == len(snapshot_points(snapshots[0])) * len(snapshots)


def written_series(store: MetricStore) -> list[tuple[str, Any, Any]]:
    """The series of every point the store holds, once per point."""
    return [(metric, tuple(sorted(labels.items())), tuple(sorted(resource.items())))
            for metric in METRICS for labels, resource, _, _ in store.points(metric)]

