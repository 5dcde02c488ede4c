"""The DirectRunner's Pub/Sub read, fitted for a local stream that runs for days.

Beam's DirectRunner reads a subscription by pulling ten messages at a time and acknowledging
them at once, before they are processed. Two things follow that a local stream must not suffer:

* A failed pull (the emulator away for more than the client's 60 s of retries) fails the bundle,
  and the DirectRunner never retries a bundle: the pipeline is dead. Here a failed pull reads
  nothing, is logged once per outage, and the next pull, on a new connection, reads on.
* Cancelling the pipeline loses the messages pulled (so acknowledged) but not yet processed. To
  stop cleanly the launcher calls ``stop_reading()`` first: later pulls read nothing, and what
  was read is processed before the pipeline is cancelled.

Both wrap the runner's private ``_PubSubReadEvaluator._read_from_pubsub`` (Beam is pinned to
2.77); ``install`` says so in the log if that ever changes, and the stream then runs as Beam
made it. Dataflow reads Pub/Sub its own way, with acknowledgements after a checkpoint; none of
this applies there.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

_LOG = logging.getLogger(__name__)
_STOPPED = threading.Event()
_OUTAGE = threading.Event()  # the last pull failed
#: Pause after a failed pull before the runner pulls again.
RETRY_PAUSE_S = 1.0


def install() -> bool:
    """Wraps the DirectRunner's Pub/Sub read (once per process); False if it cannot."""
    try:
        from apache_beam.runners.direct.transform_evaluator import _PubSubReadEvaluator
    except ImportError:
        _LOG.warning("the DirectRunner has no Pub/Sub read evaluator to wrap: a Pub/Sub outage will "
                     "stop the stream, and a stop may lose the messages in flight")
        return False
    original = getattr(_PubSubReadEvaluator, "_read_from_pubsub", None)
    if original is None:
        _LOG.warning("the DirectRunner's Pub/Sub read has changed: a Pub/Sub outage will stop the "
                     "stream, and a stop may lose the messages in flight")
        return False
    if getattr(original, "_fitted", False):
        return True

    def read(evaluator: Any, timestamp_attribute: Any) -> list[Any]:
        from google.api_core.exceptions import GoogleAPIError

        if _STOPPED.is_set():
            return []
        try:
            messages: list[Any] = original(evaluator, timestamp_attribute)
        except GoogleAPIError as error:
            if not _OUTAGE.is_set():
                _OUTAGE.set()
                _LOG.warning("pulling from Pub/Sub failed (%s); retrying until it answers", error)
            _forget_client(evaluator)
            _STOPPED.wait(RETRY_PAUSE_S)
            return []
        if _OUTAGE.is_set():
            _OUTAGE.clear()
            _LOG.warning("pulling from Pub/Sub again")
        return messages

    read._fitted = True  # type: ignore[attr-defined]
    setattr(_PubSubReadEvaluator, "_read_from_pubsub", read)  # noqa: B010 -- a private method, wrapped
    return True


def _forget_client(evaluator: Any) -> None:
    """Drops the evaluator's cached client, so the next pull connects anew (a gRPC channel that
    lost its server waits up to two minutes between attempts to reconnect)."""
    cls = type(evaluator)
    with cls._subscriber_client_cache_lock:
        client = cls._subscriber_client_cache.pop(evaluator._applied_ptransform.transform, None)
    if client is not None:
        try:
            client.client.close()
        except Exception as error:  # noqa: BLE001 -- a broken channel may fail to close; it is dropped
            _LOG.debug("closing the Pub/Sub client failed: %s", error)


def stop_reading() -> None:
    """From now on every pull reads nothing: what was read is processed, nothing more comes."""
    _STOPPED.set()
