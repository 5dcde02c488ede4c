"""The stream's import of GKE's JobSet metrics (``--gke_metrics_project``): every interval, the
points ``goodput import gke-metrics`` would read of the last ``LOOKBACK_S``, as rows of the
``jobset_metrics`` table for the stream's table sinks (``pipeline.app.gke`` reads and makes them).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import PickleCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PCollection
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from pipeline.app.gke import JOBSET_METRICS, LOOKBACK_S, read_all, series_key
from pipeline.core.rows import DEAD_LETTER, Element, dead_letter_row, timestamp
from pipeline.sinks.retries import never

_LOG = logging.getLogger(__name__)


class ImportGkeMetrics(beam.PTransform):
    """GKE's JobSet metrics of ``project``, read from Cloud Monitoring (``endpoint``: a local
    stand-in) every ``interval_s`` while the stream runs, as ("jobset_metrics", row) elements.

    Each read takes the ``LOOKBACK_S`` before it, since GKE's points come up to an hour late; of
    those, only the points after the last one emitted of their series are emitted, so that the
    table grows by what is new; a point refused (``pipeline.app.gke.point_problem``) is emitted
    once, as a ("dead_letter", row) element. (A relaunched stream reads its first lookback again: the
    ``latest_jobset_metrics`` view counts each point once.) A read that fails is logged and
    counted, and the next one takes its points in, up to the lookback.

    The reads are timed by a processing-time timer of one key, armed by an Impulse. The input,
    the stream's messages, is only its clock: none of them passes, but while the stream reads,
    their watermark keeps the timer's window open (on the Impulse's alone, which ends at once,
    the timer would never fire again). PeriodicImpulse would say it more directly, but the local
    stream's runner (the BundleBasedDirectRunner) cannot run it.
    """

    def __init__(self, project: str, interval_s: float, endpoint: str | None = None, *,
                 stopping: Callable[[], bool] = never, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.project, self.interval_s, self.endpoint = project, interval_s, endpoint
        self.stopping, self.clock = stopping, clock

    def expand(self, messages: PCollection) -> Any:
        return ((messages.pipeline | "Start" >> beam.Impulse(),
                 messages | "NoMessage" >> beam.FlatMap(lambda _: ()))
                | "Clock" >> beam.Flatten()
                | "OneKey" >> beam.Map(lambda _: ("gke", b""))
                | "Read" >> beam.ParDo(_ReadEveryInterval(self.project, self.interval_s, self.endpoint,
                                                          self.stopping, self.clock)))


class _ReadEveryInterval(beam.DoFn):
    """On one key: reads at once, then every ``interval_s`` of processing time, and emits the
    points newer than the last one emitted of their series (``LATEST``: series to end time, for
    the series seen in the last lookback)."""

    READ_TIMER = TimerSpec("read", TimeDomain.REAL_TIME)
    LATEST = ReadModifyWriteStateSpec("latest", PickleCoder())

    def __init__(self, project: str, interval_s: float, endpoint: str | None, stopping: Callable[[], bool],
                 clock: Callable[[], float]) -> None:
        self.project, self.interval_s, self.endpoint = project, interval_s, endpoint
        self.stopping, self.clock = stopping, clock
        self.points = Metrics.counter("goodput", "gke_metrics_points_imported")
        self.failures = Metrics.counter("goodput", "gke_metrics_reads_failed")
        self.refused = Metrics.counter("goodput", "gke_metrics_points_refused")

    def setup(self) -> None:
        from pipeline.sinks.monitoring import make_client

        self._client = make_client(self.endpoint)

    def process(self, element: tuple[str, bytes], read: Any = beam.DoFn.TimerParam(READ_TIMER)) -> None:
        read.set(Timestamp(self.clock()))

    @on_timer(READ_TIMER)
    def on_read(self, due: Any = beam.DoFn.TimestampParam, read: Any = beam.DoFn.TimerParam(READ_TIMER),
                latest: Any = beam.DoFn.StateParam(LATEST)) -> Iterator[Element]:
        read.set(due + self.interval_s)
        if self.stopping():
            return
        from google.api_core.exceptions import GoogleAPIError

        end_us = due.micros
        try:
            rows, refused = read_all(self._client, self.project, end_us - LOOKBACK_S * 1_000_000, end_us)
        except GoogleAPIError as error:
            self.failures.inc()
            _LOG.warning("Reading GKE's JobSet metrics of projects/%s failed: %s; the next read, in %g s, "
                         "takes their points in", self.project, error, self.interval_s)
            return
        # A refused point is a dead letter, once: it counts as emitted for its series, as a row
        # does (a read's points all end within its interval, so its end time is a time).
        read = [(series_key(row), row["end_time"], (JOBSET_METRICS, row)) for row in rows] + [
            (point.series, timestamp(point.end_us), (DEAD_LETTER, dead_letter_row(point.letter)))
            for point in refused]
        seen: dict[tuple[Any, ...], datetime.datetime] = latest.read() or {}
        new = [(key, end, element) for key, end, element in read if key not in seen or end > seen[key]]
        for key, end, _ in new:
            seen[key] = max(seen.get(key, end), end)
        oldest = timestamp(end_us - LOOKBACK_S * 1_000_000)
        latest.write({key: end for key, end in seen.items() if end > oldest})
        letters = sum(table == DEAD_LETTER for *_, (table, _) in new)
        self.points.inc(len(new) - letters)
        self.refused.inc(letters)
        for *_, element in new:
            yield element
