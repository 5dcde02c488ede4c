"""The batching worker: a bounded in-memory queue drained by one background thread.

``put`` is what every ``record_*`` call ends in: it takes a lock, numbers the event, appends it
to a deque and returns; it never waits for the thread and never raises. When the queue is full
it appends the event to the on-disk spool instead, and keeps doing so until the thread has
drained the spool, so events stay in order and nothing is lost while the spool has room.

The thread sends, in order: segments left in the spool by earlier attempts of the run, then the
queue, then this attempt's own spooled events. A failed send is retried with exponential backoff
(the queue fills and spills to disk meanwhile); what is still unsent when the worker is closed is
written to the spool for the next process of the run to send.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emitter.encoding import Record, encode_batch
from emitter.settings import EmitterSettings
from emitter.spool import Spool
from emitter.transports import Message, Transport

_LOG = logging.getLogger("emitter")


@dataclasses.dataclass(frozen=True)
class EmitterStats:
    """Counters of one recorder (one attempt), for logs and tests.

    Attributes:
        recorded: Events accepted by ``record_*`` calls.
        sent: Events delivered by the transport (an event re-sent after a failure counts once
            per delivery).
        spilled: Events that went to the on-disk spool because the queue was full.
        dropped: Events lost: the spool was full, or a call came after ``close()``.
        send_errors: Failed transport sends (each retried).
        messages_sent: Messages delivered.
    """

    recorded: int = 0
    sent: int = 0
    spilled: int = 0
    dropped: int = 0
    send_errors: int = 0
    messages_sent: int = 0


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
    ) -> None:
        self._run_id = run_id
        self._attempt_id = attempt_id
        self._transport = transport
        self._spool = spool
        self._settings = settings
        self._heartbeat = heartbeat
        self._batch = settings.max_batch_events
        self._capacity = settings.max_queue_events
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[Record] = collections.deque()
        self._spilling = False
        self._next_seq = 0
        self._finished = 0  # own events sent or dropped; flush waits on it
        self._finished_changed = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._inflight: list[Record] = []
        self._oldest_at = 0.0  # when the oldest queued event was queued
        self._force = False  # send a partial batch now (flush, close)
        self._seen_seq = 0
        self._last_activity = time.monotonic()
        self._counts: collections.Counter[str] = collections.Counter()
        self._logged: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="goodput-emitter", daemon=True)
        self._thread.start()

    # -- caller side ------------------------------------------------------------------------

    def put(self, time_us: int, kind: str, body: dict[str, Any]) -> None:
        """Queues one event; O(1), never blocks on I/O of the transport, never raises."""
        with self._lock:
            seq = self._next_seq
            self._next_seq = seq + 1
            record = (seq, time_us, kind, body)
            if not self._spilling:
                queued = len(self._queue)
                if queued < self._capacity:
                    if not queued:
                        self._oldest_at = time.monotonic()
                    self._queue.append(record)
                    if queued + 1 == self._batch:
                        self._wake.set()
                    return
                self._spilling = True
            self._spill(record)

    def _spill(self, record: Record) -> None:
        dropped_before = self._spool.dropped_events
        try:
            if self._spool.append(record):
                self._counts["spilled"] += 1
            # Events dropped to make room will never be delivered: flush must not wait for them.
            self._finished += self._spool.dropped_events - dropped_before
            if self._spool.dropped_events > dropped_before:
                self._log_once("spool-full", logging.ERROR,
                               "goodput spool %s is full: dropping the oldest events",
                               self._spool.directory)
        except OSError as error:
            self._counts["dropped"] += 1
            self._finished += 1
            self._log_once("spool-error", logging.ERROR,
                           "goodput spool %s unusable (%s): dropping events that do not fit "
                           "in memory", self._spool.directory, error)

    # -- flushing and closing ---------------------------------------------------------------

    def flush(self, timeout: float | None) -> bool:
        """Waits until every event queued before the call is delivered (or dropped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            target = self._next_seq
            self._force = True
            self._wake.set()
            while self._finished < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._finished_changed.wait(remaining)
            return True

    def close(self, timeout: float) -> bool:
        """Delivers what it can within ``timeout``, stops the thread, spools the rest."""
        delivered = self.flush(timeout)
        self._closing.set()
        self._wake.set()
        self._thread.join(max(0.0, min(timeout, 1.0)))
        with self._lock:
            leftover = list(self._inflight) + list(self._queue)
            self._queue.clear()
            self._inflight = []
            try:
                if leftover:
                    self._spool.write_segment(sorted(leftover))
                    _LOG.warning("goodput emitter: %d undelivered events kept in spool %s for "
                                 "the next process of this run", len(leftover),
                                 self._spool.directory)
                self._spool.close()
            except OSError as error:
                self._counts["dropped"] += len(leftover)
                _LOG.error("goodput emitter: could not spool %d undelivered events: %s",
                           len(leftover), error)
        try:
            self._transport.close()
        except Exception as error:  # noqa: BLE001 - a transport must not break close()
            _LOG.warning("goodput emitter: closing %r failed: %s", self._transport, error)
        return delivered

    def after_fork(self, attempt_id: str, attempt_start_ns: int) -> None:
        """Starts afresh in a forked child: empty queue, new thread, the child's own attempt."""
        self._attempt_id = attempt_id
        self._transport.after_fork()
        self._spool.after_fork(attempt_id, attempt_start_ns)
        self._init_runtime_state()

    @property
    def stats(self) -> EmitterStats:
        with self._lock:
            counts = self._counts
            return EmitterStats(
                recorded=self._next_seq,
                sent=counts["sent"],
                spilled=counts["spilled"],
                dropped=counts["dropped"] + self._spool.dropped_events,
                send_errors=counts["send_errors"],
                messages_sent=counts["messages_sent"],
            )

    def count_dropped_after_close(self) -> None:
        with self._lock:
            self._counts["dropped"] += 1

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._send_backlog()
            latency = self._settings.max_latency_s
            while not self._closing.is_set():
                with self._lock:
                    wait = latency if not self._queue else self._oldest_at + latency - time.monotonic()
                self._wake.wait(max(0.0, wait))
                self._wake.clear()
                self._drain()
                self._maybe_heartbeat()
        except Exception:  # noqa: BLE001 - the thread must never die silently
            _LOG.exception("goodput emitter thread failed; events will be spooled at close")

    def _drain(self) -> None:
        """Sends the full batches queued now, and a partial one once it is due.

        The queue goes first, then this attempt's spool. A partial batch is due when its oldest
        event has waited ``max_latency_s``, or when a flush asks for everything.
        """
        latency = self._settings.max_latency_s
        while not self._closing.is_set():
            segment = None
            with self._lock:
                queued = len(self._queue)
                due = self._force or time.monotonic() - self._oldest_at >= latency
                if queued >= self._batch or (queued and due):
                    count = min(self._batch, queued)
                    self._inflight = [self._queue.popleft() for _ in range(count)]
                elif queued:
                    return  # a partial batch that is not due yet
                elif self._spilling:
                    self._spool.seal()
                    own = self._spool.segments(own=True)
                    if not own:
                        self._spilling = False
                        self._force = False
                        return
                    segment = own[0]
                else:
                    self._force = False
                    return
            if segment is not None:
                if not self._send_segment(segment, own=True):
                    return
            elif self._deliver(self._run_id, self._attempt_id, self._inflight, own=True):
                with self._lock:
                    self._inflight = []
            else:
                return

    def _send_backlog(self) -> None:
        """Sends what earlier attempts of this run left in the spool."""
        with self._lock:
            backlog = self._spool.segments(own=False)
        for path in backlog:
            if self._closing.is_set() or not self._send_segment(path, own=False):
                return

    def _send_segment(self, path: Path, *, own: bool) -> bool:
        with self._lock:
            content = self._spool.read(path)
        if content is None:
            return True
        run_id, attempt_id, records = content
        for start in range(0, len(records), self._batch):
            chunk = records[start:start + self._batch]
            if own:
                with self._lock:
                    self._inflight = chunk
            if not self._deliver(run_id, attempt_id, chunk, own=own):
                return False
        with self._lock:
            self._inflight = []
            self._spool.remove(path)
        return True

    def _deliver(self, run_id: str, attempt_id: str, records: list[Record], *, own: bool) -> bool:
        """Sends one batch, retrying with backoff; False if closing interrupted the retries."""
        message = encode_batch(run_id, attempt_id, records)
        backoff = self._settings.retry_initial_backoff_s
        while True:
            if self._send(message):
                with self._lock:
                    self._counts["sent"] += len(records)
                    self._counts["messages_sent"] += 1
                    if own:
                        self._finished += len(records)
                        self._finished_changed.notify_all()
                return True
            if self._closing.wait(backoff):
                return False
            backoff = min(backoff * 2, self._settings.retry_max_backoff_s)

    def _send(self, message: Message) -> bool:
        try:
            self._transport.send(message)
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
        if self._next_seq != self._seen_seq:
            self._seen_seq = self._next_seq
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
