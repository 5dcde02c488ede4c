"""The emitter in someone else's training process, second round: what the environment, the
filesystem, the signature and the process model do must neither raise into the job, nor block it
past its timeout, nor lose an event while the disk has room."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import emitter.workload
from emitter import EmitterSettings, GoodputRecorder
from emitter.transports import FileTransport
from goodput_schemas.wire import encode_batch
from support.emitter import FlakyTransport, GatedTransport, emitter_threads, file_events
from support.runs import at


@pytest.fixture(autouse=True)
def _no_spool_in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Spools these tests move (a taken root) go under the test's own directory."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))


# -- the constructor and every call are total --------------------------------------------------------


def test_a_destination_the_emitter_does_not_understand_keeps_the_events_for_the_next_process(
        make_settings, monkeypatch, tmp_path, caplog):
    """$GOODPUT_DESTINATION=garbage neither raises nor loses: the error is logged once, events
    wait in the spool, and the next process of the run, with a destination it understands,
    sends them."""
    monkeypatch.setenv("GOODPUT_DESTINATION", "garbage")
    with caplog.at_level(logging.ERROR, logger="emitter"):
        recorder = GoodputRecorder("run-1", logging_enabled=True, settings=make_settings())
    recorder.record_job_start_time(at(0))
    recorder.record_step_start_time(1, at(1))
    assert not recorder.close(timeout=5)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "goodput recorder for 'run-1': destination 'garbage' not understood: use 'file:PATH' or "
        "'projects/P/topics/T'; events are kept in memory and in the spool, for a process of the run "
        "with a destination it understands to send"]
    assert recorder.stats.kept == 2
    monkeypatch.setenv("GOODPUT_DESTINATION", f"file:{tmp_path / 'events.jsonl'}")
    following = GoodputRecorder("run-1", logging_enabled=True, settings=make_settings())
    assert following.close(timeout=5)
    assert following.stats.backlog_sent == 2
    assert [kind for *_, kind, _ in file_events(tmp_path / "events.jsonl")] == ["job_start", "step_start"]


@pytest.mark.parametrize("destination", [42, object(), b"file:/tmp/x"], ids=["int", "object", "bytes"])
def test_a_destination_that_is_no_destination_records_nothing_and_raises_nothing(make_settings, destination):
    """A destination neither a str, a path nor a transport disables recording, logged."""
    recorder = GoodputRecorder("run-1", logging_enabled=True, destination=destination,
                               settings=make_settings())
    recorder.record_job_start_time(at(0))
    assert recorder.close() and recorder.stats.recorded == 0


def test_a_path_object_as_destination_is_a_file(make_settings, tmp_path):
    """destination=Path(...) appends to that file."""
    path = tmp_path / "events.jsonl"
    recorder = GoodputRecorder("run-1", logging_enabled=True, destination=path, settings=make_settings())
    recorder.record_job_start_time(at(0))
    assert recorder.close(timeout=5)
    assert [kind for *_, kind, _ in file_events(path)] == ["job_start"]


def test_a_constructor_call_with_arguments_it_does_not_take_records_and_counts_them(make_settings,
                                                                                    events_file):
    """Arguments the recorder does not take (a newer reference's, a typo) are logged and counted
    in stats.invalid_calls, and the recorder records; a strict one raises TypeError."""
    recorder = GoodputRecorder("run-1", "log", True, None, "extra", destinaton="file:/nowhere",
                               destination=f"file:{events_file}", settings=make_settings())
    recorder.record_job_start_time(at(0))
    assert recorder.close(timeout=5)
    assert recorder.stats.invalid_calls == 1 and recorder.stats.sent == 1
    with pytest.raises(TypeError, match="destinaton"):
        GoodputRecorder("run-1", logging_enabled=True, destinaton="x", strict=True)


def test_a_recorder_without_a_job_name_records_nothing_and_raises_nothing():
    """GoodputRecorder() records nothing, logged; no call on it raises."""
    recorder = GoodputRecorder(logging_enabled=True)
    recorder.record_job_start_time()
    recorder.record_step_start_time(1)
    assert recorder.close() and recorder.stats.recorded == 0


CALLS_THAT_DO_NOT_FIT: list[Callable[[GoodputRecorder], object]] = [
    lambda r: r.record_step_start_time(),
    lambda r: r.record_step_start_time(1, step=2),
    lambda r: r.record_step_start_time(1, None, None),
    lambda r: r.record_model_metrics(),
    lambda r: r.record_model_metrics(1, 0.5),
    lambda r: r.record_model_metrics(1, lossy=0.5),
    lambda r: r.record_data_loading_start_time(end_time=None),
    lambda r: r.record_data_loading_end_time(1, 2),
    lambda r: r.record_job_start_time(1, 2, 3),
    lambda r: r.record_job_end_time(failed=True, crashed=True),
    lambda r: r.record_metrics(),
    lambda r: r.record_metrics({"loss": 1.0}, 1, None, "extra"),
    lambda r: r.record_configs(),
    lambda r: r.record_checkpoint_save(),
    lambda r: r.record_elastic_slice_counts(1),
    lambda r: r.flush(1, 2),
    lambda r: r.close(timeout=1, force=True),
]


@pytest.mark.parametrize("call", CALLS_THAT_DO_NOT_FIT)
def test_a_call_that_does_not_fit_the_signature_raises_nothing_and_is_counted(make_recorder, call):
    """A call its method does not take records nothing, is counted in stats.invalid_calls and
    raises nothing: on the per-step fast path too."""
    recorder = make_recorder()
    call(recorder)
    assert recorder.stats.invalid_calls == 1 and recorder.stats.recorded == 0


# -- record_configs ------------------------------------------------------------------------------------


def test_configs_holding_a_list_that_holds_itself_twice_record_at_once(make_recorder):
    """record_configs of a list holding itself twice returns at once, the rest recorded."""
    twice: list[Any] = []
    twice += [twice, twice]
    recorder = make_recorder()
    started = time.monotonic()
    recorder.record_configs({"seed": 1, "loop": twice})
    assert time.monotonic() - started < 1.0
    assert recorder.stats.dropped_config_entries == 2 and recorder.stats.recorded == 1


# -- what the job did not write is read off its thread ------------------------------------------------


def test_a_labels_file_that_is_a_fifo_is_never_waited_on(make_settings, tmp_path, events_file, caplog):
    """The pod's labels and annotations files as FIFOs nobody writes: they are not read (the
    reading thread never waits out its deadline), and the recorder records."""
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    os.mkfifo(podinfo / "labels")
    os.mkfifo(podinfo / "annotations")
    with caplog.at_level(logging.WARNING):
        recorder = GoodputRecorder("run-1", logging_enabled=True, destination=f"file:{events_file}",
                                   settings=make_settings(discover_workload=True, podinfo_dir=podinfo))
    assert not any("could not be read within" in r.getMessage() for r in caplog.records)
    recorder.record_job_start_time(at(0))
    assert recorder.close(timeout=5) and recorder.stats.sent == 1


@contextlib.contextmanager
def hung_mount(directory: Path) -> Iterator[None]:
    """A FUSE mount at ``directory`` whose server never answers: every access to it blocks, as on
    a hung network mount, until the context ends (the server goes away, the mount is dropped)."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("a FUSE mount needs root and /dev/fuse")
    directory.mkdir()
    fuse = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fuse},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"goodput-hung", str(directory).encode(), b"fuse", 0, options) != 0:
        os.close(fuse)
        pytest.skip(f"mounting FUSE failed: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        os.close(fuse)  # blocked accesses fail with ENOTCONN
        subprocess.run(["umount", "-l", str(directory)], check=False)


def test_a_hung_mount_under_the_pod_files_holds_the_constructor_its_deadline_at_most(
        make_settings, tmp_path, events_file, caplog):
    """The pod's files on a mount that never answers: the constructor waits
    LOCAL_SOURCES_TIMEOUT_S at most, says so, and the recorder records with what the environment
    says of the workload."""
    podinfo = tmp_path / "podinfo"
    with hung_mount(podinfo), caplog.at_level(logging.WARNING):
        started = time.monotonic()
        recorder = GoodputRecorder("run-1", logging_enabled=True, destination=f"file:{events_file}",
                                   settings=make_settings(discover_workload=True, podinfo_dir=podinfo))
        took = time.monotonic() - started
        recorder.record_job_start_time(at(0))
        assert recorder.close(timeout=5) and recorder.stats.sent == 1
    assert emitter.workload.LOCAL_SOURCES_TIMEOUT_S <= took < emitter.workload.LOCAL_SOURCES_TIMEOUT_S + 2.0
    assert any("could not be read within" in r.getMessage() for r in caplog.records)


# -- the process model ---------------------------------------------------------------------------------

SUBINTERPRETER = """
import _xxsubinterpreters as interpreters
interpreter = interpreters.create(isolated=True)
interpreters.run_string(interpreter, f'''
from emitter import EmitterSettings, GoodputRecorder
recorder = GoodputRecorder("run-1", logging_enabled=True, destination="file:" + {EVENTS!r},
                           settings=EmitterSettings(spool_dir={SPOOL!r}, collect_configs=False,
                                                    discover_workload=False))
recorder.record_job_start_time()
recorder.record_step_start_time(1)
print("closed", recorder.close(5), recorder.stats.sent)
''')
"""


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="_xxsubinterpreters is Python 3.11-3.12's")
def test_a_recorder_in_an_isolated_subinterpreter_records_without_a_thread(tmp_path):
    """In an isolated subinterpreter, where no thread can start, the recorder raises nothing and
    close() delivers what it recorded."""
    events = tmp_path / "events.jsonl"
    code = f"EVENTS, SPOOL = {str(events)!r}, {str(tmp_path / 'spool')!r}\n" + SUBINTERPRETER
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "closed True 2" in done.stdout, done.stderr
    assert [kind for *_, kind, _ in file_events(events)] == ["job_start", "step_start"]


def test_restarts_in_a_loop_while_the_destination_is_away_start_few_threads_and_lose_nothing(
        make_settings, events_file):
    """A job recording a new start every step while its destination is away: calls stay fast,
    the emitter's threads stay few, and close() spools every event it could not deliver."""
    transport = FlakyTransport(failures=10**9)
    recorder = GoodputRecorder("run-1", logging_enabled=True, destination=transport, settings=make_settings(
        retry_initial_backoff_s=0.5, retry_max_backoff_s=0.5, close_timeout_s=2.0))
    slowest, most_threads = 0.0, 0
    for step in range(2000):
        started = time.monotonic()
        recorder.record_job_start_time(at(step))
        recorder.record_step_start_time(step, at(step))
        slowest = max(slowest, time.monotonic() - started)
        most_threads = max(most_threads, len(emitter_threads()))
    assert most_threads <= 6  # four earlier attempts delivering, the current one's, one ending
    assert slowest < 5.0  # milliseconds, but for a busy machine's scheduler: was minutes
    assert not recorder.close(timeout=2)
    stats = recorder.stats
    assert (stats.recorded, stats.kept, stats.sent, stats.dropped, stats.queued) == (4000, 4000, 0, 0, 0)


# -- the spool ---------------------------------------------------------------------------------------


def spilling_recorder(make_recorder: Callable[..., GoodputRecorder],
                      make_settings: Callable[..., EmitterSettings], transport: GatedTransport,
                      **settings: Any) -> GoodputRecorder:
    """A recorder that spills from its third event on, in segments of about two events."""
    values: dict[str, Any] = {"max_queue_events": 2, "max_batch_events": 2, "max_latency_s": 60,
                              "spool_segment_bytes": 200, **settings}
    return make_recorder(destination=transport, settings=make_settings(**values))


def test_a_spool_directory_removed_mid_run_is_made_again_and_loses_nothing(
        make_recorder, make_settings, spool_dir):
    """rm -rf of the spool while a job spills (a tmp cleaner): the open segment is written again
    from its descriptor, the directory is made again, and every event arrives; what was removed
    after it was sealed is counted dropped, never lost unsaid."""
    transport = GatedTransport()
    recorder = spilling_recorder(make_recorder, make_settings, transport, spool_segment_bytes=100_000)
    for step in range(10):
        recorder.record_step_start_time(step, at(step))
    shutil.rmtree(spool_dir)
    for step in range(10, 20):
        recorder.record_step_start_time(step, at(step))
    transport.open()
    assert recorder.flush(10)
    assert sorted(transport.seqs()) == list(range(20))
    stats = recorder.stats
    assert (stats.sent, stats.dropped, stats.kept) == (20, 0, 0)


def test_a_segment_removed_while_it_is_written_is_written_again(make_recorder, make_settings, spool_dir):
    """A cleaner removes the segment being written, and only it: the writer writes it again from
    its descriptor (its lock still held), and every event arrives."""
    transport = GatedTransport()
    recorder = spilling_recorder(make_recorder, make_settings, transport, spool_segment_bytes=100_000)
    for step in range(10):
        recorder.record_step_start_time(step, at(step))
    [segment] = spool_dir.rglob("*.seg")
    segment.unlink()
    for step in range(10, 20):
        recorder.record_step_start_time(step, at(step))
    assert [path.name for path in spool_dir.rglob("*.seg")] == [segment.name]
    transport.open()
    assert recorder.flush(10)
    assert sorted(set(transport.seqs())) == list(range(20))
    assert (recorder.stats.sent, recorder.stats.dropped) == (20, 0)


def test_a_segment_removed_while_the_spool_is_full_is_written_again_at_the_next_event(
        make_recorder, make_settings, spool_dir):
    """The spool is full and every new event is dropped (counted) when a cleaner removes the
    segment being written: the next event, dropped too, writes the segment again from its
    descriptor, so that its events are on disk should the process be killed next (the soak: a
    kill after such a removal lost 210 events that nothing counted)."""
    transport = GatedTransport()
    recorder = spilling_recorder(make_recorder, make_settings, transport, spool_segment_bytes=1_000,
                                 max_spool_bytes=1_000)
    step = 0
    while recorder.stats.dropped == 0:  # until the spool is full
        recorder.record_step_start_time(step, at(step))
        step += 1
    [segment] = spool_dir.rglob("*.seg")
    segment.unlink()
    recorder.record_step_start_time(step, at(step))
    assert [path.name for path in spool_dir.rglob("*.seg")] == [segment.name]
    transport.open()
    assert recorder.flush(10)
    stats = recorder.stats  # every event delivered or counted dropped
    assert stats.sent + stats.dropped == step + 1 and stats.sent > 2
    assert sorted(set(transport.seqs())) == sorted(transport.seqs()) and len(transport.seqs()) == stats.sent


def test_sealed_segments_removed_by_someone_else_are_counted_dropped(make_recorder, make_settings, spool_dir,
                                                                     caplog):
    """Sealed segments removed before they were sent: their events are counted dropped, logged
    once, and flush() does not wait for them."""
    transport = GatedTransport()
    recorder = spilling_recorder(make_recorder, make_settings, transport)
    for step in range(30):
        recorder.record_step_start_time(step, at(step))
    for path in sorted(spool_dir.rglob("*.seg"))[:2]:
        path.unlink()
    transport.open()
    with caplog.at_level(logging.ERROR):
        assert recorder.flush(10)
    delivered = set(transport.seqs())
    stats = recorder.stats
    assert stats.dropped >= 2 and stats.dropped == stats.dropped_removed
    assert stats.dropped == 30 - len(delivered) == 30 - stats.sent
    assert len([r for r in caplog.records if "removed before it was sent" in r.getMessage()]) == 1


class SegmentRemovingTransport(GatedTransport):
    """Opens the gate; at the first message of spooled events (seq ``from_seq`` on), removes
    every sealed segment, then delivers it and the rest (``broken=False``) or fails from the next
    message on (``broken=True``)."""

    def __init__(self, spool_dir: Path, from_seq: int, broken: bool) -> None:
        super().__init__()
        self.spool_dir, self.from_seq, self.broken = spool_dir, from_seq, broken
        self.removed = False
        self.gate.set()

    def send(self, message: Any) -> None:
        if self.removed and self.broken:
            raise ConnectionError("broker unavailable")
        if not self.removed and json.loads(message.data)["events"][0]["seq"] >= self.from_seq:
            self.removed = True
            for path in self.spool_dir.rglob("*.seg"):
                path.unlink()
        super().send(message)


@pytest.mark.parametrize("broken", [False, True], ids=["delivered", "interrupted"])
def test_a_segment_removed_while_it_is_sent_counts_only_what_it_did_not_deliver(
        make_recorder, make_settings, spool_dir, broken):
    """A cleaner removes the segment the worker is sending (read already): what it delivers is
    sent, never also dropped; if the destination then fails and close() gives up, only the events
    it did not deliver are dropped, and every event is counted once."""
    transport = SegmentRemovingTransport(spool_dir, from_seq=2, broken=broken)
    gate = threading.Event()
    transport.gate = gate  # closed while the events are recorded: they spill
    recorder = spilling_recorder(make_recorder, make_settings, transport, spool_segment_bytes=100_000)
    for step in range(10):
        recorder.record_step_start_time(step, at(step))
    recorder.flush(0)  # seals the open segment
    gate.set()
    delivered = recorder.close(timeout=1)
    stats = recorder.stats
    seqs = set(transport.seqs())
    assert stats.sent == len(seqs) and stats.dropped == 10 - len(seqs), stats
    assert (stats.kept, delivered) == (0, not broken)
    assert len(seqs) == (10 if not broken else 4)  # the queue's 2, the segment's first batch of 2


class SwitchedTransport(GatedTransport):
    """Delivers while ``up`` is set, else fails at once."""

    def __init__(self) -> None:
        super().__init__()
        self.up = threading.Event()

    def send(self, message: Any) -> None:
        if not self.up.is_set():
            raise ConnectionError("broker unavailable")
        self.messages.append(message)


def test_a_forked_childs_close_never_takes_the_parents_spool(make_recorder, make_settings, spool_dir):
    """A forked child that closes its recorder while the parent's spool is empty leaves the
    parent's spool directory in place: the parent spills on into it and loses nothing."""
    transport = SwitchedTransport()
    recorder = spilling_recorder(make_recorder, make_settings, transport, max_latency_s=0.05)
    for step in range(5):
        recorder.record_step_start_time(step, at(step))
    transport.up.set()
    assert recorder.flush(10)  # what was spilled is sent: the spool holds no event
    transport.up.clear()
    pid = os.fork()
    if pid == 0:
        recorder.close(timeout=1)
        os._exit(0)
    os.waitpid(pid, 0)
    for step in range(5, 15):
        recorder.record_step_start_time(step, at(step))
    transport.up.set()
    assert recorder.flush(10)
    assert sorted(set(transport.seqs())) == list(range(15))
    assert recorder.stats.dropped == 0


def test_a_live_sibling_attempt_never_sends_or_removes_another_attempts_segments(
        make_recorder, make_settings, spool_dir, tmp_path):
    """Two processes of one run at once (one spilling): the other leaves the live attempt's
    segments alone, so each attempt's events are counted once, by it."""
    transport = GatedTransport()
    recorder = spilling_recorder(make_recorder, make_settings, transport)
    for step in range(10):
        recorder.record_step_start_time(step, at(step))
    sibling_events = tmp_path / "sibling.jsonl"
    sibling = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from emitter import EmitterSettings, GoodputRecorder
        settings = EmitterSettings(spool_dir={str(spool_dir)!r}, collect_configs=False,
                                   discover_workload=False)
        recorder = GoodputRecorder("run-1", logging_enabled=True, destination="file:{sibling_events}",
                                   settings=settings)
        assert recorder.close(5)
        print(recorder.stats.backlog_sent)
    """)], capture_output=True, text=True, timeout=60)
    assert sibling.stdout.strip() == "0", sibling.stderr
    transport.open()
    assert recorder.flush(10)
    assert sorted(transport.seqs()) == list(range(10)) and recorder.stats.sent == 10


# -- the file destination follows its path ---------------------------------------------------------------


def message(seq: int) -> Any:
    return encode_batch("run-1", "a" * 32, [(seq, 1_700_000_000_000_000 + seq, "heartbeat", {})])


def test_a_destination_file_removed_mid_run_gets_the_rest_at_its_path(tmp_path):
    """Log rotation removes the destination file between sends: the next message goes to a new
    file at the path, never into the removed one."""
    path = tmp_path / "events.jsonl"
    transport = FileTransport(path)
    transport.send(message(0))
    path.unlink()
    transport.send(message(1))
    assert [seq for _, seq, *_ in file_events(path)] == [1]


def test_a_destination_file_renamed_mid_run_keeps_what_it_got_and_the_path_gets_the_rest(tmp_path):
    """Rotation by rename: what was written stays in the renamed file, the rest goes to the path."""
    path = tmp_path / "events.jsonl"
    transport = FileTransport(path)
    transport.send(message(0))
    path.rename(tmp_path / "events.jsonl.1")
    transport.send(message(1))
    assert [seq for _, seq, *_ in file_events(tmp_path / "events.jsonl.1")] == [0]
    assert [seq for _, seq, *_ in file_events(path)] == [1]


def test_a_line_written_into_a_file_removed_meanwhile_is_not_counted_sent(tmp_path, monkeypatch):
    """A removal that comes while a line is written (after the path was checked): the send fails,
    and its retry writes the line at the path."""
    path = tmp_path / "events.jsonl"
    transport = FileTransport(path)
    transport.send(message(0))
    write = os.write

    def write_then_remove(fd: int, data: bytes) -> int:
        written = write(fd, data)
        path.unlink()
        return written

    monkeypatch.setattr(os, "write", write_then_remove)
    with pytest.raises(OSError, match="was removed while a message was written"):
        transport.send(message(1))
    monkeypatch.setattr(os, "write", write)
    transport.send(message(1))
    assert [seq for _, seq, *_ in file_events(path)] == [1]


def test_a_recorder_whose_destination_is_rotated_mid_run_delivers_every_event(make_recorder, events_file):
    """Through the recorder: events after a rotation arrive at the path, every one counted sent."""
    recorder = make_recorder()
    recorder.record_job_start_time(at(0))
    assert recorder.flush(5)
    events_file.rename(events_file.with_suffix(".1"))
    recorder.record_step_start_time(1, at(1))
    assert recorder.flush(5)
    assert [kind for *_, kind, _ in file_events(events_file)] == ["step_start"]
    assert recorder.stats.sent == 2


# -- after close -------------------------------------------------------------------------------------------


def test_calls_after_close_are_counted_and_logged_once(make_recorder, caplog):
    """Calls on a closed recorder are dropped, each counted, and logged once."""
    recorder = make_recorder()
    recorder.close()
    with caplog.at_level(logging.WARNING, logger="emitter"):
        for step in range(50):
            recorder.record_step_start_time(step, at(step))
            recorder.record_heartbeat(at(step))
    assert recorder.stats.dropped == 100
    assert len([r for r in caplog.records if "is closed" in r.getMessage()]) == 1


def test_every_event_is_sent_dropped_queued_or_kept(make_recorder, make_settings):
    """stats accounts for every event recorded: sent, dropped, in memory or in the spool."""
    transport = GatedTransport()
    recorder = spilling_recorder(make_recorder, make_settings, transport)
    for step in range(25):
        recorder.record_step_start_time(step, at(step))
    stats = recorder.stats
    assert stats.recorded == stats.sent + stats.dropped + stats.queued + stats.kept == 25
    assert not recorder.close(timeout=0.2)
    stats = recorder.stats
    assert (stats.queued, stats.kept, stats.recorded) == (0, 25, 25)
