"""End to end: simulated jobs publish through the emitter to the local Pub/Sub emulator, the
streaming pipeline (DirectRunner) writes DuckDB, and its numbers equal the batch replay's."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import grpc
import pytest
from google.pubsub_v1.types import pubsub as types

from emitter import EmitterSettings, GoodputRecorder
from pipeline.emulators.bigquery import BigQueryEmulator
from pipeline.emulators.monitoring import MonitoringEmulator
from pipeline.emulators.pubsub import PubSubBroker, PubSubEmulator
from pipeline.sinks.monitoring import CUSTOM
from support import REPO
from support.beam import table_seqs
from support.runs import at

PROJECT = "projects/goodput-local"
TOPIC = f"{PROJECT}/topics/goodput"
SUBSCRIPTION = f"{PROJECT}/subscriptions/pipeline"
COPY = f"{PROJECT}/subscriptions/copy"  # the same messages, for the batch replay
#: Steps a job records while the stream stops: bounded, so that a slow stop on a busy machine does
#: not leave more to publish than the recorder's flush can within its timeout; and paced, so that
#: they last past the stop's reading (about 6 s in the tests below) on a quick machine too.
MAX_STEPS_WHILE_STOPPING = 4_000
STEP_WHILE_STOPPING_S = 0.002
RUNS = {"run-a": ("300", "7"), "run-b": ("200", "3")}


@pytest.fixture
def emulator() -> Iterator[PubSubEmulator]:
    """An emulator with the topic and both subscriptions."""
    with PubSubEmulator() as started:
        started.broker.create_topic(types.Topic(name=TOPIC))
        for name in (SUBSCRIPTION, COPY):
            started.broker.create_subscription(types.Subscription(name=name, topic=TOPIC))
        yield started


def start_stream(host: str, database: Path | None, interval_s: float, *more: str) -> subprocess.Popen[str]:
    """The stream, writing ``database`` (if given) and what ``more`` says."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "--streaming", "--runner=BundleBasedDirectRunner",
         f"--subscription={SUBSCRIPTION}", f"--snapshot_interval_s={interval_s}",
         *([f"--duckdb={database}"] if database else []), *more],
        cwd=REPO, env=environment(host), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def environment(host: str) -> dict[str, str]:
    return {**os.environ, "PUBSUB_EMULATOR_HOST": host}


def stop_stream(stream: subprocess.Popen[str], signum: int = signal.SIGINT) -> str:
    """Stops the stream with ``signum``; its output, once it exited cleanly."""
    stream.send_signal(signum)
    output, _ = stream.communicate(timeout=60)
    assert stream.returncode == 0, output
    assert "stopped" in output
    return output


def latest_cumulative(database: Path) -> dict[str, tuple]:
    """Each run's latest cumulative row, or {} while the file is being written."""
    try:
        with duckdb.connect(str(database), read_only=True) as connection:
            rows = connection.execute(
                "SELECT run_id, goodput_pct, total_time_s, disruptions, max_productive_step, ended, "
                "last_step FROM latest_goodput WHERE window_s = 0").fetchall()
    except (duckdb.IOException, duckdb.CatalogException):
        return {}
    return {row[0]: row[1:] for row in rows}


def replay_copies(broker: PubSubBroker, tmp_path: Path, host: str) -> tuple[Path, dict[str, tuple]]:
    """Every message of the copy subscription, written to a file and replayed in batch."""
    copies = tmp_path / "events.jsonl"
    with copies.open("wb") as out:
        while batch := broker.pull(COPY, 100, wait_s=0.2):
            broker.acknowledge(COPY, [m.ack_id for m in batch])
            for message in batch:
                out.write(message.message.data + b"\n")
    database = tmp_path / "batch.duckdb"
    subprocess.run([sys.executable, "-m", "pipeline", f"--events={copies}", f"--duckdb={database}"],
                   cwd=REPO, env=environment(host), check=True, capture_output=True, timeout=120)
    return copies, latest_cumulative(database)


def test_stream_and_batch_agree(tmp_path: Path, emulator: PubSubEmulator):
    """Two runs with a crash and a restart each: the live tables end with the batch numbers,
    BigQuery receives the same rows as DuckDB, and Cloud Monitoring each run's latest goodput."""
    live = tmp_path / "live.duckdb"
    bigquery = BigQueryEmulator().start()
    monitoring = MonitoringEmulator().start()
    stream = start_stream(emulator.host, live, 1, "--bigquery_dataset=goodput-local:goodput",
                          f"--bigquery_endpoint={bigquery.endpoint}", "--bigquery_create_tables",
                          "--monitoring_project=goodput-local", f"--monitoring_endpoint={monitoring.host}",
                          "--monitoring_min_interval_s=5", "--monitoring_latest_now")
    try:
        for run_id, (steps, seed) in RUNS.items():
            subprocess.run([sys.executable, "-m", "pipeline.demo.simulated_job", "--destination", TOPIC,
                            "--run-id", run_id, "--steps", steps, "--seed", seed,
                            "--output", str(tmp_path / "spool-home" / "x")],
                           cwd=REPO, env=environment(emulator.host), check=True, capture_output=True,
                           timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and stream.poll() is None:
            rows = latest_cumulative(live)
            if set(rows) == set(RUNS) and all(row[4] for row in rows.values()):
                break
            time.sleep(0.5)
    finally:
        output = stop_stream(stream)
        bigquery.stop()
        monitoring.stop()
    assert "Cloud Monitoring refused" not in output
    with duckdb.connect(str(live), read_only=True) as connection:
        local = connection.execute("SELECT run_id, snapshot_time, window_s, goodput_pct "
                                   "FROM goodput_snapshots").fetchall()
    remote = [(r["run_id"], r["snapshot_time"].replace(tzinfo=None), r["window_s"], r["goodput_pct"])
              for r in bigquery.store.rows("goodput-local", "goodput", "goodput_snapshots")]
    assert local and sorted(local, key=str) == sorted(remote, key=str)
    copies, replayed = replay_copies(emulator.broker, tmp_path, emulator.host)
    assert {json.loads(line)["run_id"] for line in copies.read_text().splitlines()} == set(RUNS)
    streamed = latest_cumulative(live)
    assert set(streamed) == set(RUNS)
    for run_id in RUNS:
        goodput, total, disruptions, max_step, ended, _ = streamed[run_id]
        expected = replayed[run_id]
        assert goodput == pytest.approx(expected[0], abs=1e-9)
        assert total == pytest.approx(expected[1], abs=1e-6)
        assert (disruptions, max_step, ended) == (expected[2], expected[3], expected[4]) == (1, int(
            RUNS[run_id][0]) - 1, True)
    points = monitoring.store.points(CUSTOM + "goodput_pct")
    for run_id in RUNS:
        series = [value for _, resource, _, value in points if resource["job"] == run_id]
        assert series and series[-1] == pytest.approx(streamed[run_id][0], abs=1e-9)


def test_a_stream_started_again_reports_a_run_whose_last_events_no_snapshot_counts(
        tmp_path: Path, emulator: PubSubEmulator, monkeypatch, make_settings):
    """A stream read a run's last messages and stopped before it reported them (as a stop that
    gave up waiting does; here the run's snapshots are deleted after a clean stop): the events
    are in the file, ahead of every snapshot. A stream started again reports the run at once,
    though it sends nothing more: its latest snapshot shows every step and the end."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    live = tmp_path / "live.duckdb"
    stream = start_stream(emulator.host, live, 1)
    with GoodputRecorder("run-quiet", logging_enabled=True, destination=TOPIC,
                         settings=make_settings()) as recorder:  # on the real clock: recent events
        recorder.record_job_start_time()
        for step in range(20):
            recorder.record_step_start_time(step)
        recorder.record_job_end_time()
    wait_until_read(emulator.broker, 60)
    stop_stream(stream)
    assert latest_cumulative(live)["run-quiet"][-2:] == (True, 19)
    with duckdb.connect(str(live)) as connection:
        connection.execute("DELETE FROM goodput_snapshots WHERE run_id = 'run-quiet'")
    assert "run-quiet" not in latest_cumulative(live)
    stream = start_stream(emulator.host, live, 1)  # no message: it asks the file at its start
    deadline = time.monotonic() + 30
    while "run-quiet" not in latest_cumulative(live) and time.monotonic() < deadline:
        time.sleep(0.2)
    stop_stream(stream)
    assert latest_cumulative(live)["run-quiet"][-2:] == (True, 19)


def test_a_stream_launched_anew_restores_its_runs_from_bigquery(
        tmp_path: Path, emulator: PubSubEmulator, monkeypatch, make_settings):
    """A stream that writes only to BigQuery is stopped mid-run, and a new one starts with no
    state (as a Dataflow job drained and launched again): it restores the run from the raw events
    table in BigQuery when the run speaks again, so its snapshots go on as those of a stream that
    never stopped (the batch replay of every message); a run that begins after the relaunch has
    no history to restore. Without the restore, the first run's elapsed time would begin at the
    relaunch (goodput 100 %, not 95.5 %)."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    runs, streams = {"run-relaunched": 99, "run-new": 9}, []
    with BigQueryEmulator() as bigquery:
        sinks = ("--bigquery_dataset=goodput-local:goodput", f"--bigquery_endpoint={bigquery.endpoint}",
                 "--bigquery_create_tables")

        def stream_until(last_steps: dict[str, int], record: Callable[[], None]) -> None:
            """A new stream reads what ``record`` publishes until snapshots show ``last_steps``."""
            stream = start_stream(emulator.host, None, 1, *sinks)
            streams.append(stream)
            record()
            for recorder in recorders.values():
                assert recorder.flush(timeout=20)
            wait_until_read(emulator.broker, 60)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(
                    latest_in_bigquery(bigquery).get(run_id, ())[-1:] != (step,)
                    for run_id, step in last_steps.items()):
                time.sleep(0.2)
            stop_stream(stream)

        def first_half() -> None:
            recorders["run-relaunched"].record_job_start_time(at(0))
            for step in range(50):
                recorders["run-relaunched"].record_step_start_time(step, at(10 + 2 * step))

        def second_half() -> None:
            for step in range(50, 100):
                recorders["run-relaunched"].record_step_start_time(step, at(10 + 2 * step))
            recorders["run-relaunched"].record_job_end_time(at(220))
            recorders["run-new"].record_job_start_time(at(300))
            for step in range(10):
                recorders["run-new"].record_step_start_time(step, at(305 + step))
            recorders["run-new"].record_job_end_time(at(320))

        recorders = {run_id: GoodputRecorder(run_id, logging_enabled=True, destination=TOPIC,
                                             settings=make_settings()) for run_id in runs}
        try:
            stream_until({"run-relaunched": 49}, first_half)
            stream_until(runs, second_half)
        finally:
            for recorder in recorders.values():
                recorder.close(timeout=5)
            for stream in streams:
                if stream.poll() is None:
                    stream.kill()
        streamed = latest_in_bigquery(bigquery)
    replayed = replay_copies(emulator.broker, tmp_path, emulator.host)[1]
    assert set(streamed) == set(replayed) == set(runs)
    for run_id, last_step in runs.items():
        assert streamed[run_id][0] == pytest.approx(replayed[run_id][0], abs=1e-9)
        assert streamed[run_id][1] == pytest.approx(replayed[run_id][1], abs=1e-6)
        assert streamed[run_id][2:] == replayed[run_id][2:] == (0, last_step, True, last_step)
    assert replayed["run-relaunched"][:2] == (pytest.approx(100 * 210 / 220), 220)  # from 0 s to 220 s


def latest_in_bigquery(bigquery: BigQueryEmulator) -> dict[str, tuple]:
    """Each run's latest cumulative row in BigQuery, as ``latest_cumulative`` gives it."""
    latest: dict[str, dict] = {}
    for row in bigquery.store.rows("goodput-local", "goodput", "goodput_snapshots"):
        if row["window_s"] == 0 and row["snapshot_time"] >= latest.get(row["run_id"], row)["snapshot_time"]:
            latest[row["run_id"]] = row
    return {run_id: tuple(row[name] for name in ("goodput_pct", "total_time_s", "disruptions",
                                                  "max_productive_step", "ended", "last_step"))
            for run_id, row in latest.items()}


def test_an_outage_loses_nothing_and_a_stop_reports_everything(
        tmp_path: Path, emulator: PubSubEmulator, monkeypatch, make_settings):
    """Pub/Sub goes away mid-run for a few seconds: the emitter spools, the pipeline's reads
    retry, and every event arrives once it is back. Then SIGTERM, before the next interval
    snapshot is due, still leaves the run's latest events in DuckDB."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    live = tmp_path / "live.duckdb"
    stream = start_stream(emulator.host, live, interval_s=5)
    recorder = GoodputRecorder("run-outage", logging_enabled=True, destination=TOPIC,
                               settings=make_settings(max_batch_events=20))
    try:
        recorder.record_job_start_time(at(0))
        for step in range(50):
            recorder.record_step_start_time(step, at(10 + step))
        assert recorder.flush(timeout=20)
        emulator.stop()
        for step in range(50, 100):
            recorder.record_step_start_time(step, at(10 + step))
        assert recorder.flush(timeout=1) is False  # nowhere to deliver
        time.sleep(3)  # Pub/Sub stays away: the pipeline's pulls fail meanwhile
        emulator = PubSubEmulator(port=emulator.port, broker=emulator.broker).start()
        assert recorder.flush(timeout=60)
        wait_until_read(emulator.broker, 120)
        output = stop_stream(stream, signal.SIGTERM)
    finally:
        recorder.close(timeout=5)
        if stream.poll() is None:
            stream.kill()
        emulator.stop()
    assert "final snapshots within" in output
    copies, replayed = replay_copies(emulator.broker, tmp_path, emulator.host)
    seqs = sorted(e["seq"] for line in copies.read_text().splitlines()
                  for e in json.loads(line)["events"])
    assert seqs == list(range(101))  # job start and 100 steps, each once
    streamed = latest_cumulative(live)["run-outage"]
    assert streamed[-1] == replayed["run-outage"][-1] == 99  # the last step, read before the stop
    assert streamed[2:5] == replayed["run-outage"][2:5]  # disruptions, max productive step, ended


@contextlib.contextmanager
def streaming(host: str, database: Path, interval_s: float, run_id: str, settings: EmitterSettings,
              *more: str) -> Iterator[tuple[subprocess.Popen[str], GoodputRecorder]]:
    """The stream and a recorder of ``run_id`` publishing to it; afterwards the recorder is
    closed and the stream, if it still runs, killed."""
    stream = start_stream(host, database, interval_s, *more)
    recorder = GoodputRecorder(run_id, logging_enabled=True, destination=TOPIC, settings=settings)
    try:
        yield stream, recorder
    finally:
        recorder.close(timeout=5)
        if stream.poll() is None:
            stream.kill()


def wait_until_read(broker: PubSubBroker, timeout_s: float) -> None:
    """Returns once the stream has read every message of its subscription."""
    deadline = time.monotonic() + timeout_s
    while broker.unacknowledged(SUBSCRIPTION) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert broker.unacknowledged(SUBSCRIPTION) == 0


def published_seqs(broker: PubSubBroker) -> list[int]:
    """The sequence numbers of every event published, read from the copy subscription."""
    seqs = []
    while batch := broker.pull(COPY, 100, wait_s=0.2):
        broker.acknowledge(COPY, [m.ack_id for m in batch])
        seqs.extend(e["seq"] for m in batch for e in json.loads(m.message.data)["events"])
    return sorted(seqs)


def test_pulls_refused_past_the_clients_retries_never_stop_the_stream(
        tmp_path: Path, emulator: PubSubEmulator, monkeypatch, make_settings):
    """Pub/Sub refuses pulls with RESOURCE_EXHAUSTED, which its client does not retry (Beam's
    DirectRunner would fail the pipeline): the stream logs it once, pulls again, reads every
    event and stops cleanly."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    live = tmp_path / "live.duckdb"
    emulator.broker.fail_pulls_next(5, grpc.StatusCode.RESOURCE_EXHAUSTED)
    settings = make_settings(max_batch_events=10)
    with streaming(emulator.host, live, 2, "run-quota", settings) as (stream, recorder):
        recorder.record_job_start_time(at(0))
        for step in range(60):
            recorder.record_step_start_time(step, at(10 + step))
        assert recorder.flush(timeout=20)
        wait_until_read(emulator.broker, 60)
        output = stop_stream(stream, signal.SIGTERM)
    assert "pulling from Pub/Sub failed" in output and "pulling from Pub/Sub again" in output
    assert table_seqs(live) == list(range(61))


def test_a_quiet_streams_snapshot_is_not_held_by_an_idle_pull(tmp_path: Path, emulator: PubSubEmulator,
                                                             monkeypatch, make_settings):
    """The DirectRunner does all its work on one thread, so a pull waiting for messages holds
    every timer: with Beam's 30 s pulls, the snapshot of a run's last message came ~30 s late.
    A message sent once the stream is idle shows in a snapshot within the interval (2 s) plus a
    pull's deadline and the write: well under 15 s, where a 30 s pull would take 28 s or more."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    live = tmp_path / "live.duckdb"
    with streaming(emulator.host, live, 2, "run-quiet", make_settings()) as (stream, recorder):
        recorder.record_job_start_time(at(0))
        recorder.record_step_start_time(0, at(1))
        assert recorder.flush(timeout=20)
        deadline = time.monotonic() + 120
        while latest_cumulative(live).get("run-quiet", (None,) * 6)[5] != 0:
            assert time.monotonic() < deadline, "the first snapshot never came"
            time.sleep(0.1)
        time.sleep(3)  # the stream is idle in a pull
        recorder.record_step_start_time(1, at(2))
        assert recorder.flush(timeout=20)
        sent = time.monotonic()
        while latest_cumulative(live).get("run-quiet", (None,) * 6)[5] != 1:
            assert time.monotonic() - sent < 60, "the second snapshot never came"
            time.sleep(0.1)
        waited = time.monotonic() - sent
        stop_stream(stream)
    assert waited < 15, f"the snapshot came {waited:.1f} s after the message"


def test_a_pull_of_more_than_4_mib_is_read(tmp_path: Path, emulator: PubSubEmulator):
    """The stream pulls up to 1,000 messages at once, which may weigh far more than the 4 MiB an
    emulator's default channel takes (the stream would pull the same refused messages forever):
    80 messages of 64 kB, all in the subscription before the stream starts, are read and
    dead-lettered."""
    live = tmp_path / "live.duckdb"
    emulator.broker.publish(TOPIC, [types.PubsubMessage(data=b"%02d" % index + b"x" * 64_000)
                                    for index in range(80)])
    stream = start_stream(emulator.host, live, 2)
    try:
        wait_until_read(emulator.broker, 60)
    finally:
        stop_stream(stream)
    with duckdb.connect(str(live), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM dead_letter").fetchone() == (80,)


@pytest.mark.parametrize("monitoring", ["up", "failing"])
def test_a_stop_while_messages_keep_coming_loses_none(tmp_path: Path, emulator: PubSubEmulator,
                                                      monkeypatch, make_settings, monitoring):
    """SIGTERM while a job keeps publishing, with Cloud Monitoring up or failing every request:
    the stream reads no more once it begins to stop and its sinks retry no more, so it stops
    promptly, every message it acknowledged is in the events table and the rest wait in the
    subscription for the next start; none is lost in between."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    live = tmp_path / "live.duckdb"
    with MonitoringEmulator() as stand_in:
        if monitoring == "failing":
            stand_in.store.fail_next(100_000, grpc.StatusCode.UNAVAILABLE)
        settings = make_settings(max_batch_events=2, max_latency_s=0.01)
        with streaming(emulator.host, live, 1, "run-busy", settings, "--monitoring_project=goodput-local",
                       f"--monitoring_endpoint={stand_in.host}", "--monitoring_min_interval_s=5",
                       "--monitoring_latest_now") as (stream, recorder):
            recorder.record_job_start_time(at(0))
            deadline = time.monotonic() + 60
            while not table_seqs(live) and time.monotonic() < deadline:  # the stream reads
                time.sleep(0.2)
            step = 0
            stream.send_signal(signal.SIGTERM)
            stopping = time.monotonic()
            while stream.poll() is None and time.monotonic() < stopping + 60:
                if step < MAX_STEPS_WHILE_STOPPING:  # what is published must be flushed below
                    recorder.record_step_start_time(step, at(10 + step))
                    step += 1
                time.sleep(STEP_WHILE_STOPPING_S)
            stopped_s = time.monotonic() - stopping
            for _ in range(10):  # and after the stop: for the next start
                recorder.record_step_start_time(step, at(10 + step))
                step += 1
            assert recorder.flush(timeout=20)
            output = stream.communicate(timeout=30)[0]
    assert stream.returncode == 0, output
    assert stopped_s < 20, output  # an interval, the series' turn (5 s) and 2 s: not Monitoring's retries
    # What is left: messages a pull the stop cancelled had taken are the subscription's again
    # when their ack deadline passes, as with the service.
    left = []
    deadline = time.monotonic() + 30
    while emulator.broker.unacknowledged(SUBSCRIPTION) and time.monotonic() < deadline:
        batch = emulator.broker.pull(SUBSCRIPTION, 100, wait_s=0.2)
        left.extend(e["seq"] for m in batch for e in json.loads(m.message.data)["events"])
        emulator.broker.acknowledge(SUBSCRIPTION, [m.ack_id for m in batch])
    read = table_seqs(live)
    assert step > 100 and left and read  # messages came before, during and after the stop
    assert sorted(read + left) == published_seqs(emulator.broker) == list(range(step + 1))


def test_a_stop_waits_for_what_was_read_to_be_written_past_its_grace(
        tmp_path: Path, emulator: PubSubEmulator, monkeypatch, make_settings):
    """BigQuery answers every insert 3 s late, past the stop's 2 s grace for writing what was
    read: the stop says so and waits for the writes instead of cancelling them, so the message
    read just before the signal is in both BigQuery and DuckDB."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    live = tmp_path / "live.duckdb"
    with BigQueryEmulator() as bigquery, streaming(
            emulator.host, live, 1, "run-slow", make_settings(), "--bigquery_create_tables",
            "--bigquery_dataset=goodput-local:goodput", f"--bigquery_endpoint={bigquery.endpoint}",
    ) as (stream, recorder):
        recorder.record_job_start_time(at(0))
        assert recorder.flush(timeout=20)
        deadline = time.monotonic() + 60
        while not bigquery.store.rows("goodput-local", "goodput", "events") and time.monotonic() < deadline:
            time.sleep(0.1)  # the stream runs and writes
        bigquery.store.slow_next(1000, 3.0)
        recorder.record_step_start_time(0, at(10))
        assert recorder.flush(timeout=20)
        wait_until_read(emulator.broker, 30)
        output = stop_stream(stream)
        seqs = sorted(row["seq"] for row in bigquery.store.rows("goodput-local", "goodput", "events"))
    assert "still writing what was read" in output
    assert seqs == table_seqs(live) == [0, 1]


def test_a_failed_pipeline_exits_1_instead_of_serving_a_dead_stream(
        tmp_path: Path, emulator: PubSubEmulator, monkeypatch, make_settings):
    """A bundle that fails for good (a DuckDB file that cannot be written) stops the DirectRunner's
    pipeline, whose state never says so: the launcher sees it in the runner's reports, says so
    and exits 1, instead of leaving a process that reads nothing."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
    doomed = tmp_path / "live.duckdb"
    # A new file in a directory that can be written passes the launcher's checks; its
    # write-ahead log being a directory fails the first commit, in a bundle.
    (tmp_path / "live.duckdb.wal").mkdir()
    with streaming(emulator.host, doomed, 1, "run-doomed", make_settings()) as (stream, recorder):
        recorder.record_job_start_time(at(0))
        assert recorder.flush(timeout=20)
        output = stream.communicate(timeout=90)[0]
    assert stream.returncode == 1, output
    assert "the streaming pipeline failed" in output
