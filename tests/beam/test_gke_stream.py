"""The stream's import of GKE's JobSet metrics (``--gke_metrics_project``) with TestStream: it reads
the Cloud Monitoring stand-in every interval of processing time and emits each point once, though
every read takes the last two hours again; and its options."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import grpc
import pytest
from apache_beam import coders
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.test_stream import TestStream as Stream
from apache_beam.testing.util import assert_that, equal_to

from pipeline.app.checks import UsageError
from pipeline.beam.gke import ImportGkeMetrics
from pipeline.beam.options import parse_command_line
from pipeline.emulators.monitoring import MetricStore, MonitoringEmulator
from support.beam import streaming_options
from support.gke import PROJECT, jobset_series

INTERVAL_S = 600
#: The stream's clock at its start, and the epoch of the points' times: points are dated in the
#: years the event contract allows, and TestStream's processing time, which starts at 0, is moved
#: to T0 first.
T0 = 1_790_000_000.0


@pytest.fixture
def emulator() -> Iterator[MonitoringEmulator]:
    """js-a's scheduling goodput each minute from 60 s to 1800 s of processing time, and its
    times to recover once, at 900 s (the stream's clock starts at T0)."""
    store = MetricStore()
    store.preload(f"projects/{PROJECT}", [
        jobset_series("scheduling_goodput", "js-a", [(T0 + 60.0 * m, 0.5) for m in range(1, 31)]),
        jobset_series("times_to_recover", "js-a", [(T0 + 900.0, (1, 75.0))])])
    with MonitoringEmulator(store=store) as running:
        yield running


def imported(emulator: MonitoringEmulator, stream: Stream, stopping: Any = lambda: False,
             start: float = 0.0) -> Any:
    """A pipeline of ``stream`` and the import (its clock ``start`` seconds after T0), and its
    (table, metric, end time in seconds after T0, value) per element emitted."""
    pipeline = BeamTestPipeline(options=streaming_options())
    rows = (pipeline
            | stream
            | ImportGkeMetrics(PROJECT, INTERVAL_S, emulator.host, stopping=stopping,
                               clock=lambda: T0 + start)
            | beam.Map(lambda element: (element[0], element[1]["metric"],
                                        element[1]["end_time"].timestamp() - T0, element[1]["value"])))
    return pipeline, rows


def messages() -> Stream:
    return Stream(coder=coders.TupleCoder([coders.StrUtf8Coder(), coders.BytesCoder()])).add_elements(
        [("message-1", b"{}")]).advance_processing_time(T0)


def test_reads_every_interval_emit_each_point_once(emulator):
    """Reads at 0 (nothing yet), 600, 1200, 1800 and 2400 s each take the 2 hours before them: each
    point is emitted once, by the first read after it, and no message passes."""
    stream = (messages()
              .advance_processing_time(1)      # the read at 0: no point yet
              .advance_processing_time(600)    # the read at 600: 60 .. 600 s
              .advance_processing_time(600)    # at 1200: 660 .. 1200 s, and 900 s's recovery
              .advance_processing_time(600)    # at 1800: 1260 .. 1800 s
              .advance_processing_time(600)    # at 2400: nothing new
              .advance_watermark_to_infinity())
    pipeline, rows = imported(emulator, stream)
    expected = [("jobset_metrics", "scheduling_goodput", 60.0 * m, 0.5) for m in range(1, 31)]
    assert_that(rows, equal_to([*expected, ("jobset_metrics", "times_to_recover", 900.0, 75.0)]))
    pipeline.run().wait_until_finish()


def test_a_failed_read_is_made_up_by_the_next(emulator):
    """The read at 600 s fails (PERMISSION_DENIED: the client does not retry it); the read at
    1200 s takes in its points with its own."""
    emulator.store.fail_reads_next(1, grpc.StatusCode.PERMISSION_DENIED)
    stream = (messages()
              .advance_processing_time(601)   # the read at 600 s fails
              .advance_processing_time(600)   # the read at 1200 s: 60 .. 1200 s
              .advance_watermark_to_infinity())
    pipeline, rows = imported(emulator, stream, start=600.0)
    expected = [("jobset_metrics", "scheduling_goodput", 60.0 * m, 0.5) for m in range(1, 21)]
    assert_that(rows, equal_to([*expected, ("jobset_metrics", "times_to_recover", 900.0, 75.0)]))
    pipeline.run().wait_until_finish()
    assert emulator.store.reads == 1 + 5  # the failed call, then one per metric


def test_a_refused_point_is_one_dead_letter(emulator):
    """js-b's latest point, a NaN, is emitted once as a dead letter with its reason, though each
    read takes it in again; the points before it are rows."""
    emulator.store.preload(f"projects/{PROJECT}", [jobset_series(
        "scheduling_goodput", "js-b", [(T0 + 60.0, 0.5), (T0 + 120.0, 0.5), (T0 + 180.0, math.nan)])])
    stream = (messages()
              .advance_processing_time(601)   # the read at 600 s: 60 .. 180 s, the NaN refused
              .advance_processing_time(600)   # at 1200 s: the same points again, none emitted
              .advance_watermark_to_infinity())
    pipeline = BeamTestPipeline(options=streaming_options())
    emitted = (pipeline
               | stream
               | ImportGkeMetrics(PROJECT, INTERVAL_S, emulator.host, clock=lambda: T0 + 600.0)
               | beam.Filter(lambda element: element[1].get("jobset_name", "js-b") == "js-b")
               | beam.Map(lambda element: (element[0], element[1]["reason"] if element[0] == "dead_letter"
                                           else element[1]["end_time"].timestamp() - T0)))
    assert_that(emitted, equal_to([
        ("jobset_metrics", 60.0), ("jobset_metrics", 120.0),
        ("dead_letter", "kubernetes.io/jobset/scheduling_goodput: scheduling_goodput must be a fraction in "
                        "0..1, got nan")]))
    pipeline.run().wait_until_finish()


def test_a_stopping_stream_reads_nothing(emulator):
    """Once the job is stopping, a due read reads nothing."""
    stream = messages().advance_processing_time(601).advance_watermark_to_infinity()
    pipeline, rows = imported(emulator, stream, stopping=lambda: True)
    assert_that(rows, equal_to([]))
    pipeline.run().wait_until_finish()


@pytest.mark.parametrize(("argv", "refusal"), [
    (["--gke_metrics_project=p-1234", "--events=e.jsonl", "--duckdb=g.duckdb"],
     "--gke_metrics_project has no effect in a batch replay"),
    (["--streaming", "--subscription=projects/p/subscriptions/s", "--duckdb=g.duckdb",
      "--gke_metrics_interval_s=60"], "--gke_metrics_interval_s needs --gke_metrics_project"),
    (["--streaming", "--subscription=projects/p/subscriptions/s", "--monitoring_project=p-1234",
      "--gke_metrics_project=p-1234"], "--gke_metrics_project needs --duckdb or --bigquery_dataset"),
    (["--streaming", "--subscription=projects/p/subscriptions/s", "--duckdb=g.duckdb",
      "--monitoring_endpoint=127.0.0.1:8086"], "--monitoring_endpoint needs --monitoring_project or "
                                               "--gke_metrics_project"),
])
def test_options_that_do_not_hold_together(argv, refusal):
    """The import's options are the stream's, need a project, and write tables."""
    with pytest.raises(UsageError, match=refusal):
        parse_command_line(argv)


def test_the_endpoint_serves_the_import_alone():
    """--monitoring_endpoint with --gke_metrics_project alone is the stand-in the import reads."""
    options = parse_command_line(["--streaming", "--subscription=projects/p/subscriptions/s",
                                  "--duckdb=g.duckdb", "--gke_metrics_project=p-1234",
                                  "--monitoring_endpoint=127.0.0.1:8086"])
    assert (options.gke_metrics_project, options.gke_metrics_interval_s, options.monitoring_endpoint) == (
        "p-1234", 300.0, "127.0.0.1:8086")
