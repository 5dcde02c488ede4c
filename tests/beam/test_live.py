"""The streaming run tracker with TestStream: timers, duplicates, silence, lag, drains, cleanup.

Every test adds its messages at processing time 0 (the injected clock says 0 too), published
(their timestamps) at ``PUBLISHED`` s unless it says otherwise: before the clock, as a publish
time always is. It then moves processing time on so that SNAPSHOT_TIMER fires, and the watermark
(what the pipeline has read of the publish times) so that QUIET_TIMER fires; each test says which
timer fires when. The watermark's move to infinity at the end is the input's end (a drain).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import itertools
import pickle
import weakref
from typing import Any

import apache_beam as beam
import duckdb
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.test_stream import TestStream as Stream
from apache_beam.testing.util import assert_that
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from goodput_schemas.wire import encode_batch
from pipeline.beam import direct_runner, live
from pipeline.beam.live import DecodedStates, TrackRunsLive
from pipeline.beam.transforms import SnapshotRows, WriteToDuckDB
from pipeline.core import engine, state_coder
from pipeline.core.detect import DetectionSettings
from pipeline.core.events import Batch, Event, encode_events, parse_batch
from pipeline.core.rows import timestamp
from pipeline.core.snapshot import Snapshot
from pipeline.sinks.raw_events import DuckDBEvents
from support.beam import keyed_stream, replay, streaming_options, table
from support.runs import record_ours, shape
from support.state import Bag, Cell, Timer
from support.steps import S, attempt_events, host_events, host_summaries, step_times

WINDOWS = (300,)
#: When the tests' messages are published, in seconds: long before the clock's 0, so that QUIET_TIMER
#: is a silence, not the input's end.
PUBLISHED = -10_000


def published(seconds_after: float) -> float:
    """The watermark ``seconds_after`` the tests' messages were published."""
    return PUBLISHED + seconds_after


@functools.cache
def run_batches(end: bool, run_id: str = "run") -> tuple[Batch, ...]:
    """Messages of a run with one restart, with its end or still running."""
    run = shape("restarted" if end else "running", seed=30)
    events = record_ours(run.attempts)
    batches = []
    for attempt_id in dict.fromkeys(e.attempt_id for e in events):
        mine = [e for e in events if e.attempt_id == attempt_id]
        for start in range(0, len(mine), 40):
            chunk = [(e.seq, e.time_us, e.kind, e.body) for e in mine[start:start + 40]]
            batch, dead = parse_batch(encode_batch(run_id, attempt_id, chunk).data)
            assert batch is not None and not dead
            batches.append(batch)
    return tuple(batches)


#: No hang is looked for before 300 s of silence, unless a test says so.
NO_EARLY_HANG = DetectionSettings(hang_min_s=3600)


def track(stream: Stream, check: Any, stopping: Any = lambda: False, table: str = "goodput_snapshots",
          detection: DetectionSettings = NO_EARLY_HANG, clock: Any = lambda: 0.0, **timers: float) -> None:
    settings = {"snapshot_interval_s": 30.0, "silence_s": 300.0, "gc_after_s": 600.0, **timers}
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        tracked = pipeline | stream | TrackRunsLive(WINDOWS, clock=clock, stopping=stopping,
                                                    detection=detection, **settings)
        rows = (tracked.snapshots
                | SnapshotRows()
                | beam.Filter(lambda row: row[0] == table)
                | beam.Map(lambda row: row[1]))
        assert_that(rows, check)


def engine_snapshot(batches: tuple[Batch, ...], as_of_us: int) -> Snapshot:
    state = engine.RunState(batches[0].run_id)
    for batch in batches:
        state.add_batch(batch)
    snapshot = state.snapshot(as_of_us, WINDOWS)
    assert snapshot is not None
    return snapshot


def latest_time(batches: tuple[Batch, ...]) -> int:
    return max(batch.max_time_us for batch in batches)


def up_to_the_restart(batches: tuple[Batch, ...]) -> tuple[Batch, ...]:
    """The batches up to the first of the run's second attempt, whose message is reported at once."""
    first = batches[0].attempt_id
    return batches[:next(i for i, batch in enumerate(batches) if batch.attempt_id != first) + 1]


def restart_snapshots(batches: tuple[Batch, ...]) -> list[Snapshot]:
    """What the restart's message reports at once, no snapshot having reported the run before:
    the run as of its first attempt's last event, and as of the restart's message."""
    upto = up_to_the_restart(batches)
    down = max(batch.max_time_us for batch in upto[:-1])
    return [engine_snapshot(upto, down), engine_snapshot(upto, latest_time(upto))]


def test_interval_snapshot_and_then_silence():
    """The restart at once (with the run as it went down before it), at 30 s the interval
    snapshot, at 300 s the silence snapshot: a stalled run whose last five minutes are lost,
    with every number the engine's for the same events and time."""
    batches = run_batches(end=False)
    latest = latest_time(batches)
    stream = (keyed_stream(PUBLISHED)
              .add_elements([("run", b) for b in batches])
              .advance_processing_time(31)                # SNAPSHOT_TIMER fires at 30 s
              .advance_watermark_to(published(310))      # QUIET_TIMER fires at 300 s
              .advance_watermark_to_infinity())

    def check(rows: list[dict[str, Any]]) -> None:
        cumulative = sorted((r for r in rows if r["window_s"] == 0), key=lambda r: r["snapshot_time"])
        assert len(cumulative) == 4, rows
        expected = [*restart_snapshots(batches),
                    *(engine_snapshot(batches, latest + s * 1_000_000) for s in (30, 300))]
        for row, snapshot in zip(cumulative, expected, strict=True):
            assert row["snapshot_time"] == timestamp(snapshot.as_of_us)
            assert abs(row["goodput_pct"] - snapshot.cumulative.goodput_pct) < 1e-9
        assert [row["disruptions"] for row in cumulative] == [0, 1, 1, 1]
        stalled = next(r for r in rows if r["window_s"] == 300 and r["snapshot_time"] ==
                       cumulative[3]["snapshot_time"])
        assert stalled["goodput_pct"] == 0.0

    track(stream, check)


def test_a_silent_run_is_reported_every_interval_until_gc_after_s():
    """Silent from the start: the silence snapshot at 300 s, then one every 30 s while no event
    comes, up to 600 s of silence (gc_after_s); each loses the time since the last event."""
    batches = run_batches(end=False)
    latest = latest_time(batches)
    stream = (keyed_stream(PUBLISHED)
              .add_elements([("run", b) for b in batches])
              .advance_processing_time(31)             # SNAPSHOT_TIMER at 30 s
              .advance_watermark_to(published(900))   # QUIET_TIMER at 300 s, 330 s, ..., 600 s
              .advance_watermark_to_infinity())

    def check(rows: list[dict[str, Any]]) -> None:
        cumulative = sorted((r for r in rows if r["window_s"] == 0), key=lambda r: r["snapshot_time"])
        assert len(cumulative) == 2 + 1 + 11, [r["snapshot_time"] for r in cumulative]
        expected = [*restart_snapshots(batches),
                    *(engine_snapshot(batches, latest + s * 1_000_000) for s in (30, *range(300, 601, 30)))]
        for row, snapshot in zip(cumulative, expected, strict=True):
            assert row["total_time_s"] == snapshot.cumulative.total_s
            assert abs(row["goodput_pct"] - snapshot.cumulative.goodput_pct) < 1e-9
        assert all(r["goodput_pct"] == 0.0 for r in rows if r["window_s"] == 60
                   and r["snapshot_time"] > cumulative[2]["snapshot_time"])

    track(stream, check)


def test_a_run_with_no_step_is_found_hung_within_its_threshold_and_one_interval():
    """No event after the messages: the silence timer fires at the hang threshold (60 s, the
    run's steps being much shorter), before the 300 s of silence, and its snapshot finds the
    hang: started at the last step, found 60 s after it, reported once. (The first attempt's
    last step came 67 s before the restart, and nothing of it after: a crash, no hang.)"""
    batches = run_batches(end=False)
    last_step = max(t for batch in batches for t in batch.step_times)
    stream = (keyed_stream(PUBLISHED)
              .add_elements([("run", b) for b in batches])
              .advance_processing_time(31)            # SNAPSHOT_TIMER at 30 s
              .advance_watermark_to(published(61))   # QUIET_TIMER at 60 s: the hang threshold
              .advance_watermark_to_infinity())

    def check(rows: list[dict[str, Any]]) -> None:
        assert [(r["kind"], r["ended_at"] is None) for r in rows] == [("hang", True)]
        (row,) = [r for r in rows if r["started_at"] == timestamp(last_step)]
        assert (row["ended_at"], row["host"]) == (None, None)
        assert row["detected_at"] == row["changed_at"] == timestamp(last_step + 60_000_000)

    track(stream, check, table="run_anomalies", detection=DetectionSettings())


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


def test_a_worker_without_the_run_decoded_replays_its_log_and_compacts_to_the_same_numbers(
        monkeypatch: pytest.MonkeyPatch):
    """Two runs' messages interleaved on a worker that keeps one decoded state at a time: every
    message and timer reads its run's stored state and log and replays the log. Compaction is
    due at every snapshot timer. The end snapshots are still the engine's for the same events."""
    monkeypatch.setattr(live, "DECODED_STATES_MAX_BYTES", 1)
    monkeypatch.setattr(live, "COMPACT_MIN_BYTES", 0)
    runs = {run_id: run_batches(end=True, run_id=run_id) for run_id in ("run", "other")}
    interleaved = [(batch.run_id, batch) for pair in zip(*runs.values(), strict=True)
                   for batch in pair]
    half = len(interleaved) // 2
    stream = (keyed_stream()
              .add_elements(interleaved[:half])
              .advance_processing_time(31)  # SNAPSHOT_TIMER: the logs are compacted
              .add_elements(interleaved[half:])
              .advance_processing_time(31)
              .advance_watermark_to_infinity())

    def check(rows: list[dict[str, Any]]) -> None:
        for run_id, batches in runs.items():
            ends = [r for r in rows if r["run_id"] == run_id and r["window_s"] == 0 and r["ended"]]
            expected = engine_snapshot(batches, latest_time(batches))
            assert ends and abs(ends[-1]["goodput_pct"] - expected.cumulative.goodput_pct) < 1e-9
            assert ends[-1]["max_productive_step"] == expected.max_productive_step

    track(stream, check)


def test_state_is_cleared_after_the_run_ends():
    """gc_after_s after its last message the ended run's state is gone: the same messages
    arriving again are news."""
    batches = run_batches(end=True)
    stream = (keyed_stream(PUBLISHED)
              .add_elements([("run", b) for b in batches])
              .advance_processing_time(10)
              .add_elements([("run", batches[-1])])   # a redelivery: the run has ended already
              .advance_watermark_to(published(700))   # QUIET_TIMER forgets the run at 600 s
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
    with the engine's numbers; a run already reported at its end is not reported again. (Each
    run's restart was reported at once, before, with the run as it went down.)

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
                                  "FROM goodput_snapshots WHERE window_s = 0 "
                                  "ORDER BY run_id, snapshot_time").fetchall()
    assert [r[0] for r in rows] == ["ended"] * 3 + ["pending"] * 3
    restarts = [snapshot for batches in (ended, pending) for snapshot in restart_snapshots(batches)]
    assert [r[2] for r in rows[:2] + rows[3:5]] == [snapshot.max_productive_step for snapshot in restarts]
    rows = rows[2::3]
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


def test_decoded_states_are_kept_while_their_token_is_the_stored_one():
    """A run's decoded state is reused while the stored record's token is the one it was kept
    with; any other token means Beam stores another state (written elsewhere, or a retry)."""
    kept = DecodedStates(max_bytes=1 << 20)
    encoded, state = _state_with_steps("run", 10)
    kept.put("run", 7, len(encoded), state)
    assert kept.get("run", 7) is state
    assert kept.get("run", 8) is None
    assert kept.get("other", 7) is None


def test_decoded_states_drop_the_least_recently_used_past_their_byte_budget():
    """Past the budget the least recently used state goes, as a kept state grows too (its
    archive read); the newest always stays."""
    kept = DecodedStates(max_bytes=2 * 1000)
    for token, run_id in enumerate(("a", "b", "c")):
        kept.put(run_id, token, 1000, engine.RunState(run_id))
    assert kept.get("a", 0) is None and kept.get("c", 2) is not None
    tiny = DecodedStates(max_bytes=1)
    tiny.put("big", 1, 1000, engine.RunState("big"))
    assert tiny.get("big", 1) is not None
    kept.grow("b", 1500)  # b read its archive: with c, past the budget
    assert kept.get("b", 1) is None and kept.get("c", 2) is not None


def test_state_written_per_message_is_the_message_not_the_history(tmp_path):
    """A run restored with 20,000 steps of history, then 200 messages of 2 steps: the whole
    state is written once, with the restore, and each later message writes its own encoding
    plus the record, whatever the history (compaction is not due within these messages). The
    worker keeps the run decoded, so a message reads only the stored record, not the state."""
    direct_runner.count_every_bundle()

    def message(first: int, count: int) -> bytes:
        records = [(seq, 1_700_000_000_000_000 + seq * 1_000_000, "step_start", {"step": seq})
                   for seq in range(first, first + count)]
        return encode_batch("run", "a", records).data

    history = [message(first, 1000) for first in range(0, 20_000, 1000)]
    later = [parse_batch(message(first, 2))[0] for first in range(20_000, 20_400, 2)]
    state = engine.RunState("run")
    for data in history:
        state.add_batch(parse_batch(data)[0])
    state.add_batch(later[0])
    whole = len(state_coder.encode_state(state))
    logged = sum(len(state_coder.encode_batch(b)) for b in later[1:])  # the first came with the history
    tables = DuckDBEvents(str(replay(history, tmp_path)))
    stream = keyed_stream().add_elements([("run", b) for b in later]).advance_watermark_to_infinity()
    pipeline = beam.Pipeline(options=streaming_options())
    _ = pipeline | stream | TrackRunsLive(WINDOWS, clock=lambda: 0.0, tables=tables)
    result = pipeline.run()
    result.wait_until_finish()

    def counted(name: str) -> int:
        [counter] = result.metrics().query(MetricsFilter().with_name(name))["counters"]
        return int(counter.committed)

    assert counted("restored_runs") == 1
    written = counted("state_bytes_written")
    assert whole + logged < written <= whole + logged + len(later) * live.Record.SIZE + 200
    assert counted("state_bytes_read") <= 2 * live.Record.SIZE * len(later)  # by messages and timers


class Tracked:
    """One run's cells and timers, and the tracker's methods called on them as a runner would."""

    def __init__(self, now: list[float], **settings: Any) -> None:
        self.fn = live.TrackRunDoFn(WINDOWS, 30.0, 300.0, 600.0, clock=lambda: now[0],
                                    **{"detection": NO_EARLY_HANG, **settings})
        self.fn.setup()
        self.cells = {"whole": Cell(), "log": Bag(), "info": Cell(), "rows": Cell(), "steps": Bag()}
        self.timers = {"snapshot": Timer(), "quiet": Timer(), "final": Timer()}

    def record(self) -> live.Record:
        return live.Record.decode(self.cells["info"].read())

    def message(self, batch: Batch, published_us: int) -> list[Snapshot]:
        return _snapshots(self.fn.process(("run", batch), Timestamp(micros=published_us), GlobalWindow(),
                                          *self.cells.values(), *self.timers.values()))

    def snapshot_fires(self, at_us: int) -> list[Snapshot]:
        return _snapshots(self.fn.on_snapshot("run", Timestamp(micros=at_us), *self.cells.values()))

    def quiet_fires(self, at_us: int) -> list[Snapshot]:
        return _snapshots(self.fn.on_quiet("run", Timestamp(micros=at_us), *self.cells.values(),
                                           *self.timers.values()))

    def final_fires(self) -> list[Snapshot]:
        return _snapshots(self.fn.on_final("run", *self.cells.values()))


def _snapshots(outputs: Any) -> list[Snapshot]:
    return [output for output in outputs if isinstance(output, Snapshot)]


def test_a_timer_firing_that_is_not_the_pending_one_reports_nothing():
    """A runner may deliver a timer's firing twice, or the firing of a timer set again since
    (Beam's DirectRunner did, under a backlog, and a silent run was then reported over and over):
    only the pending timer's firing reports, known to the millisecond (Dataflow keeps a timer's
    time to the millisecond)."""
    batches = run_batches(end=False)
    now = [0.0]
    run = Tracked(now)
    run.message(batches[0], PUBLISHED * S)
    now[0] = 10.000_457  # the second message: silence due 310.000457 s after the first, the snapshot at 30 s
    run.message(batches[1], PUBLISHED * S + 10_000_457)
    assert run.record().due_us == 30 * S and run.timers["quiet"].times[-1] == (PUBLISHED + 310) * S + 457
    assert len(run.snapshot_fires(30 * S)) == 1
    assert run.snapshot_fires(30 * S) == []  # delivered twice
    assert run.quiet_fires((PUBLISHED + 300) * S) == []  # set again since, for 310 s
    [silent] = run.quiet_fires((PUBLISHED + 310) * S)  # its time to the millisecond
    assert silent.as_of_us == latest_time(batches[:2]) + 300 * S
    assert run.record().quiet_us == (PUBLISHED + 340) * S + 457  # the next, an interval on
    assert run.quiet_fires((PUBLISHED + 310) * S) == []  # delivered twice
    now[0] = 500.0
    run.message(batches[2], (PUBLISHED + 500) * S)  # the next interval snapshot: at 510 s
    assert run.snapshot_fires(30 * S) == []  # the one of 30 s, delivered again late
    assert len(run.snapshot_fires(510 * S)) == 1


def test_a_run_that_never_ends_leaves_nothing_behind_gc_after_s_after_its_last_message():
    """A run with no end, silent: reported every interval up to gc_after_s after its last message
    (600 s, on publish time), then every state cell is empty and every timer cleared; the next
    message of the run is a new run's first."""
    batches = run_batches(end=False)
    now = [0.0]
    run = Tracked(now)
    for batch in batches:
        run.message(batch, PUBLISHED * S)
    now[0] = 1_000.0  # the clock past every firing: each is a silence, not the input's end
    fired = 0
    while (due := run.record().quiet_us) < (PUBLISHED + 600) * S:
        assert len(run.quiet_fires(due)) == 1
        fired += 1
    assert fired == 1 + (600 - 300) // 30 - 1  # at 300 s, 330 s, ..., 570 s
    [last] = run.quiet_fires((PUBLISHED + 600) * S)
    assert last.as_of_us == latest_time(batches) + 600 * S
    assert {name: (cell.value, cell.items) for name, cell in run.cells.items()} == {
        name: (None, []) for name in run.cells}
    assert [timer.times[-1] for timer in run.timers.values()] == [None, None, None]
    # set by the first message, and by the first after the restart's report, then cleared
    assert run.timers["snapshot"].times == [30 * S, 30 * S, None]
    assert run.fn.store.decoded.get("run", 0) is None
    assert run.final_fires() == [] and run.quiet_fires((PUBLISHED + 600) * S) == []
    run.message(batches[0], (PUBLISHED + 700) * S)
    assert run.record().log_entries == 0 and run.record().whole_bytes  # written whole: a new run


def test_a_quiet_timer_that_fires_before_its_time_on_the_clock_is_the_inputs_end():
    """A drain moves the watermark to infinity at once: QUIET_TIMER fires though the clock is
    still before its time. That reports nothing and sets no timer; FINAL_TIMER then reports the
    run once, and nothing follows it."""
    batches = run_batches(end=False)
    now = [0.0]
    run = Tracked(now, detection=DetectionSettings())
    for batch in batches:
        run.message(batch, 0)
    now[0] = 20.0  # a drain 20 s after the messages: the hang threshold, 60 s, is not up
    quiet = run.record().quiet_us
    assert run.quiet_fires(quiet) == []
    assert run.record().quiet_us == quiet and run.timers["quiet"].times[-1] == quiet
    [final] = run.final_fires()
    assert final.as_of_us == latest_time(batches) + 20 * S and final.open_anomalies["hang"] == 0
    assert run.final_fires() == [] and run.snapshot_fires(run.timers["snapshot"].times[-1]) == []


#: The processing time the stream's clock says: set by ``Arrive`` as messages come.
_NOW = [0.0]


def _processing_time() -> float:
    return _NOW[0]


class Arrive(beam.DoFn):
    """(run, (arrival s, batch)) in, (run, batch) out, the clock set to the batch's arrival."""

    def process(self, element: tuple[str, tuple[float, Batch]]) -> Any:
        run_id, (arrival_s, batch) = element
        _NOW[0] = arrival_s
        yield run_id, batch


def test_the_stream_writes_the_anomaly_rows_the_batch_replay_writes(tmp_path):
    """A run of 1 s steps, 30 % slower from 10 to 25 minutes in, stuck for 200 s at 30 minutes,
    with a host among 8 that is 30 % slower from 10 to 30 minutes, to its end at 40 minutes.
    Its messages come 30 s of event time at a time, 30 s apart, so every snapshot is up to 30 s
    ahead of the events still to come: the stream writes the replay's run_anomalies rows, each
    once, and the end closes the slowdown and the straggler."""
    start = 1_750_000_000 * S
    times = step_times(2_400, 1.0, slow=(600, 1500, 0.3), gaps={1800: 200.0}, start_us=start)
    end = times[-1] + S
    summaries = [s for s in host_summaries(8, 45, slow=(3, 600, 1800, 0.3), start_us=start) if s[1] < end]
    events = sorted(attempt_events("a", times, end_us=end) + host_events(summaries), key=lambda e: e.time_us)
    chunks = [list(chunk) for _, chunk in itertools.groupby(
        events, key=lambda e: (e.time_us - start) // (30 * S))]
    messages = [[encode_events([e for e in chunk if e.attempt_id == attempt])
                 for attempt in dict.fromkeys(e.attempt_id for e in chunk)] for chunk in chunks]
    stream = keyed_stream()
    for chunk, datas in enumerate(messages):
        stream = stream.add_elements([("run", (30.0 * chunk, parse_batch(data)[0])) for data in datas])
        stream = stream.advance_processing_time(30)
    stream = stream.advance_watermark_to_infinity()
    replayed = table(replay([data for datas in messages for data in datas], tmp_path), "run_anomalies")
    assert {(row[1], row[2]) for row in replayed} == {
        ("slowdown", None), ("hang", None), ("straggler", "host-3")} and len(replayed) == 6

    def check(streamed: list[tuple[Any, ...]]) -> None:
        naive = [tuple(v.replace(tzinfo=None) if isinstance(v, datetime.datetime) else v for v in row)
                 for row in streamed]  # as DuckDB gives them back
        assert sorted(naive, key=repr) == sorted(replayed, key=repr)

    _NOW[0] = 0.0
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        tracked = pipeline | stream | beam.ParDo(Arrive()) | TrackRunsLive(WINDOWS, clock=_processing_time)
        rows = (tracked.snapshots
                | SnapshotRows()
                | beam.Filter(lambda row: row[0] == "run_anomalies")
                | beam.Map(lambda row: tuple(row[1].values())))
        assert_that(rows, check)


def test_a_host_summary_too_late_to_be_scored_is_counted():
    """Ten minutes of a run's steps and of summaries of 4 hosts, each message reported as it
    comes (a stopping stream), then a summary dated before them: left out of the scores, and
    counted."""
    start = 1_750_000_000 * S
    summaries = sorted(attempt_events("a", step_times(600, 1.0, start_us=start))
                       + host_events(host_summaries(4, 10, start_us=start)), key=lambda e: e.time_us)
    late = Event("run", "timer-late", 0, start + 60 * S, "host_steps",
                 {"host": "host-9", "count": 60, "mean_s": 1.0, "max_s": 1.0})
    batches = [parse_batch(encode_events([event]))[0] for event in [*summaries, late]]
    pipeline = beam.Pipeline(options=streaming_options())
    _ = (pipeline | keyed_stream().add_elements([("run", b) for b in batches]).advance_watermark_to_infinity()
         | TrackRunsLive(WINDOWS, clock=lambda: 0.0, stopping=lambda: True))
    result = pipeline.run()
    result.wait_until_finish()
    [counter] = result.metrics().query(MetricsFilter().with_name("late_host_summaries"))["counters"]
    assert counter.committed == 1


def test_a_pipeline_three_hang_thresholds_behind_finds_the_run_that_stopped_and_no_other(tmp_path):
    """Two runs of 1 s steps publish a message every 10 s; "stuck" stops after 60 s, "busy" goes
    on for 800 s. The pipeline reads each message 180 s after it was published (three times the
    hang threshold, 60 s: a backlog after an outage), then catches up. Silence goes by what it has
    read: "stuck" is found hung, 60 s after its last step; "busy" has no anomaly and no silent
    snapshot, though the clock was 180 s past its latest message read, again and again."""
    start = 1_750_000_000 * S
    runs = {"busy": step_times(800, 1.0, noise=0.0, compile_s=0.0, start_us=start),
            "stuck": step_times(60, 1.0, noise=0.0, compile_s=0.0, start_us=start)}
    stream, clock_s = keyed_stream(-1), 0.0
    for published_s in range(0, 810, 10):
        read_s = published_s + 180 if published_s < 600 else 780 + (published_s - 600) / 10  # catching up
        stream, clock_s = stream.advance_processing_time(read_s - clock_s), read_s
        elements = []
        for run_id, times in runs.items():
            events = [dataclasses.replace(event, run_id=run_id) for event in attempt_events("a", times)
                      if published_s * S <= event.time_us - start + 10 * S < (published_s + 10) * S]
            if events:
                elements.append((run_id, (read_s, parse_batch(encode_events(events))[0])))
        stream = stream.advance_watermark_to(published_s).add_elements(elements)
    stream = stream.advance_watermark_to_infinity()
    database = tmp_path / "lag.duckdb"
    _NOW[0] = 0.0
    pipeline = beam.Pipeline(options=streaming_options())
    tracked = (pipeline | stream | beam.ParDo(Arrive())
               | TrackRunsLive(WINDOWS, clock=_processing_time, detection=DetectionSettings()))
    tracked.snapshots | SnapshotRows() | WriteToDuckDB(str(database))
    pipeline.run().wait_until_finish()
    with duckdb.connect(str(database), read_only=True) as connection:
        anomalies = connection.execute("SELECT run_id, kind, epoch_us(started_at), epoch_us(detected_at) "
                                       "FROM run_anomalies").fetchall()
        busy = connection.execute("SELECT count(*), min(goodput_pct) FROM goodput_snapshots WHERE run_id = "
                                  "'busy' AND window_s = 300 AND epoch_us(snapshot_time) > ?",
                                  [start + 400 * S]).fetchall()
    last_step = runs["stuck"][-1]
    assert anomalies == [("stuck", "hang", last_step, last_step + 60 * S)]
    assert busy[0][0] >= 5 and busy[0][1] > 95  # every snapshot of it productive, none silent


def test_a_worker_keeps_its_decoded_runs_and_tables_between_bundles(tmp_path):
    """A runner may set the tracker up anew for every bundle (Beam's DirectRunner as shipped) and
    drop the last: the next one finds the process's decoded runs and restore tables as they
    were. (Beam keeps alive only the object of the ``Shared`` handle a process acquired last: with
    one handle for the decoded runs and another for the tables, each bundle decoded every run's
    whole history again.)"""
    fn = TrackRunsLive(WINDOWS, tables=DuckDBEvents(str(tmp_path / "none.duckdb"))).fn
    first = pickle.loads(pickle.dumps(fn))
    first.setup()
    kept = weakref.ref(first.store)
    first.teardown()
    del first
    gc.collect()
    second = pickle.loads(pickle.dumps(fn))
    second.setup()
    assert kept() is second.store and second.store.history is not None


def test_a_run_record_reads_back_as_written_and_refuses_another_layout():
    record = live.Record(token=7, whole_bytes=1, log_entries=2, log_bytes=3, published_us=-4, arrived_us=5,
                         due_us=live.NONE, quiet_us=6, reported_us=7)
    data = record.encode()
    assert len(data) == live.Record.SIZE and live.Record.decode(data) == record
    with pytest.raises(ValueError, match="not a version 1 run record"):
        live.Record.decode(b"\x02" + data[1:])
