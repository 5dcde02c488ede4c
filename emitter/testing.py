"""Capture a recorder's events in tests, with no transport and no files.

Example::

    from emitter import GoodputRecorder
    from emitter.testing import capture_events

    def test_my_training_loop_records_steps():
        with capture_events() as captured:
            recorder = GoodputRecorder("job", logging_enabled=True)
            train(recorder)
        assert [e.kind for e in captured.events][:2] == ["job_start", "step_start"]

Every recorder created inside the ``with`` block (with ``logging_enabled=True``) delivers to the
capture instead of its destination, through the same queue and background thread as in
production, spooling to a directory of the capture's own (so nothing an earlier process left in
the real spool is delivered to it). Reading ``captured.events`` flushes those recorders first, so
no sleep is needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from goodput_schemas.wire import Message

if TYPE_CHECKING:
    from emitter.recorder import GoodputRecorder


@dataclasses.dataclass(frozen=True)
class CapturedEvent:
    """One delivered event, decoded from its message (``workload_uid``: its header's, or empty)."""

    run_id: str
    attempt_id: str
    seq: int
    time_us: int
    kind: str
    body: dict[str, Any]
    workload_uid: str = ""


class _MemoryTransport:
    def __init__(self, capture: CapturedEvents) -> None:
        self._capture = capture

    def send(self, message: Message) -> None:
        self._capture._deliver(message)

    def after_fork(self) -> None:
        """Nothing to reopen."""

    def close(self) -> None:
        """Nothing to release."""


class CapturedEvents:
    """The messages and events delivered by recorders created during a capture."""

    def __init__(self, spool_dir: str) -> None:
        #: Where the recorders of this capture spool.
        self.spool_dir = spool_dir
        self._lock = threading.Lock()
        self._messages: list[Message] = []
        self._recorders: list[GoodputRecorder] = []

    def transport(self) -> _MemoryTransport:
        return _MemoryTransport(self)

    def attach(self, recorder: GoodputRecorder) -> None:
        with self._lock:
            self._recorders.append(recorder)

    def _deliver(self, message: Message) -> None:
        with self._lock:
            self._messages.append(message)

    def flush(self, timeout: float = 10.0) -> bool:
        """Waits for every attached recorder to deliver what it has recorded."""
        with self._lock:
            recorders = list(self._recorders)
        return all(recorder.flush(timeout) for recorder in recorders)

    @property
    def messages(self) -> list[Message]:
        """Delivered messages (after a flush), in delivery order."""
        self.flush()
        with self._lock:
            return list(self._messages)

    @property
    def events(self) -> list[CapturedEvent]:
        """Delivered events (after a flush), in delivery order."""
        events = []
        for message in self.messages:
            batch = json.loads(message.data)
            for event in batch["events"]:
                (kind, body), = ((k, v) for k, v in event.items() if k not in ("seq", "time_us"))
                events.append(CapturedEvent(batch["run_id"], batch["attempt_id"], event["seq"],
                                            event["time_us"], kind, body, batch.get("workload_uid", "")))
        return events


_active: CapturedEvents | None = None


def active_capture() -> CapturedEvents | None:
    """The capture in progress, if any (used by ``GoodputRecorder``)."""
    return _active


@contextlib.contextmanager
def capture_events() -> Iterator[CapturedEvents]:
    """Captures the events of every recorder created inside the block; not reentrant."""
    global _active
    if _active is not None:
        raise RuntimeError("capture_events() is already active")
    _active = captured = CapturedEvents(tempfile.mkdtemp(prefix="goodput-capture-"))
    try:
        yield captured
    finally:
        _active = None
        captured.flush()
        shutil.rmtree(captured.spool_dir, ignore_errors=True)
