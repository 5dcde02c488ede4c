"""Where events go when the job says nothing: the fleet's topic in the project the job runs in.

A recorder constructed with no ``destination`` and no ``$GOODPUT_DESTINATION`` still records (a
job that ran with the reference library must not fail at start-up for a setting it never had).
Its background thread looks for the project as Google's client libraries do, from
``$GOOGLE_CLOUD_PROJECT`` (or ``$GCLOUD_PROJECT``) and else from ``google.auth.default()``: the
application default credentials' project, or on Google Cloud the metadata server's. Events go to
``projects/PROJECT/topics/fleet-goodput-events``, the topic the Terraform module creates (its
default ``name``). Where no project can be found, the emitter says so once, keeps what it records
in memory and in the spool, and looks again every ``SEARCH_INTERVAL_S``; the job runs on.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from emitter.transports import PubSubTransport
from goodput_schemas.wire import Message

_LOG = logging.getLogger(__name__)

#: The topic the Terraform module creates for events (``${var.name}-events``, default name).
DEFAULT_TOPIC_ID = "fleet-goodput-events"
#: Environment variables that name the project, in the order Google's libraries read them.
PROJECT_ENV = ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT")
#: How long a failed search waits before the next one.
SEARCH_INTERVAL_S = 300.0


class DestinationNotFound(RuntimeError):
    """No destination is configured and no project could be found."""


def find_project() -> str | None:
    """The project the job runs in, as Google's client libraries find it; ``None`` if none.

    May take seconds (a metadata server that does not answer): call it off the caller's thread.
    """
    for name in PROJECT_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    try:
        import google.auth  # a dependency of google-cloud-pubsub

        _, project = google.auth.default()
    except Exception as error:  # noqa: BLE001 - no credentials, no metadata server: not found
        _LOG.debug("goodput emitter: google.auth.default() found no project: %s", error)
        return None
    return project or None


class DiscoveredTransport:
    """Publishes to the fleet's topic in the job's project, found on the first send.

    The search runs in the emitter's background thread (the only caller of ``send``), so a
    recorder's constructor never waits for a metadata server.
    """

    def __init__(self, *, send_timeout_s: float = 30.0, topic_id: str = DEFAULT_TOPIC_ID) -> None:
        self.topic_id = topic_id
        self.send_timeout_s = send_timeout_s
        self._inner: PubSubTransport | None = None
        self._next_search = 0.0
        #: ``None`` until the first search ends, then whether it found a project.
        self.found: bool | None = None
        #: Set when the first search has ended.
        self.searched = threading.Event()
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        inner = self._inner
        if inner is None:
            inner = self._search()
        inner.send(message)

    def _search(self) -> PubSubTransport:
        now = time.monotonic()
        if now < self._next_search:
            raise DestinationNotFound(self._advice())
        project = find_project()
        with self._lock:
            self.found = project is not None
            self.searched.set()
            if project is None:
                self._next_search = now + SEARCH_INTERVAL_S
                raise DestinationNotFound(self._advice())
            self._inner = PubSubTransport(f"projects/{project}/topics/{self.topic_id}",
                                          timeout_s=self.send_timeout_s)
            _LOG.info("goodput emitter: no destination configured; sending to %s, found from "
                      "the job's project", self._inner.topic)
            return self._inner

    def delivery_time(self, timeout: float) -> float:
        """How much of ``timeout`` delivering is worth: after waiting (within it) for the first
        search to end, 0 if it found nowhere to deliver."""
        began = time.monotonic()
        self.searched.wait(timeout)
        return 0.0 if self.found is False else max(0.0, timeout - (time.monotonic() - began))

    def _advice(self) -> str:
        return ("no destination: set $GOODPUT_DESTINATION ('projects/P/topics/T' or 'file:PATH') "
                "or run where the project is known ($GOOGLE_CLOUD_PROJECT, application default "
                "credentials, the metadata server); events are kept in the spool meanwhile")

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        if self._inner is not None:
            self._inner.after_fork()

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()

    def __repr__(self) -> str:
        inner = self._inner.topic if self._inner is not None else "not found yet"
        return f"DiscoveredTransport({inner})"
