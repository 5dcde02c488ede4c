"""The local Pub/Sub emulator, driven by the real google-cloud-pubsub clients."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.publisher.exceptions import MessageTooLargeError
from google.pubsub_v1.services import publisher as publisher_gapic
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.types import pubsub as types

from pipeline.emulators.pubsub import (
    MAX_ACK_REQUEST_BYTES,
    MAX_PUBLISH_REQUEST_BYTES,
    PubSubBroker,
    PubSubEmulator,
)
from support.pubsub import emulator_host

PROJECT = "projects/local"
TOPIC = f"{PROJECT}/topics/events"
SUBSCRIPTION = f"{PROJECT}/subscriptions/pipeline"


@pytest.fixture(params=["local", "google"])
def emulator(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The emulator's address: this project's, and Google's where it is installed."""
    with emulator_host(request.param) as host:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
        yield host


@pytest.fixture
def publisher(emulator: str) -> Iterator[pubsub_v1.PublisherClient]:
    client = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))
    client.create_topic(name=TOPIC)
    yield client
    client.stop()


@pytest.fixture
def subscriber(emulator: str) -> Iterator[pubsub_v1.SubscriberClient]:
    client = pubsub_v1.SubscriberClient()
    yield client
    client.close()


def test_publish_pull_acknowledge(publisher, subscriber):
    """A published message arrives with its data, attributes and ids, once acknowledged gone."""
    subscriber.create_subscription(name=SUBSCRIPTION, topic=TOPIC)
    message_id = publisher.publish(TOPIC, b"batch", run_id="run-1").result(timeout=10)
    response = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=10)
    (received,) = response.received_messages
    assert received.message.data == b"batch"
    assert dict(received.message.attributes) == {"run_id": "run-1"}
    assert received.message.message_id == message_id
    assert received.message.publish_time is not None
    subscriber.acknowledge(subscription=SUBSCRIPTION, ack_ids=[received.ack_id])
    again = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=2)  # held ~1 s
    assert not again.received_messages


def test_an_empty_pull_waits_for_a_message_or_until_just_before_its_deadline(publisher, subscriber):
    """As the service does: a pull with nothing to deliver is held until a message comes, and
    then answered at once; with none, it is answered empty about a second before its deadline."""
    subscriber.create_subscription(name=SUBSCRIPTION, topic=TOPIC)
    started = time.monotonic()
    empty = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=3, retry=None)
    assert not empty.received_messages and 1.5 <= time.monotonic() - started < 3
    late = threading.Timer(1.0, lambda: publisher.publish(TOPIC, b"late").result(timeout=10))
    late.start()
    started = time.monotonic()
    received = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=10, retry=None)
    assert [m.message.data for m in received.received_messages] == [b"late"]
    assert 0.9 <= time.monotonic() - started < 3
    late.join()


def test_nack_redelivers(publisher, subscriber):
    """A deadline set to 0 (a nack) makes the message deliverable again at once."""
    subscriber.create_subscription(name=SUBSCRIPTION, topic=TOPIC)
    publisher.publish(TOPIC, b"x").result(timeout=10)
    first = subscriber.pull(subscription=SUBSCRIPTION, max_messages=1, timeout=10).received_messages[0]
    subscriber.modify_ack_deadline(subscription=SUBSCRIPTION, ack_ids=[first.ack_id],
                                   ack_deadline_seconds=0)
    second = subscriber.pull(subscription=SUBSCRIPTION, max_messages=1, timeout=10).received_messages[0]
    assert second.message.message_id == first.message.message_id
    assert second.ack_id != first.ack_id


def test_ordering_key_waits_for_the_outstanding_message(publisher, subscriber):
    """With ordering, a key's next message is held back until the previous one is acknowledged."""
    subscriber.create_subscription(request={"name": SUBSCRIPTION, "topic": TOPIC,
                                            "enable_message_ordering": True})
    for data in (b"a", b"b"):
        publisher.publish(TOPIC, data, ordering_key="run-1").result(timeout=10)
    publisher.publish(TOPIC, b"other", ordering_key="run-2").result(timeout=10)
    first = subscriber.pull(subscription=SUBSCRIPTION, max_messages=1, timeout=10).received_messages
    assert [m.message.data for m in first] == [b"a"]
    held = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in held] == [b"other"]
    subscriber.acknowledge(subscription=SUBSCRIPTION, ack_ids=[first[0].ack_id])
    after = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in after] == [b"b"]


def test_dead_letter_after_max_delivery_attempts(publisher, subscriber):
    """A message nacked max_delivery_attempts times moves to the dead-letter topic."""
    dead_topic = f"{PROJECT}/topics/dead"
    publisher.create_topic(name=dead_topic)
    subscriber.create_subscription(name=f"{PROJECT}/subscriptions/dead", topic=dead_topic)
    subscriber.create_subscription(request={
        "name": SUBSCRIPTION, "topic": TOPIC,
        "dead_letter_policy": {"dead_letter_topic": dead_topic, "max_delivery_attempts": 5}})
    publisher.publish(TOPIC, b"poison").result(timeout=10)
    attempts = []
    for _ in range(5):
        (received,) = subscriber.pull(subscription=SUBSCRIPTION, max_messages=1,
                                      timeout=10).received_messages
        attempts.append(received.delivery_attempt)
        subscriber.modify_ack_deadline(subscription=SUBSCRIPTION, ack_ids=[received.ack_id],
                                       ack_deadline_seconds=0)
    assert attempts == [1, 2, 3, 4, 5]
    gone = subscriber.pull(subscription=SUBSCRIPTION, max_messages=1, timeout=2).received_messages
    assert not gone
    (dead,) = subscriber.pull(subscription=f"{PROJECT}/subscriptions/dead", max_messages=1,
                              timeout=10).received_messages
    assert dead.message.data == b"poison"


def test_streaming_pull_delivers_everything_once_acknowledged(publisher, subscriber):
    """The client's streaming subscribe receives every message; acks stop redelivery."""
    subscriber.create_subscription(name=SUBSCRIPTION, topic=TOPIC)
    received: list[bytes] = []
    done = threading.Event()

    def callback(message: pubsub_v1.subscriber.message.Message) -> None:
        received.append(message.data)
        message.ack()
        if len(received) >= 50:
            done.set()

    future = subscriber.subscribe(SUBSCRIPTION, callback)
    try:
        for index in range(50):
            publisher.publish(TOPIC, f"m{index}".encode()).result(timeout=10)
        assert done.wait(20), f"received only {len(received)}"
    finally:
        future.cancel()
        future.result(timeout=10)
    assert sorted(received) == sorted(f"m{index}".encode() for index in range(50))


def test_errors_are_the_services_errors(publisher, subscriber):
    """Unknown topics and subscriptions, duplicates and bad names fail as Pub/Sub fails them."""
    with pytest.raises(exceptions.NotFound):
        publisher.publish(f"{PROJECT}/topics/nope", b"x").result(timeout=10)
    with pytest.raises(exceptions.AlreadyExists):
        publisher.create_topic(name=TOPIC)
    with pytest.raises(exceptions.NotFound):
        subscriber.pull(subscription=f"{PROJECT}/subscriptions/nope", max_messages=1, timeout=10)
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.create_subscription(name="not-a-name", topic=TOPIC)


def test_ack_deadline_expiry_redelivers():
    """A message not acknowledged within its ack deadline is delivered again."""
    now = [0.0]
    broker = PubSubBroker(clock=lambda: now[0])
    broker.create_topic(types.Topic(name=TOPIC))
    broker.create_subscription(types.Subscription(name=SUBSCRIPTION, topic=TOPIC,
                                                  ack_deadline_seconds=30))
    broker.publish(TOPIC, [types.PubsubMessage(data=b"x")])
    (first,) = broker.pull(SUBSCRIPTION, 10)
    now[0] = 29.0
    assert broker.pull(SUBSCRIPTION, 10) == []
    now[0] = 30.5
    (again,) = broker.pull(SUBSCRIPTION, 10)
    assert again.message.message_id == first.message.message_id


@pytest.fixture
def local() -> Iterator[PubSubEmulator]:
    """This project's emulator alone (the fault hooks are its own), with the topic and two
    subscriptions."""
    with PubSubEmulator() as running:
        running.broker.create_topic(types.Topic(name=TOPIC))
        for name in (SUBSCRIPTION, f"{PROJECT}/subscriptions/other"):
            running.broker.create_subscription(types.Subscription(name=name, topic=TOPIC))
        yield running


def test_duplicate_next_delivers_the_next_messages_twice(local, monkeypatch):
    """duplicate_next(2): the next two messages published come twice, with their one message id,
    to every subscription; the one after comes once."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", local.host)
    local.broker.duplicate_next(2)
    publisher = pubsub_v1.PublisherClient()
    ids = [publisher.publish(TOPIC, data).result(timeout=10) for data in (b"a", b"b", b"c")]
    subscriber = pubsub_v1.SubscriberClient()
    for name in (SUBSCRIPTION, f"{PROJECT}/subscriptions/other"):
        received = subscriber.pull(subscription=name, max_messages=10, timeout=10).received_messages
        assert sorted((m.message.data, m.message.message_id) for m in received) == [
            (b"a", ids[0]), (b"a", ids[0]), (b"b", ids[1]), (b"b", ids[1]), (b"c", ids[2])]
    subscriber.close()


def test_fail_pulls_next_fails_one_subscriptions_pulls_with_the_code(local, monkeypatch):
    """fail_pulls_next(2, RESOURCE_EXHAUSTED, subscription): its next two pulls fail as a quota
    error through the real client (which does not retry it), then pulls deliver; other
    subscriptions are not affected."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", local.host)
    local.broker.publish(TOPIC, [types.PubsubMessage(data=b"x")])
    local.broker.fail_pulls_next(2, grpc.StatusCode.RESOURCE_EXHAUSTED, SUBSCRIPTION)
    subscriber = pubsub_v1.SubscriberClient()
    other = subscriber.pull(subscription=f"{PROJECT}/subscriptions/other", max_messages=10, timeout=10)
    assert [m.message.data for m in other.received_messages] == [b"x"]
    for _ in range(2):
        with pytest.raises(exceptions.ResourceExhausted):
            subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=10)
    received = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=10)
    assert [m.message.data for m in received.received_messages] == [b"x"]
    subscriber.close()


# -- the service's limits ---------------------------------------------------------------------
# Google's emulator enforces none of these (it took 10,485,761-byte requests and 1,025-byte
# attribute values, and timed out on 12 MB); the tests below hold this emulator to the service.


def _message_making_a_request_of(size: int, **fields: str) -> types.PubsubMessage:
    """A message whose Publish request to TOPIC, alone, serializes to exactly ``size`` bytes."""
    length = size
    while True:
        message = types.PubsubMessage(data=b"x" * length, **fields)
        actual = types.PublishRequest.pb(types.PublishRequest(topic=TOPIC, messages=[message])).ByteSize()
        if actual == size:
            return message
        length += size - actual


@pytest.fixture
def api(local: PubSubEmulator) -> Iterator[publisher_gapic.PublisherClient]:
    """The generated Publisher client that the batching one wraps: it sends a request as it is
    given, with no checks of its own."""
    channel = grpc.insecure_channel(local.host)
    yield publisher_gapic.PublisherClient(transport=PublisherGrpcTransport(channel=channel))
    channel.close()


def _publish(api: publisher_gapic.PublisherClient, *messages: types.PubsubMessage) -> list[str]:
    return list(api.publish(topic=TOPIC, messages=list(messages), retry=None, timeout=30).message_ids)


def test_a_publish_request_of_exactly_ten_megabytes_is_delivered_whole(local, monkeypatch):
    """A message making a 10,000,000-byte Publish request goes through the batching client and
    arrives with every byte of its data."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", local.host)
    message = _message_making_a_request_of(MAX_PUBLISH_REQUEST_BYTES, ordering_key="run-1")
    publisher = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))
    message_id = publisher.publish(TOPIC, message.data, ordering_key="run-1").result(timeout=30)
    publisher.stop()
    (received,) = local.broker.pull(SUBSCRIPTION, 10)
    assert received.message.message_id == message_id
    assert received.message.data == message.data


def test_one_byte_over_the_limit_the_batching_client_refuses_before_sending(local, monkeypatch):
    """A message making a 10,000,001-byte request: the batching client raises
    MessageTooLargeError at the call and nothing is published."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", local.host)
    message = _message_making_a_request_of(MAX_PUBLISH_REQUEST_BYTES + 1)
    publisher = pubsub_v1.PublisherClient()
    with pytest.raises(MessageTooLargeError):
        publisher.publish(TOPIC, message.data)
    publisher.stop()
    assert local.broker.unacknowledged(SUBSCRIPTION) == 0


def test_one_byte_over_the_limit_the_service_refuses_with_invalid_argument(api, local):
    """A 10,000,001-byte Publish request sent as it is: INVALID_ARGUMENT in the service's words,
    and nothing is published."""
    with pytest.raises(exceptions.InvalidArgument) as refused:
        _publish(api, _message_making_a_request_of(MAX_PUBLISH_REQUEST_BYTES + 1))
    assert refused.value.message == ("The value for request_size is too large. You passed 10000001 in "
                                     "the request, but the maximum value is 10000000.")
    assert local.broker.unacknowledged(SUBSCRIPTION) == 0


def test_a_request_over_gRPCs_default_receive_size_is_published(api, local):
    """A request of 4 MiB and a byte, over gRPC's default limit but within the service's, is
    published (not refused RESOURCE_EXHAUSTED, which the clients would retry as a quota error)."""
    message = _message_making_a_request_of(4 * 1024 * 1024 + 1)
    _publish(api, message)
    (received,) = local.broker.pull(SUBSCRIPTION, 10)
    assert received.message.data == message.data


def test_a_request_of_exactly_ten_mebibytes_meets_the_services_rule(api):
    """A request of 10 MiB passes the front end and is refused by the service's own rule."""
    with pytest.raises(exceptions.InvalidArgument, match=r"request_size is too large\. You passed 10485760 "):
        _publish(api, _message_making_a_request_of(10 * 1024 * 1024))


def test_a_request_over_ten_mebibytes_is_refused_by_the_front_end(api):
    """A request of 10 MiB and a byte: INVALID_ARGUMENT with the front end's words."""
    with pytest.raises(exceptions.InvalidArgument) as refused:
        _publish(api, _message_making_a_request_of(10 * 1024 * 1024 + 1))
    assert refused.value.message == "Request payload size exceeds the limit: 10485760 bytes."


def test_an_acknowledge_request_over_half_a_mebibyte_is_refused_by_the_front_end(local, monkeypatch):
    """Acknowledge takes at most 512 KiB: a larger request is INVALID_ARGUMENT, a smaller one is
    served (unknown ack ids are ignored)."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", local.host)
    subscriber = pubsub_v1.SubscriberClient()
    ack_id = "x" * MAX_ACK_REQUEST_BYTES
    while (size := len(types.AcknowledgeRequest.serialize(types.AcknowledgeRequest(
            subscription=SUBSCRIPTION, ack_ids=[ack_id])))) != MAX_ACK_REQUEST_BYTES:
        ack_id = ack_id[:MAX_ACK_REQUEST_BYTES - size]
    subscriber.acknowledge(subscription=SUBSCRIPTION, ack_ids=[ack_id])
    with pytest.raises(exceptions.InvalidArgument, match="exceeds the limit: 524288 bytes"):
        subscriber.acknowledge(subscription=SUBSCRIPTION, ack_ids=[ack_id + "x"])
    subscriber.close()


def _messages(count: int = 1, **fields: Any) -> list[types.PubsubMessage]:
    return [types.PubsubMessage(data=b"x", **fields) for _ in range(count)]


def _attributes(count: int) -> dict[str, str]:
    return {f"k{index}": "v" for index in range(count)}


# Each limit: the largest request the service takes, and the smallest it refuses with its answer.
LIMITS = {
    "messages per request": (_messages(1000), _messages(1001), exceptions.InvalidArgument,
                             "The value for message_count is too large. You passed 1001 in the "
                             "request, but the maximum value is 1000."),
    "attributes per message": (_messages(attributes=_attributes(100)),
                               _messages(attributes=_attributes(101)), exceptions.InvalidArgument,
                               "has 101 attributes, but the maximum allowed is 100"),
    "attribute key bytes": (_messages(attributes={"é" * 128: "v"}),
                            _messages(attributes={"é" * 128 + "k": "v"}), exceptions.InvalidArgument,
                            'The attribute "" in the request has a key that is too long. The length '
                            "is 257 characters, but the maximum allowed is 256."),
    "attribute value bytes": (_messages(attributes={"k": "v" * 1024}),
                              _messages(attributes={"k": "é" * 512 + "v"}), exceptions.InvalidArgument,
                              'The attribute "k" in the request has a value that is too long. The '
                              "length is 1025 characters, but the maximum allowed is 1024."),
    "ordering key bytes": (_messages(ordering_key="o" * 1024), _messages(ordering_key="o" * 1025),
                           exceptions.InvalidArgument, "is 1025 bytes, but the maximum allowed is 1024"),
    "one ordering key per request": (
        _messages(2, ordering_key="run-1"), [*_messages(ordering_key="run-1"), *_messages()],
        exceptions.FailedPrecondition, "all messages must have no ordering key or they must all "
                                       "have the same ordering key"),
}


@pytest.mark.parametrize("limit", LIMITS)
def test_per_request_and_per_message_limits_are_the_services(api, local, limit):
    """At the limit a request is published; one past it is refused whole, with the service's
    status code."""
    taken, refused, error, words = LIMITS[limit]
    assert len(_publish(api, *taken)) == len(taken)
    before = local.broker.unacknowledged(SUBSCRIPTION)
    with pytest.raises(error) as raised:
        _publish(api, *refused)
    assert words in raised.value.message
    assert local.broker.unacknowledged(SUBSCRIPTION) == before


def test_command_line_help():
    """The emulator's command explains itself."""
    result = subprocess.run([sys.executable, "-m", "pipeline.emulators.pubsub", "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    assert "PUBSUB_EMULATOR_HOST" in result.stdout
