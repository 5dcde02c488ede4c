"""A local Pub/Sub emulator: the ``google.pubsub.v1`` Publisher and Subscriber gRPC services.

Google's emulator needs ``gcloud`` and Java, which a development machine or CI may not have. This
one keeps topics, subscriptions and messages in memory and speaks the real protocol, so the
unmodified clients reach it exactly as they reach Google's emulator::

    python -m pipeline.emulators.pubsub --port 8085 --topic projects/goodput-local/topics/goodput \
        --subscription projects/goodput-local/subscriptions/goodput &
    export PUBSUB_EMULATOR_HOST=localhost:8085

(it starts empty but for the ``--topic`` and ``--subscription`` it is given),

or in-process: ``with PubSubEmulator() as emulator: os.environ["PUBSUB_EMULATOR_HOST"] =
emulator.host``.

Implemented: topics and subscriptions (create, get, list, delete), Publish, Pull, StreamingPull,
Acknowledge, ModifyAckDeadline; a Pull with nothing to deliver waits for a message, as the
service does, and answers empty a second before its deadline (``PULL_EARLY_S``), as Google's
emulator does; ack deadlines with redelivery when they pass; ordering keys (a
key's messages are delivered in publish order, one batch at a time: the next waits until the
outstanding ones are acknowledged); dead-letter policies (after ``max_delivery_attempts``
deliveries a message moves to the dead-letter topic); the service's limits on a publish, refused
with its status codes and words (see ``check_publish``). Not implemented (a call answers
UNIMPLEMENTED): schemas, snapshots, seek, push and export subscriptions, filters.

Faults are injected through the broker: ``duplicate_next(n)`` delivers the next n messages
published twice (an at-least-once redelivery); ``fail_pulls_next(n, code)`` makes the next n
Pull calls (of one subscription, or of any) fail with ``code``. Stopping the emulator and
starting a new one on the same port with the same broker is an outage.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import empty_pb2
from google.pubsub_v1.types import pubsub as types

from pipeline.emulators import (
    FRONT_END_MAX_REQUEST_BYTES,
    GRPC_SERVER_OPTIONS,
    Sized,
    add_topic_options,
    check_topic_options,
    emulator_parser,
    log_to_console,
    payload_too_large,
    serve_until_signalled,
    sized,
)

_LOG = logging.getLogger(__name__)
_DEFAULT_ACK_DEADLINE_S = 10
#: An empty Pull answers this long before the caller's deadline, as Google's emulator does (the
#: caller gets an empty answer rather than DEADLINE_EXCEEDED)...
PULL_EARLY_S = 1.0
#: ... and after at most this long, whatever its deadline.
PULL_MAX_WAIT_S = 60.0
_MAX_ACK_DEADLINE_S = 600
# The service's limits on a publish (https://cloud.google.com/pubsub/quotas#resource_limits).
#: The serialized PublishRequest: topic name, messages with their data, attributes and ordering
#: keys. The documented "message size (the data field): 10 MB" is within it.
MAX_PUBLISH_REQUEST_BYTES = 10_000_000
MAX_MESSAGES_PER_PUBLISH = 1000
MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024
#: Acknowledge and ModifyAckDeadline requests pass the front end only up to 512 KiB.
MAX_ACK_REQUEST_BYTES = 512 * 1024
_QUOTAS = "Refer to https://cloud.google.com/pubsub/quotas for more information."


@dataclasses.dataclass
class _Delivery:
    message: types.PubsubMessage
    attempts: int = 0
    deadline: float = 0.0  # while outstanding: when it becomes deliverable again
    ack_id: str = ""


@dataclasses.dataclass
class _Subscription:
    proto: types.Subscription
    pending: collections.deque[_Delivery] = dataclasses.field(default_factory=collections.deque)
    outstanding: dict[str, _Delivery] = dataclasses.field(default_factory=dict)

    @property
    def ack_deadline_s(self) -> int:
        return self.proto.ack_deadline_seconds or _DEFAULT_ACK_DEADLINE_S


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class PubSubBroker:
    """The emulator's state and rules, independent of gRPC. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Condition()
        self._topics: dict[str, types.Topic] = {}
        self._subscriptions: dict[str, _Subscription] = {}
        self._message_ids = itertools.count(1)
        self._ack_ids = itertools.count(1)
        self._duplicates = 0
        self._failing_pulls: dict[str | None, list[grpc.StatusCode]] = {}

    # -- faults -----------------------------------------------------------------------------

    def duplicate_next(self, count: int) -> None:
        """The next ``count`` messages published are delivered twice to every subscription."""
        with self._lock:
            self._duplicates += count

    def fail_pulls_next(self, count: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
                        subscription: str | None = None) -> None:
        """The next ``count`` Pull calls (of ``subscription``, or of any) fail with ``code``,
        delivering nothing."""
        with self._lock:
            self._failing_pulls.setdefault(subscription, []).extend([code] * count)

    # -- topics -----------------------------------------------------------------------------

    def create_topic(self, topic: types.Topic) -> types.Topic:
        _check_name(topic.name, "/topics/")
        with self._lock:
            if topic.name in self._topics:
                raise _Abort(grpc.StatusCode.ALREADY_EXISTS, f"Topic already exists: {topic.name}")
            self._topics[topic.name] = topic
            return topic

    def get_topic(self, name: str) -> types.Topic:
        with self._lock:
            return self._topic(name)

    def list_topics(self, project: str) -> list[types.Topic]:
        with self._lock:
            return [t for n, t in sorted(self._topics.items()) if n.startswith(project + "/")]

    def delete_topic(self, name: str) -> None:
        with self._lock:
            self._topic(name)
            del self._topics[name]
            for subscription in self._subscriptions.values():
                if subscription.proto.topic == name:
                    subscription.proto.topic = "_deleted-topic_"

    def topic_subscriptions(self, name: str) -> list[str]:
        with self._lock:
            self._topic(name)
            return sorted(n for n, s in self._subscriptions.items() if s.proto.topic == name)

    def _topic(self, name: str) -> types.Topic:
        topic = self._topics.get(name)
        if topic is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"Topic not found: {name}")
        return topic

    # -- subscriptions ----------------------------------------------------------------------

    def create_subscription(self, subscription: types.Subscription) -> types.Subscription:
        _check_name(subscription.name, "/subscriptions/")
        deadline = subscription.ack_deadline_seconds
        if deadline and not 10 <= deadline <= _MAX_ACK_DEADLINE_S:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         f"ack_deadline_seconds must be between 10 and 600, got {deadline}")
        policy = subscription.dead_letter_policy
        if policy.dead_letter_topic and not 5 <= policy.max_delivery_attempts <= 100:
            if policy.max_delivery_attempts:
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                             "max_delivery_attempts must be between 5 and 100")
            policy.max_delivery_attempts = 5
        with self._lock:
            self._topic(subscription.topic)
            if subscription.name in self._subscriptions:
                raise _Abort(grpc.StatusCode.ALREADY_EXISTS,
                             f"Subscription already exists: {subscription.name}")
            if not subscription.ack_deadline_seconds:
                subscription.ack_deadline_seconds = _DEFAULT_ACK_DEADLINE_S
            self._subscriptions[subscription.name] = _Subscription(subscription)
            return subscription

    def get_subscription(self, name: str) -> types.Subscription:
        with self._lock:
            return self._subscription(name).proto

    def list_subscriptions(self, project: str) -> list[types.Subscription]:
        with self._lock:
            return [s.proto for n, s in sorted(self._subscriptions.items())
                    if n.startswith(project + "/")]

    def delete_subscription(self, name: str) -> None:
        with self._lock:
            self._subscription(name)
            del self._subscriptions[name]
            self._lock.notify_all()

    def _subscription(self, name: str) -> _Subscription:
        subscription = self._subscriptions.get(name)
        if subscription is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"Subscription does not exist: {name}")
        return subscription

    # -- messages ---------------------------------------------------------------------------

    def publish(self, topic_name: str, messages: list[types.PubsubMessage]) -> list[str]:
        """The ids of ``messages``, published together (all or none), as one Publish request."""
        check_publish(topic_name, messages)
        with self._lock:
            self._topic(topic_name)
            ids = [self._deliver(topic_name, message) for message in messages]
            self._lock.notify_all()
            return ids

    def _deliver(self, topic_name: str, message: types.PubsubMessage) -> str:
        published = types.PubsubMessage(message)
        published.message_id = str(next(self._message_ids))
        published.publish_time = datetime.datetime.now(datetime.timezone.utc)  # type: ignore[assignment]
        copies = 1
        if self._duplicates:
            self._duplicates -= 1
            copies = 2
        for subscription in self._subscriptions.values():
            if subscription.proto.topic == topic_name:
                for _ in range(copies):
                    subscription.pending.append(_Delivery(types.PubsubMessage(published)))
        return published.message_id

    def pull(self, name: str, max_messages: int, wait_s: float = 0.0,
             gone: Callable[[], bool] = lambda: False) -> list[types.ReceivedMessage]:
        """Up to ``max_messages`` deliverable messages, waiting up to ``wait_s`` for one, or until
        ``gone()`` (the caller cancelled, the emulator stops)."""
        deadline = self._clock() + wait_s
        with self._lock:
            failing = self._failing_pulls.get(name) or self._failing_pulls.get(None)
            if failing:
                raise _Abort(failing.pop(0), "Injected failure")
            while True:
                subscription = self._subscription(name)
                received = self._take(subscription, max(1, max_messages))
                remaining = deadline - self._clock()
                if received or remaining <= 0 or gone():
                    return received
                self._lock.wait(min(remaining, 0.1))

    def _take(self, subscription: _Subscription, limit: int) -> list[types.ReceivedMessage]:
        self._expire(subscription)
        now = self._clock()
        ordered = subscription.proto.enable_message_ordering
        busy_keys = {d.message.ordering_key for d in subscription.outstanding.values()
                     if d.message.ordering_key} if ordered else set()
        blocked: set[str] = set()
        taken: list[types.ReceivedMessage] = []
        kept: collections.deque[_Delivery] = collections.deque()
        while subscription.pending:
            delivery = subscription.pending.popleft()
            key = delivery.message.ordering_key if ordered else ""
            if len(taken) >= limit or (key and (key in busy_keys or key in blocked)):
                if key:
                    blocked.add(key)  # later messages of the key wait behind this one
                kept.append(delivery)
                continue
            policy = subscription.proto.dead_letter_policy
            if policy.dead_letter_topic and delivery.attempts >= policy.max_delivery_attempts:
                if policy.dead_letter_topic in self._topics:
                    self._deliver(policy.dead_letter_topic, delivery.message)
                continue
            delivery.attempts += 1
            delivery.ack_id = f"{subscription.proto.name}:{next(self._ack_ids)}"
            delivery.deadline = now + subscription.ack_deadline_s
            subscription.outstanding[delivery.ack_id] = delivery
            received = types.ReceivedMessage(ack_id=delivery.ack_id, message=delivery.message)
            if policy.dead_letter_topic:
                received.delivery_attempt = delivery.attempts
            taken.append(received)
        subscription.pending = kept
        return taken

    def _expire(self, subscription: _Subscription) -> None:
        """Outstanding messages past their deadline become deliverable again, in publish order."""
        now = self._clock()
        expired = [d for d in subscription.outstanding.values() if d.deadline <= now]
        if expired:
            for delivery in expired:
                del subscription.outstanding[delivery.ack_id]
            self._requeue(subscription, expired)

    @staticmethod
    def _requeue(subscription: _Subscription, deliveries: list[_Delivery]) -> None:
        merged = sorted([*deliveries, *subscription.pending], key=lambda d: int(d.message.message_id))
        subscription.pending = collections.deque(merged)

    def unacknowledged(self, name: str) -> int:
        """How many of the subscription's messages are not acknowledged yet."""
        with self._lock:
            subscription = self._subscription(name)
            return len(subscription.pending) + len(subscription.outstanding)

    def acknowledge(self, name: str, ack_ids: list[str]) -> None:
        with self._lock:
            subscription = self._subscription(name)
            for ack_id in ack_ids:
                subscription.outstanding.pop(ack_id, None)  # unknown or expired: ignored
            self._lock.notify_all()

    def modify_ack_deadline(self, name: str, ack_ids: list[str], seconds: int) -> None:
        if not 0 <= seconds <= _MAX_ACK_DEADLINE_S:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         f"ack_deadline_seconds must be between 0 and 600, got {seconds}")
        with self._lock:
            subscription = self._subscription(name)
            nacked = []
            for ack_id in ack_ids:
                delivery = subscription.outstanding.get(ack_id)
                if delivery is None:
                    continue
                if seconds == 0:
                    nacked.append(subscription.outstanding.pop(ack_id))
                else:
                    delivery.deadline = self._clock() + seconds
            if nacked:
                self._requeue(subscription, nacked)
            self._lock.notify_all()


def check_publish(topic_name: str, messages: list[types.PubsubMessage]) -> None:
    """Refuses a Publish request that breaks the service's limits, as the service does.

    The status codes are the service's, and so are the words where they have been seen from it
    (request size, message count, attribute key and value sizes, mixed ordering keys); for the
    number of attributes and the ordering key's size they are this emulator's own.
    """
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    if not messages:
        raise _Abort(invalid, "Publish needs at least one message")
    if len(messages) > MAX_MESSAGES_PER_PUBLISH:
        raise _Abort(invalid, f"The value for message_count is too large. You passed {len(messages)} "
                              f"in the request, but the maximum value is {MAX_MESSAGES_PER_PUBLISH}.")
    plain = [types.PubsubMessage.pb(message) for message in messages]  # fast to read
    size = _field_bytes(len(topic_name.encode())) + sum(_field_bytes(m.ByteSize()) for m in plain)
    if size > MAX_PUBLISH_REQUEST_BYTES:
        raise _Abort(invalid, f"The value for request_size is too large. You passed {size} in the "
                              f"request, but the maximum value is {MAX_PUBLISH_REQUEST_BYTES}.")
    for message in plain:
        if not message.data and not message.attributes:
            raise _Abort(invalid, "A message needs data or attributes")
        if len(message.attributes) > MAX_ATTRIBUTES:
            raise _Abort(invalid, f"A message in the request has {len(message.attributes)} attributes, "
                                  f"but the maximum allowed is {MAX_ATTRIBUTES}. {_QUOTAS}")
        for key, value in message.attributes.items():
            # Sizes are in UTF-8 bytes, though the service's words say "characters"; it does
            # not repeat a key that is too long.
            if len(key.encode()) > MAX_ATTRIBUTE_KEY_BYTES:
                raise _Abort(invalid, f'The attribute "" in the request has a key that is too long. The '
                                      f"length is {len(key.encode())} characters, but the maximum allowed "
                                      f"is {MAX_ATTRIBUTE_KEY_BYTES}. {_QUOTAS}")
            if len(value.encode()) > MAX_ATTRIBUTE_VALUE_BYTES:
                raise _Abort(invalid, f'The attribute "{key}" in the request has a value that is too '
                                      f"long. The length is {len(value.encode())} characters, but the "
                                      f"maximum allowed is {MAX_ATTRIBUTE_VALUE_BYTES}. {_QUOTAS}")
        if len(message.ordering_key.encode()) > MAX_ORDERING_KEY_BYTES:
            raise _Abort(invalid, f"An ordering key in the request is {len(message.ordering_key.encode())} "
                                  f"bytes, but the maximum allowed is {MAX_ORDERING_KEY_BYTES}. {_QUOTAS}")
    if len({message.ordering_key for message in plain}) > 1:
        raise _Abort(grpc.StatusCode.FAILED_PRECONDITION,
                     "In a single publish request, all messages must have no ordering key or they "
                     "must all have the same ordering key. [code=539b]")


def _field_bytes(length: int) -> int:
    """Serialized bytes of a length-delimited protobuf field (number < 16) of ``length`` bytes:
    its tag, its length as a varint, its content."""
    return 1 + max(1, (length.bit_length() + 6) // 7) + length


def _check_name(name: str, kind: str) -> None:
    project, separator, resource = name.partition(kind)
    if not project.startswith("projects/") or not separator or not resource or "/" in resource:
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid resource name: {name!r}")


# -- gRPC ----------------------------------------------------------------------------------------


def _handlers(broker: PubSubBroker, stopping: threading.Event) -> list[grpc.GenericRpcHandler]:
    def unary(call: Callable[..., Any], request_type: Any, response_type: Any | None,
              max_request_bytes: int = FRONT_END_MAX_REQUEST_BYTES, with_context: bool = False) -> Any:
        """A handler of ``call(request)``, or of ``call(request, context)`` ``with_context``."""
        def handle(request: Sized, context: grpc.ServicerContext) -> Any:
            if request.request is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, payload_too_large(max_request_bytes))
            try:
                result = call(request.request, context) if with_context else call(request.request)
            except _Abort as error:
                context.abort(error.code, str(error))
            return empty_pb2.Empty() if response_type is None else result

        serializer = (empty_pb2.Empty.SerializeToString if response_type is None
                      else response_type.serialize)
        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=sized(request_type.deserialize, max_request_bytes),
            response_serializer=serializer)

    def pull(request: types.PullRequest, context: grpc.ServicerContext) -> types.PullResponse:
        """Waits for a message unless asked not to, as the service does (see PULL_EARLY_S)."""
        wait_s = 0.0
        if not request.return_immediately:
            remaining = context.time_remaining()
            wait_s = PULL_MAX_WAIT_S if remaining is None else min(PULL_MAX_WAIT_S, remaining - PULL_EARLY_S)
        return types.PullResponse(received_messages=broker.pull(
            request.subscription, request.max_messages, max(0.0, wait_s),
            gone=lambda: stopping.is_set() or not context.is_active()))

    publisher = {
        "CreateTopic": unary(broker.create_topic, types.Topic, types.Topic),
        "GetTopic": unary(lambda r: broker.get_topic(r.topic), types.GetTopicRequest, types.Topic),
        "ListTopics": unary(lambda r: types.ListTopicsResponse(topics=broker.list_topics(r.project)),
                            types.ListTopicsRequest, types.ListTopicsResponse),
        "ListTopicSubscriptions": unary(
            lambda r: types.ListTopicSubscriptionsResponse(
                subscriptions=broker.topic_subscriptions(r.topic)),
            types.ListTopicSubscriptionsRequest, types.ListTopicSubscriptionsResponse),
        "DeleteTopic": unary(lambda r: broker.delete_topic(r.topic), types.DeleteTopicRequest, None),
        "Publish": unary(
            lambda r: types.PublishResponse(message_ids=broker.publish(r.topic, list(r.messages))),
            types.PublishRequest, types.PublishResponse),
    }
    subscriber = {
        "CreateSubscription": unary(broker.create_subscription, types.Subscription, types.Subscription),
        "GetSubscription": unary(lambda r: broker.get_subscription(r.subscription),
                                 types.GetSubscriptionRequest, types.Subscription),
        "ListSubscriptions": unary(
            lambda r: types.ListSubscriptionsResponse(subscriptions=broker.list_subscriptions(r.project)),
            types.ListSubscriptionsRequest, types.ListSubscriptionsResponse),
        "DeleteSubscription": unary(lambda r: broker.delete_subscription(r.subscription),
                                    types.DeleteSubscriptionRequest, None),
        "Pull": unary(pull, types.PullRequest, types.PullResponse, with_context=True),
        "Acknowledge": unary(lambda r: broker.acknowledge(r.subscription, list(r.ack_ids)),
                             types.AcknowledgeRequest, None, MAX_ACK_REQUEST_BYTES),
        "ModifyAckDeadline": unary(
            lambda r: broker.modify_ack_deadline(r.subscription, list(r.ack_ids), r.ack_deadline_seconds),
            types.ModifyAckDeadlineRequest, None, MAX_ACK_REQUEST_BYTES),
        "StreamingPull": grpc.stream_stream_rpc_method_handler(
            lambda requests, context: _streaming_pull(broker, stopping, requests, context),
            request_deserializer=types.StreamingPullRequest.deserialize,
            response_serializer=types.StreamingPullResponse.serialize),
    }
    return [grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", publisher),
            grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", subscriber)]


def _streaming_pull(broker: PubSubBroker, stopping: threading.Event,
                    requests: Iterator[types.StreamingPullRequest],
                    context: grpc.ServicerContext) -> Iterator[types.StreamingPullResponse]:
    """One StreamingPull stream: acks and deadline changes come in, messages go out."""
    try:
        first = next(requests)
    except StopIteration:
        return
    name = first.subscription
    try:
        broker.get_subscription(name)
    except _Abort as error:
        context.abort(error.code, str(error))
    limit = first.max_outstanding_messages or 1000
    closed = threading.Event()
    errors: queue.Queue[_Abort] = queue.Queue()

    def apply(request: types.StreamingPullRequest) -> None:
        try:
            if request.ack_ids:
                broker.acknowledge(name, list(request.ack_ids))
            for ack_id, seconds in zip(request.modify_deadline_ack_ids,
                                       request.modify_deadline_seconds, strict=False):
                broker.modify_ack_deadline(name, [ack_id], seconds)
        except _Abort as error:
            errors.put(error)

    def read() -> None:
        try:
            apply(first)
            for request in requests:
                apply(request)
        except grpc.RpcError:
            pass
        finally:
            closed.set()

    reader = threading.Thread(target=read, name="pubsub-emulator-stream", daemon=True)
    reader.start()
    while not closed.is_set() and not stopping.is_set() and context.is_active():
        if not errors.empty():
            failure = errors.get()
            context.abort(failure.code, str(failure))
        try:
            received = broker.pull(name, limit, wait_s=0.2)
        except _Abort as error:
            context.abort(error.code, str(error))
        if received:
            yield types.StreamingPullResponse(received_messages=received)


class PubSubEmulator:
    """The emulator as a gRPC server on localhost; a context manager that stops it.

    Given the ``broker`` of an emulator that was stopped, a new one on the same port serves the
    same topics, subscriptions and messages: a service that was away for a while, not a new one.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", max_workers: int = 32,
                 broker: PubSubBroker | None = None) -> None:
        self.broker = broker or PubSubBroker()
        self._stopping = threading.Event()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pubsub-emulator"),
            options=GRPC_SERVER_OPTIONS)
        self._server.add_generic_rpc_handlers(_handlers(self.broker, self._stopping))
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.host = f"{host}:{self.port}"

    def start(self) -> PubSubEmulator:
        self._server.start()
        _LOG.info("Pub/Sub emulator listening on %s", self.host)
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        self._stopping.set()
        self._server.stop(grace_s).wait()

    def __enter__(self) -> PubSubEmulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def create(broker: PubSubBroker, topic: str | None, subscriptions: list[str] | None) -> None:
    """Creates ``topic`` and its ``subscriptions`` in ``broker``, as a client would."""
    if topic is not None:
        broker.create_topic(types.Topic(name=topic))
    for name in dict.fromkeys(subscriptions or ()):
        broker.create_subscription(types.Subscription(name=name, topic=topic))


def main(argv: list[str] | None = None) -> int:
    parser = emulator_parser(
        "pubsub", "Run a local Pub/Sub emulator (google.pubsub.v1 over gRPC, in memory). "
                  "Point clients at it with PUBSUB_EMULATOR_HOST=HOST:PORT.", 8085)
    add_topic_options(parser)
    args = parser.parse_args(argv)
    problem = check_topic_options(args.topic, args.subscription)
    if problem is not None:
        parser.error(problem)
    log_to_console()
    emulator = PubSubEmulator(args.port, args.host)
    create(emulator.broker, args.topic, args.subscription)
    emulator.start()
    print(f"export PUBSUB_EMULATOR_HOST={emulator.host}", flush=True)
    if args.topic:
        print(f"export GOODPUT_DESTINATION={args.topic}", flush=True)
    for name in dict.fromkeys(args.subscription or ()):
        print(f"# {name}: read it with python -m pipeline --streaming --runner=BundleBasedDirectRunner "
              f"--subscription={name} --duckdb=goodput.duckdb", flush=True)
    return serve_until_signalled(emulator)


if __name__ == "__main__":
    sys.exit(main())
