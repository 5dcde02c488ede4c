"""For tests through the local Pub/Sub emulator: a topic with an ordered subscription, and what
reached it; and Google's emulator, where this machine has it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def google_emulator() -> Iterator[str]:
    """Google's emulator (gcloud, Java), where this machine has it; its address. The test
    skips where it is not installed."""
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


@contextlib.contextmanager
def emulator_host(kind: str) -> Iterator[str]:
    """The address of a running emulator: this project's (``local``) or Google's (``google``,
    which skips the test where it is not installed)."""
    if kind == "local":
        with PubSubEmulator() as running:
            yield running.host
    else:
        with google_emulator() as host:
            yield host


@contextlib.contextmanager
def subscribed(kind: str, topic: str, subscription: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``emulator_host(kind)`` as ``PUBSUB_EMULATOR_HOST``, with ``topic`` and ``subscription``
    made by the real clients: its address."""
    from google.cloud import pubsub_v1

    with emulator_host(kind) as host:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
        pubsub_v1.PublisherClient().create_topic(name=topic)
        subscriber = pubsub_v1.SubscriberClient()
        subscriber.create_subscription(name=subscription, topic=topic)
        subscriber.close()
        yield host
