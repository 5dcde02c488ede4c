"""Live tracking of runs in a streaming pipeline: one stateful DoFn per run, wrapping the engine.

Each run's state (``engine.RunState``, stored with its explicit coder) lives in Beam state keyed
by run id, so the pipeline scales out across workers. A message's timestamp is its Pub/Sub
publish time, and the watermark follows what the pipeline has read of them: a run is silent when
the pipeline has read everything published up to its last message plus a threshold and nothing
of the run came, so a pipeline that is behind (a backlog after an outage, an update, a worker
restart) is not a fleet that hangs. Snapshots are emitted

* every ``snapshot_interval_s`` of processing time while messages arrive (SNAPSHOT_TIMER, the
  one processing-time timer, set only by a message: on Dataflow each one holds a drain until it
  fires);
* at once when the run records its end, or a restart (an attempt's start after another's): the
  disruption is on the dashboards at once; and first, if no snapshot has reported the run as of
  its last event before the restart, one as of then, so that the disruption alert's range
  (``delta(disruptions[10m])``) holds a point from before the crash, however late the pipeline
  read its messages;
* when the run falls silent, on event time (QUIET_TIMER): ``silence_s`` after its last message,
  or as long after it as makes its steps a hang if that is sooner, and then every
  ``snapshot_interval_s`` while it stays silent, up to ``gc_after_s`` of silence: its elapsed
  time keeps growing with no step, so rolling goodput drops and stays down for as long as an
  alert's duration needs, and a hang is found within one interval of its threshold
  (``pipeline.core.detect``; a run whose heartbeats still arrive while its steps hang is found
  by the interval snapshots);
* when the input ends (FINAL_TIMER, at the end of the window: a drained Dataflow job, the end of
  a test stream), for every run with messages no snapshot has reported yet: one final snapshot.

``gc_after_s`` after a run's last message (on event time, by QUIET_TIMER), ended or not, its
state and timers are cleared: nothing of it is left. A run that speaks again after that is
restored.

A drain moves the watermark to infinity at once: every QUIET_TIMER fires, though no run fell
silent. Python's SDK does not say that a timer fires for a drain, so the tracker tells by the
clock: the watermark follows publish times, which the service stamps, so it never passes the
wall clock while the input runs. A QUIET_TIMER firing more than ``CLOCK_SLACK_S`` before its
time on the clock is the input's end, and reports nothing (FINAL_TIMER reports the run).

Events with old event times (a backfill, a replay through the stream) are counted as they come:
the timers go by when messages were published and arrived, never by the events' own times.

The DirectRunner cannot drain: its Pub/Sub read holds the watermark at the wall clock. There the
launcher makes ``stopping`` true instead, after which every message is reported as it arrives,
and stops the pipeline once the pending interval snapshots are due (``next_snapshot_due``).

The first message of a run with no state here, or the ``Unreported`` mark of one, restores the
run's history from the raw events table (``pipeline.beam.restore``) if the stream writes one: its
state is then the history and the message, and its snapshot times go on from the last one in
the table. A restore whose query fails is retried: on Dataflow by failing the work item (the
runner retries it; ``fail_work_items``), locally ``RESTORE_ATTEMPTS`` times, then logged and
counted (``restore_failures``), the run going on from its message.

An exception in the engine (a bug) stays with the run and the message it failed on: the message
goes to the ``dead_letter`` output whole, with the error, and the run goes on without it; a
snapshot that fails is a dead letter too. The pipeline never stops for one run. Of conflicting
duplicates (two different events under one attempt and seq), the engine keeps the same one
whatever their order, replacing the other in the state if that came first; the other is a dead
letter.

A snapshot is taken as of the run's own clock: its latest event time plus the time since its
last message arrived (on processing time for an interval snapshot, on publish time for a silent
one). For a live job that is now; for a replay it is the replayed time.

A run's state is stored as its state encoded whole plus a log of the messages added since
(``StoredRun``), with one fixed-size record of both and of the run's times (``Record``): a
message writes its own size plus a constant, whatever the run's history. Each worker process
keeps the runs it decoded (``DecodedStates``) for as long as they are what Beam stores, so a
message or a timer costs its own work, not a decode of the run's whole history, and a snapshot
extends the run's last one instead of rebuilding it. Every state cell and the key are coded with
deterministic coders, and the record with a version, so that ``--update`` can carry them.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import random
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.shared import Shared
from apache_beam.utils.timestamp import Timestamp

from pipeline.beam.restore import RunHistory, Unreported
from pipeline.beam.transforms import DEAD_LETTER_TAG, Stopping, engine_failure
from pipeline.core import engine, state_coder
from pipeline.core.detect import AnomalyChange, DetectionSettings
from pipeline.core.events import Batch, DeadLetter
from pipeline.core.rows import GOODPUT, snapshot_rows
from pipeline.sinks.raw_events import EventsTables, LatestSnapshot
from pipeline.sinks.retries import never

_LOG = logging.getLogger(__name__)
_US = 1_000_000
# Decoded states a worker keeps, by the size of their encodings (in memory a state takes a few
# times that, its step statistics included).
DECODED_STATES_MAX_BYTES = 64 * 1024 * 1024
#: A run's log of messages is compacted into its hot state from this size on (StoredRun): a
#: message on a worker that does not hold the run reads at most the hot state (about 16 kB) and
#: this much log.
COMPACT_MIN_BYTES = 32 * 1024
#: How many times its packed size a run's archive of steps takes once read and decoded.
ARCHIVE_IN_MEMORY = 10
#: How far before its time on the clock a QUIET_TIMER may fire and still be a run's silence
#: rather than the input's end: a worker's clock may be this much behind the publish times.
CLOCK_SLACK_S = 1.0
#: Reads of a run's history a local stream tries before the run goes on from its message.
RESTORE_ATTEMPTS = 3
RESTORE_BACKOFF_S = 1.0


def next_snapshot_due(now_us: int, interval_s: float) -> int:
    """The first interval boundary after ``now_us``: when an interval snapshot set now fires."""
    interval_us = round(interval_s * _US)
    return (now_us // interval_us + 1) * interval_us


class RestoreFailed(Exception):
    """A run's history could not be read, on a runner that retries the work item."""


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
            self._within_budget()

    def _within_budget(self) -> None:
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            self._drop(next(iter(self._entries)))

    def drop(self, run_id: str) -> None:
        with self._lock:
            self._drop(run_id)

    def grow(self, run_id: str, size: int) -> None:
        """Counts ``size`` more bytes for the run's kept state (its archive, read since)."""
        with self._lock:
            entry = self._entries.get(run_id)
            if entry is not None:
                self._entries[run_id] = (entry[0], entry[1] + size, entry[2])
                self._bytes += size
                self._within_budget()

    def _drop(self, run_id: str) -> None:
        entry = self._entries.pop(run_id, None)
        if entry is not None:
            self._bytes -= entry[1]


#: No time on record (a Record field).
NONE = -(2**63)


@dataclasses.dataclass
class Record:
    """The fixed-size record of a run's stored state and times (microseconds; ``NONE`` for none):
    the token of the stored state (drawn anew at every change of it), the whole state's size,
    the log's entries and size; the publish time and the arrival (processing time) of the run's
    latest message; the pending interval snapshot's time (NONE once every message is reported);
    the pending QUIET_TIMER's time; the latest snapshot's time."""

    token: int = 0
    whole_bytes: int = 0
    log_entries: int = 0
    log_bytes: int = 0
    published_us: int = NONE
    arrived_us: int = NONE
    due_us: int = NONE
    quiet_us: int = NONE
    reported_us: int = NONE

    VERSION = 1
    _LAYOUT = struct.Struct("<B9q")
    SIZE = _LAYOUT.size

    def encode(self) -> bytes:
        return self._LAYOUT.pack(  # not dataclasses.astuple, which deep-copies: a third of a message's cost
            self.VERSION, self.token, self.whole_bytes, self.log_entries, self.log_bytes, self.published_us,
            self.arrived_us, self.due_us, self.quiet_us, self.reported_us)

    @classmethod
    def decode(cls, data: bytes) -> Record:
        if len(data) != cls.SIZE or data[0] != cls.VERSION:
            raise ValueError(f"not a version {cls.VERSION} run record: {data[:1]!r}, {len(data)} bytes")
        return cls(*cls._LAYOUT.unpack(data)[1:])


class RunStore:
    """What the tracker keeps in a worker process, between bundles: the decoded states, the
    tables runs are restored from (if any), and the counters of the bytes of state read and
    written. One object, held by one ``Shared`` handle: Beam keeps alive only the object of the
    handle a process acquired last."""

    def __init__(self, decoded: DecodedStates, history: RunHistory | None) -> None:
        self.decoded, self.history = decoded, history
        self.written = Metrics.counter("goodput", "state_bytes_written")
        self.read = Metrics.counter("goodput", "state_bytes_read")
        self.compacted = Metrics.counter("goodput", "state_bytes_compacted")  # written, too


class StoredRun:
    """One run's state as Beam stores it, through the state cells of one call of the tracker:
    the state's hot part as of its last compaction (``whole``), the messages added since
    (``log``, a bag, each ``state_coder.encode_batch``), the ``Record`` of both and of the run's
    times (``info``), and the archive of its older steps (``archive``, a bag of the chunks
    ``state_coder.seal`` made).

    A message appends to the log and rewrites the record: it writes its own size plus a constant,
    whatever the run's history. A worker that holds the decoded state of the record's token
    (``DecodedStates``) reads nothing more; another reads the hot part and the log once, and
    replays the log (the engine adds messages deterministically), and reads the archive only if
    the engine asks for a sealed value. Compacting, on a timer, seals what the tails hold past
    ``state_coder.KEEP`` values into new chunks of the archive, writes the hot part whole again
    and clears the log, once the log is at least as large as the hot part (and
    ``COMPACT_MIN_BYTES``). Changes are written by ``save``."""

    def __init__(self, store: RunStore, run_id: str, whole: Any, log: Any, info: Any, archive: Any) -> None:
        self.store, self.run_id, self.whole, self.log, self.info = store, run_id, whole, log, info
        self.archive = archive
        self.record: Record | None = None
        self._changed: engine.RunState | None = None  # a state to store under a new token

    def read_record(self) -> Record | None:
        """The run's record (None for a run with no state)."""
        if self.record is None:
            data = self.info.read()
            if data is None:
                return None
            self.store.read.inc(len(data))
            self.record = Record.decode(data)
        return self.record

    def load(self) -> engine.RunState | None:
        """The run's state (None for a run with none); its archive read through this call's
        cell, if the engine asks for it."""
        record = self.read_record()
        if record is None:
            return None
        state = self.store.decoded.get(self.run_id, record.token)
        if state is None:
            state = (state_coder.decode_state(self.whole.read()) if record.whole_bytes
                     else engine.RunState(self.run_id))
            for entry in self.log.read():
                state.add_batch(state_coder.decode_batch(self.run_id, entry))
            self.store.read.inc(record.whole_bytes + record.log_bytes)
            self.store.decoded.put(self.run_id, record.token, record.whole_bytes + record.log_bytes, state)
        self._bind(state)
        return state

    def _bind(self, state: engine.RunState) -> None:
        """Has ``state`` read its archive through this call's cell (a state kept decoded between
        bundles was read through an earlier call's)."""
        state_coder.archive_of(state).read = self._read_archive

    def _read_archive(self) -> list[bytes]:
        chunks = list(self.archive.read())
        size = sum(map(len, chunks))
        self.store.read.inc(size)
        self.store.decoded.grow(self.run_id, ARCHIVE_IN_MEMORY * size)
        return chunks

    def append(self, batch: Batch, state: engine.RunState) -> None:
        """Stores ``state``, which is the loaded one with ``batch`` added."""
        entry = state_coder.encode_batch(batch)
        self.log.add(entry)
        self.store.written.inc(len(entry))
        record = self.record = self.record or Record()
        record.log_entries, record.log_bytes = record.log_entries + 1, record.log_bytes + len(entry)
        self._changed = state

    def write_whole(self, state: engine.RunState, seal: bool = False) -> None:
        """Stores ``state`` whole, with an empty log; with ``seal``, its tails sealed past
        ``state_coder.KEEP`` values into new chunks of the archive first (or every column sealed
        anew, after a change inside the archive)."""
        self._bind(state)
        chunks, anew = state_coder.seal(state) if seal else ([], False)
        if anew:
            self.archive.clear()
        for chunk in chunks:
            self.archive.add(chunk)
            self.store.written.inc(len(chunk))
        encoded = state_coder.encode_state(state)
        self.whole.write(encoded)
        self.log.clear()
        self.store.written.inc(len(encoded))
        record = self.record = self.record or Record()
        record.whole_bytes, record.log_entries, record.log_bytes = len(encoded), 0, 0
        self._changed = state

    def compact(self, state: engine.RunState) -> None:
        """Stores the loaded ``state`` whole if its log has grown as large as the whole state."""
        record = self.record
        if record is not None and record.log_bytes >= max(record.whole_bytes, COMPACT_MIN_BYTES):
            self.write_whole(state, seal=True)
            self.store.compacted.inc(record.whole_bytes)

    def save(self) -> None:
        """Writes the record, under a new token if the state changed."""
        assert self.record is not None
        if self._changed is not None:
            self.record.token = random.getrandbits(63)
            self.store.decoded.put(self.run_id, self.record.token,
                                self.record.whole_bytes + self.record.log_bytes, self._changed)
            self._changed = None
        self.info.write(self.record.encode())
        self.store.written.inc(Record.SIZE)

    def clear(self) -> None:
        for cell in (self.whole, self.log, self.info, self.archive):
            cell.clear()
        self.record = None
        self.store.decoded.drop(self.run_id)


class TrackRunDoFn(beam.DoFn):
    """Keeps one run's state and emits its snapshots on the timers described above."""

    RUN_STATE = ReadModifyWriteStateSpec("run_state", BytesCoder())  # StoredRun: the whole state,
    RUN_LOG = BagStateSpec("run_log", BytesCoder())  # the messages since,
    RUN_INFO = ReadModifyWriteStateSpec("run_info", BytesCoder())  # and its Record
    REPORTED_ROWS = ReadModifyWriteStateSpec("reported_rows", BytesCoder())  # see Reported
    STEP_ARCHIVE = BagStateSpec("step_archive", BytesCoder())  # StoredRun: its sealed steps' chunks
    SNAPSHOT_TIMER = TimerSpec("snapshot", TimeDomain.REAL_TIME)
    QUIET_TIMER = TimerSpec("quiet", TimeDomain.WATERMARK)
    FINAL_TIMER = TimerSpec("final", TimeDomain.WATERMARK)

    def __init__(self, windows_s: tuple[int, ...], snapshot_interval_s: float, silence_s: float,
                 gc_after_s: float, clock: Callable[[], float] = time.time,
                 stopping: Stopping = never, detection: DetectionSettings | None = None,
                 tables: EventsTables | None = None, fail_work_items: bool = False) -> None:
        self.windows_s = windows_s
        self.detection = detection
        self.snapshot_interval_s = snapshot_interval_s
        self.silence_s = silence_s
        self.gc_after_s = gc_after_s
        self.clock = clock
        self.stopping = stopping
        self.tables, self.fail_work_items = tables, fail_work_items
        self.snapshots = Metrics.counter("goodput", "snapshots")
        self.stalled = Metrics.counter("goodput", "stalled_runs")
        self.forgotten = Metrics.counter("goodput", "forgotten_runs")
        self.restored = Metrics.counter("goodput", "restored_runs")
        self.restore_failures = Metrics.counter("goodput", "restore_failures")
        self.late_host_summaries = Metrics.counter("goodput", "late_host_summaries")  # left out
        self._store = Shared()  # one RunStore per process, kept between bundles

    def setup(self) -> None:
        tables = self.tables
        self.store: RunStore = self._store.acquire(lambda: RunStore(
            DecodedStates(DECODED_STATES_MAX_BYTES),
            None if tables is None else RunHistory(tables, self.gc_after_s / 2)))

    def process(
        self,
        element: tuple[str, Batch | Unreported],
        published: Any = beam.DoFn.TimestampParam,
        window: Any = beam.DoFn.WindowParam,
        run_state: Any = beam.DoFn.StateParam(RUN_STATE),
        run_log: Any = beam.DoFn.StateParam(RUN_LOG),
        run_info: Any = beam.DoFn.StateParam(RUN_INFO),
        reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS),
        step_archive: Any = beam.DoFn.StateParam(STEP_ARCHIVE),
        snapshot_timer: Any = beam.DoFn.TimerParam(SNAPSHOT_TIMER),
        quiet_timer: Any = beam.DoFn.TimerParam(QUIET_TIMER),
        final_timer: Any = beam.DoFn.TimerParam(FINAL_TIMER),
    ) -> Iterator[Any]:
        run_id, message = element
        batch = None if isinstance(message, Unreported) else message
        stored = StoredRun(self.store, run_id, run_state, run_log, run_info, step_archive)
        latest: LatestSnapshot | None = None
        try:
            state = stored.load()
            new = state is None
            if state is None:
                history, latest = self._restore(run_id, batch is not None and _follows_earlier(batch))
                if batch is None and not history:  # marked unreported, but no longer in the tables
                    return
                state = engine.RunState(run_id)
                for earlier in history:
                    state.add_batch(earlier)
            was_ended, starts = _ended(state), _starts(state)
            conflicts: list[DeadLetter] = []
            late = state.hosts.late
            added = state.add_batch(batch, conflicts) if batch is not None else 0
            if state.hosts.late > late:
                self.late_host_summaries.inc(state.hosts.late - late)
        except RestoreFailed:
            raise  # the runner retries the work item
        except Exception as error:  # noqa: BLE001 -- a bug for one message must not stop the fleet
            # The stored state is as before the message: the message is dead-lettered whole.
            self.store.decoded.drop(run_id)  # possibly half changed: decode it again next time
            yield engine_failure(run_id, error, batch)
            return
        for letter in conflicts:  # the copies of conflicting duplicates not kept
            yield TaggedOutput(DEAD_LETTER_TAG, letter)
        if not (added or new):  # a redelivered message: nothing new
            return
        if new:  # its history and the message, written whole
            stored.write_whole(state)
            final_timer.set(window.max_timestamp())
        else:
            assert batch is not None
            stored.append(batch, state)
        record = stored.record
        assert record is not None
        if latest is not None:
            record.reported_us = latest.time_us  # its snapshot times go on from the table's
        now_us = round(self.clock() * _US)
        record.published_us, record.arrived_us = max(published.micros, record.published_us), now_us
        quiet_s = (self.gc_after_s if _ended(state)
                   else min(self.silence_s, state.hang_threshold_s(self.detection)))
        self._quiet_at(record, record.published_us + round(quiet_s * _US), quiet_timer)
        if not added and latest is not None and self._counted(state, latest):
            # Restored, the message adding nothing, and the tables' latest snapshot of the run
            # counts every event they hold (a stream started again over messages it had read):
            # reported again, it would only add a later snapshot of the same figures.
            _LOG.info("run %r: its latest snapshot in the tables counts what it holds", run_id)
            stored.save()
            return
        restarted = _starts(state) > max(starts, 1)
        if restarted and not self.stopping():
            down_us = _down_before_restart(state)
            if down_us is not None and record.reported_us < down_us:
                yield from self._snapshot(stored, state, reported_rows, now_us, as_of_us=down_us)
        if (_ended(state) and not was_ended) or restarted or self.stopping():
            yield from self._snapshot(stored, state, reported_rows, now_us)
        elif record.due_us < now_us:  # set once per interval, not once per message
            record.due_us = next_snapshot_due(now_us, self.snapshot_interval_s)
            snapshot_timer.set(Timestamp(micros=record.due_us))
        stored.save()

    # A firing of a timer that was set again for another time since (Record.due_us, quiet_us) is
    # not the pending one, and does nothing (see ``_fired_for``).

    @on_timer(SNAPSHOT_TIMER)
    def on_snapshot(self, run_id: Any = beam.DoFn.KeyParam, fired: Any = beam.DoFn.TimestampParam,
                    run_state: Any = beam.DoFn.StateParam(RUN_STATE),
                    run_log: Any = beam.DoFn.StateParam(RUN_LOG),
                    run_info: Any = beam.DoFn.StateParam(RUN_INFO),
                    reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS),
                    step_archive: Any = beam.DoFn.StateParam(STEP_ARCHIVE)) -> Iterator[Any]:
        stored = StoredRun(self.store, run_id, run_state, run_log, run_info, step_archive)
        record = stored.read_record()
        if record is not None and record.due_us != NONE and _fired_for(fired, record.due_us):
            yield from self._report(stored, reported_rows, record.due_us)

    @on_timer(FINAL_TIMER)
    def on_final(self, run_id: Any = beam.DoFn.KeyParam,
                 run_state: Any = beam.DoFn.StateParam(RUN_STATE),
                 run_log: Any = beam.DoFn.StateParam(RUN_LOG),
                 run_info: Any = beam.DoFn.StateParam(RUN_INFO),
                 reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS),
                 step_archive: Any = beam.DoFn.StateParam(STEP_ARCHIVE)) -> Iterator[Any]:
        stored = StoredRun(self.store, run_id, run_state, run_log, run_info, step_archive)
        record = stored.read_record()
        if record is not None and record.due_us != NONE:
            yield from self._report(stored, reported_rows, round(self.clock() * _US))

    @on_timer(QUIET_TIMER)
    def on_quiet(self, run_id: Any = beam.DoFn.KeyParam, fired: Any = beam.DoFn.TimestampParam,
                 run_state: Any = beam.DoFn.StateParam(RUN_STATE),
                 run_log: Any = beam.DoFn.StateParam(RUN_LOG),
                 run_info: Any = beam.DoFn.StateParam(RUN_INFO),
                 reported_rows: Any = beam.DoFn.StateParam(REPORTED_ROWS),
                 step_archive: Any = beam.DoFn.StateParam(STEP_ARCHIVE),
                 snapshot_timer: Any = beam.DoFn.TimerParam(SNAPSHOT_TIMER),
                 quiet_timer: Any = beam.DoFn.TimerParam(QUIET_TIMER),
                 final_timer: Any = beam.DoFn.TimerParam(FINAL_TIMER)) -> Iterator[Any]:
        stored = StoredRun(self.store, run_id, run_state, run_log, run_info, step_archive)
        record = stored.read_record()
        if record is None or record.quiet_us == NONE or not _fired_for(fired, record.quiet_us):
            return
        due = record.quiet_us
        if self.clock() * _US < due - CLOCK_SLACK_S * _US:  # the watermark passed the clock: the
            return  # input has ended, and FINAL_TIMER reports the run
        state = stored.load()
        assert state is not None
        forget_at = record.published_us + round(self.gc_after_s * _US)
        if not _ended(state):
            interval_us = round(self.snapshot_interval_s * _US)
            if due - interval_us < record.published_us + round(self.silence_s * _US) <= due:  # silent now
                self.stalled.inc()
            silent_for = due - record.published_us
            yield from self._snapshot(stored, state, reported_rows, record.arrived_us + silent_for)
        if due >= forget_at:  # nothing of the run is left
            stored.clear()
            reported_rows.clear()
            for timer in (snapshot_timer, quiet_timer, final_timer):
                timer.clear()
            self.forgotten.inc()
            return
        self._quiet_at(record, min(due + round(self.snapshot_interval_s * _US), forget_at), quiet_timer)
        stored.compact(state)
        stored.save()

    def _quiet_at(self, record: Record, at_us: int, quiet_timer: Any) -> None:
        record.quiet_us = at_us
        quiet_timer.set(Timestamp(micros=at_us))

    def _counted(self, state: engine.RunState, latest: LatestSnapshot) -> bool:
        """Whether the tables' latest snapshot of a restored run counts every event its state
        holds: it is as late as the latest of them, and the state's snapshot as of its time has
        its figures. (A message the tables got after it, late, is dated before it, and changes
        them.)"""
        if latest.time_us < max((attempt.last_event_us for attempt in state.attempts.values()), default=0):
            return False
        snapshot = state.snapshot(latest.time_us, self.windows_s, detection=self.detection)
        if snapshot is None:
            return False
        return latest.same_figures(next(row for table, row in snapshot_rows(snapshot)
                                        if table == GOODPUT and row["window_s"] == 0))

    def _restore(self, run_id: str,
                 surely_held: bool = False) -> tuple[tuple[Batch, ...], LatestSnapshot | None]:
        """The history of a run this tracker holds no state for, and its latest snapshot, from
        the tables (none without them, or for a run they do not hold; ``surely_held``: a message
        that follows earlier ones of its attempt, which the tables are asked for again, rather
        than trusted not to hold). A read that fails fails the work item where the runner
        retries it (``RestoreFailed``); locally it is tried ``RESTORE_ATTEMPTS`` times, then
        logged and counted, and the run goes on without it."""
        history = self.store.history
        for attempt in range(1, RESTORE_ATTEMPTS + 1):
            try:
                if history is None or not history.holds(run_id, ask_again=surely_held):
                    if surely_held:
                        _LOG.info("run %r: its message follows earlier ones, and the tables hold none",
                                  run_id)
                    return (), None
                batches, latest = history.load(run_id)
            except Exception as error:
                self.restore_failures.inc()
                assert history is not None
                if self.fail_work_items:
                    raise RestoreFailed(
                        f"could not restore run {run_id!r} from {history.tables.source}; the work item "
                        f"is retried: {type(error).__name__}: {error}") from error
                if attempt == RESTORE_ATTEMPTS or self.stopping():
                    _LOG.warning("could not restore run %r from %s after %d tries; it goes on from its "
                                 "message: %s: %s", run_id, history.tables.source, attempt,
                                 type(error).__name__, error)
                    return (), None
                time.sleep(RESTORE_BACKOFF_S * attempt)
                continue
            if batches:
                self.restored.inc()
                if _LOG.isEnabledFor(logging.INFO):
                    _LOG.info("restored run %r from %s: %d messages, %d events, seqs %s; latest snapshot %s",
                              run_id, history.tables.source, len(batches), sum(map(len, batches)),
                              _seq_ranges(batches), latest)
            return batches, latest
        raise AssertionError("unreachable")

    def _report(self, stored: StoredRun, reported_rows: Any, now_us: int) -> Iterator[Any]:
        """The pending snapshot, as of ``now_us`` on processing time; the state compacted then if
        its log is due for it (after the snapshot, which has fed the step statistics the steps
        that compaction may seal)."""
        state = stored.load()
        assert state is not None and stored.record is not None
        yield from self._snapshot(stored, state, reported_rows, now_us)
        stored.compact(state)
        stored.save()

    def _snapshot(self, stored: StoredRun, state: engine.RunState, reported_rows: Any,
                  now_us: int, as_of_us: int | None = None) -> Iterator[Any]:
        """The run's snapshot as of its latest event time plus the processing time from its last
        message's arrival to ``now_us``, and after its last snapshot: a run's snapshot times only
        go on, so the one with the latest time is the newest (an end that arrives after a stalled
        snapshot, late, is reported a microsecond after it, with the ended run's figures). Its
        anomaly rows are those no snapshot has reported (see ``Reported``): each is written once.
        Every message is reported then (``Record.due_us``); the caller saves the record. Or, with
        ``as_of_us``, as of that time of the run's."""
        record = stored.record
        assert record is not None
        latest = max((a.last_event_us for a in state.attempts.values()), default=0)
        last = None if record.reported_us == NONE else record.reported_us
        as_of = latest + max(0, now_us - record.arrived_us) if as_of_us is None else as_of_us
        if last is not None and as_of <= last:
            as_of = last + 1
        record.reported_us, record.due_us = as_of, NONE
        reported = Reported(reported_rows)
        rows = reported.recent_rows()
        try:
            snapshot = state.snapshot(as_of, self.windows_s, detection=self.detection,
                                      anomalies_after_us=last if rows is None or last is None
                                      else last - LATE_ANOMALIES_US, reported_us=last)
        except Exception as error:  # noqa: BLE001 -- as in process: one run's bug stays its own
            self.store.decoded.drop(state.run_id)
            yield engine_failure(state.run_id, error)
            return
        if snapshot is not None:
            self.snapshots.inc()
            fresh = tuple(change for change in snapshot.anomalies if _row_key(change) not in (rows or ()))
            kept = {key for key in (rows or set()) | {_row_key(change) for change in fresh}
                    if key[-1] > as_of - LATE_ANOMALIES_US}
            if kept != rows:
                self.store.written.inc(reported.write_rows(kept))
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
    """The anomaly rows of a run's snapshots in the last ``LATE_ANOMALIES_US`` before its latest
    one. A snapshot writes the rows dated in that span that are not among them: a row that a late
    message shows is written, and no row twice. A run restored from the tables has no record of
    its rows: it writes the rows dated after its last snapshot only."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

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


def _down_before_restart(state: engine.RunState) -> int | None:
    """When the run went down before its latest attempt's start: the last event of the attempts
    started before it (None if none, or if that is not before the start)."""
    started = [a for a in state.attempts.values() if a.start_us is not None]
    latest = max(started, key=lambda a: (a.start_us, a.attempt_id))
    down = max((a.last_event_us for a in started if a is not latest), default=None)
    return down if down is not None and latest.start_us is not None and down < latest.start_us else None


def _starts(state: engine.RunState) -> int:
    """How many of the run's attempts recorded their start: more than one is a restart."""
    return sum(attempt.start_us is not None for attempt in state.attempts.values())


def _follows_earlier(batch: Batch) -> bool:
    """Whether the message comes after earlier ones of its attempt (its seqs do not begin at 0)."""
    return min([*batch.step_seqs[:1], *(event.seq for event in batch.others)], default=0) > 0


def _seq_ranges(batches: Sequence[Batch]) -> str:
    """Each attempt's lowest and highest seq in ``batches``, and how many seqs, for the log."""
    seqs: dict[str, list[int]] = {}
    for batch in batches:
        seqs.setdefault(batch.attempt_id, []).extend([*batch.step_seqs, *(e.seq for e in batch.others)])
    return ", ".join(f"{attempt}: {min(s)}-{max(s)} ({len(set(s))})" for attempt, s in seqs.items() if s)


def _ended(state: engine.RunState) -> bool:
    """Whether the run's latest attempt recorded its end."""
    started = [a for a in state.attempts.values() if a.start_us is not None]
    if not started:
        return False
    latest = max(started, key=lambda a: (a.start_us, a.attempt_id))
    return latest.end_us is not None


class TrackRunsLive(beam.PTransform):
    """(run_id, Batch or Unreported) in, each run's ``Snapshot`` out as described in this
    module's docstring, and what the engine failed on as the ``dead_letter`` output. Runs are
    restored from ``tables`` where given; ``fail_work_items`` where the runner retries a failed
    work item (Dataflow), rather than stopping (the DirectRunner)."""

    def __init__(self, windows_s: tuple[int, ...], snapshot_interval_s: float = 30.0,
                 silence_s: float = 300.0, gc_after_s: float = 3600.0,
                 clock: Callable[[], float] = time.time, stopping: Stopping = never,
                 detection: DetectionSettings | None = None, tables: EventsTables | None = None,
                 fail_work_items: bool = False) -> None:
        super().__init__()
        self.tables = tables
        self.fn = TrackRunDoFn(windows_s, snapshot_interval_s, silence_s, gc_after_s, clock, stopping,
                               detection, tables, fail_work_items)

    def expand(self, keyed_batches: Any) -> Any:
        # Typed, so that the key's coder is the deterministic one of str whatever came before.
        return keyed_batches | "TrackRun" >> beam.ParDo(self.fn).with_input_types(
            tuple[str, Any]).with_outputs(DEAD_LETTER_TAG, main="snapshots")
