"""For tests through the local Pub/Sub emulator: a topic with an ordered subscription, and what
reached it."""

from __future__ import annotations

import pytest

from pipeline.emulators.pubsub import PubSubEmulator

TOPIC = "projects/local/topics/goodput"


SUBSCRIPTION = "projects/local/subscriptions/pipeline"


def open_emulator(monkeypatch: pytest.MonkeyPatch, port: int = 0) -> PubSubEmulator:
    """An emulator with the topic and an ordered subscription, and the environment pointing at it."""
    emulator = PubSubEmulator(port=port).start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    from google.pubsub_v1.types import pubsub as types

    emulator.broker.create_topic(types.Topic(name=TOPIC))
    emulator.broker.create_subscription(types.Subscription(
        name=SUBSCRIPTION, topic=TOPIC, enable_message_ordering=True))
    return emulator


def pull_all(emulator: PubSubEmulator) -> list:
    received = []
    while batch := emulator.broker.pull(SUBSCRIPTION, 100, wait_s=0.2):
        emulator.broker.acknowledge(SUBSCRIPTION, [m.ack_id for m in batch])
        received.extend(batch)
    return received
