"""Emitter faults: the topic away for minutes, the process killed with SIGKILL, a spool that is
full or read-only, a wall clock that jumps. What must hold: a ``record_*`` call never blocks or
raises; memory stays bounded; every event arrives exactly once in sequence order per attempt, or
its loss is counted (``GoodputRecorder.stats``) and detectable (a gap in the attempt's sequence
numbers).

Time is compressed: the waits the emitter makes while the broker is away are set through
``EmitterSettings`` to about a hundredth of their defaults (a send gives up after
``send_timeout_s=0.3`` instead of 30 s; the backoff between sends grows from 0.01 s to at most
0.1 s instead of from 0.5 s to 30 s), so three seconds away stand for about five minutes.
"""

from __future__ import annotations

import datetime
import errno
import gc
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_emitter import GatedTransport

import emitter.spool
from conftest import at
from emitter import EmitterStats, GoodputRecorder
from goodput_schemas.wire import Message

REPO = Path(__file__).resolve().parents[2]
TOPIC = "projects/local/topics/goodput"
SUBSCRIPTION = "projects/local/subscriptions/pipeline"
#: Settings that make minutes of retries happen in seconds (see the module docstring).
COMPRESSED = dict(retry_initial_backoff_s=0.01, retry_max_backoff_s=0.1, send_timeout_s=0.3)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Polls ``condition`` until it holds or ``timeout`` passes; never a bare sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def decode(data: bytes) -> list[tuple[str, int, int, str, dict[str, Any]]]:
    """(attempt_id, seq, time_us, kind, body) of each event of a message."""
    batch = json.loads(data)
    out = []
    for event in batch["events"]:
        (kind, body), = ((k, v) for k, v in event.items() if k not in ("seq", "time_us"))
        out.append((batch["attempt_id"], event["seq"], event["time_us"], kind, body))
    return out


def file_events(path: Path) -> list[tuple[str, int, int, str, dict[str, Any]]]:
    """The events of an emitter file, in file order; a line torn by a killed writer is skipped
    (the pipeline dead-letters it)."""
    events = []
    for line in path.read_bytes().splitlines() if path.exists() else []:
        try:
            events.extend(decode(line))
        except ValueError:
            continue
    return events


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


class FailingTransport:
    """A destination that is never reachable."""

    def send(self, message: Message) -> None:
        raise ConnectionError("destination unreachable")

    def after_fork(self) -> None:
        """Nothing inherited."""

    def close(self) -> None:
        """Nothing to release."""


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


def record_steps(recorder: GoodputRecorder, steps: range, durations: list[float],
                 queued: list[int] | None = None, pause_every: int = 0) -> None:
    """Records one step start per step, timing each call; pauses 1 ms every ``pause_every``."""
    clock = time.perf_counter
    for step in steps:
        started = clock()
        recorder.record_step_start_time(step, at(step))
        durations.append(clock() - started)
        if pause_every and step % pause_every == 0:
            if queued is not None:
                queued.append(recorder.stats.queued)
            time.sleep(0.001)


def emitter_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "goodput-emitter"}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


# -- the topic away for minutes ---------------------------------------------------------------------


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
        while time.monotonic() - away_since < 3.0:  # about 2,000 calls a second
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

    assert len(durations) >= 3000
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


# -- the process killed with SIGKILL ----------------------------------------------------------------

CHILD = """
    import datetime, itertools, os, sys, time
    from emitter import EmitterSettings, GoodputRecorder

    progress_path, destination, spool, steps = sys.argv[1:5]
    progress = os.open(progress_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    recorder = GoodputRecorder(
        "run-killed", logging_enabled=True, destination=destination,
        settings=EmitterSettings(spool_dir=spool, max_batch_events=50, max_queue_events=500,
                                 max_latency_s=0.05, heartbeat_interval_s=None,
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
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
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


# -- the spool full or read-only --------------------------------------------------------------------


def block_with_a_file(path: Path) -> Callable[[], None]:
    """Puts a file where the spool directory must go (refused even to root); returns the undo."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path.unlink


def make_read_only(path: Path) -> Callable[[], None]:
    """Makes the spool root read-only; returns the undo."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o500)
    return lambda: path.chmod(0o700)


def writes_to_read_only_directories() -> bool:
    """Whether this process ignores directory permissions (root, CAP_DAC_OVERRIDE)."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "read-only"
        directory.mkdir(mode=0o500)
        try:
            (directory / "probe").touch()
        except PermissionError:
            return False
        finally:
            directory.chmod(0o700)
        return True


@pytest.mark.parametrize("refuse", [
    pytest.param(block_with_a_file, id="path-blocked"),
    pytest.param(make_read_only, id="read-only", marks=pytest.mark.skipif(
        writes_to_read_only_directories(), reason="this process may write to read-only directories")),
])
def test_a_spool_that_refuses_writes_drops_the_oldest_counted_logged_once_and_recovers(
    refuse, make_recorder, make_settings, spool_dir, caplog
):
    """With memory full and the spool refusing writes, calls neither raise nor block: the oldest
    queued events are dropped, counted and logged once; once writable, the spool is used again."""
    undo = refuse(spool_dir)
    transport = GatedTransport()
    recorder = make_recorder(destination=transport, settings=make_settings(
        max_queue_events=50, max_batch_events=10, max_latency_s=60))
    durations: list[float] = []
    with caplog.at_level(logging.WARNING, logger="emitter"):
        record_steps(recorder, range(500), durations)
    refused = recorder.stats
    assert (refused.recorded, refused.dropped, refused.queued, refused.spilled) == (500, 450, 50, 0)
    assert percentile(durations, 0.99) < 0.001
    logged = [r for r in caplog.records if "refuses events" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR

    undo()
    record_steps(recorder, range(500, 700), durations)
    assert recorder.stats.spilled == 200
    transport.open()
    assert recorder.flush(10)
    delivered = transport.seqs()
    in_flight = delivered[:10]  # the batch being sent when memory filled up
    assert delivered == in_flight + list(range(460, 700))  # the oldest queued went first
    stats = recorder.stats
    assert len(delivered) + stats.dropped == stats.recorded == 700


class FullDisk:
    """The spool module's ``os``, on a disk that can fill up: a write then stores part of its
    data and the next one fails with ENOSPC, as on a real full disk."""

    def __init__(self) -> None:
        self.full = False
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        if not self.full:
            return os.write(fd, data)
        self.refused += 1
        if len(data) > 1 and self.refused % 2:
            return os.write(fd, data[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_keeps_memory_bounded_leaves_no_torn_line_and_counts_every_loss(
    monkeypatch, make_recorder, make_settings, spool_dir
):
    """When the disk fills up while spilling, memory stays bounded, what was spooled stays whole,
    and every event is delivered once or counted as dropped; freed space is used again."""
    disk = FullDisk()
    monkeypatch.setattr(emitter.spool, "os", disk)
    transport = GatedTransport()
    recorder = make_recorder(destination=transport, settings=make_settings(
        max_queue_events=50, max_batch_events=10, max_latency_s=60))
    durations: list[float] = []
    record_steps(recorder, range(1000), durations)  # 950 spilled
    disk.full = True
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for step in range(1000, 21_000):
            recorder.record_step_start_time(step, at(step))
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert growth < 256 * 1024, growth  # not 20,000 refused events kept somewhere
    assert disk.refused >= 20_000
    for path in spool_dir.rglob("*.seg"):
        assert all(json.loads(line) for line in path.read_bytes().splitlines())  # no torn line

    disk.full = False
    record_steps(recorder, range(21_000, 21_500), durations)
    transport.open()
    assert recorder.flush(10)
    delivered = transport.seqs()
    stats = recorder.stats
    assert percentile(durations, 0.99) < 0.001
    assert len(delivered) == len(set(delivered))
    assert len(delivered) + stats.dropped == stats.recorded == 21_500
    assert set(range(50, 1000)) <= set(delivered)  # spooled before the disk filled up
    assert set(range(21_000, 21_500)) <= set(delivered)  # spooled after it was freed


def test_room_made_by_dropping_an_earlier_attempts_backlog_is_counted_apart(
    make_recorder, make_settings
):
    """Events of an earlier attempt dropped from a full spool count as backlog_dropped, not as
    this attempt's: flush() still waits for this attempt's own events."""
    settings = make_settings(max_queue_events=1, max_batch_events=1, max_spool_bytes=20_000,
                             spool_segment_bytes=1000)
    others = emitter_threads()
    first = make_recorder(destination=FailingTransport(), settings=settings)
    for step in range(300):
        first.record_step_start_time(step, at(step))
    assert first.close(timeout=0.2) is False
    assert first.stats.dropped == 0
    assert wait_for(lambda: not emitter_threads() - others)  # its process would have exited

    transport = GatedTransport()
    second = make_recorder(destination=transport, settings=settings)
    for index in range(25):  # big events: room is made by dropping the backlog's oldest
        second.record_custom_badput_event_start_time(at(1000 + index), f"eval-{index:02d}-" + "x" * 240)
    stats = second.stats
    assert stats.backlog_dropped > stats.recorded == 25 and stats.dropped == 0
    assert second.flush(timeout=0.2) is False  # none of its own was delivered
    transport.open()
    assert second.flush(timeout=10)
    stats = second.stats
    assert (stats.sent, stats.dropped) == (25, 0)
    backlog = [seq for m in transport.messages for attempt, seq, *_ in decode(m.data)
               if attempt == first.attempt_id]
    assert len(backlog) == len(set(backlog)) == stats.backlog_sent
    assert stats.backlog_sent + stats.backlog_dropped == 300


def test_text_with_unicode_line_separators_survives_the_spool(make_recorder, make_settings):
    """A spooled event whose text holds U+2028 or U+0085 (not escaped by JSON) arrives intact."""
    transport = GatedTransport()
    labels = {"a": "eval\u2028set", "b": "eval\x85set", "c": "eval\u2029set"}  # free text: kept
    recorder = make_recorder(destination=transport, labels=labels, settings=make_settings(
        max_queue_events=1, max_batch_events=1, max_latency_s=60))
    for index in range(3):
        recorder.record_job_start_time(at(index))
    assert recorder.stats.spilled >= 2
    transport.open()
    assert recorder.flush(10)
    bodies = [body for m in transport.messages for *_, body in decode(m.data)]
    assert [body["labels"] for body in bodies] == [labels] * 3


# -- the wall clock jumping -------------------------------------------------------------------------


def test_event_times_follow_a_jumping_wall_clock_and_nothing_is_lost(make_recorder, events_file):
    """Calls that pass no time are dated by the wall clock as given, back and forth; all arrive."""
    t0 = 1_793_520_000 * 10**9
    day = 86_400 * 10**9
    readings = iter([t0, t0 + 10**9, t0 - 3_600 * 10**9, t0 + day, t0 - day, t0 + 2 * day])
    recorder = make_recorder(wall_clock_ns=lambda: next(readings))  # the first: the attempt's start
    recorder.record_job_start_time()
    recorder.record_step_start_time(0)
    recorder.record_step_start_time(1)
    recorder.record_step_start_time(2)
    recorder.record_heartbeat()
    assert recorder.close()
    events = file_events(events_file)
    assert [seq for _, seq, *_ in events] == [0, 1, 2, 3, 4]
    assert [time_us for _, _, time_us, *_ in events] == [
        t // 1000 for t in (t0 + 10**9, t0 - 3_600 * 10**9, t0 + day, t0 - day, t0 + 2 * day)]


def test_a_checkpoint_save_across_a_backward_clock_jump_records_no_blocking_instead_of_raising(
    make_recorder, events_file, caplog
):
    """A save timed from before a backward jump to "now" is not a caller mistake: it is recorded
    as not blocking, with a warning, and never raises into the training loop."""
    before_jump = datetime.datetime(2026, 11, 1, 9, tzinfo=datetime.timezone.utc)
    after_jump_ns = int((before_jump - datetime.timedelta(hours=1)).timestamp()) * 10**9
    recorder = make_recorder(wall_clock_ns=lambda: after_jump_ns)
    with caplog.at_level(logging.WARNING, logger="emitter"):
        recorder.record_checkpoint_save(100, before_jump)
        recorder.record_checkpoint_restore(100, before_jump)
    with pytest.raises(ValueError, match="before start_time"):  # both times given: the caller's
        recorder.record_checkpoint_save(100, before_jump, before_jump - datetime.timedelta(seconds=1))
    assert recorder.close()
    bodies = [body for *_, body in file_events(events_file)]
    assert [body["blocking_s"] for body in bodies] == [0.0, 0.0]
    assert sum("clock" in r.getMessage() for r in caplog.records) == 2


def test_a_jumping_wall_clock_neither_stalls_nor_hurries_batching_or_heartbeats(
    monkeypatch, make_recorder, make_settings, events_file
):
    """With the process's wall clock jumping a day back and forth on every reading, a partial
    batch still waits max_latency_s and then goes, and idle heartbeats keep their interval."""
    real_ns = time.time_ns
    jumps = itertools.cycle([-86_400 * 10**9, 86_400 * 10**9, -3_600 * 10**9, 0])

    def jumping_ns() -> int:
        return real_ns() + next(jumps)

    monkeypatch.setattr(time, "time_ns", jumping_ns)
    monkeypatch.setattr(time, "time", lambda: jumping_ns() / 1e9)
    recorder = make_recorder(settings=make_settings(max_latency_s=0.3, max_batch_events=1000,
                                                    heartbeat_interval_s=0.1))
    recorded_at = time.monotonic()
    recorder.record_job_start_time()
    assert wait_for(lambda: events_file.exists(), timeout=5)
    assert time.monotonic() - recorded_at >= 0.25  # not hurried by a forward jump
    first_heartbeats = time.monotonic()
    assert wait_for(lambda: sum(e[3] == "heartbeat" for e in file_events(events_file)) >= 3,
                    timeout=10)  # not stalled by a backward one
    elapsed = time.monotonic() - first_heartbeats
    assert recorder.close()
    heartbeats = sum(e[3] == "heartbeat" for e in file_events(events_file))
    assert heartbeats <= (time.monotonic() - recorded_at) / 0.1 + 1, (heartbeats, elapsed)
    assert [seq for _, seq, *_ in file_events(events_file)] == list(range(recorder.stats.recorded))


# -- loss is observable -----------------------------------------------------------------------------


def test_every_counter_is_public_and_documented(make_recorder):
    """GoodputRecorder.stats returns EmitterStats, whose docstring documents every counter."""
    recorder = make_recorder()
    stats = recorder.stats
    assert isinstance(stats, EmitterStats)
    documented = EmitterStats.__doc__ or ""
    for name in ("recorded", "sent", "spilled", "dropped", "send_errors", "messages_sent", "queued",
                 "backlog_sent", "backlog_dropped"):
        assert f"{name}:" in documented and isinstance(getattr(stats, name), int)
    assert GoodputRecorder.stats.__doc__
