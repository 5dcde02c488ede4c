"""Beam's DirectRunner fitted for a local stream that runs for days.

It reads a subscription by pulling messages and acknowledging them at once, before they are
processed. Beam's own read pulls ten at a time; this one up to ``PULL_MAX_MESSAGES``, as many as
Pub/Sub allows: a bundle is what one pull took, and the runner pays a cost per bundle (each step's
evaluator, its keys' state copies, its timers), so under load ten at a time spent most of its
time on that. Its client receives responses of any size, as the client library sets it up for Pub/Sub (for an
emulator the library opens a channel that refuses responses over 4 MiB, a hundred messages of
1,000 events, and a read that hit it would be refused forever). What a local stream that runs
for days must not suffer:

* A failed pull (the emulator away for more than the client's 60 s of retries, a quota error the
  client does not retry) fails the bundle, and the DirectRunner never retries a bundle: the
  pipeline is dead. Here a failed pull reads nothing, is logged once per outage, and the next
  pull, on a new connection, reads on; a failed acknowledgement keeps what was pulled.
* Cancelling the pipeline loses the messages pulled (so acknowledged) but not yet processed. To
  stop cleanly the launcher first calls ``start_stopping(requests_by)``: from then on
  ``stopping()`` is true, and the steps it was given to (the run tracker, the cloud sinks) report
  each message at once and retry nothing, and the sinks' requests end by ``requests_by``, answered
  or not (``pipeline.sinks.retries``); then ``stop_reading()``: later pulls read nothing, and what
  was read is processed; ``drained`` tells when that is done, and the launcher cancels then.
  ``busy`` names the steps whose bundles are still running, for a stop that cannot wait for them.
* Pub/Sub holds a pull with nothing to deliver open until its deadline, and the runner does all
  its work on one thread: while a pull waits, no timer fires, so no snapshot is made. Beam's read
  gives its pulls 30 s, and a quiet stream's snapshots came up to 30 s late; here a pull's
  deadline is ``PULL_TIMEOUT_S``, 2 s (Pub/Sub answers an idle pull about a second before its
  deadline, or it ends at its deadline; either way it read nothing).
* A stop that waited for a pull in flight would break its word. ``stop_reading()`` cancels the
  pulls in flight instead, by closing their clients; they had acknowledged nothing, so what they
  took is delivered again to the next stream, after its ack deadline (a Pub/Sub that does not
  notice the cancel holds the pull to its deadline first, and may hand it a message published
  meanwhile).

``install`` replaces the runner's private ``_PubSubReadEvaluator._read_from_pubsub`` (Beam is
pinned to 2.77) with ``read``, which pulls and acknowledges as it does, and keeps its client in
the runner's cache of them; it says so in the log if that method is ever gone, and the stream then
runs as Beam made it. It also cuts what the runner pays around every bundle
(``pipeline.beam.direct_bundles``).

And the runner counts a step's metrics only for its first bundle on each of its threads: a
thread's state sampler keeps the scoped state it made for the step's first bundle, with that
bundle's metrics container, and every later bundle's counters go to that container, already
committed. ``count_every_bundle`` (which ``install`` calls) gives each bundle a sampler of its own.

And the runner may deliver a timer twice: it looks for due timers in the keys' committed state
after every bundle, and a timer whose firing waits behind other bundles of its step is found
and fired again, since its state keeps it until that firing commits. A callback that re-sets
its timer for a time already past (a silent run's next snapshot, after a busy minute) is then
called over and over, and each call makes another. ``deliver_timers_once`` (which ``install``
calls) delivers a firing only if its timer is still set for that time, as a runner that fires
each timer once would.

And when a bundle fails for good the runner tells only ``wait_until_finish``, which then waits for
its worker threads and may never return: ``failure`` looks for the failure instead, so that the
launcher stops and says so rather than serve a dead pipeline.

Dataflow reads Pub/Sub its own way, with acknowledgements after a checkpoint, and reports failed
jobs itself; none of this applies there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.utils.timestamp import Timestamp
from google.api_core.exceptions import DeadlineExceeded, GoogleAPIError

from pipeline.beam import direct_bundles
from pipeline.sinks.retries import stop_requests_by

_LOG = logging.getLogger(__name__)
_STOPPING = threading.Event()  # the job is stopping: report each message at once
_STOPPED = threading.Event()  # the job reads no more
_OUTAGE = threading.Event()  # the last pull failed
_STOP_LOCK = threading.Condition()  # a pull begins, an acknowledgement ends, or the reading stops
_PULLING = 0  # reads between their start and their return (under _STOP_LOCK)
_ACKING = 0  # acknowledgements under way (under _STOP_LOCK): the reading stops after them
#: A pull's deadline: an idle pull is held open this long (less a second), unless cancelled; the
#: runner's timers wait for it.
PULL_TIMEOUT_S = 2.0
#: Pause after a failed pull before the runner pulls again.
RETRY_PAUSE_S = 1.0
#: Messages a pull takes at most, and so a bundle holds: Pub/Sub's own limit (Beam's read takes 10).
PULL_MAX_MESSAGES = 1000
#: How long the reading's stop waits for acknowledgements under way before it cancels them.
ACK_WAIT_S = 10.0


def install() -> bool:
    """Replaces the DirectRunner's Pub/Sub read with ``read``; False (logged) if it cannot."""
    from apache_beam.runners.direct import transform_evaluator

    evaluator = getattr(transform_evaluator, "_PubSubReadEvaluator", None)
    if not hasattr(evaluator, "_read_from_pubsub"):
        _LOG.warning("the DirectRunner's Pub/Sub read has changed: a Pub/Sub outage will stop the "
                     "stream, and a stop may lose the messages in flight")
        return False
    setattr(evaluator, "_read_from_pubsub", read)  # noqa: B010 -- a private method, replaced
    count_every_bundle()
    deliver_timers_once()
    direct_bundles.install()
    for event in (_STOPPING, _STOPPED, _OUTAGE):  # a new stream in this process
        event.clear()
    stop_requests_by(None)
    return True


def count_every_bundle() -> None:
    """Makes the DirectRunner count the metrics of every bundle, not only of each thread's first
    (see the module docstring): each bundle runs under a state sampler of its own. Idempotent."""
    from apache_beam.runners.direct.executor import TransformExecutor

    call = TransformExecutor.call
    if getattr(call, "counts_every_bundle", False):
        return

    def call_counted(executor: Any, _: Any) -> Any:
        with own_state_sampler() as sampler:
            return call(executor, sampler)

    call_counted.counts_every_bundle = True  # type: ignore[attr-defined]
    TransformExecutor.call = call_counted  # type: ignore[method-assign]


def deliver_timers_once() -> None:
    """Makes the DirectRunner deliver a timer firing only while its timer is set for the time it
    fired for (see the module docstring): a firing that another delivered, or whose timer was
    set again for another time since, is dropped. Idempotent."""
    from apache_beam.runners.direct.transform_evaluator import _TransformEvaluator

    deliver = _TransformEvaluator.process_timer_wrapper
    if getattr(deliver, "delivers_once", False):
        return

    def deliver_once(evaluator: Any, firing: Any) -> None:
        state = evaluator._step_context.get_keyed_state(firing.encoded_key)
        timers = state.timers.get(firing.window, {})
        if timers.get((firing.name, firing.time_domain, firing.dynamic_timer_tag)) == firing.timestamp:
            deliver(evaluator, firing)

    deliver_once.delivers_once = True  # type: ignore[attr-defined]
    _TransformEvaluator.process_timer_wrapper = deliver_once  # type: ignore[method-assign]


@contextlib.contextmanager
def own_state_sampler() -> Iterator[Any]:
    """A new state sampler, this thread's for the block (Beam counts a thread's metrics through
    its sampler's current scoped state); the thread's earlier one is put back after."""
    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    previous, sampler = statesampler.get_current_tracker(), statesampler.StateSampler("", CounterFactory())
    statesampler.set_current_tracker(sampler)
    try:
        yield sampler
    finally:
        statesampler.set_current_tracker(previous)


def read(evaluator: Any, timestamp_attribute: str | None) -> list[tuple[Any, Any]]:
    """What the runner's read does (pull messages, acknowledge them, stamp each with its publish
    time), with larger pulls; a failed pull reads nothing, and a failed acknowledgement keeps what
    was pulled: the messages may come again, and the pipeline drops repeated events."""
    if timestamp_attribute:
        raise NotImplementedError("the local stream stamps messages with their publish time")
    global _PULLING
    with _STOP_LOCK:
        if _STOPPED.is_set():
            return []
        client = _client(evaluator)
        _PULLING += 1
    try:
        return _pull(evaluator, client)
    finally:
        with _STOP_LOCK:
            _PULLING -= 1


def _pull(evaluator: Any, client: Any) -> list[tuple[Any, Any]]:
    """``read``'s pull and acknowledgement, with ``client``."""
    global _ACKING
    try:
        received = list(client.pull(subscription=evaluator._sub_name, max_messages=PULL_MAX_MESSAGES,
                                    timeout=PULL_TIMEOUT_S).received_messages)
    except (GoogleAPIError, ValueError) as error:  # ValueError: a channel that stop_reading closed
        if _STOPPED.is_set() or isinstance(error, DeadlineExceeded):
            return []  # cancelled, or idle until its deadline: nothing was acknowledged
        if not isinstance(error, GoogleAPIError):
            raise
        if not _OUTAGE.is_set():
            _OUTAGE.set()
            _LOG.warning("pulling from Pub/Sub failed (%s); retrying until it answers", error)
        _forget_client(evaluator)
        _STOPPED.wait(RETRY_PAUSE_S)
        return []
    if _OUTAGE.is_set():
        _OUTAGE.clear()
        _LOG.warning("pulling from Pub/Sub again")
    if received:
        with _STOP_LOCK:
            if _STOPPED.is_set():
                return []  # the reading stopped during the pull: as a cancelled pull's, its messages wait
            _ACKING += 1
        try:
            client.acknowledge(subscription=evaluator._sub_name, ack_ids=[m.ack_id for m in received])
        except (GoogleAPIError, ValueError) as error:
            _LOG.warning("acknowledging %d messages failed (%s): they may be delivered again",
                         len(received), error)
        finally:
            with _STOP_LOCK:
                _ACKING -= 1
                _STOP_LOCK.notify_all()
    return [(Timestamp.from_utc_datetime(m.message.publish_time), PubsubMessage._from_message(m.message))
            for m in received]


def _client(evaluator: Any) -> Any:
    """The subscriber client of the evaluator's read, from the runner's cache (where
    ``stop_reading`` and ``_forget_client`` find it), made on first use: on an emulator, with a
    channel that takes responses of any size, as the library's channel to Pub/Sub does."""
    cls, transform = type(evaluator), evaluator._applied_ptransform.transform
    with cls._subscriber_client_cache_lock:
        cached = cls._subscriber_client_cache.get(transform)
        if cached is None:
            from apache_beam.runners.direct.transform_evaluator import _PubSubSubscriberClient
            from google.cloud import pubsub_v1
            from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

            host, arguments = os.environ.get("PUBSUB_EMULATOR_HOST"), {}
            if host:
                arguments["transport"] = SubscriberGrpcTransport(channel=grpc.insecure_channel(
                    host, options=[("grpc.max_receive_message_length", -1)]))
            cached = cls._subscriber_client_cache[transform] = _PubSubSubscriberClient(
                pubsub_v1.SubscriberClient(**arguments))
        return cached.client


def _forget_client(evaluator: Any) -> None:
    """Drops the evaluator's cached client, so the next pull connects anew (a gRPC channel that
    lost its server waits up to two minutes between attempts to reconnect)."""
    cls = type(evaluator)
    with cls._subscriber_client_cache_lock:
        client = cls._subscriber_client_cache.pop(evaluator._applied_ptransform.transform, None)
    if client is not None:
        _close(client)


def _close(client: Any) -> None:
    """Closes a cached subscriber client's channel, cancelling its calls in flight."""
    try:
        client.client.close()
    except Exception as error:  # noqa: BLE001 -- a broken channel may fail to close; it is dropped
        _LOG.debug("closing the Pub/Sub client failed: %s", error)


def start_stopping(requests_by: float) -> None:
    """From now on ``stopping()`` is true in this process, and the cloud sinks' requests end by the
    monotonic ``requests_by``."""
    stop_requests_by(requests_by)
    _STOPPING.set()


def stopping() -> bool:
    """Whether this process's local stream is stopping (given to the steps that care: it is
    pickled by reference, and so read in the process that runs them)."""
    return _STOPPING.is_set()


def stop_reading() -> None:
    """From now on every pull reads nothing: what was read is processed, nothing more comes. A
    pull in flight is cancelled (its client closed): what it took, unacknowledged, stays in the
    subscription for the next stream. An acknowledgement under way ends first (within
    ``ACK_WAIT_S``): cancelled, it would leave messages that are processed in the subscription,
    to be read again by the next stream."""
    from apache_beam.runners.direct import transform_evaluator

    with _STOP_LOCK:
        _STOPPED.set()
        _STOP_LOCK.wait_for(lambda: not _ACKING, ACK_WAIT_S)
    evaluator = getattr(transform_evaluator, "_PubSubReadEvaluator", None)
    if evaluator is None or not hasattr(evaluator, "_subscriber_client_cache"):
        return
    with evaluator._subscriber_client_cache_lock:
        clients = list(evaluator._subscriber_client_cache.values())
        evaluator._subscriber_client_cache.clear()
    for client in clients:
        _close(client)


def drained(result: Any) -> Callable[[], bool] | None:
    """For the pipeline of ``result``, after ``stop_reading()``: a check that turns true once
    everything the stream read is processed, so that the launcher cancels as soon as cancelling
    loses nothing. It is true when no pull is returning, every bundle that was queued or running
    when the pulls had all returned is done (one may hold what they read), no step has input
    waiting, and no timer is due (a due timer may release what a step holds, as the Monitoring
    writer's do). It reads the runner's private structures (Beam is pinned); None, logged, if
    they are gone: the launcher then waits its fixed grace."""
    executor: Any = getattr(getattr(result, "_executor", None), "_executor", None)
    try:
        context = executor.evaluation_context
        watermarks = context._watermark_manager._transform_to_watermarks
        roots, scheduled, lock = executor.root_nodes, executor.transform_executor_services, context._lock
    except AttributeError:
        _LOG.warning("the DirectRunner has changed: a stop waits a fixed time for what was read")
        return None
    earlier: frozenset[Any] | None = None  # the bundles queued or running once the pulls returned

    def done() -> bool:
        nonlocal earlier
        with _STOP_LOCK:
            if _PULLING:
                return False
        running = scheduled.executors
        if earlier is None:
            earlier = running
        if earlier & running or any(e._applied_ptransform not in roots for e in running):
            return False
        with lock:  # a step's outputs become the next steps' input under this lock
            for transform, marks in watermarks.items():
                with marks._lock:
                    if marks._fired_timers or (marks._pending and transform not in roots):
                        return False
                    now = marks._clock.time()
                    if any(state.get_timers(watermark=marks._input_watermark, processing_time=now)[0]
                           for state in marks._keyed_states.values()):
                        return False
        return True

    return done


def busy(result: Any) -> list[str]:
    """The labels of the steps of ``result``'s pipeline whose bundles are running or queued (the
    runner's private structures, as ``drained`` reads them; none if they are gone)."""
    executor: Any = getattr(getattr(result, "_executor", None), "_executor", None)
    scheduled = getattr(getattr(executor, "transform_executor_services", None), "executors", ())
    return sorted({e._applied_ptransform.full_label for e in scheduled})


def failure(result: Any) -> BaseException | None:
    """The exception that stopped the DirectRunner pipeline of ``result``, if the runner has
    reported one since the last call; None otherwise. It takes the report from the runner's
    queue of updates for the user (private, as ``install`` uses), which ``wait_until_finish``
    would wait on: the caller keeps what it gets."""
    updates = getattr(getattr(getattr(result, "_executor", None), "_executor", None), "visible_updates", None)
    update = updates.poll() if updates is not None else None
    if update is None or update.exception is None:
        return None
    exception = update.exception
    if isinstance(exception, tuple):  # the runner's stall report: (exception, None, None)
        exception = exception[0]
    return exception  # type: ignore[no-any-return]
