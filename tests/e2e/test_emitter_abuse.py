"""The emitter in a real process under abuse: SIGTERM mid-burst to a job whose handler records its
end and closes the recorder, and a disk that fills up under the spool and the destination while
the job records, checked through the pipeline's tables."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emitter import EmitterSettings, GoodputRecorder
from support.beam import query, run_batch
from support.runs import at

#: A training loop recording steps as fast as it can, whose SIGTERM handler does what a job's
#: preemption handler does: record the end, close the recorder, exit.
CHILD = """
    import signal, sys
    from emitter import EmitterSettings, GoodputRecorder

    destination, spool, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    recorder = GoodputRecorder("preempted", logging_enabled=True, destination=destination,
                               settings=EmitterSettings(spool_dir=spool, max_batch_events=50,
                                                        max_latency_s=0.005, collect_configs=False,
                                                        heartbeat_interval_s=None))

    def preempted(signum, frame):
        recorder.record_job_end_time()
        delivered = recorder.close(timeout)
        print(f"closed delivered={delivered}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, preempted)
    recorder.record_job_start_time()
    print("ready", flush=True)
    step = 0
    while True:
        recorder.record_step_start_time(step)
        step += 1
"""

#: What Python's start and exit may add to the close timeout.
EXIT_MARGIN_S = 1.5


def preempt(destination: str, spool: Path, timeout_s: float, rng: random.Random) -> float:
    """Starts the child, sends SIGTERM mid-burst; seconds from the signal to its exit."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), destination,
                              str(spool), str(timeout_s)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.stderr.read() if child.stderr else ""
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        child.wait(timeout_s + 10)
        took = time.monotonic() - signalled
        out, err = child.communicate()
        assert child.returncode == 0, err
        assert "closed delivered=" in out, err
        return took
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_sigterm_mid_burst_to_a_job_whose_handler_closes_always_exits_within_the_timeout(
        tmp_path):
    """Fifty times: SIGTERM lands while record_* holds the emitter's lock; the handler records the
    end and closes; the process exits within the close timeout, and the job's end arrives with
    no sequence number used for two events."""
    rng = random.Random(19)
    timeout_s = 2.0
    slowest = 0.0
    for attempt in range(50):
        events = tmp_path / f"events-{attempt}.jsonl"
        slowest = max(slowest, preempt(f"file:{events}", tmp_path / "spool", timeout_s, rng))
        batches = [json.loads(line) for line in events.read_text().splitlines()]
        numbered: dict[tuple[str, int], dict[str, object]] = {}
        for batch in batches:
            for event in batch["events"]:
                # A copy of one event is at-least-once delivery; two events under one number are not.
                assert numbered.setdefault((batch["attempt_id"], event["seq"]), event) == event
        own = batches[-1]["attempt_id"]
        assert any("job_end" in event for (attempt_id, _), event in numbered.items() if attempt_id == own)
    assert slowest < timeout_s + EXIT_MARGIN_S, slowest


def test_sigterm_to_a_job_whose_destination_hangs_exits_within_the_timeout(tmp_path):
    """With the destination a FIFO that nobody reads, the handler's close still returns by its
    deadline and the process exits; what was not delivered is in the spool."""
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    rng = random.Random(20)
    timeout_s = 1.0
    took = [preempt(f"file:{fifo}", tmp_path / "spool", timeout_s, rng) for _ in range(5)]
    assert max(took) < timeout_s + EXIT_MARGIN_S, took
    assert list((tmp_path / "spool").rglob("*.seg"))


def test_a_job_that_ends_without_closing_exits_by_the_close_timeout_whatever_the_destination(
        tmp_path):
    """A job that never calls close() and whose destination hangs (a FIFO nobody reads): the
    exit hook closes the recorder within its timeout and the process exits."""
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    script = textwrap.dedent("""
        import sys
        from emitter import EmitterSettings, GoodputRecorder
        recorder = GoodputRecorder("ends", logging_enabled=True, destination=sys.argv[1],
                                   settings=EmitterSettings(spool_dir=sys.argv[2],
                                                            close_timeout_s=1.0))
        recorder.record_job_start_time()
        for step in range(1000):
            recorder.record_step_start_time(step)
    """)
    started = time.monotonic()
    ended = subprocess.run([sys.executable, "-c", script, f"file:{fifo}", str(tmp_path / "spool")],
                           capture_output=True, text=True, timeout=30)
    assert ended.returncode == 0, ended.stderr
    assert time.monotonic() - started < 1.0 + EXIT_MARGIN_S + 1.0  # Python's start too
    assert list((tmp_path / "spool").rglob("*.seg"))


# -- a full disk ------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path``: a disk that really fills up."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills up) needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def grow(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def test_a_disk_filling_up_under_spool_and_destination_loses_nothing_uncounted(tmp_path):
    """The destination's disk and then the spool's fill up mid-write while a job records 20,000
    steps; once space is freed the rest is delivered. Every event is in the pipeline's events
    table or counted as dropped, no line is torn, and the attempt's job start is there."""
    with small_disk(tmp_path / "out", "64k") as out, small_disk(tmp_path / "spool", "256k") as spool:
        events = out / "events.jsonl"
        recorder = GoodputRecorder(
            "full-disk", logging_enabled=True, destination=f"file:{events}", chip_count=256,
            settings=EmitterSettings(spool_dir=spool, max_queue_events=500, max_batch_events=100,
                                     max_latency_s=0.01, retry_initial_backoff_s=0.01,
                                     retry_max_backoff_s=0.05, spool_segment_bytes=16 * 1024,
                                     max_spool_bytes=10 * 1024 * 1024, heartbeat_interval_s=None,
                                     collect_configs=False))
        recorder.record_job_start_time(at(0))
        for step in range(20_000):
            recorder.record_step_start_time(step, at(1 + step / 100))
        full = recorder.stats
        assert full.send_errors > 0 and full.spilled > 0 and full.dropped > 0, full
        grow(out, "64m")
        assert not recorder.close(timeout=60)  # all that was kept is delivered; some was dropped
        stats = recorder.stats
        database = tmp_path / "goodput.duckdb"
        run_batch(f"--events={events}", f"--duckdb={database}")
    assert query(database, "SELECT count(*) FROM dead_letter") == [(0,)]
    (kept, distinct, starts), = query(
        database, "SELECT count(*), count(DISTINCT seq), count(*) FILTER (kind = 'job_start') "
                  "FROM events")
    assert kept == distinct == stats.sent
    assert stats.sent + stats.dropped == stats.recorded == 20_001
    assert starts == 1
