"""End to end: simulated jobs publish through the emitter to the local Pub/Sub emulator, the
streaming pipeline (DirectRunner) writes DuckDB, and its numbers equal the batch replay's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from google.pubsub_v1.types import pubsub as types

from pipeline.emulators.pubsub import PubSubEmulator

REPO = Path(__file__).resolve().parent.parent
PROJECT = "projects/goodput-local"
TOPIC = f"{PROJECT}/topics/goodput"
RUNS = {"run-a": ("300", "7"), "run-b": ("200", "3")}


def latest_cumulative(database: Path) -> dict[str, tuple]:
    """Each run's latest cumulative row, or {} while the file is being written."""
    try:
        with duckdb.connect(str(database), read_only=True) as connection:
            rows = connection.execute(
                "SELECT run_id, goodput_pct, total_time_s, disruptions, max_productive_step, ended "
                "FROM latest_goodput WHERE window_s = 0").fetchall()
    except (duckdb.IOException, duckdb.CatalogException):
        return {}
    return {row[0]: row[1:] for row in rows}


def test_stream_and_batch_agree(tmp_path: Path):
    """Two runs with a crash and a restart each: the live tables end with the batch numbers."""
    with PubSubEmulator() as emulator:
        broker = emulator.broker
        broker.create_topic(types.Topic(name=TOPIC))
        for name in ("pipeline", "copy"):
            broker.create_subscription(types.Subscription(
                name=f"{PROJECT}/subscriptions/{name}", topic=TOPIC))
        env = {**os.environ, "PYTHONPATH": str(REPO), "PUBSUB_EMULATOR_HOST": emulator.host}
        live = tmp_path / "live.duckdb"
        stream = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "--streaming", "--runner=BundleBasedDirectRunner",
             f"--subscription={PROJECT}/subscriptions/pipeline", f"--duckdb={live}",
             "--snapshot_interval_s=1"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for run_id, (steps, seed) in RUNS.items():
                subprocess.run([sys.executable, "examples/simulated_job.py", "--destination", TOPIC,
                                "--run-id", run_id, "--steps", steps, "--seed", seed,
                                "--output", str(tmp_path / "spool-home" / "x")],
                               cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and stream.poll() is None:
                rows = latest_cumulative(live)
                if set(rows) == set(RUNS) and all(row[-1] for row in rows.values()):
                    break
                time.sleep(0.5)
        finally:
            stream.send_signal(signal.SIGINT)
            output, _ = stream.communicate(timeout=60)
        assert stream.returncode == 0, output
        assert "stopped" in output
        # The same messages, from the second subscription, replayed in batch.
        copies = tmp_path / "events.jsonl"
        with copies.open("wb") as out:
            while batch := broker.pull(f"{PROJECT}/subscriptions/copy", 100, wait_s=0.2):
                broker.acknowledge(f"{PROJECT}/subscriptions/copy", [m.ack_id for m in batch])
                for message in batch:
                    out.write(message.message.data + b"\n")
    assert {json.loads(line)["run_id"] for line in copies.read_text().splitlines()} == set(RUNS)
    batch_db = tmp_path / "batch.duckdb"
    subprocess.run([sys.executable, "-m", "pipeline", f"--events={copies}", f"--duckdb={batch_db}"],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
    streamed, replayed = latest_cumulative(live), latest_cumulative(batch_db)
    assert set(streamed) == set(RUNS)
    for run_id in RUNS:
        goodput, total, disruptions, max_step, ended = streamed[run_id]
        expected = replayed[run_id]
        assert goodput == pytest.approx(expected[0], abs=1e-9)
        assert total == pytest.approx(expected[1], abs=1e-6)
        assert (disruptions, max_step, ended) == (expected[2], expected[3], expected[4]) == (1, int(
            RUNS[run_id][0]) - 1, True)
