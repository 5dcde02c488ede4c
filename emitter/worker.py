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
events by number.)

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

#: Room left in a message for what a destination adds to its data (Pub/Sub's topic, attributes
#: and ordering key count against its 10 MB request limit).
MESSAGE_HEADROOM_BYTES = 16 * 1024


@dataclasses.dataclass(frozen=True)
class EmitterStats:
    """Counters of one recorder (one attempt): what it recorded and where each event went.

    ``GoodputRecorder.stats`` returns a snapshot of them. No loss is silent: once ``flush()``
    returns True, every event this attempt recorded is counted in ``sent`` or in ``dropped``.
    ``close()`` leaves what it could not deliver in time in the spool for the next attempt of
    the run (and says so in the log); the next attempt counts it in ``backlog_sent``.

    Attributes:
        recorded: Events accepted by ``record_*`` calls; their sequence numbers are
            ``0 .. recorded - 1``.
        sent: Events of this attempt delivered by the transport, each counted once.
        spilled: Events written to the on-disk spool because the in-memory queue was full.
        dropped: Events of this attempt lost, for any reason: memory and spool were both full
            or the spool refused them (the oldest go first, the attempt's ``job_start`` last),
            the destination refused their message for good (``dropped_refused``), or a call
            came after ``close()`` (such a call is not in ``recorded``).
        dropped_refused: Of ``dropped``, events whose message the destination refused for good
            (too large for it): they are never retried.
        send_errors: Failed transport sends (each retried with backoff).
        messages_sent: Messages delivered (this attempt's and the backlog's).
        queued: Events held in memory at the moment: at most ``max_queue_events``, but for the
            attempt's ``job_start`` and for a few more while several threads record at once.
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
    send_errors: int = 0
    messages_sent: int = 0
    queued: int = 0
    backlog_sent: int = 0
    backlog_dropped: int = 0
    invalid_calls: int = 0
    dropped_config_entries: int = 0
    dropped_metric_values: int = 0


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
    ) -> None:
        self._run_id = run_id
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
        self.lane = Lane(min(2 * self._batch, MAX_LANE_SLOTS), MAX_COUNT, self._wakeup.release)
        self._queue: collections.deque[Record] = collections.deque()
        self._spilling = False
        self._finished = 0  # own events sent or dropped; flush waits on it
        self._finished_changed = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._inflight: list[Record] = []  # a batch taken from the queue, being sent
        # (lowest seq of a batch, numbers drawn once the events derived from it were queued)
        self._derived: list[tuple[int, int]] = []
        self._update_room()
        self._force = False  # send a partial batch now (flush, close)
        self._seen_seq = 0
        self._last_activity = time.monotonic()
        self._counts: collections.Counter[str] = collections.Counter()
        self._logged: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="goodput-emitter", daemon=True)
        self._thread.start()

    # -- caller side ------------------------------------------------------------------------

    def put(self, time_us: int, kind: str, body: Any) -> None:
        """Queues one event; O(1), never blocks on I/O of the transport, never raises."""
        if not self.lane.put(time_us, kind, body):
            self._put_with_lock(time_us, kind, body)

    def _absorb(self) -> None:
        """Moves the lane's events to the queue (holding the lock)."""
        if len(self.lane):
            self._queue.extend(self.lane.take())

    def _update_room(self) -> None:
        """Sets the lane's room from the queue's state (holding the lock): what is left in memory,
        none while spilling; and has it wake the thread when the queue and the lane hold a batch."""
        lane, queued = self.lane, len(self._queue)
        lane.room = 0 if self._spilling else self._capacity - len(self._inflight) - queued
        lane.wake_at = max(1, self._batch - queued)
        if len(lane) >= lane.wake_at:
            self._wake()

    def _put_with_lock(self, time_us: int, kind: str, body: Any) -> None:
        """Queues or spills one event when the lane has no room or events wait in the spool."""
        with self._lock:
            self._absorb()
            record = (self.lane.draw(), time_us, kind, body)
            try:
                if not self._spilling or kind in PROTECTED_KINDS:
                    queued = len(self._queue)
                    if queued + len(self._inflight) < self._capacity or kind in PROTECTED_KINDS:
                        self._queue.append(record)
                        if queued + 1 >= self._batch:
                            self._wake()
                        return
                    self._spilling = True
                self._spill(record)
            finally:
                self._update_room()

    def _recorded(self) -> int:
        """How many numbers were drawn for events now queued or gone (holding the lock)."""
        return self.lane.next_seq

    def _wake(self) -> None:
        """Wakes the thread (holding the lock)."""
        if self._wakeup.locked():
            # A signal handler's wake may come between the check and the release.
            with contextlib.suppress(RuntimeError):
                self._wakeup.release()

    def _spill(self, record: Record) -> None:
        dropped_before = self._spool.dropped_events
        try:
            stored = self._spool.append(record)
        except OSError as error:
            self._log_once("spool-error", logging.ERROR,
                           "goodput spool %s refuses events (%s): keeping the newest %d in memory "
                           "and dropping the oldest until it accepts them again",
                           self._spool.directory, error, self._capacity)
            self._keep_in_memory(record)
            return
        if stored:
            self._counts["spilled"] += 1
        dropped = self._spool.dropped_events - dropped_before
        if dropped:
            self._finish(dropped)  # never delivered: flush must not wait for them
            self._log_once("spool-full", logging.ERROR,
                           "goodput spool %s is full: dropping the oldest events",
                           self._spool.directory)

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
        with self._lock:
            target = self._recorded()
            self._force = True
            self._wake()
            while self._finished < (target := self._covering(target)):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._finished_changed.wait(remaining)
            return True

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
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _LOG.error("goodput emitter: the worker of %r is stuck; closing without it",
                       self._run_id)
            return False
        try:
            self._wake()
        finally:
            self._lock.release()
        self._thread.join(max(0.0, min(deadline - time.monotonic(), 1.0)))
        with self._lock:
            self.lane.room = 0
            self._absorb()
            leftover = list(self._inflight) + list(self._queue)
            self._queue.clear()
            self._inflight = []
            if leftover:
                full_before = self._spool.dropped_events
                refused = self._spool.write_segment(sorted(leftover))
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
        try:
            self._transport.close()
        except Exception as error:  # noqa: BLE001 - a transport must not break close()
            _LOG.warning("goodput emitter: closing %r failed: %s", self._transport, error)
        return delivered and not dropped

    def after_fork(self, attempt_id: str, attempt_start_ns: int, derive: Derive | None = None) -> None:
        """Starts afresh in a forked child: empty queue, new thread, the child's own attempt (and
        the recorder's hook for it)."""
        self._attempt_id = attempt_id
        self._derive = derive
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
                send_errors=counts["send_errors"],
                messages_sent=counts["messages_sent"],
                queued=len(self._queue) + len(self._inflight) + len(self.lane),
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
                return
            except Exception:  # noqa: BLE001 - the thread must neither die nor die silently
                if "thread" not in self._logged:
                    self._logged.add("thread")
                    _LOG.exception("goodput emitter thread failed; it carries on after a pause")
            if self._closing.wait(self._settings.retry_max_backoff_s):
                return

    def _serve(self) -> None:
        self._send_backlog()
        latency = self._settings.max_latency_s
        while not self._closing.is_set():
            # Woken for a full batch, a flush or a close; else the latency has passed since the
            # last wake, and whatever is queued is due.
            woken = self._wakeup.acquire(timeout=latency)
            if not self._drain(partial=not woken):
                self._maybe_heartbeat()  # only an idle recorder needs one

    def _drain(self, *, partial: bool) -> bool:
        """Sends the full batches queued now, and a partial one if ``partial`` or a flush asks
        for everything. The queue goes first, then this attempt's spool. Returns whether it sent
        anything."""
        sent = False
        while not self._closing.is_set():
            segment = None
            with self._lock:
                self._absorb()
                queue = self._queue
                queued = len(queue)
                if self._inflight:
                    pass  # a batch whose sending an error interrupted: it goes first
                elif queued >= self._batch or (queued and (partial or self._force)):
                    if queued <= self._batch:
                        self._inflight = list(queue)
                        queue.clear()
                    else:
                        self._inflight = [queue.popleft() for _ in range(self._batch)]
                    self._update_room()
                elif queued:
                    return sent  # a partial batch that is not due yet
                elif self._spilling:
                    try:
                        self._spool.seal()
                        own = self._spool.segments(own=True)
                    except OSError as error:
                        self._log_once("spool-list", logging.ERROR,
                                       "goodput spool %s cannot be read (%s); retrying",
                                       self._spool.directory, error)
                        return sent
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
        """Sends what earlier attempts of this run left in the spool."""
        with self._lock:
            try:
                backlog = self._spool.segments(own=False)
            except OSError as error:
                _LOG.error("goodput spool %s cannot be read (%s): events that earlier attempts "
                           "left there are not sent", self._spool.directory, error)
                return
        for path in backlog:
            if self._closing.is_set() or not self._send_segment(path, own=False):
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
            for start in range(0, len(records), self._batch):
                if not self._deliver(run_id, attempt_id, workload_uid, records[start:start + self._batch],
                                     own=own):
                    return False
            with self._lock:
                self._spool.remove(path)
            return True
        finally:
            with self._lock:
                self._spool.claim(None)

    def _deliver(self, run_id: str, attempt_id: str, workload_uid: str, records: list[Record], *,
                 own: bool) -> bool:
        """Sends one batch, as one message unless it is too large for one, retrying with
        backoff; False if closing interrupted the retries (a part sent already is sent again
        with the rest: the pipeline drops the repeated events)."""
        refused = messages = 0
        for message in encode_batches(run_id, attempt_id, records, MAX_MESSAGE_BYTES - MESSAGE_HEADROOM_BYTES,
                                      workload_uid, encode_events):
            backoff = self._settings.retry_initial_backoff_s
            while not (sent := self._send(message)):
                if sent is None:  # refused for good: retrying would never end
                    refused += sum(message.first_seq <= seq <= message.last_seq
                                   for seq, *_ in records)
                    break
                if self._closing.wait(backoff):
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

    def _send(self, message: Message) -> bool | None:
        """Sends one message: True if delivered, False to retry, None if refused for good."""
        try:
            self._transport.send(message)
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
