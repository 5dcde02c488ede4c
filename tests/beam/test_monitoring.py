"""The per-run gate of ``WriteToMonitoring``, on a test stream: each series has one writer, its
points in time order and no more often than the interval, with the run's latest values."""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that
from apache_beam.transforms.window import GlobalWindow

from pipeline.beam.transforms import PENDING_VERSION, _GateSeries, decode_pending
from pipeline.sinks.monitoring import (
    REFERENCE,
    MonitoringSettings,
    Point,
    snapshot_points,
)
from support.beam import keyed_stream, streaming_options
from support.runs import run_snapshot
from support.state import Cell, Timer
from support.steps import S


def test_gate_releases_each_run_at_most_every_interval_with_its_latest_values():
    """Four snapshots of a run within 12 s and one of another run: each first snapshot at once;
    the next no sooner than 10 s after, with the latest values (the one before it, held back, is
    replaced); each release carries every series of the run once."""
    first, second, third, fourth = (run_snapshot(after_s=s) for s in (0, 5, 9, 12))
    other = run_snapshot("run-2")
    stream = (keyed_stream()
              .add_elements([(s.run_id, s) for s in (first, other)])  # released at 0 s
              .advance_processing_time(2)
              .add_elements([("run-1", second)])  # held back until 10 s
              .advance_processing_time(2)
              .add_elements([("run-1", third)])  # replaces it: released at 10 s
              .advance_processing_time(10)
              .add_elements([("run-1", fourth)])  # at 14 s: held back until 20 s
              .advance_processing_time(20))

    def check(points: list[Point]) -> None:
        released = sorted((p.run_id, p.end_us, p.value) for p in points
                          if p.metric == REFERENCE + "total_elapsed_time")
        assert released == [("run-1", 0, first.cumulative.total_s),
                            ("run-1", 10_000_000, third.cumulative.total_s),
                            ("run-1", 20_000_000, fourth.cumulative.total_s),
                            ("run-2", 0, other.cumulative.total_s)]
        series = [p.series for p in points if p.end_us == 10_000_000]
        assert len(series) == len(set(series)) == len(snapshot_points(third))

    # The clock says 0 throughout; processing time moves the timers: a release held back is
    # stamped when its run's interval allows.
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        points = (pipeline
                  | stream
                  | beam.ParDo(_GateSeries(MonitoringSettings(), streaming=True, clock=lambda: 0.0)))
        assert_that(points, check)


def test_gate_forgets_a_run_an_interval_after_its_last_points_and_codes_its_state_as_json():
    """Called as a runner would: a snapshot released at once, a second held back (its points kept
    as versioned JSON, the same points back), released when the interval allows; an interval
    after that, with nothing new, the run's state is empty and its timers cleared or spent."""
    gate = _GateSeries(MonitoringSettings(), streaming=True, clock=lambda: now[0])
    now = [100.0]
    pending, last, release, final = Cell(), Cell(), Timer(), Timer()
    first, second = run_snapshot(after_s=0), run_snapshot(after_s=5)
    released = list(gate.process(("run-1", first), GlobalWindow(), pending, last, release, final))
    assert {p.end_us for p in released} == {100 * S} and release.times == [110 * S]
    now[0] = 103.0
    assert list(gate.process(("run-1", second), GlobalWindow(), pending, last, release, final)) == []
    assert decode_pending(pending.read()) == (second.as_of_us, snapshot_points(second))
    assert json.loads(pending.read())[0] == PENDING_VERSION
    now[0] = 110.0
    held = list(gate.on_release(pending, last, release, final))
    assert [p.value for p in held] == [p.value for p in snapshot_points(second)]
    assert {p.end_us for p in held} == {110 * S} and final.times[-1] is None and release.times[-1] == 120 * S
    now[0] = 115.0  # a firing delivered early or again: the interval is not up, nothing forgotten
    assert list(gate.on_release(pending, last, release, final)) == [] and last.read() == 110 * S
    now[0] = 120.0
    assert list(gate.on_release(pending, last, release, final)) == []
    assert (pending.read(), last.read()) == (None, None)
