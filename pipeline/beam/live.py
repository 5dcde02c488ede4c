"""Live tracking of runs in a streaming pipeline: one stateful DoFn per run, wrapping the engine.

Each run's state (``engine.RunState``, stored with its explicit coder) lives in Beam state keyed
by run id, so the pipeline scales out across workers. Snapshots are emitted

* every ``snapshot_interval_s`` of processing time while events arrive (SNAPSHOT_TIMER),
* at once when the run records its end,
* when the run falls silent for ``silence_s``, or for as long as makes its steps a hang if that
  is sooner (SILENCE_TIMER), and then every ``snapshot_interval_s`` while it stays silent, up to
  ``gc_after_s`` of silence: its elapsed time keeps growing with no step, so rolling goodput
  drops and stays down for as long as an alert's duration needs, and a hang is found within one
  interval of its threshold (``pipeline.core.detect``; a run whose heartbeats still arrive
  while its steps hang is found by the interval snapshots);
* when the input ends (FINAL_TIMER, on event time at the end of the window: a drained Dataflow
  job, the end of a test stream), for every run with events no snapshot has reported yet;

and the state of a run that has ended is cleared ``gc_after_s`` after its last message
(GC_TIMER). The other timers run on processing time, so events with old event times (a backfill
or a replay through the stream) are counted, never wiped by a timer that fires at once.

The DirectRunner cannot drain: its Pub/Sub read holds the watermark at the wall clock. There the
launcher makes ``stopping`` true instead, after which every message is reported as it arrives,
and stops the pipeline once the pending interval snapshots are due (``next_snapshot_due``).

A run's first message may come with the run's history (``pipeline.beam.restore.Restored``): the
run was in the raw events table before this pipeline held it. Its state is then the history and
the message, and its snapshot times go on from the last one in the table. A run restored with
no message (events in the table that no snapshot there counts) is reported as if its last
message had just arrived.

An exception in the engine (a bug) stays with the run and the message it failed on: the message
goes to the ``dead_letter`` output whole, with the error, and the run goes on without it; a
snapshot that fails is a dead letter too. The pipeline never stops for one run. Of conflicting
duplicates (two different events under one attempt and seq), the engine keeps the same one
whatever their order, replacing the other in the state if that came first; the other is a dead
letter.

A snapshot is taken as of the run's own clock: its latest event time plus the processing time
since that event arrived. For a live job that is now; for a replay it is the replayed time.

A run's state is stored as its state encoded whole plus a log of the messages added since
(``StoredRun``): a message writes its own size plus a constant, whatever the run's history. Each
worker process keeps the runs it decoded (``DecodedStates``) for as long as they are what Beam
stores, so a message or a timer costs its own work, not a decode of the run's whole history, and
a snapshot extends the run's last one instead of rebuilding it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder, VarIntCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.shared import Shared
from apache_beam.utils.timestamp import Timestamp

from pipeline.beam.restore import Restored
from pipeline.beam.transforms import DEAD_LETTER_TAG, Stopping, engine_failure
from pipeline.core import engine, state_coder
from pipeline.core.detect import AnomalyChange, DetectionSettings
from pipeline.core.events import Batch, DeadLetter
from pipeline.sinks.retries import never

_US = 1_000_000
# Decoded states a worker keeps, by the size of their encodings (in memory a state takes a few
# times that, its step statistics included).
DECODED_STATES_MAX_BYTES = 64 * 1024 * 1024
#: A run's log of messages is compacted into its whole state from this size on (StoredRun).
COMPACT_MIN_BYTES = 64 * 1024
#: A record of StoredRun: token, the whole state's bytes, the log's messages and bytes.
_RECORD = struct.Struct("<qqqq")
_TIME_BYTES = 8  # a microsecond time in Beam state (a VarInt: 8 bytes from 2^49 to 2^56 µs)


def next_snapshot_due(now_us: int, interval_s: float) -> int:
    """The first interval boundary after ``now_us``: when an interval snapshot set now fires."""
    interval_us = round(interval_s * _US)
    return (now_us // interval_us + 1) * interval_us


class DecodedStates:
    """Decoded run states by run id, each with the token of the stored state it equals and that
    state's size in bytes; the least recently used go first once their sizes pass ``max_bytes``.
    One is shared by the tracker's instances in a process (each bundle's thread)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[str, tuple[int, int, engine.RunState]] = (
            collections.OrderedDict())
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, run_id: str, token: int) -> engine.RunState | None:
        """The kept state of the run if it is the stored one of ``token``, else None."""
        with self._lock:
            entry = self._entries.get(run_id)
            if entry is None or entry[0] != token:
                return None
            self._entries.move_to_end(run_id)
            return entry[2]

    def put(self, run_id: str, token: int, size: int, state: engine.RunState) -> None:
        with self._lock:
            self._drop(run_id)
            self._entries[run_id] = (token, size, state)
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                self._drop(next(iter(self._entries)))

    def drop(self, run_id: str) -> None:
        with self._lock:
            self._drop(run_id)

    def _drop(self, run_id: str) -> None:
        entry = self._entries.pop(run_id, None)
        if entry is not None:
            self._bytes -= entry[1]


class StoredRun:
    """One run's state as Beam stores it, through the state cells of one call of the tracker:
    the state encoded whole as of its last compaction (``whole``), the messages added since
    (``log``, a bag, each ``state_coder.encode_batch``), and a record of both (``info``: a token
    drawn anew at every write, the whole state's size, the log's length and size).

    A message appends to the log and rewrites the record: it writes its own size plus a constant,
    whatever the run's history. A worker that holds the decoded state of the record's token
    (``DecodedStates``) reads nothing more; another reads the whole state and the log once, and
    replays the log (the engine adds messages deterministically). Compacting, on the interval
    timer, writes the state whole again and clears the log once the log is at least as large as
    the whole state (and ``COMPACT_MIN_BYTES``): the state written whole at least doubles in
    between, so a run's life writes bytes in proportion to its length. A state stored whole
    before the log existed is read as a whole state with an empty log."""

    def __init__(self, fn: TrackRunDoFn, run_id: str, whole: Any, log: Any, info: Any) -> None:
        self.fn, self.run_id, self.whole, self.log, self.info = fn, run_id, whole, log, info
        self._record: tuple[int, int, int, int] | None = None  # token, whole, log entries, log bytes

    def load(self) -> engine.RunState | None:
        """The run's state (None for a run with none)."""
        fn, run_id = self.fn, self.run_id
        stored = self.info.read()
        if stored is None:  # a new run, or one stored whole before the log existed
            encoded = self.whole.read()
            if encoded is None:
                return None
            fn.bytes_read.inc(len(encoded))
            state = state_coder.decode_state(encoded)
            self._write_record(len(encoded), 0, 0, state)
            return state
        fn.bytes_read.inc(len(stored))
        self._record = record = _RECORD.unpack(stored)
        token, whole_bytes, _, log_bytes = record
        kept = fn.decoded.get(run_id, token)
        if kept is not None:
            return kept
        state = state_coder.decode_state(self.whole.read()) if whole_bytes else engine.RunState(run_id)
        for entry in self.log.read():
            state.add_batch(state_coder.decode_batch(run_id, entry))
        fn.bytes_read.inc(whole_bytes + log_bytes)
        fn.decoded.put(run_id, token, whole_bytes + log_bytes, state)
        return state

    def append(self, batch: Batch, state: engine.RunState) -> None:
        """Stores ``state``, which is the loaded one with ``batch`` added."""
        entry = state_coder.encode_batch(batch)
        self.log.add(entry)
        self.fn.bytes_written.inc(len(entry))
        _, whole_bytes, entries, log_bytes = self._record or (0, 0, 0, 0)
        self._write_record(whole_bytes, entries + 1, log_bytes + len(entry), state)

    def write_whole(self, state: engine.RunState) -> None:
        """Stores ``state`` encoded whole, with an empty log."""
        encoded = state_coder.encode_state(state)
        self.whole.write(encoded)
        self.log.clear()
        self.fn.bytes_written.inc(len(encoded))
        self._write_record(len(encoded), 0, 0, state)

    def compact(self, state: engine.RunState) -> None:
        """Stores the loaded ``state`` whole if its log has grown as large as the whole state."""
        if self._record is not None:
            _, whole_bytes, _, log_bytes = self._record
            if log_bytes >= max(whole_bytes, COMPACT_MIN_BYTES):
                self.write_whole(state)
                self.fn.bytes_compacted.inc(self._record[1])

    def clear(self) -> None:
        for cell in (self.whole, self.log, self.info):
            cell.clear()
        self.fn.decoded.drop(self.run_id)

    def _write_record(self, whole_bytes: int, entries: int, log_bytes: int, state: engine.RunState) -> None:
        self._record = (random.getrandbits(63), whole_bytes, entries, log_bytes)
        self.info.write(_RECORD.pack(*self._record))
        self.fn.bytes_written.inc(_RECORD.size)
        self.fn.decoded.put(self.run_id, self._record[0], whole_bytes + log_bytes, state)


class TrackRunDoFn(beam.DoFn):
    """Keeps one run's state and emits its snapshots on the timers described above."""

    RUN_STATE = ReadModifyWriteStateSpec("run_state", BytesCoder())  # StoredRun: the whole state,
    RUN_LOG = BagStateSpec("run_log", BytesCoder())  # the messages since,
    RUN_INFO = ReadModifyWriteStateSpec("run_info", BytesCoder())  # and a record of both
    ARRIVED = ReadModifyWriteStateSpec("arrived_us", VarIntCoder())  # processing time, last event
    SNAPSHOT_DUE = ReadModifyWriteStateSpec("snapshot_due_us", VarIntCoder())  # pending timer
    SILENCE_DUE = ReadModifyWriteStateSpec("silence_due_us", VarIntCoder())  # pending silence timer
    REPORTED = ReadModifyWriteStateSpec("reported_us", VarIntCoder())  # the last snapshot's time
    REPORTED_ROWS = ReadModifyWriteStateSpec("reported_rows", BytesCoder())  # and its recent rows
    SNAPSHOT_TIMER = TimerSpec("snapshot", TimeDomain.REAL_TIME)
    SILENCE_TIMER = TimerSpec("silence", TimeDomain.REAL_TIME)
    GC_TIMER = TimerSpec("gc", TimeDomain.REAL_TIME)
    FINAL_TIMER = TimerSpec("final", TimeDomain.WATERMARK)

    def __init__(self, windows_s: tuple[int, ...], snapshot_interval_s: float, silence_s: float,
                 gc_after_s: float, clock: Callable[[], float] = time.time,
                 stopping: Stopping = never, detection: DetectionSettings | None = None) -> None:
        self.windows_s = windows_s
        self.detection = detection
        self.snapshot_interval_s = snapshot_interval_s
        self.silence_s = silence_s
        self.gc_after_s = gc_after_s
        self.clock = clock
        self.stopping = stopping
        self.snapshots = Metrics.counter("goodput", "snapshots")
        self.stalled = Metrics.counter("goodput", "stalled_runs")
        self.bytes_written = Metrics.counter("goodput", "state_bytes_written")
        self.bytes_read = Metrics.counter("goodput", "state_bytes_read")
        self.bytes_compacted = Metrics.counter("goodput", "state_bytes_compacted")  # written, too
        self.late_host_summaries = Metrics.counter("goodput", "late_host_summaries")  # left out
        self._decoded = Shared()  # one DecodedStates per process, kept between bundles

    def setup(self) -> None:
        self.decoded: DecodedStates = self._decoded.acquire(
            lambda: DecodedStates(DECODED_STATES_MAX_BYTES))

    def process(
        self,
        element: tuple[str, Batch | Restored],
        window: Any = beam.DoFn.WindowParam,
        run_state: Any = beam.DoFn.StateParam(RUN_STATE),
        run_log: Any = beam.DoFn.StateParam(RUN_LOG),
        run_info: Any = beam.DoFn.StateParam(RUN_INFO),
        arrived: Any = beam.DoFn.StateParam(ARRIVED),
        snapshot_due: Any = beam.DoFn.StateParam(SNAPSHOT_DUE),
        silence_due: Any = beam.DoFn.StateParam(SILENCE_DUE),
        reported: Any = beam.DoFn.StateParam(REPORTED),
        reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS),
        snapshot_timer: Any = beam.DoFn.TimerParam(SNAPSHOT_TIMER),
        silence_timer: Any = beam.DoFn.TimerParam(SILENCE_TIMER),
        gc_timer: Any = beam.DoFn.TimerParam(GC_TIMER),
        final_timer: Any = beam.DoFn.TimerParam(FINAL_TIMER),
    ) -> Iterator[Any]:
        run_id, message = element
        restore = message if isinstance(message, Restored) else None
        batch = message.batch if isinstance(message, Restored) else message
        stored = StoredRun(self, run_id, run_state, run_log, run_info)
        try:
            state = stored.load()  # a history sent again for a run held here is in its state
            restored = state is None and restore is not None
            if state is None:
                state = engine.RunState(run_id)
                final_timer.set(window.max_timestamp())
                for earlier in restore.history if restore is not None else ():
                    state.add_batch(earlier)
            was_ended = _ended(state)
            conflicts: list[DeadLetter] = []
            late = state.hosts.late
            added = state.add_batch(batch, conflicts) if batch is not None else 0
            if state.hosts.late > late:
                self.late_host_summaries.inc(state.hosts.late - late)
        except Exception as error:  # noqa: BLE001 -- a bug for one message must not stop the fleet
            # The stored state is as before the message: the message is dead-lettered whole.
            self.decoded.drop(run_id)  # possibly half changed: decode it again next time
            yield engine_failure(run_id, error, batch)
            return
        for letter in conflicts:  # the copies of conflicting duplicates not kept
            yield TaggedOutput(DEAD_LETTER_TAG, letter)
        now_us = round(self.clock() * _US)
        if _ended(state):  # forgotten gc_after_s after its last message, redelivered ones too
            gc_timer.set(Timestamp(micros=now_us + round(self.gc_after_s * _US)))
        if not (added or restored):  # a redelivered message: nothing new
            return
        if restored and restore is not None and restore.reported_us is not None:
            reported.write(restore.reported_us)  # its snapshot times go on from the table's
        if restored:  # its history and the message, written whole
            stored.write_whole(state)
        elif batch is not None:
            stored.append(batch, state)
        arrived.write(now_us)
        silence_at = now_us + round(min(self.silence_s, state.hang_threshold_s(self.detection)) * _US)
        silence_timer.set(Timestamp(micros=silence_at))
        silence_due.write(silence_at)
        self.bytes_written.inc(2 * _TIME_BYTES)
        if (_ended(state) and not was_ended) or self.stopping():
            snapshot_due.clear()
            yield from self._snapshot(state, Reported(reported, reported_rows), now_us, now_us)
            return
        due = snapshot_due.read()
        if due is None or due < now_us:  # set once per interval, not once per message
            due = next_snapshot_due(now_us, self.snapshot_interval_s)
            snapshot_timer.set(Timestamp(micros=due))
            snapshot_due.write(due)
            self.bytes_written.inc(_TIME_BYTES)

    # The processing-time timers know when they fire without a clock: when they were set for. A
    # firing of a timer that was set again for another time since (SNAPSHOT_DUE, SILENCE_DUE) is
    # not the pending one, and does nothing (see ``_fired_for``).

    @on_timer(SNAPSHOT_TIMER)
    def on_snapshot(self, run_id: Any = beam.DoFn.KeyParam, fired: Any = beam.DoFn.TimestampParam,
                    run_state: Any = beam.DoFn.StateParam(RUN_STATE),
                    run_log: Any = beam.DoFn.StateParam(RUN_LOG),
                    run_info: Any = beam.DoFn.StateParam(RUN_INFO),
                    arrived: Any = beam.DoFn.StateParam(ARRIVED),
                    snapshot_due: Any = beam.DoFn.StateParam(SNAPSHOT_DUE),
                    reported: Any = beam.DoFn.StateParam(REPORTED),
                    reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS)) -> Iterator[Any]:
        yield from self._report_pending(StoredRun(self, run_id, run_state, run_log, run_info), arrived,
                                        snapshot_due, Reported(reported, reported_rows), fired)

    @on_timer(FINAL_TIMER)
    def on_final(self, run_id: Any = beam.DoFn.KeyParam,
                 run_state: Any = beam.DoFn.StateParam(RUN_STATE),
                 run_log: Any = beam.DoFn.StateParam(RUN_LOG),
                 run_info: Any = beam.DoFn.StateParam(RUN_INFO),
                 arrived: Any = beam.DoFn.StateParam(ARRIVED),
                 snapshot_due: Any = beam.DoFn.StateParam(SNAPSHOT_DUE),
                 reported: Any = beam.DoFn.StateParam(REPORTED),
                 reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS)) -> Iterator[Any]:
        yield from self._report_pending(StoredRun(self, run_id, run_state, run_log, run_info), arrived,
                                        snapshot_due, Reported(reported, reported_rows),
                                        at_us=round(self.clock() * _US))

    @on_timer(SILENCE_TIMER)
    def on_silence(self, run_id: Any = beam.DoFn.KeyParam, fired: Any = beam.DoFn.TimestampParam,
                   run_state: Any = beam.DoFn.StateParam(RUN_STATE),
                   run_log: Any = beam.DoFn.StateParam(RUN_LOG),
                   run_info: Any = beam.DoFn.StateParam(RUN_INFO),
                   arrived: Any = beam.DoFn.StateParam(ARRIVED),
                   silence_due: Any = beam.DoFn.StateParam(SILENCE_DUE),
                   reported: Any = beam.DoFn.StateParam(REPORTED),
                   reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS),
                   silence_timer: Any = beam.DoFn.TimerParam(SILENCE_TIMER)) -> Iterator[Any]:
        arrived_us, due = arrived.read(), silence_due.read()
        if due is None:  # set by a job without SILENCE_DUE (then updated), or reported already
            due = fired.micros
        elif not _fired_for(fired, due):
            return
        silence_due.clear()
        stored = StoredRun(self, run_id, run_state, run_log, run_info)
        if arrived_us is not None and (state := stored.load()) is not None:
            stored.compact(state)
            if not _ended(state):
                interval_us = round(self.snapshot_interval_s * _US)
                if due - interval_us < arrived_us + round(self.silence_s * _US) <= due:  # silent now
                    self.stalled.inc()
                yield from self._snapshot(state, Reported(reported, reported_rows), arrived_us, due)
                again = due + interval_us
                if again - arrived_us <= round(self.gc_after_s * _US):
                    silence_timer.set(Timestamp(micros=again))
                    silence_due.write(again)

    @on_timer(GC_TIMER)
    def on_gc(self, run_id: Any = beam.DoFn.KeyParam,
              run_state: Any = beam.DoFn.StateParam(RUN_STATE),
              run_log: Any = beam.DoFn.StateParam(RUN_LOG),
              run_info: Any = beam.DoFn.StateParam(RUN_INFO),
              arrived: Any = beam.DoFn.StateParam(ARRIVED),
              snapshot_due: Any = beam.DoFn.StateParam(SNAPSHOT_DUE),
              silence_due: Any = beam.DoFn.StateParam(SILENCE_DUE),
              reported: Any = beam.DoFn.StateParam(REPORTED),
              reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS)) -> None:
        stored = StoredRun(self, run_id, run_state, run_log, run_info)
        state = stored.load()
        if state is not None and _ended(state):  # not restarted since
            stored.clear()
            for cell in (arrived, snapshot_due, silence_due, reported, reported_rows):
                cell.clear()

    def _report_pending(self, stored: StoredRun, arrived: Any, snapshot_due: Any, reported: Reported,
                        fired: Timestamp | None = None, at_us: int | None = None) -> Iterator[Any]:
        """The snapshot an interval timer is pending for, if one is (and the timer that
        ``fired``, if given, is the pending one): as of ``at_us``, or of when it is due. The
        run's state is compacted first if its log is due for it."""
        arrived_us, due = arrived.read(), snapshot_due.read()
        if due is None or (fired is not None and not _fired_for(fired, due)):
            return
        snapshot_due.clear()
        if arrived_us is not None and (state := stored.load()) is not None:
            stored.compact(state)
            yield from self._snapshot(state, reported, arrived_us, due if at_us is None else at_us)


    def _snapshot(self, state: engine.RunState, reported: Reported, arrived_us: int,
                  now_us: int) -> Iterator[Any]:
        """The run's snapshot as of its latest event time plus the processing time since that
        event arrived, and after its last snapshot: a run's snapshot times only go on, so the
        one with the latest time is the newest (an end that arrives after a stalled snapshot,
        late, is reported a microsecond after it, with the ended run's figures). Its anomaly rows
        are those no snapshot has reported (see ``Reported``): each is written once."""
        latest = max((a.last_event_us for a in state.attempts.values()), default=0)
        as_of, last = latest + max(0, now_us - arrived_us), reported.time.read()
        if last is not None and as_of <= last:
            as_of = last + 1
        reported.time.write(as_of)
        self.bytes_written.inc(_TIME_BYTES)
        rows = reported.recent_rows()
        try:
            snapshot = state.snapshot(as_of, self.windows_s, detection=self.detection,
                                      anomalies_after_us=last if rows is None or last is None
                                      else last - LATE_ANOMALIES_US)
        except Exception as error:  # noqa: BLE001 -- as in process: one run's bug stays its own
            self.decoded.drop(state.run_id)
            yield engine_failure(state.run_id, error)
            return
        if snapshot is not None:
            self.snapshots.inc()
            fresh = tuple(change for change in snapshot.anomalies if _row_key(change) not in (rows or ()))
            kept = {key for key in (rows or set()) | {_row_key(change) for change in fresh}
                    if key[-1] > as_of - LATE_ANOMALIES_US}
            if kept != rows:
                self.bytes_written.inc(reported.write_rows(kept))
            yield dataclasses.replace(snapshot, anomalies=fresh) if fresh != snapshot.anomalies else snapshot


#: How late a message may come and still have the anomaly rows it shows written: a row dated
#: before the last snapshot (a slowdown found at a step that arrived after a snapshot ahead of
#: it) is written if it is dated at most this long before it.
LATE_ANOMALIES_US = 3600 * _US

#: An anomaly row's identity: kind, host, onset, end, and the time of its state.
RowKey = tuple[str, "str | None", int, "int | None", int]


def _row_key(change: AnomalyChange) -> RowKey:
    return change.kind, change.host, change.started_us, change.ended_us, change.changed_us


class Reported:
    """What a run's snapshots reported: the last one's time, and the anomaly rows of the last
    ``LATE_ANOMALIES_US`` before it. A snapshot writes the rows dated in that span that are not
    among them: a row that a late message shows is written, and no row twice. A run with no
    record of its rows (restored from the tables, or held by an earlier version) writes the rows
    dated after the last snapshot only, as before."""

    def __init__(self, time: Any, rows: Any) -> None:
        self.time, self.rows = time, rows

    def recent_rows(self) -> set[RowKey] | None:
        data = self.rows.read()
        return None if data is None else {tuple(key) for key in json.loads(data)}

    def write_rows(self, keys: set[RowKey]) -> int:
        """Records ``keys``; the bytes written."""
        data = json.dumps(sorted(keys, key=repr)).encode()
        self.rows.write(data)
        return len(data)


def _fired_for(fired: Timestamp, due_us: int) -> bool:
    """Whether a timer that fired at ``fired`` is the one set for ``due_us``: runners keep a
    timer's time to the millisecond (Dataflow), or as it was set (the DirectRunner)."""
    return fired.micros // 1000 == due_us // 1000


def _ended(state: engine.RunState) -> bool:
    """Whether the run's latest attempt recorded its end."""
    started = [a for a in state.attempts.values() if a.start_us is not None]
    if not started:
        return False
    latest = max(started, key=lambda a: (a.start_us, a.attempt_id))
    return latest.end_us is not None


class TrackRunsLive(beam.PTransform):
    """(run_id, Batch or Restored) in, each run's ``Snapshot`` out as described in this module's
    docstring, and what the engine failed on as the ``dead_letter`` output."""

    def __init__(self, windows_s: tuple[int, ...], snapshot_interval_s: float = 30.0,
                 silence_s: float = 300.0, gc_after_s: float = 3600.0,
                 clock: Callable[[], float] = time.time, stopping: Stopping = never,
                 detection: DetectionSettings | None = None) -> None:
        super().__init__()
        self.fn = TrackRunDoFn(windows_s, snapshot_interval_s, silence_s, gc_after_s, clock, stopping,
                               detection)

    def expand(self, keyed_batches: Any) -> Any:
        return keyed_batches | "TrackRun" >> beam.ParDo(self.fn).with_outputs(DEAD_LETTER_TAG,
                                                                                main="snapshots")
