"""The emitter publishing to Pub/Sub (the local emulator, through the real client library)."""

from __future__ import annotations

import json
import time

import pytest

from emitter import GoodputRecorder
from emitter.transports import PubSubTransport, transport_for
from pipeline.core.events import parse_message
from support.pubsub import TOPIC, open_emulator, pull_all
from support.runs import at


def test_topic_destination_selects_pubsub():
    """A topic name is a Pub/Sub destination; a malformed one is a clear error."""
    assert isinstance(transport_for(TOPIC), PubSubTransport)
    with pytest.raises(ValueError, match="not understood"):
        transport_for("projects/local/topics/")


def test_batches_are_published_with_attributes_and_ordering_key(monkeypatch, make_settings):
    """Each batch is one message: run id, message id and event time attributes, key = run id."""
    emulator = open_emulator(monkeypatch)
    try:
        recorder = GoodputRecorder("run-7", logging_enabled=True, destination=TOPIC,
                                   settings=make_settings(max_batch_events=10))
        recorder.record_job_start_time(at(0))
        for step in range(25):
            recorder.record_step_start_time(step, at(1 + step))
        assert recorder.close(timeout=20)
        received = pull_all(emulator)
    finally:
        emulator.stop()
    assert [len(json.loads(m.message.data)["events"]) for m in received] == [10, 10, 6]
    events = [e for m in received for e in parse_message(m.message.data)[0]]
    assert [e.seq for e in events] == list(range(26))
    for m in received:
        batch = json.loads(m.message.data)
        attributes = dict(m.message.attributes)
        assert attributes["run_id"] == "run-7" and m.message.ordering_key == "run-7"
        first, last = batch["events"][0]["seq"], batch["events"][-1]["seq"]
        assert attributes["message_id"] == f"{batch['attempt_id']}:{first}-{last}"
        assert int(attributes["event_time"]) == max(e["time_us"] for e in batch["events"]) // 1000


def test_no_event_is_lost_while_the_broker_is_away(monkeypatch, make_settings):
    """Events recorded while the emulator is down arrive once it is back on the same address."""
    emulator = open_emulator(monkeypatch)
    port = emulator.port
    recorder = GoodputRecorder("run-8", logging_enabled=True, destination=TOPIC,
                               settings=make_settings(max_batch_events=5))
    try:
        recorder.record_job_start_time(at(0))
        assert recorder.flush(timeout=20)
        assert len(pull_all(emulator)) == 1
        emulator.stop()
        for step in range(30):
            recorder.record_step_start_time(step, at(1 + step))
        assert recorder.flush(timeout=1) is False  # nowhere to deliver
        time.sleep(0.5)  # the broker stays away a while
        emulator = open_emulator(monkeypatch, port=port)
        assert recorder.flush(timeout=60)
        received = pull_all(emulator)
    finally:
        recorder.close(timeout=5)
        emulator.stop()
    seqs = sorted({e.seq for m in received for e in parse_message(m.message.data)[0]})
    assert seqs == list(range(1, 31))


def test_a_message_pubsub_refuses_for_good_is_refused_not_retried(monkeypatch):
    """A message larger than Pub/Sub takes fails its send as refused for good (the worker then
    drops and counts it) instead of as an outage to retry; a normal one after it is published."""
    from emitter.transports import MessageRefused
    from goodput_schemas.wire import Message

    emulator = open_emulator(monkeypatch)
    transport = PubSubTransport(TOPIC, timeout_s=5)
    try:
        oversized = Message("run", "a", 0, 0, 1, b"x" * 10_000_001)
        with pytest.raises(MessageRefused, match="too large"):
            transport.send(oversized)
        transport.send(Message("run", "a", 1, 1, 1, b"{}"))
        assert [m.message.data for m in pull_all(emulator)] == [b"{}"]
    finally:
        transport.close()
        emulator.stop()
