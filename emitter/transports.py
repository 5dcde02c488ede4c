"""Where encoded messages go: the transport interface and the file transport.

A transport is called only from the emitter's background thread. ``send`` either delivers the
message or raises; the worker retries with backoff and spools, so a transport never needs its
own retry loop or buffering.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from pathlib import Path
from typing import Any, Protocol


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


class PubSubTransport:
    """Publishes each message to a Pub/Sub topic with the real ``google-cloud-pubsub`` client.

    One Pub/Sub message per batch: the data is the batch's JSON encoding; attributes carry the
    run id, the message id (``attempt_id:first-last``, for deduplication) and the event time in
    milliseconds (for Beam's ``timestamp_attribute``); the ordering key is the run id. ``send``
    waits for the broker's acknowledgement, so a failure reaches the worker, which retries with
    backoff and spools meanwhile. The client's own retries are cut short for the same reason,
    and its flow control errors instead of blocking. ``$PUBSUB_EMULATOR_HOST`` points the client
    at an emulator, as for every Google client.
    """

    def __init__(self, topic: str, *, timeout_s: float = 30.0) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self._client: Any = None

    def _publisher(self) -> Any:
        if self._client is None:
            import google.cloud.pubsub_v1 as pubsub_v1  # imported here: files never need it

            self._client = pubsub_v1.PublisherClient(
                batch_settings=pubsub_v1.types.BatchSettings(max_messages=1, max_latency=0.0),
                publisher_options=pubsub_v1.types.PublisherOptions(
                    enable_message_ordering=True,
                    flow_control=pubsub_v1.types.PublishFlowControl(
                        message_limit=1000,
                        limit_exceeded_behavior=pubsub_v1.types.LimitExceededBehavior.ERROR),
                ),
            )
        return self._client

    def send(self, message: Message) -> None:
        from google.api_core import retry

        client = self._publisher()
        future = client.publish(
            self.topic, message.data, ordering_key=message.run_id,
            retry=retry.Retry(initial=0.1, maximum=1.0, timeout=self.timeout_s),
            timeout=self.timeout_s,
            run_id=message.run_id, message_id=message.message_id,
            event_time=str(message.event_time_us // 1000),
        )
        try:
            future.result(timeout=self.timeout_s)
        except Exception:
            # A failed publish pauses its ordering key; the worker's retry must find it open.
            client.resume_publish(self.topic, message.run_id)
            raise

    def after_fork(self) -> None:
        self._client = None  # a gRPC channel must not cross a fork

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client = None

    def __repr__(self) -> str:
        return f"PubSubTransport({self.topic!r})"


_TOPIC = re.compile(r"projects/[^/]+/topics/[^/]+")


def transport_for(destination: str) -> Transport:
    """The transport for a destination string.

    ``file:PATH`` appends to a local file; ``projects/P/topics/T`` publishes to a Pub/Sub topic.

    Raises:
        ValueError: The destination is not understood.
    """
    if destination.startswith("file:"):
        path = destination[len("file:"):]
        if not path:
            raise ValueError("destination 'file:' needs a path, e.g. 'file:/var/log/goodput.jsonl'")
        return FileTransport(path)
    if _TOPIC.fullmatch(destination):
        return PubSubTransport(destination)
    raise ValueError(
        f"destination {destination!r} not understood: use 'file:PATH' or 'projects/P/topics/T'"
    )
