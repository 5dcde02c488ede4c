"""The emitter inside someone else's training process, tried as an attacker and a chaos engineer
would: any argument, a private spool, files planted in it, torn and short writes, a destination
that hangs or refuses, and memory and spool full at once."""

from __future__ import annotations

import datetime
import json
import os
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import emitter.transports
from emitter import EmitterSettings, GoodputRecorder
from emitter.spool import run_directory
from emitter.transports import FileTransport, MessageRefused
from goodput_schemas.wire import Message, encode_batch
from support.emitter import GatedTransport, decode, read_events, wait_for
from support.runs import at

# -- any argument -----------------------------------------------------------------------------------

ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.binary(),
    st.datetimes(), st.datetimes(timezones=st.timezones()), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    st.builds(object), st.just(float("nan")), st.just(2**70), st.just(-(2**70)),
    st.just("\x00\u202e"), st.just(datetime.datetime.max), st.just(datetime.date(2026, 1, 1)),
)
#: Each call with the positional parameters it requires and the most it takes.
CALLS = [
    ("record_job_start_time", 0, 1), ("record_job_end_time", 0, 1),
    ("record_step_start_time", 1, 2), ("record_tpu_init_start_time", 0, 1),
    ("record_tpu_init_end_time", 0, 1), ("record_training_preparation_start_time", 0, 1),
    ("record_training_preparation_end_time", 0, 1), ("record_data_loading_start_time", 0, 1),
    ("record_data_loading_end_time", 0, 1), ("record_custom_badput_event_start_time", 0, 2),
    ("record_custom_badput_event_end_time", 0, 2), ("record_checkpoint_progress", 2, 2),
    ("record_elastic_slice_counts", 3, 4), ("record_elastic_wait_start_time", 1, 2),
    ("record_elastic_wait_end_time", 1, 2), ("record_elastic_reinit_start_time", 0, 1),
    ("record_elastic_reinit_end_time", 0, 1), ("record_checkpoint_save", 2, 4),
    ("record_checkpoint_restore", 2, 3), ("record_heartbeat", 0, 1), ("record_model_metrics", 1, 1),
    ("record_configs", 1, 2), ("record_metrics", 1, 3), ("flush", 0, 1),
]
METRICS = ("loss", "step_time_s", "tokens_per_s", "samples_per_s", "mfu", "tflops_per_device",
           "time_")


@st.composite
def a_call(draw: st.DrawFn) -> tuple[str, list[object], dict[str, object]]:
    name, required, most = draw(st.sampled_from(CALLS))
    arguments = draw(st.lists(ANYTHING, min_size=required, max_size=most))
    keywords = (draw(st.dictionaries(st.sampled_from(METRICS), ANYTHING, max_size=3))
                if name == "record_model_metrics" else {})
    return name, arguments, keywords


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(a_call(), min_size=1, max_size=12), timeout=st.one_of(st.none(), ANYTHING))
def test_no_argument_makes_a_call_raise_and_close_keeps_its_deadline(tmp_path_factory, calls,
                                                                    timeout):
    """Any Python object for any parameter of any call: nothing escapes into the caller, every
    call is recorded or counted as invalid, and close() returns within its timeout."""
    directory = tmp_path_factory.mktemp("any")
    recorder = GoodputRecorder(
        "run", logging_enabled=True, destination=f"file:{directory / 'events.jsonl'}",
        settings=EmitterSettings(spool_dir=directory / "spool", heartbeat_interval_s=None,
                                 max_latency_s=0.01, close_timeout_s=2.0))
    try:
        for name, arguments, keywords in calls:
            getattr(recorder, name)(*arguments, **keywords)
        stats = recorder.stats
        assert stats.recorded + stats.invalid_calls >= sum(
            name not in ("flush", "record_checkpoint_progress") for name, _, _ in calls)
        started = time.monotonic()
        recorder.close(timeout)  # an invalid timeout is counted, then the default one applies
        assert time.monotonic() - started < 2.0 + 0.5
    finally:
        recorder.close()


# -- the spool is private ---------------------------------------------------------------------------


def test_the_default_spool_is_the_users_own_and_private(make_recorder, make_settings, spool_dir):
    """The default root names the user; the directories the spool makes are 0700."""
    assert f"goodput-spool-{os.geteuid()}" in str(EmitterSettings().spool_dir)
    recorder = make_recorder(destination=GatedTransport(), settings=make_settings(
        max_queue_events=1, max_latency_s=60))
    recorder.record_step_start_time(0, at(0))
    recorder.record_step_start_time(1, at(1))  # spilled
    assert recorder.stats.spilled == 1
    for directory in (spool_dir, run_directory(spool_dir, "run-1")):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_a_group_readable_spool_of_the_users_own_is_made_private(make_recorder, make_settings,
                                                                spool_dir):
    """An existing spool directory open to the group or others is closed before use."""
    spool_dir.mkdir(mode=0o755)
    os.chmod(spool_dir, 0o777)
    recorder = make_recorder(destination=GatedTransport(), settings=make_settings(
        max_queue_events=1, max_latency_s=60))
    recorder.record_step_start_time(0, at(0))
    recorder.record_step_start_time(1, at(1))
    assert stat.S_IMODE(spool_dir.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_spool_root_another_user_made_first_is_never_used_and_loses_nothing(
        make_recorder, make_settings, spool_dir, tmp_path, monkeypatch, caplog):
    """A spool root another user made first (the predictable <tmp>/goodput-spool-<uid>) is
    neither read nor written: the spool moves to a new private directory, logged, and every
    event the job records is delivered."""
    spool_dir.mkdir(mode=0o700)
    os.chown(spool_dir, 65534, 65534)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    transport = GatedTransport()
    recorder = make_recorder(destination=transport, settings=make_settings(
        max_queue_events=5, max_latency_s=60))
    for step in range(8):
        recorder.record_step_start_time(step, at(step))
    assert recorder.stats.spilled == 3 and recorder.stats.kept == 3
    assert list(spool_dir.iterdir()) == []
    [moved] = tmp_path.glob(f"goodput-spool-{os.geteuid()}-*")
    assert stat.S_IMODE(moved.stat().st_mode) == 0o700 and moved.stat().st_uid == os.geteuid()
    assert any("belongs to uid 65534" in r.getMessage() and str(moved) in r.getMessage()
               for r in caplog.records)
    transport.open()
    assert recorder.flush(10)
    assert transport.seqs() == list(range(8))
    assert recorder.stats.sent == 8 and recorder.stats.kept == 0


def planted_segment(spool_dir: Path, run_id: str, header: dict[str, str], name: str) -> Path:
    directory = run_directory(spool_dir, run_id)
    directory.mkdir(parents=True, mode=0o700, exist_ok=True)
    path = directory / name
    events = [json.dumps([0, at(0).timestamp() * 1e6 // 1, "step_start", {"step": 99}])]
    path.write_text("\n".join([json.dumps(header), *events]) + "\n")
    return path


@pytest.mark.parametrize("header", [
    {"run_id": "victim", "attempt_id": "a" * 32},  # another run's events, in this run's spool
    {"run_id": "run-1", "attempt_id": "b" * 32},  # an attempt other than its file name says
])
def test_a_segment_planted_in_the_spool_is_never_sent(make_recorder, make_settings, spool_dir,
                                                     header):
    """A segment whose header names another run, or an attempt other than its name, is removed
    unsent: nobody can publish as another run with this job's credentials."""
    spool_dir.mkdir(mode=0o700)
    planted = planted_segment(spool_dir, "run-1", header,
                              f"{0:020d}-{'a' * 32}-{0:012d}.seg")
    transport = GatedTransport()
    transport.open()
    recorder = make_recorder(destination=transport, settings=make_settings())
    recorder.record_job_start_time(at(1))
    assert recorder.flush(10)
    assert wait_for(lambda: not planted.exists())
    assert [kind for *_, kind, _ in (e for m in transport.messages for e in decode(m.data))] == [
        "job_start"]
    assert recorder.stats.backlog_sent == 0


def test_a_segment_that_is_a_symbolic_link_is_never_followed(make_recorder, make_settings,
                                                            spool_dir, tmp_path):
    """A segment planted as a link to another file is removed without reading what it points to."""
    spool_dir.mkdir(mode=0o700)
    target = planted_segment(tmp_path / "elsewhere", "run-1", {"run_id": "run-1",
                             "attempt_id": "a" * 32}, f"{0:020d}-{'a' * 32}-{0:012d}.seg")
    directory = run_directory(spool_dir, "run-1")
    directory.mkdir(mode=0o700)
    link = directory / target.name
    link.symlink_to(target)
    transport = GatedTransport()
    transport.open()
    recorder = make_recorder(destination=transport, settings=make_settings())
    recorder.record_job_start_time(at(1))
    assert recorder.flush(10)
    assert wait_for(lambda: not os.path.lexists(link))
    assert target.exists()
    assert recorder.stats.backlog_sent == 0


# -- a file destination: whole lines or nothing -----------------------------------------------------


def message(seq: int) -> Message:
    return encode_batch("run", "a" * 32, [(seq, 1_790_000_000_000_000 + seq, "step_start",
                                          {"step": seq})])


def test_a_torn_tail_a_killed_writer_left_is_cut_off_before_the_next_line(tmp_path, caplog):
    """A last line with no end is cut off, never appended to: the next message stays readable."""
    path = tmp_path / "events.jsonl"
    whole = message(0).data + b"\n"
    path.write_bytes(whole + message(1).data[:40])
    transport = FileTransport(path)
    transport.send(message(2))
    transport.close()
    assert path.read_bytes() == whole + message(2).data + b"\n"
    assert any("torn line of 40 bytes" in r.getMessage() for r in caplog.records)


class ShortWrites:
    """``os`` for the file transport, whose next ``write`` stops halfway (a disk filling up)."""

    def __init__(self) -> None:
        self.short = 1

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        if self.short:
            self.short -= 1
            return os.write(fd, data[:len(data) // 2])
        return os.write(fd, data)


def test_a_short_write_is_cut_off_and_the_retry_is_the_only_copy(monkeypatch, make_recorder,
                                                                 events_file):
    """A full disk that takes half a line: the half is cut off again, the send fails and is
    retried, and the file holds each message once, whole; nothing is counted as sent twice."""
    monkeypatch.setattr(emitter.transports, "os", ShortWrites())
    recorder = make_recorder()
    for step in range(5):
        recorder.record_step_start_time(step, at(step))
    assert recorder.close()
    assert [e["seq"] for e in read_events(events_file)] == list(range(5))
    stats = recorder.stats
    assert (stats.sent, stats.send_errors, stats.dropped) == (5, 1, 0)


def test_a_fifo_nobody_reads_neither_hangs_a_send_nor_close(make_recorder, make_settings,
                                                           tmp_path):
    """A FIFO without a reader as the destination: sends fail at once and are retried, and
    close() returns by its deadline, keeping the events in the spool."""
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    recorder = make_recorder(destination=f"file:{fifo}")
    recorder.record_job_start_time(at(0))
    assert wait_for(lambda: recorder.stats.send_errors >= 1)
    started = time.monotonic()
    assert not recorder.close(timeout=0.5)
    assert time.monotonic() - started < 1.5


def goodput_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("goodput-")}


class StuckTransport(GatedTransport):
    """A destination whose sends and close hang, like a write to a hung mount, until ``open()``."""

    def close(self) -> None:
        self.gate.wait(30)


def test_close_keeps_its_deadline_while_a_send_hangs(make_recorder):
    """A send stuck on its destination holds up neither close() nor the process's exit."""
    before = goodput_threads()
    transport = StuckTransport()
    recorder = make_recorder(destination=transport)
    recorder.record_job_start_time(at(0))
    assert wait_for(lambda: recorder.stats.queued == 1)
    started = time.monotonic()
    assert not recorder.close(timeout=1.0)
    assert time.monotonic() - started < 1.5
    transport.open()  # the mount comes back: the stuck threads end
    assert wait_for(lambda: goodput_threads() <= before)


class Refusing(GatedTransport):
    """A destination that refuses messages over ``limit`` bytes for good."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.refusals = 0
        self.open()

    def send(self, message: Message) -> None:
        if len(message.data) > self.limit:
            self.refusals += 1
            raise MessageRefused(f"message of {len(message.data)} bytes over {self.limit}")
        super().send(message)


def test_a_message_the_destination_refuses_for_good_is_dropped_and_counted_not_retried(
        make_recorder, make_settings):
    """A message too large for the destination is sent once, dropped and counted; the events
    after it are delivered."""
    transport = Refusing(limit=2_000)
    recorder = make_recorder(destination=transport, settings=make_settings(max_batch_events=1),
                             labels={f"k{i}": "v" * 250 for i in range(9)})
    recorder.record_job_start_time(at(0))  # with its labels, over the limit
    recorder.record_step_start_time(1, at(1))
    assert not recorder.close(timeout=5)
    assert transport.refusals == 1
    stats = recorder.stats
    assert (stats.dropped, stats.dropped_refused, stats.sent) == (1, 1, 1)


# -- memory and spool full: the attempt's start goes last -------------------------------------------


def test_with_memory_and_spool_full_the_job_start_is_kept_and_close_reports_the_loss(
        make_recorder, make_settings, tmp_path, monkeypatch):
    """Memory full and the spool refusing: the oldest events are dropped but never the attempt's
    job_start (its chips and accelerator), and close() says that not everything arrived."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(blocked))  # nowhere to move the spool to either
    transport = GatedTransport()
    recorder = make_recorder(destination=transport, chip_count=512, settings=make_settings(
        spool_dir=blocked, max_queue_events=10, max_batch_events=10, max_latency_s=60))
    recorder.record_job_start_time(at(0))
    for step in range(100):
        recorder.record_step_start_time(step, at(step + 1))
    transport.open()
    assert not recorder.close(timeout=10)
    kinds = [(kind, body) for m in transport.messages for *_, kind, body in decode(m.data)]
    assert kinds[0] == ("job_start", {"emitter_version": kinds[0][1]["emitter_version"],
                                      "chip_count": 512})
    stats = recorder.stats
    assert stats.sent + stats.dropped == stats.recorded == 101
    assert stats.dropped > 0


# -- a signal handler that closes -------------------------------------------------------------------


def test_a_call_from_inside_a_call_holding_the_lock_neither_deadlocks_nor_reuses_a_number(
        make_recorder, events_file):
    """What a signal handler does while put() holds the lock (here: a transport of the spool's
    disk calling back) records its event under a number of its own and returns."""
    recorder = make_recorder()
    worker = recorder._worker
    assert worker is not None
    with worker._lock:  # as if interrupted inside put()
        recorder.record_job_end_time(at(1))
        assert recorder.flush(5)  # its wait releases the lock, so the worker delivers
    recorder.record_step_start_time(1, at(2))
    assert recorder.close(5)
    assert sorted(e["seq"] for e in read_events(events_file)) == [0, 1]

