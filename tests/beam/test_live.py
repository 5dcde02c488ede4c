"""The streaming run tracker with TestStream: processing-time timers, duplicates, silence, cleanup.

Every test adds its messages at processing time 0 (the injected clock says 0 too), then moves
processing time on so that the timers fire; each test says which timer fires when.
"""

from __future__ import annotations

import functools
from typing import Any

import apache_beam as beam
import duckdb
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.test_stream import TestStream as Stream
from apache_beam.testing.util import assert_that

from pipeline.beam.live import DecodedStates, TrackRunsLive
from pipeline.beam.transforms import SnapshotRows, WriteToDuckDB
from pipeline.core import engine, state_coder
from pipeline.core.events import Batch, Event, parse_batch
from pipeline.core.snapshot import Snapshot
from support.beam import keyed_stream, streaming_options
from support.runs import record_ours, shape

WINDOWS = (300,)


@functools.cache
def run_batches(end: bool) -> tuple[Batch, ...]:
    """Messages of a run with one restart, with its end or still running."""
    from goodput_schemas.wire import encode_batch

    run = shape("restarted" if end else "running", seed=30)
    events = record_ours(run.attempts)
    batches = []
    for attempt_id in dict.fromkeys(e.attempt_id for e in events):
        mine = [e for e in events if e.attempt_id == attempt_id]
        for start in range(0, len(mine), 40):
            chunk = [(e.seq, e.time_us, e.kind, e.body) for e in mine[start:start + 40]]
            batch, dead = parse_batch(encode_batch("run", attempt_id, chunk).data)
            assert batch is not None and not dead
            batches.append(batch)
    return tuple(batches)


def track(stream: Stream, check: Any, stopping: Any = lambda: False, **timers: float) -> None:
    settings = {"snapshot_interval_s": 30.0, "silence_s": 300.0, "gc_after_s": 600.0, **timers}
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        tracked = pipeline | stream | TrackRunsLive(WINDOWS, clock=lambda: 0.0, stopping=stopping, **settings)
        rows = (tracked.snapshots
                | SnapshotRows()
                | beam.Filter(lambda row: row[0] == "goodput_snapshots")
                | beam.Map(lambda row: row[1]))
        assert_that(rows, check)


def engine_snapshot(batches: tuple[Batch, ...], as_of_us: int) -> Snapshot:
    state = engine.RunState("run")
    for batch in batches:
        state.add_batch(batch)
    snapshot = state.snapshot(as_of_us, WINDOWS)
    assert snapshot is not None
    return snapshot


def latest_time(batches: tuple[Batch, ...]) -> int:
    return max(batch.max_time_us for batch in batches)


def test_interval_snapshot_and_then_silence():
    """At 30 s the interval snapshot, at 300 s the silence snapshot: a stalled run whose last
    five minutes are lost, with every number the engine's for the same events and time."""
    batches = run_batches(end=False)
    latest = latest_time(batches)
    stream = (keyed_stream()
              .add_elements([("run", b) for b in batches])
              .advance_processing_time(31)    # SNAPSHOT_TIMER fires at 30 s
              .advance_processing_time(280)   # SILENCE_TIMER fires at 300 s
              .advance_watermark_to_infinity())

    def check(rows: list[dict[str, Any]]) -> None:
        cumulative = sorted((r for r in rows if r["window_s"] == 0), key=lambda r: r["snapshot_time"])
        assert len(cumulative) == 2, rows
        for row, seconds_after in zip(cumulative, (30, 300), strict=True):
            expected = engine_snapshot(batches, latest + seconds_after * 1_000_000)
            assert abs(row["goodput_pct"] - expected.cumulative.goodput_pct) < 1e-9
            assert row["disruptions"] == 1
        stalled = next(r for r in rows if r["window_s"] == 300 and r["snapshot_time"] ==
                       cumulative[1]["snapshot_time"])
        assert stalled["goodput_pct"] == 0.0

    track(stream, check)


def test_a_silent_run_is_reported_every_interval_until_gc_after_s():
    """Silent from the start: the silence snapshot at 300 s, then one every 30 s while no event
    comes, up to 600 s of silence (gc_after_s); each loses the time since the last event."""
    batches = run_batches(end=False)
    latest = latest_time(batches)
    stream = (keyed_stream()
              .add_elements([("run", b) for b in batches])
              .advance_processing_time(31)   # SNAPSHOT_TIMER at 30 s
              .advance_processing_time(900)  # SILENCE_TIMER at 300 s, 330 s, ..., 600 s
              .advance_watermark_to_infinity())

    def check(rows: list[dict[str, Any]]) -> None:
        cumulative = sorted((r for r in rows if r["window_s"] == 0), key=lambda r: r["snapshot_time"])
        assert len(cumulative) == 1 + 11, [r["snapshot_time"] for r in cumulative]
        for row, seconds_after in zip(cumulative, (30, *range(300, 601, 30)), strict=True):
            expected = engine_snapshot(batches, latest + seconds_after * 1_000_000)
            assert row["total_time_s"] == expected.cumulative.total_s
            assert abs(row["goodput_pct"] - expected.cumulative.goodput_pct) < 1e-9
        assert all(r["goodput_pct"] == 0.0 for r in rows if r["window_s"] == 60
                   and r["snapshot_time"] > cumulative[0]["snapshot_time"])

    track(stream, check)


def test_duplicates_and_reordering_do_not_change_the_final_numbers():
    """Messages delivered twice and in reverse order: an end snapshot as soon as the end is
    known, and the interval snapshot that follows equals the engine's on the distinct events."""
    batches = run_batches(end=True)
    shuffled = list(reversed(batches)) + list(batches[:3])
    stream = (keyed_stream()
              .add_elements([("run", b) for b in shuffled])
              .advance_processing_time(31)  # SNAPSHOT_TIMER fires at 30 s
              .advance_watermark_to_infinity())

    def check(rows: list[dict[str, Any]]) -> None:
        cumulative = [r for r in rows if r["window_s"] == 0]
        assert any(r["ended"] for r in cumulative)
        final = max(cumulative, key=lambda r: r["snapshot_time"])
        expected = engine_snapshot(batches, latest_time(batches))
        assert final["ended"] and final["disruptions"] == 1
        assert abs(final["goodput_pct"] - expected.cumulative.goodput_pct) < 1e-9
        assert final["total_time_s"] == expected.cumulative.total_s

    track(stream, check)


def test_state_is_cleared_after_the_run_ends():
    """After gc_after_s the ended run's state is gone: the same messages arriving again are news."""
    batches = run_batches(end=True)
    stream = (keyed_stream()
              .add_elements([("run", b) for b in batches])
              .advance_processing_time(10)
              .add_elements([("run", batches[-1])])   # a redelivery: the run has ended already
              .advance_processing_time(700)           # GC_TIMER fires at 600 s
              .add_elements([("run", b) for b in batches])  # after clean-up: a new state
              .advance_processing_time(10)
              .advance_watermark_to_infinity())

    def check(rows: list[dict[str, Any]]) -> None:
        ends = [r for r in rows if r["window_s"] == 0 and r["ended"]]
        assert len(ends) == 2, ends  # the first end, and the end after clean-up; no redelivery
        final = engine_snapshot(batches, latest_time(batches))
        assert {r["max_productive_step"] for r in ends} == {final.max_productive_step}

    track(stream, check, snapshot_interval_s=10_000.0, silence_s=10_000.0)


def test_the_end_of_the_input_reports_what_no_snapshot_has(tmp_path):
    """The input ends (a drained job) before the interval is up: FINAL_TIMER reports the run once,
    with the engine's numbers; a run already reported at its end is not reported again.

    Its rows carry the end of the window as their timestamp, which ``assert_that`` (a GroupByKey)
    drops as late, so they are read back from the streaming DuckDB writer, as in production."""
    pending, ended = run_batches(end=False), run_batches(end=True)
    stream = (keyed_stream()
              .add_elements([("pending", b) for b in pending] + [("ended", b) for b in ended])
              .advance_processing_time(10)
              .advance_watermark_to_infinity())
    database = tmp_path / "live.duckdb"
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        tracked = pipeline | stream | TrackRunsLive(WINDOWS, 10_000.0, 10_000.0, 600.0, clock=lambda: 0.0)
        tracked.snapshots | SnapshotRows() | WriteToDuckDB(str(database))
    with duckdb.connect(str(database), read_only=True) as connection:
        rows = connection.execute("SELECT run_id, goodput_pct, max_productive_step, ended "
                                  "FROM goodput_snapshots WHERE window_s = 0 ORDER BY run_id").fetchall()
    expected = engine_snapshot(pending, latest_time(pending))
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("ended", engine_snapshot(ended, latest_time(ended)).max_productive_step, True),
        ("pending", expected.max_productive_step, False)]
    assert abs(rows[1][1] - expected.cumulative.goodput_pct) < 1e-9


def test_while_stopping_every_message_is_reported_at_once():
    """While the job is stopping (the launcher stopping a DirectRunner job) there is one snapshot
    per new message, none for a redelivery, and no interval timer is waited for."""
    batches = run_batches(end=False)
    stream = (keyed_stream()
              .add_elements([("run", b) for b in batches[:3]])
              .add_elements([("run", batches[0])])  # a redelivery
              .advance_processing_time(1))
    expected = [engine_snapshot(batches[:n], latest_time(batches[:n])).last_step for n in (1, 2, 3)]

    def check(rows: list[dict[str, Any]]) -> None:
        assert sorted(r["last_step"] for r in rows if r["window_s"] == 0) == expected

    track(stream, check, stopping=lambda: True, snapshot_interval_s=10_000.0)


def _state_with_steps(run_id: str, steps: int) -> tuple[bytes, engine.RunState]:
    state = engine.RunState(run_id)
    for step in range(steps):
        state.add(Event(run_id, "a", step, 1_800_000_000_000_000 + step * 1_000_000, "step_start",
                               {"step": step}))
    return state_coder.encode_state(state), state


def test_decoded_states_are_kept_while_their_bytes_are_what_beam_stores():
    """A run's state is decoded once, then reused until the stored bytes change."""
    kept = DecodedStates(max_bytes=1 << 20)
    encoded, _ = _state_with_steps("run", 10)
    first = kept.get("run", encoded)
    assert kept.get("run", bytes(encoded)) is first  # equal bytes, even in another object
    newer, _ = _state_with_steps("run", 11)
    assert kept.get("run", newer) is not first
    assert len(kept.get("run", newer).attempts["a"].steps) == 11


def test_decoded_states_drop_the_least_recently_used_past_their_byte_budget():
    """Past the budget the least recently used state goes; the newest always stays."""
    encoded, _ = _state_with_steps("a", 100)
    kept = DecodedStates(max_bytes=2 * len(encoded))
    for run_id in ("a", "b", "c"):
        kept.put(run_id, _state_with_steps(run_id, 100)[0], engine.RunState(run_id))
    assert kept.get("a", _state_with_steps("a", 100)[0]).attempts  # decoded again: it was dropped
    tiny = DecodedStates(max_bytes=1)
    tiny.put("big", encoded, engine.RunState("big"))
    assert tiny.get("big", encoded).attempts == {}  # the kept (empty) object, not a decode
