"""Local stand-ins for cloud services, speaking their real protocols.

Each is started from the command line (``python -m pipeline.emulators.NAME --port P``, or
``goodput emulator NAME``) or in-process as a context manager; the helpers here are their shared
command-line parts and the request-size rule of Google's front end, which every API sits behind.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

#: The largest request Google's front end passes on to an API, in bytes (10 MiB). A larger one is
#: answered INVALID_ARGUMENT (HTTP 400) "Request payload size exceeds the limit: 10485760 bytes."
#: before the service sees it: reported from Pub/Sub over gRPC and REST and from BigQuery's insertAll.
FRONT_END_MAX_REQUEST_BYTES = 10 * 1024 * 1024
#: gRPC server options of the stand-ins: a port in use is an error, not a shared port; and no
#: receive limit of gRPC's own (4 MiB by default, answered RESOURCE_EXHAUSTED, which clients retry
#: as a quota error), so every size is judged by the service's rules instead.
GRPC_SERVER_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", -1)]


def payload_too_large(limit: int) -> str:
    """The front end's words for a request over ``limit`` bytes."""
    return f"Request payload size exceeds the limit: {limit} bytes."


class Sized(NamedTuple):
    """A gRPC request with the size it had on the wire; ``request`` is None when the size is
    over the front end's limit (such a request is refused unread)."""

    size: int
    request: Any


def sized(deserialize: Callable[[bytes], Any],
          limit: int = FRONT_END_MAX_REQUEST_BYTES) -> Callable[[bytes], Sized]:
    """A request deserializer that keeps the request's size on the wire beside it."""

    def read(raw: bytes) -> Sized:
        return Sized(len(raw), deserialize(raw) if len(raw) <= limit else None)

    return read


class Stoppable(Protocol):
    def stop(self) -> None: ...


def emulator_parser(name: str, description: str, port: int) -> argparse.ArgumentParser:
    """The command line every stand-in shares: ``--port`` and ``--host``."""
    parser = argparse.ArgumentParser(prog=f"python -m pipeline.emulators.{name}", description=description)
    parser.add_argument("--port", type=int, default=port, help="port to listen on (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    return parser


#: The names ``--topic`` and ``--subscription`` of the Pub/Sub emulator take, with a project id
#: that Beam's Pub/Sub read takes too (``apache_beam.io.gcp.pubsub.PROJECT_ID_REGEXP``).
_PROJECT = r"[a-z][-a-z0-9:.]{4,61}[a-z0-9]"
_TOPIC = re.compile(rf"projects/{_PROJECT}/topics/[^/\s]+")
_SUBSCRIPTION = re.compile(rf"projects/{_PROJECT}/subscriptions/[^/\s]+")
#: What a name that is not one of them is told.
_PROJECT_HINT = "P: a project id, 6 or more lower-case letters, digits and hyphens, e.g. goodput-local"


def add_topic_options(parser: argparse.ArgumentParser) -> None:
    """``--topic`` and ``--subscription``: what the emulator holds when it starts."""
    parser.add_argument("--topic", metavar="projects/P/topics/T",
                        help="create this topic at start (where the emitter publishes: "
                             "GOODPUT_DESTINATION=projects/P/topics/T)")
    parser.add_argument("--subscription", metavar="projects/P/subscriptions/S", action="append",
                        help="create this subscription of --topic at start (what the stream reads: "
                             "python -m pipeline --streaming --subscription=...); may be repeated")


def check_topic_options(topic: str | None, subscriptions: list[str] | None) -> str | None:
    """What is wrong with ``--topic`` and ``--subscription``, in one line; None if nothing."""
    if subscriptions and not topic:
        return "--subscription needs --topic, the topic it is a subscription of"
    if topic is not None and not _TOPIC.fullmatch(topic):
        return f"--topic={topic} is not projects/P/topics/T ({_PROJECT_HINT})"
    for name in subscriptions or ():
        if not _SUBSCRIPTION.fullmatch(name):
            return f"--subscription={name} is not projects/P/subscriptions/S ({_PROJECT_HINT})"
    return None


def log_to_console() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")


def serve_until_signalled(emulator: Stoppable) -> int:
    """Keeps a started stand-in serving until SIGINT or SIGTERM, then stops it."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    emulator.stop()
    return 0
