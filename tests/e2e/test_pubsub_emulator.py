"""The local Pub/Sub emulator, driven by the real google-cloud-pubsub clients."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.pubsub_v1.types import pubsub as types

from pipeline.emulators.pubsub import PubSubBroker, PubSubEmulator

PROJECT = "projects/local"
TOPIC = f"{PROJECT}/topics/events"
SUBSCRIPTION = f"{PROJECT}/subscriptions/pipeline"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _google_emulator() -> Iterator[str]:
    """Google's emulator (gcloud, Java), where this machine has it."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("Google's Pub/Sub emulator (gcloud beta emulators pubsub) is not installed")
    host = f"127.0.0.1:{_free_port()}"
    # Its own process group: stopping gcloud alone would leave the Java emulator running.
    process = subprocess.Popen([gcloud, "beta", "emulators", "pubsub", "start", f"--host-port={host}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", int(host.rsplit(":", 1)[1]))) == 0:
                    break
            time.sleep(0.2)
        else:
            pytest.fail("Google's Pub/Sub emulator did not start within 60 s")
        yield host
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture(params=["local", "google"])
def emulator(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The emulator's address: this project's, and Google's where it is installed."""
    if request.param == "local":
        with PubSubEmulator() as running:
            monkeypatch.setenv("PUBSUB_EMULATOR_HOST", running.host)
            yield running.host
    else:
        with _google_emulator() as host:
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
    again = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=10)
    assert not again.received_messages


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
    gone = subscriber.pull(subscription=SUBSCRIPTION, max_messages=1, timeout=10).received_messages
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


def test_command_line_help():
    """The emulator's command explains itself."""
    result = subprocess.run([sys.executable, "-m", "pipeline.emulators.pubsub", "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    assert "PUBSUB_EMULATOR_HOST" in result.stdout
