"""Where encoded messages go: the transport interface and the file transport.

A transport is called only from the emitter's background thread. ``send`` either delivers the
message or raises; the worker retries with backoff and spools, so a transport never needs its
own retry loop or buffering.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Message:
    """One encoded message: a batch of events of one attempt, ready to publish.

    Attributes:
        run_id: The run the events belong to (Pub/Sub attribute and ordering key).
        attempt_id: The attempt that recorded them.
        first_seq: Sequence number of the first event in the batch.
        last_seq: Sequence number of the last event in the batch.
        event_time_us: The latest event time in the batch (Pub/Sub event-time attribute).
        data: The JSON encoding of the ``EventBatch``.
    """

    run_id: str
    attempt_id: str
    first_seq: int
    last_seq: int
    event_time_us: int
    data: bytes

    @property
    def message_id(self) -> str:
        """Identifies the batch; the same events re-sent in the same batch get the same id."""
        return f"{self.attempt_id}:{self.first_seq}-{self.last_seq}"


class Transport(Protocol):
    """Delivers messages; called from one background thread only."""

    def send(self, message: Message) -> None:
        """Delivers one message or raises."""

    def after_fork(self) -> None:
        """Drops handles inherited from the parent process (called in a forked child)."""

    def close(self) -> None:
        """Releases resources; ``send`` is not called afterwards."""


class FileTransport:
    """Appends each message's JSON encoding as one line to a local file.

    The line is written with a single ``write`` on a file opened in append mode, so several
    processes may share one file without interleaving lines.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None

    def send(self, message: Message) -> None:
        with self._lock:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            line = message.data + b"\n"
            written = os.write(self._fd, line)
            if written != len(line):
                # A short write leaves a partial line; the reader dead-letters it, and the
                # whole message is sent again, so nothing is lost.
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._fd = None

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __repr__(self) -> str:
        return f"FileTransport({str(self.path)!r})"


def transport_for(destination: str) -> Transport:
    """The transport for a destination string.

    ``file:PATH`` appends to a local file. Pub/Sub topics (``projects/P/topics/T``) are not
    supported by this version of the emitter.

    Raises:
        ValueError: The destination is not understood.
    """
    if destination.startswith("file:"):
        path = destination[len("file:"):]
        if not path:
            raise ValueError("destination 'file:' needs a path, e.g. 'file:/var/log/goodput.jsonl'")
        return FileTransport(path)
    if destination.startswith("projects/") and "/topics/" in destination:
        raise ValueError(
            f"destination {destination!r}: Pub/Sub topics are not supported by this emitter "
            "version; use 'file:PATH'"
        )
    raise ValueError(
        f"destination {destination!r} not understood: use 'file:PATH' or 'projects/P/topics/T'"
    )
