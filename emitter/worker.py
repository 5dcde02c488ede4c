"""The batching worker: a bounded in-memory queue drained by one background thread.

Every ``record_*`` call ends in the worker's ``lane`` (``emitter.lane``): the per-step calls go
there themselves, the others through ``put``. The lane numbers the event and queues it; it never
waits for the thread and never raises. It runs in the training loop, so while memory has room it
takes no lock and does nothing else but, once a batch is queued, wake the thread; the thread
moves the lane's events to its own queue (holding the lock) whenever it looks at the queue, and
keeps the lane's ``room`` at what is left in memory. The thread wakes otherwise for a flush or
close, and once every ``max_latency_s``. A call that finds no room takes the lock: when the
queue is full the event goes to the on-disk spool instead, and events keep doing so
until the thread has drained the spool, so events stay in order and nothing is lost while the
spool has room. When the spool refuses events too (a full or read-only disk), the queue keeps
the newest events and drops the oldest, counted; the next event that overflows tries the spool
again. An attempt's ``job_start`` (it carries the run's metadata) is never spilled nor dropped:
it stays in memory until it is sent, and is the last event the worker gives up.

A signal handler may call into the emitter while the code it interrupted holds the lock (a
SIGTERM handler that records the job's end and closes the recorder): the lock is re-entrant,
every wait releases it, and sequence numbers are drawn in one atomic step, so the handler
neither deadlocks nor gives its event the number of the one it interrupted. (Its event may be
queued before the interrupted one, whose number is lower: the pipeline orders an attempt's
events by number.) Nor does it lose the interrupted one: a slow-path event is numbered and
put where the worker looks for it (``_pending``) in that same step, before it is queued or
spilled, and a ``close`` from the handler spools it with the rest (a copy spilled by the call
it interrupted as well is dropped by the pipeline). While the interrupted call writes the spool,
the handler's events stay in memory, the handler's ``close`` writes segments of its own, and
the thread leaves the open segment alone (a handler's wait lets it run).

A worker whose attempt ended (the job recorded a new start) retires: its own thread delivers what
it holds within a deadline, spools the rest and ends; no other thread is started for it. Where no
thread can be started (an isolated subinterpreter, a process out of threads, or, for a while, the
recorder's restarts: ``may_start``), the worker works without one: events wait in memory and in
the spool, and ``flush`` and ``close`` deliver them from the caller's thread, within their timeout;
a wake starts the thread once it may.

The thread sends, in order: segments left in the spool by earlier attempts of the run, then the
queue, then this attempt's own spooled events. A failed send is retried with exponential backoff
(the queue fills and spills to disk meanwhile); what is still unsent when the worker is closed is
written to the spool for the next process of the run to send. The thread reads and decodes spool
segments without holding the lock, so a ``record_*`` call never waits for the disk's reads.

Before it sends a batch from the queue, the thread shows it to the recorder's ``derive`` hook
(``emitter.collect``), which may complete the job start's workload and returns the events to
record because of it (the collected configs); a ``flush`` that waits for a batch waits for what
was derived from it too.

Every pause here is paced by the monotonic clock: a wall clock that jumps neither stalls nor
hurries batching, retries or heartbeats.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emitter.lane import Lane, encode_events
from emitter.settings import EmitterSettings
from emitter.spool import Spool
from emitter.transports import MessageRefused, Transport
from goodput_schemas.limits import MAX_COUNT, MAX_MESSAGE_BYTES
from goodput_schemas.wire import Message, Record, encode_batches

_LOG = logging.getLogger("emitter")

#: The recorder's hook: given a batch of the attempt's own events about to be sent, the events
#: to record because of it, as (time_us, kind, body), or None once it will record nothing more
#: for the attempt (the worker stops asking).
Derive = Callable[[list[Record]], list[tuple[int, str, Any]] | None]

#: Kinds never spilled nor dropped to make room: an attempt's start carries its metadata (chips,
#: accelerator, run group), without which the pipeline cannot weigh or place the attempt.
PROTECTED_KINDS = frozenset({"job_start"})

#: Slots of a lane at most: two batches, so that the callers go on while the thread takes one,
#: up to this (a larger batch fills from several moves).
MAX_LANE_SLOTS = 4096

#: How long ``close`` waits for the thread to let go of the worker's lock, past its deadline.
CLOSE_LOCK_GRACE_S = 0.25

#: Room left in a message for what a destination adds to its data (Pub/Sub's topic, attributes
#: and ordering key count against its 10 MB request limit).
MESSAGE_HEADROOM_BYTES = 16 * 1024


@dataclasses.dataclass(frozen=True)
class EmitterStats:
    """Counters of one recorder (one attempt): what it recorded and where each event went.

    ``GoodputRecorder.stats`` returns a snapshot of them. No loss is silent: every event
    recorded is in ``sent``, ``dropped``, ``queued`` (in memory) or ``kept`` (in the spool), and
    once ``flush()`` returns True, in ``sent`` or ``dropped``. ``close()`` leaves what it could
    not deliver in time in the spool for the next attempt of the run (``kept``, and says so in the
    log); the next attempt counts it in ``backlog_sent``.

    Attributes:
        recorded: Events accepted by ``record_*`` calls; their sequence numbers are
            ``0 .. recorded - 1``.
        sent: Events of this attempt delivered by the transport, each counted once.
        spilled: Events written to the on-disk spool because the in-memory queue was full.
        dropped: Events of this attempt lost, for any reason: memory and spool were both full
            or the spool refused them (the oldest go first, the attempt's ``job_start`` last),
            the destination refused their message for good (``dropped_refused``), someone else
            removed their spool segment (``dropped_removed``), or a call came after ``close()``
            (such a call is not in ``recorded``).
        dropped_refused: Of ``dropped``, events whose message the destination refused for good
            (too large for it): they are never retried.
        dropped_removed: Of ``dropped``, events whose spool segment someone else removed (a tmp
            cleaner) before it was sent.
        send_errors: Failed transport sends (each retried with backoff).
        messages_sent: Messages delivered (this attempt's and the backlog's).
        queued: Events held in memory at the moment: at most ``max_queue_events``, but for the
            attempt's ``job_start`` and for a few more while several threads record at once.
        kept: Events of this attempt in the on-disk spool: spilled and not sent yet, or left
            there by ``close()`` for the next process of the run.
        backlog_sent: Events left in the spool by earlier attempts of the run (a crash, a
            ``close()`` that ran out of time), delivered by this attempt.
        backlog_dropped: Events of earlier attempts dropped from a full spool to make room, or
            refused for good by the destination.
        invalid_calls: ``record_*`` calls that recorded nothing because an argument could not
            be recorded (each logged, once per method); not in ``recorded``.
        dropped_config_entries: Entries left out of ``configs`` events that were recorded:
            refused by the contract's limits, or past ``MAX_CONFIG_ENTRIES`` (logged once).
        dropped_metric_values: Values left out of ``record_metrics`` calls: of metric names past
            the attempt's ``MAX_METRIC_NAMES`` (logged once).
    """

    recorded: int = 0
    sent: int = 0
    spilled: int = 0
    dropped: int = 0
    dropped_refused: int = 0
    dropped_removed: int = 0
    send_errors: int = 0
    messages_sent: int = 0
    queued: int = 0
    kept: int = 0
    backlog_sent: int = 0
    backlog_dropped: int = 0
    invalid_calls: int = 0
    dropped_config_entries: int = 0
    dropped_metric_values: int = 0


class SendCancelled(Exception):
    """A send gave up before it began: its worker stopped while it waited for the transport."""


class BatchWorker:
    """Queues the events of one attempt and delivers them in batches from a daemon thread."""

    def __init__(
        self,
        run_id: str,
        attempt_id: str,
        transport: Transport,
        spool: Spool,
        settings: EmitterSettings,
        heartbeat: Callable[[], None] | None = None,
        *,
        workload_uid: str = "",
        derive: Derive | None = None,
        may_start: Callable[[], bool] | None = None,
        restart: bool = False,
    ) -> None:
        self._run_id = run_id
        self._restart = restart  # the attempt of a restart in this process: see _serve
        # Whether the thread may start now (None: always); until it may, the worker waits without
        # one, and starts it at a wake that finds it may.
        self._may_start = may_start
        self._attempt_id = attempt_id
        self._workload_uid = workload_uid
        self._derive = derive
        self._transport = transport
        self._spool = spool
        self._settings = settings
        self._heartbeat = heartbeat
        self._batch = settings.max_batch_events
        self._capacity = settings.max_queue_events
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        # Re-entrant, and no plain Lock or Event that the caller's side waits on: see the module
        # docstring.
        self._lock = threading.RLock()
        # Held while no wake is pending: a wake releases it (callers never wait on it), the
        # thread's wait takes it again. (It costs the thread's wait less than a Condition.)
        self._wakeup = threading.Lock()
        self._wakeup.acquire()
        #: Where the recorder's calls queue events: see the module docstring.
        # Woken by releasing the lock, a call into C: a signal handler that ends the process (a
        # SystemExit) must not run inside a wake, which the lane does not let fail. A worker
        # waiting to start its thread starts it at the slow path's wake instead.
        self.lane = Lane(min(2 * self._batch, MAX_LANE_SLOTS), MAX_COUNT, self._wakeup.release)
        self._queue: collections.deque[Record] = collections.deque()
        # Slow-path events being queued or spilled: (the recording thread, [time_us, kind, body,
        # seq once numbered, True once a signal handler's flush queued it]).
        self._pending: list[tuple[int, list[Any]]] = []
        self._spilling = False
        self._finished = 0  # own events sent or dropped; flush waits on it
        self._spool_dropped = self._spool.dropped_events  # of them, dropped by the spool
        self._finished_changed = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._closed = False
        self._retiring = False
        self._delivered = False  # whether close (or retirement) delivered every event
        # When sending stops: a retiring worker's, or a flush's from the caller's thread (no thread).
        self._deadline: float | None = None
        self._inflight: list[Record] = []  # a batch taken from the queue, being sent
        # (lowest seq of a batch, numbers drawn once the events derived from it were queued)
        self._derived: list[tuple[int, int]] = []
        self._update_room()
        self._force = False  # send a partial batch now (flush, close)
        self._seen_seq = 0
        self._last_activity = time.monotonic()
        self._counts: collections.Counter[str] = collections.Counter()
        self._logged: set[str] = set()
        self._thread: threading.Thread | None = None
        self._start_thread()

    def _start_thread(self) -> None:
        """Starts the thread, where it may start and can."""
        if self._may_start is not None and not self._may_start():
            return
        thread = threading.Thread(target=self._run, name="goodput-emitter", daemon=True)
        try:
            thread.start()
        except RuntimeError as error:  # an isolated subinterpreter, a process out of threads
            self._may_start = lambda: False
            _LOG.warning("goodput emitter: no background thread for %r (%s): events wait in memory "
                         "and in the spool, and flush() and close() deliver them", self._run_id, error)
            return
        self._thread = thread

    @property
    def spool(self) -> Spool:
        """Where the attempt's events wait on disk."""
        return self._spool

    # -- caller side ------------------------------------------------------------------------

    def put(self, time_us: int, kind: str, body: Any) -> None:
        """Queues one event; O(1), never blocks on I/O of the transport, never raises."""
        if not self.lane.put(time_us, kind, body):
            self._put_with_lock(time_us, kind, body)

    def _absorb(self) -> None:
        """Moves the lane's events to the queue (holding the lock)."""
        if len(self.lane):
            self.lane.take_into(self._queue)

    def _update_room(self) -> None:
        """Sets the lane's room from the queue's state (holding the lock): what is left in memory,
        none while spilling; and has it wake the thread when the queue and the lane hold a batch."""
        lane, queued = self.lane, len(self._queue)
        lane.room = 0 if self._spilling or self._closed else self._capacity - len(self._inflight) - queued
        lane.wake_at = max(1, self._batch - queued)
        if len(lane) >= lane.wake_at:
            self._wake()

    def _put_with_lock(self, time_us: int, kind: str, body: Any) -> None:
        """Queues or spills one event when the lane has no room or events wait in the spool."""
        slot = [time_us, kind, body]
        pending = (threading.get_ident(), slot)
        self._pending.append(pending)
        self.lane.draw_into(slot)  # numbered where a signal handler's close finds it: one step
        try:
            with self._lock:
                self._absorb()
                if len(slot) == 4:  # else a signal handler placed it
                    self._place((slot[3], time_us, kind, body))
                    slot.append(True)
                self._pending.remove(pending)
                self._update_room()
        except BaseException:
            with contextlib.suppress(ValueError):
                self._pending.remove(pending)
            raise

    def _adopt_interrupted(self) -> None:
        """Places the events that calls on this thread were placing when a signal handler (this
        call's caller) interrupted them, so that the handler's flush delivers them and its close
        counts each once (holding the lock). One a spill under way is writing is left to it."""
        me = threading.get_ident()
        interrupted = [slot for owner, slot in list(self._pending) if owner == me and len(slot) == 4]
        if not interrupted:
            return
        queued = {record[0] for record in itertools.chain(self._inflight, self._queue)}
        for slot in interrupted:
            if slot[3] in queued:
                slot.append(True)  # queued just before the handler came
            elif not self._spool.busy:
                self._place((slot[3], slot[0], slot[1], slot[2]))
                slot.append(True)

    def _place(self, record: Record) -> None:
        """Queues an event, or spills it while memory is full (holding the lock)."""
        kind = record[2]
        if not self._spilling or kind in PROTECTED_KINDS:
            queued = len(self._queue)
            if queued + len(self._inflight) < self._capacity or kind in PROTECTED_KINDS:
                self._queue.append(record)
                if queued + 1 >= self._batch:
                    self._wake()
                return
            self._spilling = True
        if self._spool.busy or self._closed:
            # A signal handler interrupted a spill on this thread (its own events wait in memory,
            # behind none: the pipeline orders them by number), or recorded after a close.
            self._queue.append(record)
            return
        self._spill(record)

    def _recorded(self) -> int:
        """How many numbers were drawn for events now queued or gone (holding the lock)."""
        drawn = [slot[3] + 1 for _, slot in list(self._pending) if len(slot) >= 4]
        return max(self.lane.next_seq, *drawn) if drawn else self.lane.next_seq

    def _wake(self) -> None:
        """Wakes the thread (starts it, if it waits to start and now may)."""
        if self._thread is None and not self._closed:
            self._start_thread()
        if self._wakeup.locked():
            # A signal handler's wake may come between the check and the release.
            with contextlib.suppress(RuntimeError):
                self._wakeup.release()

    def _spill(self, record: Record) -> None:
        try:
            stored = self._spool.append(record)
        except OSError as error:
            self._log_once("spool-error", logging.ERROR,
                           "goodput spool %s refuses events (%s): keeping the newest %d in memory "
                           "and dropping the oldest until it accepts them again",
                           self._spool.directory, error, self._capacity)
            self._keep_in_memory(record)
            return
        finally:
            self._finish_spool_drops()
        if stored:
            self._counts["spilled"] += 1

    def _finish_spool_drops(self) -> None:
        """Counts the events the spool dropped since last asked (full, or removed by someone
        else) as finished: never delivered, flush must not wait for them (holding the lock)."""
        dropped = self._spool.dropped_events - self._spool_dropped
        if dropped > 0:
            self._spool_dropped += dropped
            self._finish(dropped)
            self._log_once("spool-full", logging.ERROR,
                           "goodput spool %s is full (or its files were removed): dropping events, "
                           "the oldest first, counted in stats.dropped", self._spool.directory)

    def _keep_in_memory(self, record: Record) -> None:
        """Queues an event the spool refused, dropping the oldest queued one if memory is full.

        While events spilled earlier wait on disk, the event overtakes them: the pipeline puts
        an attempt's events back in order by sequence number.
        """
        queue = self._queue
        if len(queue) + len(self._inflight) >= self._capacity:
            self._counts["dropped"] += 1
            self._finish(1)
            oldest = next((i for i, queued in enumerate(queue) if queued[2] not in PROTECTED_KINDS),
                          None)
            if oldest is None:
                return  # all in memory is being sent or protected: the event itself is the oldest
            del queue[oldest]
        queue.append(record)
        if len(queue) >= self._batch:
            self._wake()

    def _finish(self, count: int) -> None:
        """Counts own events delivered or dropped (holding the lock); wakes ``flush``."""
        self._finished += count
        self._finished_changed.notify_all()

    # -- flushing and closing ---------------------------------------------------------------

    def flush(self, timeout: float | None) -> bool:
        """Waits until every event queued before the call is delivered (or dropped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wake()
        if self._thread is None:
            return self._flush_here(deadline)
        with self._lock:
            self._adopt_interrupted()
            target = self._recorded()
            self._force = True
            self._wake()
            while self._finished < (target := self._covering(target)):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._finished_changed.wait(remaining)
            return True

    def _flush_here(self, deadline: float | None) -> bool:
        """``flush`` without a thread: the thread's work, done by the caller until ``deadline``."""
        with self._lock:
            self._adopt_interrupted()
            target = self._recorded()
            self._force = True
            self._deadline = deadline
        try:
            self._send_backlog()
            while self._drain(partial=True) and self._finished < self._covering(target):
                pass
        finally:
            self._deadline = None
        with self._lock:
            return self._finished >= self._covering(target)

    def _covering(self, target: int) -> int:
        """How many numbers a flush waiting for the first ``target`` waits for: those, and the
        events derived from any of them (holding the lock)."""
        return max([target, *(drawn for lowest, drawn in self._derived if lowest < target)])

    def close(self, timeout: float) -> bool:
        """Delivers what it can within ``timeout``, stops the thread, spools the rest.

        Returns whether every event of the attempt was delivered: False if the deadline came
        first or any event was dropped.
        """
        deadline = time.monotonic() + timeout
        delivered = self.flush(timeout)
        self._closing.set()
        # The thread holds the lock for moments (past the deadline too: a close of 0 s must not
        # leave the events in memory for that), unless a disk it touches under it hangs.
        if not self._lock.acquire(timeout=max(CLOSE_LOCK_GRACE_S, deadline - time.monotonic())):
            _LOG.error("goodput emitter: the worker of %r is stuck; closing without it",
                       self._run_id)
            return False
        try:
            self._wake()
        finally:
            self._lock.release()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, min(deadline - time.monotonic(), 1.0)))
        return self._end(delivered)

    def retire(self, timeout: float) -> None:
        """Ends the attempt without waiting: the thread delivers what the worker holds within
        ``timeout``, spools the rest and stops (at once without a thread, to the spool)."""
        if self._thread is None:  # to the spool at once, from the caller's thread
            self._closing.set()
            self._end(False)
            return
        # Without the lock, which the thread may hold for a while (listing the spool): flags the
        # thread reads, set in the order it reads them.
        self._deadline = time.monotonic() + timeout
        self._force = True
        self._retiring = True
        self._wake()

    def retire_now(self) -> None:
        """Has a retiring worker stop delivering and spool what it holds, as soon as it can."""
        self._closing.set()
        self._wake()  # without its lock, which its thread may hold while it spools: not waited on

    def done(self) -> bool:
        """Whether a retiring (or closed) worker has ended."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self, deadline: float | None) -> bool:
        """Whether a retiring worker delivered everything, waiting until ``deadline`` at most."""
        if self._thread is not None:
            self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self.done() and self._delivered

    def _end(self, delivered: bool) -> bool:
        """Spools what memory holds, closes the spool and the transport; whether everything was
        delivered."""
        with self._lock:
            if self._closed:
                return self._delivered
            self._closed = True
            self.lane.room = 0
            self._absorb()
            leftover = self._leftover()
            self._queue.clear()
            self._inflight = []
            if leftover:
                full_before = self._spool.dropped_events
                refused = self._spool.write_segment(leftover)
                self._counts["dropped"] += refused
                kept = len(leftover) - refused - (self._spool.dropped_events - full_before)
                if kept:
                    _LOG.warning("goodput emitter: %d undelivered events kept in spool %s for "
                                 "the next process of this run", kept, self._spool.directory)
            try:
                self._spool.close()
            except OSError as error:
                _LOG.error("goodput emitter: closing spool %s failed: %s",
                           self._spool.directory, error)
            dropped = self._counts["dropped"] + self._spool.dropped_events
            self._delivered = delivered and not dropped and not self._spool.kept_events
        try:
            self._transport.close()
        except Exception as error:  # noqa: BLE001 - a transport must not break close()
            _LOG.warning("goodput emitter: closing %r failed: %s", self._transport, error)
        return self._delivered

    def _leftover(self) -> list[Record]:
        """Every event in memory, in seq order, once each: in flight, queued, and being spilled by
        a call a signal handler interrupted (holding the lock; a copy the call writes as well is
        dropped by the pipeline)."""
        self._adopt_interrupted()
        records = {record[0]: record for record in [*self._inflight, *self._queue]}
        for _, slot in list(self._pending):
            if len(slot) == 4:
                records.setdefault(slot[3], (slot[3], slot[0], slot[1], slot[2]))
        return [records[seq] for seq in sorted(records)]

    def deliver_late(self, time_us: int, kind: str, body: Any, timeout: float) -> None:
        """Records an event after the worker closed (from an exit hook that ran after the
        recorder's): sends it within ``timeout``, else spools it for the next process of the run."""
        slot = [time_us, kind, body]
        self.lane.draw_into(slot)
        record: Record = (slot[3], time_us, kind, body)
        if not self._send_within([record], timeout):
            with self._lock:
                self._counts["dropped"] += self._spool.write_segment([record])

    def _send_within(self, records: list[Record], timeout: float) -> bool:
        """Sends ``records`` once, on a thread waited for ``timeout`` at most (a send may hang);
        whether they were delivered (and counted)."""
        messages = list(encode_batches(self._run_id, self._attempt_id, records,
                                       MAX_MESSAGE_BYTES - MESSAGE_HEADROOM_BYTES, self._workload_uid,
                                       encode_events))
        delivered = threading.Event()

        def send() -> None:
            if all(self._send(message) for message in messages):
                delivered.set()

        try:
            sender = threading.Thread(target=send, name="goodput-emitter-late", daemon=True)
            sender.start()
        except RuntimeError:  # no threads here: the spool is what a hung send cannot block
            return False
        sender.join(timeout)
        if not delivered.is_set():  # a send still under way may deliver it too: a copy, dropped
            return False
        with self._lock:
            self._counts["messages_sent"] += len(messages)
            self._counts["sent"] += len(records)
            self._finish(len(records))
        return True

    def after_fork(self, attempt_id: str, attempt_start_ns: int, derive: Derive | None = None) -> None:
        """Starts afresh in a forked child: empty queue, new thread, the child's own attempt (and
        the recorder's hook for it)."""
        self._attempt_id = attempt_id
        self._derive = derive
        self._may_start = None
        self._transport.after_fork()
        self._spool.after_fork(attempt_id, attempt_start_ns)
        self._init_runtime_state()

    @property
    def stats(self) -> EmitterStats:
        with self._lock:
            counts = self._counts
            return EmitterStats(
                recorded=self._recorded(),
                sent=counts["sent"],
                spilled=counts["spilled"],
                dropped=counts["dropped"] + self._spool.dropped_events,
                dropped_refused=counts["dropped_refused"],
                dropped_removed=self._spool.removed_events,
                send_errors=counts["send_errors"],
                messages_sent=counts["messages_sent"],
                queued=len(self._queue) + len(self._inflight) + len(self.lane),
                kept=self._spool.kept_events,
                backlog_sent=counts["backlog_sent"],
                backlog_dropped=counts["backlog_dropped"] + self._spool.dropped_backlog_events,
            )

    def count_dropped_after_close(self) -> None:
        with self._lock:
            self._counts["dropped"] += 1

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                self._serve()
                break
            except Exception:  # noqa: BLE001 - the thread must neither die nor die silently
                if "thread" not in self._logged:
                    self._logged.add("thread")
                    _LOG.exception("goodput emitter thread failed; it carries on after a pause")
            if self._closing.wait(self._settings.retry_max_backoff_s):
                break
        if self._retiring:
            self._end(self._retired_empty())

    def _serve(self) -> None:
        # Woken for a full batch, a flush or a close; else the latency has passed since the last
        # wake, and whatever is queued is due. The spool is listed for what earlier attempts
        # left at once, or after the first wake in a restart's attempt: one that the next restart
        # ends at once never lists it.
        if self._restart:
            woken = self._wait()
            self._send_backlog()
        else:
            self._send_backlog()
            woken = self._wait()
        while not self._stopping():
            if not self._drain(partial=not woken):
                if self._retiring:
                    if self._retired_empty():
                        return
                else:
                    self._maybe_heartbeat()  # only an idle recorder needs one
            woken = self._wait()

    def _wait(self) -> bool:
        """Waits for a wake, at most the latency (or until the deadline); whether woken."""
        latency = self._settings.max_latency_s
        wait = latency if self._deadline is None else min(latency, self._deadline - time.monotonic())
        return self._wakeup.acquire(timeout=max(0.0, wait))

    def _retired_empty(self) -> bool:
        """Whether a retiring worker has delivered everything it held."""
        with self._lock:
            return self._finished >= self._covering(self._recorded())

    def _drain(self, *, partial: bool) -> bool:
        """Sends the full batches queued now, and a partial one if ``partial`` or a flush asks
        for everything. The queue goes first, then this attempt's spool. Returns whether it sent
        anything."""
        sent = False
        while not self._stopping():
            segment = None
            with self._lock:
                self._absorb()
                queue = self._queue
                queued = len(queue)
                if self._inflight:
                    pass  # a batch whose sending an error interrupted: it goes first
                elif queued >= self._batch or (queued and (partial or self._force)):
                    # Copied, then taken from the queue: always in one or both (a signal
                    # handler's close finds them, when this runs on the caller's thread).
                    self._inflight = list(itertools.islice(queue, self._batch))
                    for _ in range(len(self._inflight)):
                        queue.popleft()
                    self._update_room()
                elif queued:
                    return sent  # a partial batch that is not due yet
                elif self._spilling:
                    if self._spool.busy:
                        return sent  # a spill a signal handler interrupted: its segment is open
                    try:
                        self._spool.seal()
                        own = self._spool.segments(own=True)
                    except OSError as error:
                        self._log_once("spool-list", logging.ERROR,
                                       "goodput spool %s cannot be read (%s); retrying",
                                       self._spool.directory, error)
                        return sent
                    finally:
                        self._finish_spool_drops()
                    if not own:
                        self._spilling = False
                        self._update_room()
                        self._force = False
                        return sent
                    segment = own[0]
                else:
                    self._force = False
                    return sent
            if segment is not None:
                if not self._send_segment(segment, own=True):
                    return sent
                sent = True
                continue
            self._derive_from(self._inflight)
            if not self._deliver(self._run_id, self._attempt_id, self._workload_uid, self._inflight,
                                 own=True):
                return sent
            sent = True
            with self._lock:
                self._inflight = []
                self._update_room()
        return sent

    def _stopping(self) -> bool:
        """Whether sending must stop now: closing, or past the deadline of a retirement or of a
        flush from the caller's thread."""
        return self._closing.is_set() or (self._deadline is not None and time.monotonic() >= self._deadline)

    def _derive_from(self, batch: list[Record]) -> None:
        """Queues the events the recorder's hook derives from a batch about to be sent."""
        if self._derive is None:
            return
        try:
            derived = self._derive(batch)
        except Exception:  # noqa: BLE001 - the hook must not stop the sending: logged once
            if "derive" not in self._logged:
                self._logged.add("derive")
                _LOG.exception("goodput emitter: collecting what an attempt's events imply failed")
            return
        if derived is None:  # it will derive nothing more from this attempt
            self._derive = None
            return
        if derived:
            with self._lock:
                for time_us, kind, body in derived:
                    self.put(time_us, kind, body)
                self._derived.append((min(record[0] for record in batch), self._recorded()))

    def _send_backlog(self) -> None:
        """Sends what earlier attempts of this run left in the spool (not once it retires: the
        next attempt does)."""
        if self._retiring or self._stopping():
            return
        with self._lock:
            try:
                backlog = self._spool.segments(own=False)
            except OSError as error:
                _LOG.error("goodput spool %s cannot be read (%s): events that earlier attempts "
                           "left there are not sent", self._spool.directory, error)
                return
        for path in backlog:
            if self._stopping() or not self._send_segment(path, own=False):
                return

    def _send_segment(self, path: Path, *, own: bool) -> bool:
        """Sends a sealed segment and deletes it; False if it is still there to send later."""
        with self._lock:
            self._spool.claim(path)  # making room must not drop what is being sent
        try:
            content = self._spool.read(path)  # disk reads and decoding, without the lock
            if content is None:
                return not own  # another process's is skipped; this attempt's is retried later
            run_id, attempt_id, workload_uid, records = content
            if own:  # what an interrupted send of it delivered is not sent, nor counted, again
                records = records[self._spool.already_sent(path):]
            for start in range(0, len(records), self._batch):
                chunk = records[start:start + self._batch]
                if not self._deliver(run_id, attempt_id, workload_uid, chunk, own=own):
                    return False
                if own:
                    with self._lock:
                        self._spool.delivered(path, len(chunk))
            with self._lock:
                self._spool.remove(path)
            return True
        finally:
            with self._lock:
                self._spool.claim(None)

    def _deliver(self, run_id: str, attempt_id: str, workload_uid: str, records: list[Record], *,
                 own: bool) -> bool:
        """Sends one batch, as one message unless it is too large for one, retrying with
        backoff; False if closing (or the caller's deadline) interrupted the retries (a part sent
        already is sent again with the rest: the pipeline drops the repeated events)."""
        refused = messages = 0
        for message in encode_batches(run_id, attempt_id, records, MAX_MESSAGE_BYTES - MESSAGE_HEADROOM_BYTES,
                                      workload_uid, encode_events):
            backoff = self._settings.retry_initial_backoff_s
            while not (sent := self._send(message)):
                if sent is None:  # refused for good: retrying would never end
                    refused += sum(message.first_seq <= seq <= message.last_seq
                                   for seq, *_ in records)
                    break
                if self._closing.wait(self._backoff(backoff)) or self._stopping():
                    with self._lock:
                        self._counts["messages_sent"] += messages
                    return False
                backoff = min(backoff * 2, self._settings.retry_max_backoff_s)
            else:
                messages += 1
        with self._lock:
            self._counts["messages_sent"] += messages
            if own:
                self._counts["sent"] += len(records) - refused
                self._counts["dropped"] += refused
                self._counts["dropped_refused"] += refused
                self._finish(len(records))
            else:
                self._counts["backlog_sent"] += len(records) - refused
                self._counts["backlog_dropped"] += refused
        return True

    def _backoff(self, backoff: float) -> float:
        """The wait before the next try: ``backoff``, cut at the deadline."""
        if self._deadline is None:
            return backoff
        return max(0.0, min(backoff, self._deadline - time.monotonic()))

    def _send(self, message: Message) -> bool | None:
        """Sends one message: True if delivered, False to retry, None if refused for good."""
        send_unless = getattr(self._transport, "send_unless", None)
        try:
            if send_unless is None:
                self._transport.send(message)
            else:  # the recorder's transport, shared by its attempts (one send at a time)
                send_unless(message, self._stopping)
        except SendCancelled:
            return False
        except MessageRefused as error:
            self._log_once("refused", logging.ERROR,
                           "goodput emitter: %r refused a message of %d bytes for good (%s); its "
                           "events are dropped and counted", self._transport, len(message.data),
                           error)
            return None
        except Exception as error:  # noqa: BLE001 - transport failures are logged, never raised
            with self._lock:
                self._counts["send_errors"] += 1
            self._log_once(f"send:{type(error).__name__}", logging.WARNING,
                           "goodput emitter: sending to %r failed (%s: %s); retrying with backoff",
                           self._transport, type(error).__name__, error)
            return False
        return True

    def _maybe_heartbeat(self) -> None:
        interval = self._settings.heartbeat_interval_s
        if self._heartbeat is None or interval is None:
            return
        now = time.monotonic()
        with self._lock:
            recorded = self._recorded()
        if recorded != self._seen_seq:
            self._seen_seq = recorded
            self._last_activity = now
        elif now - self._last_activity >= interval:
            self._last_activity = now
            self._heartbeat()

    def _log_once(self, key: str, level: int, message: str, *args: object) -> None:
        if key in self._logged:
            _LOG.debug(message, *args)
        else:
            self._logged.add(key)
            _LOG.log(level, message, *args)
