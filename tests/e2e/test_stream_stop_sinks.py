"""The local stream's stop keeps the bound it prints while BigQuery or Cloud Monitoring does not
answer: stalled (the stand-in's process stopped with SIGSTOP: connections are taken, requests
never answered) or gone (killed: connections refused). Each stand-in runs in a process of its own;
the stream is the launcher's, with its wait past the grace cut from 60 s to ``DRAIN_MAX_S``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from google.pubsub_v1.types import pubsub as types

from emitter import EmitterSettings, GoodputRecorder
from pipeline.emulators.pubsub import PubSubEmulator
from support import REPO
from support.beam import table_seqs
from support.runs import at

PROJECT = "projects/goodput-local"
TOPIC = f"{PROJECT}/topics/goodput"
SUBSCRIPTION = f"{PROJECT}/subscriptions/pipeline"
#: The stop's wait for what was read past its grace: the launcher's 60 s, cut so that a stop
#: against a sink that never answers takes seconds.
DRAIN_MAX_S = 5
#: The launcher, as ``python -m pipeline`` runs it, with ``DRAIN_MAX_S``; SIGUSR1 makes it print
#: its threads' stacks (for a stop that does not end).
LAUNCHER = ("import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1); "
            "from pipeline.beam import launcher; "
            f"launcher.DRAIN_MAX_S = {DRAIN_MAX_S}; sys.exit(launcher.run())")
#: How long past its printed bound a stream may say it stopped: a poll, a busy machine's
#: scheduling (as tests/e2e/test_stream_stop.py allows).
SLACK_S = 2.0
#: How soon a second signal stops the stream: the launcher waits a second for the step under way.
AT_ONCE_S = 1 + SLACK_S
SINKS: dict[str, Callable[[str], tuple[str, ...]]] = {
    "bigquery": lambda address: ("--bigquery_dataset=goodput-local:goodput", f"--bigquery_endpoint={address}",
                                 "--bigquery_create_tables"),
    "monitoring": lambda address: ("--monitoring_project=goodput-local", f"--monitoring_endpoint={address}",
                                   "--monitoring_min_interval_s=5", "--monitoring_latest_now"),
}
FAULTS = {"stalled": signal.SIGSTOP, "gone": signal.SIGKILL}


@pytest.fixture
def pubsub(monkeypatch: pytest.MonkeyPatch) -> Iterator[PubSubEmulator]:
    """The Pub/Sub emulator with the topic and the subscription."""
    with PubSubEmulator() as started:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", started.host)
        started.broker.create_topic(types.Topic(name=TOPIC))
        started.broker.create_subscription(types.Subscription(name=SUBSCRIPTION, topic=TOPIC))
        yield started


@contextlib.contextmanager
def stand_in(name: str, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The stand-in ``pipeline.emulators.NAME`` in a process of its own, on a free port, and its
    address; killed afterwards."""
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", f"pipeline.emulators.{name}", "--port=0"],
                                   cwd=REPO, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening on (\S+)", log.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield process, found.group(1)
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


@contextlib.contextmanager
def streaming(host: str, settings: EmitterSettings, *more: str
              ) -> Iterator[tuple[subprocess.Popen[str], GoodputRecorder]]:
    """The stream (snapshots every second, writing what ``more`` says) and a recorder of run
    ``run-stop`` publishing to it; afterwards the recorder is closed and the stream, if it still
    runs, killed."""
    stream = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "--streaming", "--runner=BundleBasedDirectRunner",
         f"--subscription={SUBSCRIPTION}", "--snapshot_interval_s=1", *more],
        cwd=REPO, env={**os.environ, "PUBSUB_EMULATOR_HOST": host}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    recorder = GoodputRecorder("run-stop", logging_enabled=True, destination=TOPIC, settings=settings)
    try:
        yield stream, recorder
    finally:
        recorder.close(timeout=5)
        if stream.poll() is None:
            stream.kill()
            stream.communicate()


def record_steps(recorder: GoodputRecorder, steps: range) -> None:
    """Records the steps (a step a second from 10 s) and delivers them."""
    for step in steps:
        recorder.record_step_start_time(step, at(10 + step))
    assert recorder.flush(timeout=20)


def run_until_written(stream: subprocess.Popen[str], recorder: GoodputRecorder, database: Path) -> None:
    """The run starts and records five steps, and the stream writes them to ``database``."""
    recorder.record_job_start_time(at(0))
    record_steps(recorder, range(5))
    deadline = time.monotonic() + 60
    while table_seqs(database) != list(range(6)):
        assert time.monotonic() < deadline and stream.poll() is None
        time.sleep(0.1)


def wait_until_read(pubsub: PubSubEmulator) -> None:
    """Returns once the stream has read every message of its subscription, or after 30 s: a
    stream whose one thread waits on a sink reads nothing meanwhile."""
    deadline = time.monotonic() + 30
    while pubsub.broker.unacknowledged(SUBSCRIPTION) and time.monotonic() < deadline:
        time.sleep(0.05)


def left_in_subscription(pubsub: PubSubEmulator) -> list[int]:
    """The sequence numbers of the messages the stream did not take, once a pull it cancelled
    has given them back (after their acknowledgement deadline)."""
    left: list[int] = []
    deadline = time.monotonic() + 30
    while pubsub.broker.unacknowledged(SUBSCRIPTION) and time.monotonic() < deadline:
        batch = pubsub.broker.pull(SUBSCRIPTION, 100, wait_s=0.2)
        left.extend(event["seq"] for message in batch for event in json.loads(message.message.data)["events"])
        pubsub.broker.acknowledge(SUBSCRIPTION, [message.ack_id for message in batch])
    return left


def read_until(stream: subprocess.Popen[str], text: str) -> None:
    """Reads the stream's output until a line with ``text``."""
    assert stream.stdout is not None
    while text not in stream.stdout.readline():
        assert stream.poll() is None


def signal_stop(stream: subprocess.Popen[str]) -> tuple[str, float]:
    """Sends SIGTERM; the rest of the stream's output once it ended, and how long after the signal
    it said "stopped" (its interpreter's teardown follows: under half a second on a quiet machine,
    seconds on a busy one). A stream still running a minute later fails the test with its
    threads' stacks."""
    assert stream.stdout is not None
    output_lines, lines, stopped = stream.stdout, [], []

    def read() -> None:
        for line in output_lines:
            lines.append(line)
            if line.strip() == "stopped":
                stopped.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stream.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        stream.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stream.send_signal(signal.SIGUSR1)
        time.sleep(1)
        stream.kill()
    reader.join(timeout=10)
    output = "".join(lines)
    assert stream.returncode == 0 and stopped, output
    return output, stopped[0] - signalled


def printed_bound_s(output: str) -> int:
    """The bound the stop printed: its final snapshots' time, and the wait past it if it said so."""
    first = re.search(r"stopping: final snapshots within (\d+) s", output)
    more = re.search(r"waiting up to (\d+) s more", output)
    assert first, output
    return int(first.group(1)) + (int(more.group(1)) if more else 0)


def dead_letter_sources(database: Path) -> set[str]:
    """The kinds of source of the dead letters in the DuckDB file (``monitoring``, ...)."""
    with duckdb.connect(str(database), read_only=True) as connection:
        rows = connection.execute("SELECT source FROM dead_letter").fetchall()
    return {source.split(":")[0] for source, in rows}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("sink", SINKS)
def test_a_stop_keeps_its_printed_bound_while_a_sink_stalls_or_is_gone(
        sink: str, fault: str, tmp_path: Path, pubsub: PubSubEmulator, make_settings):
    """SIGTERM after a sink stalled or went away, with a message published since: the stream stops
    within the bound it printed, every message it read is in the DuckDB events table (the rest
    wait in the subscription), and what the sink could not write is said (BigQuery's rows logged,
    Cloud Monitoring's points dead letters)."""
    live = tmp_path / "live.duckdb"
    with stand_in(sink, tmp_path / f"{sink}.log") as (process, address), streaming(
            pubsub.host, make_settings(), f"--duckdb={live}", *SINKS[sink](address)) as (stream, recorder):
        run_until_written(stream, recorder, live)
        process.send_signal(FAULTS[fault])
        record_steps(recorder, range(5, 10))
        wait_until_read(pubsub)
        output, took_s = signal_stop(stream)
    assert took_s <= printed_bound_s(output) + SLACK_S, output
    assert sorted(table_seqs(live) + left_in_subscription(pubsub)) == list(range(11))
    if sink == "bigquery":
        assert re.search(r"BigQuery insert of \d+ rows into \w+ failed", output), output
    else:
        assert "monitoring" in dead_letter_sources(live), output


def test_a_second_signal_stops_at_once_while_a_sink_stalls(tmp_path: Path, pubsub: PubSubEmulator,
                                                           make_settings):
    """A second SIGTERM while the stop waits for an insert that a stalled BigQuery never answers
    ends the stream within a few seconds, naming the step it did not wait for."""
    live = tmp_path / "live.duckdb"
    with stand_in("bigquery", tmp_path / "bigquery.log") as (process, address), streaming(
            pubsub.host, make_settings(), f"--duckdb={live}", *SINKS["bigquery"](address)
    ) as (stream, recorder):
        run_until_written(stream, recorder, live)
        process.send_signal(signal.SIGSTOP)
        record_steps(recorder, range(5, 10))
        stream.send_signal(signal.SIGTERM)
        read_until(stream, "still writing what was read")  # an insert waits for its answer
        output, took_s = signal_stop(stream)
    assert took_s <= AT_ONCE_S, output
    assert re.search(r"stopping: .*WriteToBigQuery/InsertPerBundle.* did not finish", output), output


def test_a_stop_keeps_its_printed_bound_while_a_step_waits_on_a_stalled_service(
        tmp_path: Path, pubsub: PubSubEmulator, make_settings):
    """A stream that writes only to BigQuery asks it, at its start and when a run first speaks,
    for the run's history; while BigQuery is stalled those queries wait (a minute, which no
    sink's bound cuts): the stop does not wait for them past its printed bound, and says which
    step did not finish."""
    with stand_in("bigquery", tmp_path / "bigquery.log") as (process, address), streaming(
            pubsub.host, make_settings(), *SINKS["bigquery"](address)) as (stream, recorder):
        read_until(stream, "streaming from")
        process.send_signal(signal.SIGSTOP)
        recorder.record_job_start_time(at(0))
        assert recorder.flush(timeout=20)
        wait_until_read(pubsub)
        output, took_s = signal_stop(stream)
    assert took_s <= printed_bound_s(output) + SLACK_S, output
    assert re.search(r"stopping: .*(Unreported/|TrackRuns/).* did not finish", output), output
