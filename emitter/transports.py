"""Where encoded messages go: the transport interface and the file transport.

A transport is called only from the emitter's background thread. ``send`` either delivers the
message or raises; the worker retries with backoff and spools, so a transport never needs its
own retry loop or buffering. A transport raises ``MessageRefused`` for a message its destination
will never take (too large for it): the worker drops and counts its events instead of retrying.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from goodput_schemas.limits import MAX_MESSAGE_BYTES
from goodput_schemas.wire import Message

_LOG = logging.getLogger("emitter")
_TAIL_CHUNK = 64 * 1024


class MessageRefused(Exception):
    """The destination refuses this message for good (e.g. it is too large for it)."""


class Transport(Protocol):
    """Delivers messages; called from one background thread only."""

    def send(self, message: Message) -> None:
        """Delivers one message or raises."""

    def after_fork(self) -> None:
        """Drops handles inherited from the parent process (called in a forked child)."""

    def close(self) -> None:
        """Releases resources; ``send`` is not called afterwards."""


class DestinationUnusable(Exception):
    """The destination cannot take messages (not configured, or not understood)."""


class Undeliverable:
    """The transport of a destination the emitter does not understand (a ``$GOODPUT_DESTINATION``
    of ``garbage``, say): every send fails, so that events wait in memory and in the spool, where
    the next process of the run, with a destination it understands, sends them. A job never ends
    for a setting of its metrics."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def send(self, message: Message) -> None:
        raise DestinationUnusable(self.reason)

    def delivery_time(self, timeout: float) -> float:
        """How much of ``timeout`` delivering is worth: none."""
        return 0.0

    def after_fork(self) -> None:
        """Nothing inherited."""

    def close(self) -> None:
        """Nothing held."""

    def __repr__(self) -> str:
        return "Undeliverable()"


class FileTransport:
    """Appends each message's JSON encoding as one line to a local file.

    A line is written whole or not at all: on a regular file each write holds an exclusive
    ``flock`` (several processes may share one file), a short write (a full disk) is cut off
    again before the send fails and is retried, and a torn tail that a killed writer left is
    cut off before the next line is appended, so it can never swallow that line. A FIFO or a
    device gets each line whole, written on until it is; opening a FIFO nobody reads fails at
    once (and is retried) instead of hanging.

    The file follows its path: once the path names another file (a log rotation renamed it, or
    removed it), the next message opens the path again. A line written to a file that was removed
    meanwhile is lost with it: the send fails and is retried at the path, never counted sent.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._regular = True

    def send(self, message: Message) -> None:
        with self._lock:
            if self._fd is not None and self._regular and not self._at_path(self._fd):
                self._forget()
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
                             | os.O_CLOEXEC, 0o644)
                self._regular = stat.S_ISREG(os.fstat(fd).st_mode)
                if self._regular:  # read too: a torn tail is found by reading it
                    os.close(fd)
                    fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
                else:
                    os.set_blocking(fd, True)
                self._fd = fd
            line = message.data + b"\n"
            if self._regular:
                self._append(self._fd, line)
            else:
                written = 0
                while written < len(line):
                    written += os.write(self._fd, line[written:])

    def _at_path(self, fd: int) -> bool:
        """Whether the path still names the open file."""
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def _forget(self) -> None:
        """Closes the open file: the next send opens the path again."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def _append(self, fd: int, line: bytes) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            end = self._repair_tail(fd, os.fstat(fd).st_size)
            written = os.write(fd, line)
            if written != len(line):
                os.ftruncate(fd, end)
                raise OSError(errno.ENOSPC, f"short write to {self.path} ({written} of "
                                            f"{len(line)} bytes), cut off again")
            if os.fstat(fd).st_nlink == 0:
                # Removed before or while the line was written: the line went with it.
                self._forget()
                raise OSError(errno.ENOENT, f"{self.path} was removed while a message was written "
                                            "to it; writing it again at the path")
        finally:
            if self._fd == fd:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _repair_tail(self, fd: int, end: int) -> int:
        """Cuts off a last line with no end (its writer was killed mid-write); the new end."""
        if end == 0 or os.pread(fd, 1, end - 1) == b"\n":
            return end
        cut, position = 0, end
        while position > 0:
            start = max(0, position - _TAIL_CHUNK)
            newline = os.pread(fd, position - start, start).rfind(b"\n")
            if newline >= 0:
                cut = start + newline + 1
                break
            position = start
        os.ftruncate(fd, cut)
        _LOG.warning("goodput emitter: %s ended in a torn line of %d bytes (a writer was cut off "
                     "mid-line); cut it off", self.path, end - cut)
        return cut

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._fd = None

    def close(self) -> None:
        with self._lock:
            self._forget()

    def __repr__(self) -> str:
        return f"FileTransport({str(self.path)!r})"


class PubSubTransport:
    """Publishes each message to a Pub/Sub topic with the real ``google-cloud-pubsub`` client.

    One Pub/Sub message per batch: the data is the batch's JSON encoding; attributes carry the
    run id, the message id (``attempt_id:first-last``, for deduplication) and the event time in
    milliseconds (for Beam's ``timestamp_attribute``); the ordering key is the run id. ``send``
    waits for the broker's acknowledgement, so a failure reaches the worker, which retries with
    backoff and spools meanwhile. The client's own retries are cut short for the same reason (it
    makes them endless when ordering keys are used), and its flow control errors instead of
    blocking. ``$PUBSUB_EMULATOR_HOST`` points the client at an emulator, as for every Google
    client.

    A send that failed leaves nothing behind that could still deliver its message later, after
    the retry that replaced it (a duplicate, out of order): the client's retries end by
    ``timeout_s`` and ``send`` waits for them to end. It then discards the client, with its
    paused ordering key and its gRPC channel, which while the broker is away waits longer and
    longer between reconnection attempts (up to two minutes); the next send starts a new
    client, which connects at once.
    """

    def __init__(self, topic: str, *, timeout_s: float = 30.0) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()
        self._sending = False

    def _publisher(self) -> Any:
        with self._lock:
            self._sending = True
            if self._client is None:
                import google.cloud.pubsub_v1 as pubsub_v1  # imported here: files never need it

                self._client = pubsub_v1.PublisherClient(
                    batch_settings=pubsub_v1.types.BatchSettings(max_messages=1, max_latency=0.0),
                    publisher_options=pubsub_v1.types.PublisherOptions(
                        enable_message_ordering=True,
                        # One message at a time: the limits only ever meet a single message,
                        # whose size is the request limit's to judge (a refusal for good).
                        flow_control=pubsub_v1.types.PublishFlowControl(
                            message_limit=1000, byte_limit=2 * MAX_MESSAGE_BYTES,
                            limit_exceeded_behavior=pubsub_v1.types.LimitExceededBehavior.ERROR),
                    ),
                )
            return self._client

    def send(self, message: Message) -> None:
        from google.api_core import exceptions, retry

        deadline = time.monotonic() + self.timeout_s
        transient = retry.if_exception_type(  # the client's own choice for Publish
            exceptions.Aborted, exceptions.Cancelled, exceptions.DeadlineExceeded,
            exceptions.InternalServerError, exceptions.ResourceExhausted,
            exceptions.ServiceUnavailable, exceptions.Unknown)

        def retryable(error: Exception) -> bool:
            # With ordering keys the client retries for 2**32 s whatever the Retry says:
            # the predicate is what ends its retries.
            return time.monotonic() < deadline and bool(transient(error))

        client = future = None
        delivered = False
        try:
            client = self._publisher()
            future = client.publish(
                self.topic, message.data, ordering_key=message.run_id,
                retry=retry.Retry(predicate=retryable, initial=0.1, maximum=1.0,
                                  timeout=self.timeout_s),
                timeout=self.timeout_s,
                run_id=message.run_id, message_id=message.message_id,
                event_time=str(message.event_time_us // 1000),
            )
            # Retries end by the deadline; the attempt then in flight within timeout_s more.
            future.result(timeout=2 * self.timeout_s + 2.0)
            delivered = True
        except exceptions.InvalidArgument as error:
            raise MessageRefused(str(error)) from error
        except ValueError as error:
            if type(error).__name__ == "MessageTooLargeError":  # the client's own check
                raise MessageRefused(str(error)) from error
            raise
        finally:
            with self._lock:
                self._sending = False
                if not delivered and self._client is client:
                    self._client = None
                kept = client is None or self._client is client
            # Closing a channel under a publish still running would kill its thread noisily.
            if not kept and (future is None or future.done()):
                _release(client)

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._sending = False
        self._client = None  # a gRPC channel must not cross a fork

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            sending = self._sending
        if client is not None and not sending:  # else the send releases it as it ends
            _release(client)

    def __repr__(self) -> str:
        return f"PubSubTransport({self.topic!r})"


def _release(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.stop()
    with contextlib.suppress(Exception):
        client.transport.close()


_TOPIC = re.compile(r"projects/[^/]+/topics/[^/]+")


def transport_for(destination: str, *, send_timeout_s: float = 30.0) -> Transport:
    """The transport for a destination string.

    ``file:PATH`` appends to a local file; ``projects/P/topics/T`` publishes to a Pub/Sub topic,
    each send taking at most about ``send_timeout_s``.

    Raises:
        ValueError: The destination is not understood (the recorder sends to ``Undeliverable``
            then).
    """
    if destination.startswith("file:"):
        path = destination[len("file:"):]
        if not path:
            raise ValueError("destination 'file:' needs a path, e.g. 'file:/var/log/goodput.jsonl'")
        return FileTransport(path)
    if _TOPIC.fullmatch(destination):
        return PubSubTransport(destination, timeout_s=send_timeout_s)
    raise ValueError(
        f"destination {destination!r} not understood: use 'file:PATH' or 'projects/P/topics/T'"
    )
