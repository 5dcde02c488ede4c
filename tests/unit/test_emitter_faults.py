"""Emitter faults in this process: a spool that is full or read-only, a wall clock that jumps, a
backlog that makes room. What must hold: a ``record_*`` call never blocks or raises; memory stays
bounded; every event arrives exactly once in sequence order per attempt, or its loss is counted
(``GoodputRecorder.stats``) and detectable (a gap in the attempt's sequence numbers)."""

from __future__ import annotations

import datetime
import errno
import itertools
import json
import logging
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import emitter.spool
from emitter import EmitterStats, GoodputRecorder
from goodput_schemas.wire import Message
from support.emitter import (
    FlakyTransport,
    GatedTransport,
    decode,
    emitter_threads,
    file_events,
    percentile,
    record_steps,
    wait_for,
)
from support.runs import at


class FailingTransport:
    """A destination that is never reachable."""

    def send(self, message: Message) -> None:
        raise ConnectionError("destination unreachable")

    def after_fork(self) -> None:
        """Nothing inherited."""

    def close(self) -> None:
        """Nothing to release."""


# -- the topic away for minutes ---------------------------------------------------------------------


# -- the process killed with SIGKILL ----------------------------------------------------------------


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
    refuse, make_recorder, make_settings, spool_dir, caplog, monkeypatch
):
    """With memory full and the spool refusing writes, calls neither raise nor block: the oldest
    queued events are dropped, counted and logged once; once writable, the spool is used again."""
    undo = refuse(spool_dir)
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir / "tmp"))  # nowhere to move to either
    transport = GatedTransport()
    recorder = make_recorder(destination=transport, settings=make_settings(
        max_queue_events=50, max_batch_events=10, max_latency_s=60))
    durations: list[float] = []
    with caplog.at_level(logging.WARNING, logger="emitter"):
        record_steps(recorder, range(500), durations)
    refused = recorder.stats
    assert (refused.recorded, refused.dropped, refused.queued, refused.spilled) == (500, 450, 50, 0)
    # Not blocked: a call that waited on the spool would take milliseconds every time. Of 500
    # calls, a busy machine's scheduler alone delays a few past 1 ms (p99 3 ms seen beside two
    # other test processes on two cores), not one in twenty.
    assert percentile(durations, 0.95) < 0.001
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
    labels = {"a": "eval\u2028set", "b": "eval\x85set", "c": "eval\u2029set"}  # free text: kept
    settings = make_settings(max_queue_events=1, max_batch_events=1, max_latency_s=60)
    recorder = make_recorder(destination=FlakyTransport(failures=10**9), labels=labels,
                             settings=settings)
    recorder.record_job_start_time(at(1))  # never spilled: it goes to the spool when close() ends
    recorder.record_step_start_time(1, at(2))
    assert recorder.stats.spilled == 1
    assert not recorder.close(timeout=0.2)
    transport = GatedTransport()
    transport.open()
    next_attempt = make_recorder(destination=transport, settings=settings)
    assert wait_for(lambda: next_attempt.stats.backlog_sent == 2)
    bodies = sorted((body for m in transport.messages for *_, body in decode(m.data)),
                    key=lambda body: "step" in body)
    assert [body.get("labels") for body in bodies] == [labels, None]


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
    # Both times given: the caller's mistake, recorded as nothing and counted.
    recorder.record_checkpoint_save(100, before_jump, before_jump - datetime.timedelta(seconds=1))
    assert recorder.stats.invalid_calls == 1
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
