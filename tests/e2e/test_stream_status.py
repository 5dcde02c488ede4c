"""A running local stream says on stderr, at an interval, what it has done so far."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import pubsub_v1

from goodput_schemas.wire import encode_batch
from pipeline.beam import launcher
from support.pubsub import subscribed

PROJECT = "projects/goodput-local"
TOPIC = f"{PROJECT}/topics/goodput"
SUBSCRIPTION = f"{PROJECT}/subscriptions/pipeline"
STATUS_INTERVAL_S = 0.3
RUNS = 3
#: A status line: the counts it gives.
STATUS = re.compile(r"status: (\d+) messages read \((\d+) events\), (\d+) runs held, (\d+) snapshots, "
                    r"(\d+) dead letters")


@pytest.fixture
def pubsub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This project's emulator, with the topic and the subscription made by the real clients."""
    with subscribed("local", TOPIC, SUBSCRIPTION, monkeypatch) as host:
        yield host


def test_a_stream_prints_its_status_at_the_interval(pubsub: str, tmp_path: Path):
    """Three runs' messages and one malformed message: the status lines come every interval and
    count up to 4 messages read, 3 runs held and 1 dead letter, and the snapshots made."""
    output = io.StringIO()

    def publish_then_stop() -> None:
        deadline = time.monotonic() + 120
        while "streaming from" not in output.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        publisher = pubsub_v1.PublisherClient()
        start_us = int(time.time() * 1e6)
        for run in range(RUNS):
            message = encode_batch(f"run-{run}", "attempt-1", [
                (0, start_us, "job_start", {}), (1, start_us + 1000, "step_start", {"step": 0})])
            publisher.publish(TOPIC, message.data).result(timeout=30)
        publisher.publish(TOPIC, b"not a batch of events").result(timeout=30)
        while time.monotonic() < deadline:  # until a line counts them all, then a moment more
            found = STATUS.findall(output.getvalue())
            if found and found[-1][0] == str(RUNS + 1) and int(found[-1][3]) >= RUNS:
                break
            time.sleep(0.05)
        time.sleep(3 * STATUS_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGINT)

    stopper = threading.Thread(target=publish_then_stop, daemon=True)
    stopper.start()
    started = time.monotonic()
    with contextlib.redirect_stderr(output):
        code = launcher.run(["--streaming", "--runner=BundleBasedDirectRunner",
                             f"--subscription={SUBSCRIPTION}", "--snapshot_interval_s=1",
                             f"--status_interval_s={STATUS_INTERVAL_S}",
                             f"--duckdb={tmp_path / 'live.duckdb'}"])
    took_s = time.monotonic() - started
    stopper.join(timeout=10)
    printed = output.getvalue()
    assert code == 0, printed
    lines = STATUS.findall(printed)
    before_stop = printed.split("stopping:")[0]
    # One line per interval while it streamed (the loop wakes at least every interval).
    assert len(STATUS.findall(before_stop)) >= 3
    assert len(lines) <= took_s / STATUS_INTERVAL_S + 1
    messages, events, runs, snapshots, dead = (int(value) for value in lines[-1])
    assert (messages, events, runs, dead) == (RUNS + 1, 2 * RUNS, RUNS, 1)
    assert snapshots >= RUNS
    counts = [tuple(int(value) for value in line) for line in lines]
    assert counts == sorted(counts)  # what is counted only grows
