"""Emitter faults that take a stand-in or a process: the topic away for minutes or never answering,
and the process killed with SIGKILL. What must hold: a ``record_*`` call never blocks or raises;
every event arrives exactly once in sequence order per attempt, or its loss is counted
(``GoodputRecorder.stats``) and detectable (a gap in the attempt's sequence numbers).

Time is compressed: the waits the emitter makes while the broker is away are set through
``EmitterSettings`` to about a hundredth of their defaults (a send gives up after
``send_timeout_s=0.3`` instead of 30 s; the backoff between sends grows from 0.01 s to at most
0.1 s instead of from 0.5 s to 30 s), so three seconds away stand for about five minutes."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emitter import GoodputRecorder
from support.emitter import decode, emitter_threads, file_events, percentile, record_steps, wait_for
from support.runs import at

TOPIC = "projects/local/topics/goodput"


SUBSCRIPTION = "projects/local/subscriptions/pipeline"


#: Settings that make minutes of retries happen in seconds (see the module docstring).
COMPRESSED = dict(retry_initial_backoff_s=0.01, retry_max_backoff_s=0.1, send_timeout_s=0.3)


def seqs_of(events: list[tuple[str, int, int, str, dict[str, Any]]], attempt_id: str) -> list[int]:
    return [seq for attempt, seq, *_ in events if attempt == attempt_id]


def spooled_seqs(root: Path) -> list[int]:
    """Sequence numbers in the spool's segment files, oldest segment first: a header line, then
    one ``[seq, time_us, kind, body]`` line per event."""
    return [json.loads(line)[0] for path in sorted(root.rglob("*.seg"))
            for line in path.read_bytes().splitlines()[1:]]


def missing(seqs: list[int]) -> int:
    """What the pipeline can count from one attempt's sequence numbers: the gaps below the highest."""
    return max(seqs) + 1 - len(set(seqs)) if seqs else 0


class Broker:
    """The local Pub/Sub emulator as a service that goes away and comes back on its address."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from google.pubsub_v1.types import pubsub as types

        from pipeline.emulators.pubsub import PubSubEmulator

        self._emulator_class = PubSubEmulator
        self.emulator = PubSubEmulator().start()
        self.port, self.broker = self.emulator.port, self.emulator.broker
        self.up = True
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", self.emulator.host)
        self.broker.create_topic(types.Topic(name=TOPIC))
        self.broker.create_subscription(types.Subscription(
            name=SUBSCRIPTION, topic=TOPIC, enable_message_ordering=True))

    def stop(self) -> None:
        if self.up:
            self.up = False
            self.emulator.stop(grace_s=0.2)

    def start(self) -> None:
        if not self.up:
            self.emulator = self._emulator_class(port=self.port, broker=self.broker).start()
            self.up = True

    def received(self) -> list[tuple[str, int, int, str, dict[str, Any]]]:
        """Every event published so far, in delivery order (pulled and acknowledged)."""
        events = []
        while batch := self.broker.pull(SUBSCRIPTION, 1000, wait_s=0.2):
            self.broker.acknowledge(SUBSCRIPTION, [m.ack_id for m in batch])
            for received in batch:
                events.extend(decode(received.message.data))
        return events


@pytest.fixture
def pubsub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    """The Pub/Sub emulator with the topic and an ordered subscription; stopped after the test."""
    broker = Broker(monkeypatch)
    yield broker
    broker.stop()


@pytest.fixture
def recorders() -> Iterator[list[GoodputRecorder]]:
    """Recorders a test makes itself; closed after it."""
    made: list[GoodputRecorder] = []
    yield made
    for recorder in made:
        recorder.close(timeout=2)


def test_a_topic_away_for_minutes_never_blocks_training_and_every_event_arrives_once_in_order(
    pubsub, make_settings, spool_dir, recorders
):
    """Thousands of calls while the broker is away (retried for "minutes") return at once, hold
    memory to the queue bound, and all arrive exactly once, in order, once it is back."""
    settings = make_settings(max_batch_events=100, max_queue_events=500, max_latency_s=0.05,
                             spool_segment_bytes=64 * 1024, **COMPRESSED)
    recorder = GoodputRecorder("run-outage", logging_enabled=True, destination=TOPIC,
                               settings=settings)
    recorders.append(recorder)
    recorder.record_job_start_time(at(0))
    assert recorder.flush(timeout=20)
    durations: list[float] = []
    queued: list[int] = []
    # A full collection of a test process's heap takes tens of milliseconds whatever is being
    # timed: the cyclic collector waits while calls are timed.
    gc.disable()
    try:
        pubsub.stop()
        away_since = time.monotonic()
        step = 1
        # Three seconds away and at least 2,000 calls, however slowly a busy machine sleeps.
        while time.monotonic() - away_since < 3.0 or step <= 2000:
            record_steps(recorder, range(step, step + 200), durations, queued, pause_every=2)
            step += 200
        failures = recorder.stats.send_errors
        on_disk = sum(p.stat().st_size for p in spool_dir.rglob("*.seg"))
        pubsub.start()
        # Training goes on while the backlog drains.
        record_steps(recorder, range(step, step + 1000), durations, queued, pause_every=2)
        step += 1000
    finally:
        gc.enable()
    assert recorder.flush(timeout=30)
    events = pubsub.received()

    assert failures >= 2  # the emitter kept retrying all along
    assert max(queued) <= settings.max_queue_events  # memory: the queue bound; the rest on disk
    assert 0 < on_disk <= settings.max_spool_bytes
    assert percentile(durations, 0.99) < 0.001, percentile(durations, 0.99)
    assert max(durations) < 0.05, max(durations)
    assert [seq for _, seq, *_ in events] == list(range(step))  # exactly once, in order
    stats = recorder.stats
    assert (stats.recorded, stats.sent, stats.dropped) == (step, step, 0)
    assert not list(spool_dir.rglob("*.seg"))


def test_a_topic_that_never_answers_costs_close_only_its_deadline_and_the_next_attempt_sends_all(
    pubsub, make_settings, spool_dir, recorders
):
    """With the broker away from the first send, close() keeps its deadline and spools what is
    undelivered; the next attempt delivers it first, once, in order."""
    pubsub.stop()
    settings = make_settings(max_batch_events=50, max_queue_events=200, **COMPRESSED)
    others = emitter_threads()
    first = GoodputRecorder("run-never", logging_enabled=True, destination=TOPIC, settings=settings)
    recorders.append(first)
    first.record_job_start_time(at(0))
    for step in range(1000):
        first.record_step_start_time(step, at(1 + step))
    started = time.monotonic()
    assert first.close(timeout=0.5) is False
    assert time.monotonic() - started < 0.5 + 1.5  # the flush deadline, then at most 1 s to stop
    assert first.stats.dropped == 0
    assert list(spool_dir.rglob("*.seg"))
    # Its process would exit now: let the send it was making end before the broker is back.
    assert wait_for(lambda: not emitter_threads() - others)

    pubsub.start()
    second = GoodputRecorder("run-never", logging_enabled=True, destination=TOPIC, settings=settings)
    recorders.append(second)
    second.record_job_start_time(at(2000))
    assert second.close(timeout=20)
    events = pubsub.received()

    assert seqs_of(events, first.attempt_id) == list(range(1001))
    assert [a for a, *_ in events] == [first.attempt_id] * 1001 + [second.attempt_id]
    assert second.stats.backlog_sent == 1001
    assert not list(spool_dir.rglob("*.seg"))


CHILD = """
    import datetime, itertools, os, sys, time
    from emitter import EmitterSettings, GoodputRecorder

    progress_path, destination, spool, steps = sys.argv[1:5]
    progress = os.open(progress_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    recorder = GoodputRecorder(
        "run-killed", logging_enabled=True, destination=destination,
        settings=EmitterSettings(spool_dir=spool, max_batch_events=50, max_queue_events=500,
                                 max_latency_s=0.05, heartbeat_interval_s=None, collect_configs=False,
                                 retry_initial_backoff_s=0.01, retry_max_backoff_s=0.1))
    t0 = datetime.datetime(2026, 11, 1, 8, tzinfo=datetime.timezone.utc)
    recorder.record_job_start_time(t0)
    os.write(progress, recorder.attempt_id.encode() + b"\\n")
    for step in range(int(steps)) if steps != "forever" else itertools.count():
        recorder.record_step_start_time(step, t0 + datetime.timedelta(seconds=1 + step))
        os.write(progress, b"%d\\n" % (step + 1))  # the sequence number just recorded
        if step % 10 == 0 and steps == "forever":
            time.sleep(0.001)  # a training loop's pace
    os.write(progress, b"done\\n")
    time.sleep(60)  # killed before this ends
"""


def run_and_kill(tmp_path: Path, destination: str, steps: str,
                 ready: Callable[[list[str]], bool]) -> tuple[str, list[str]]:
    """Runs the child until ``ready(progress lines)``, SIGKILLs it; its attempt id and progress."""
    progress = tmp_path / "progress"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(progress), destination,
         str(tmp_path / "spool"), steps],
        env=dict(os.environ), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    try:
        def lines() -> list[str]:
            return progress.read_text().splitlines() if progress.exists() else []

        assert wait_for(lambda: ready(lines()) or child.poll() is not None, timeout=30)
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stderr:
            child.stderr.close()
    attempt, *rest = lines()
    return attempt, rest


def test_sigkill_with_the_destination_up_loses_at_most_what_was_in_memory(
    tmp_path, make_settings, events_file, recorders
):
    """A process killed mid-run loses at most the events held in memory (max_queue_events; in
    practice those of the last max_latency_s); the rest arrive once, in order."""
    attempt, progress = run_and_kill(tmp_path, f"file:{events_file}", "forever",
                                     lambda lines: len(lines) > 2000)
    last_reported = int(progress[-1])  # seqs 0..last_reported were recorded, perhaps one more
    assert last_reported > 2000
    delivered_before = seqs_of(file_events(events_file), attempt)

    # The next attempt of the run sends what the killed one had spooled, if anything.
    nxt = GoodputRecorder("run-killed", logging_enabled=True, destination=f"file:{events_file}",
                          settings=make_settings(spool_dir=tmp_path / "spool"))
    recorders.append(nxt)
    nxt.record_job_start_time(at(10_000))
    assert nxt.close(timeout=10)
    delivered = seqs_of(file_events(events_file), attempt)

    assert delivered == sorted(set(delivered))  # each once, in order
    assert delivered[:len(delivered_before)] == delivered_before
    assert max(delivered) <= last_reported + 1
    assert last_reported + 2 - len(delivered) <= 500  # the child's max_queue_events
    assert nxt.stats.backlog_sent == len(delivered) - len(delivered_before)


def test_sigkill_with_the_destination_away_keeps_all_but_the_memory_queue_and_the_gap_shows(
    tmp_path, make_settings, events_file, recorders
):
    """Killed while its destination is away, a process leaves in the spool every event beyond
    the max_queue_events it held in memory; the next attempt sends them first, and the lost ones
    show as a gap in the killed attempt's sequence numbers."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    attempt, _ = run_and_kill(tmp_path, f"file:{blocker}/events.jsonl", "3000",
                              lambda lines: bool(lines) and lines[-1] == "done")
    assert spooled_seqs(tmp_path / "spool") == list(range(500, 3001))  # all but the 500 in memory

    nxt = GoodputRecorder("run-killed", logging_enabled=True, destination=f"file:{events_file}",
                          settings=make_settings(spool_dir=tmp_path / "spool"))
    recorders.append(nxt)
    nxt.record_job_start_time(at(10_000))
    assert nxt.close(timeout=10)
    events = file_events(events_file)

    assert [a for a, *_ in events] == [attempt] * 2501 + [nxt.attempt_id]  # the backlog first
    assert seqs_of(events, attempt) == list(range(500, 3001))
    assert missing(seqs_of(events, attempt)) == 500  # what the pipeline can count
    assert nxt.stats.backlog_sent == 2501
    assert not list((tmp_path / "spool").rglob("*.seg"))
