"""Streaming freshness and throughput on the DirectRunner, through the local Pub/Sub emulator.

The streaming pipeline runs as its own process (``--runner=BundleBasedDirectRunner``, a 5 s
snapshot interval, DuckDB output) reading a subscription of the local emulator.

* Freshness: once the pipeline shows a warm-up message, 4 runs publish one step a second each
  with the real Pub/Sub client; for each step, the time from its publish to the first snapshot
  in DuckDB that shows it (``last_step``), polled every 50 ms. Target: p99 under the snapshot
  interval + 5 s.
* Throughput: 100 runs publish 1,000-event messages as fast as they can; events per second from
  the first publish until every run's snapshot shows its last step.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb

from benchmarks.common import percentile

REPO = Path(__file__).resolve().parent.parent
PROJECT = "projects/goodput-bench"
TOPIC = f"{PROJECT}/topics/events"
SUBSCRIPTION = f"{PROJECT}/subscriptions/pipeline"
INTERVAL_S = 5.0
T0_US = 1_800_000_000 * 1_000_000


def _last_steps(database: Path) -> dict[str, int]:
    try:
        with duckdb.connect(str(database), read_only=True) as connection:
            rows = connection.execute(
                "SELECT run_id, max(last_step) FROM goodput_snapshots GROUP BY run_id").fetchall()
    except (duckdb.IOException, duckdb.CatalogException):
        return {}
    return {run_id: step for run_id, step in rows if step is not None}


def _message(run_id: str, first_seq: int, steps: range, start: bool) -> bytes:
    from emitter.encoding import encode_batch

    records = []
    seq = first_seq
    if start:
        records.append((seq, T0_US, "job_start", {"chip_count": 8}))
        seq += 1
    for step in steps:
        records.append((seq, T0_US + (step + 1) * 1_000_000, "step_start", {"step": step}))
        seq += 1
    return encode_batch(run_id, f"{run_id}-attempt", records).data


def run() -> str:
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import pubsub as types

    from pipeline.emulators.pubsub import PubSubEmulator

    with PubSubEmulator() as emulator, tempfile.TemporaryDirectory() as scratch:
        emulator.broker.create_topic(types.Topic(name=TOPIC))
        emulator.broker.create_subscription(types.Subscription(name=SUBSCRIPTION, topic=TOPIC))
        env = {**os.environ, "PYTHONPATH": str(REPO), "PUBSUB_EMULATOR_HOST": emulator.host}
        database = Path(scratch) / "live.duckdb"
        stream = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "--streaming", "--runner=BundleBasedDirectRunner",
             f"--subscription={SUBSCRIPTION}", f"--duckdb={database}",
             f"--snapshot_interval_s={INTERVAL_S}"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
        publisher = pubsub_v1.PublisherClient()
        try:
            # Warm-up: measure from the moment the pipeline is reading, not while it starts.
            publisher.publish(TOPIC, _message("warm-up", 0, range(0, 1), start=True)).result(timeout=30)
            deadline = time.monotonic() + 120
            while "warm-up" not in _last_steps(database) and time.monotonic() < deadline:
                time.sleep(0.1)
            # Freshness: 4 live runs, one step a second each, 30 steps, watched meanwhile.
            runs = [f"fresh-{i}" for i in range(4)]
            published: dict[tuple[str, int], float] = {}
            seen: dict[tuple[str, int], float] = {}
            watching = threading.Event()

            def watch() -> None:
                while not watching.is_set():
                    now = time.monotonic()
                    for run_id, last in _last_steps(database).items():
                        for step in range(last + 1):
                            seen.setdefault((run_id, step), now)
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            for step in range(30):
                for run_id in runs:
                    data = _message(run_id, 0 if step == 0 else step + 1, range(step, step + 1),
                                    start=step == 0)
                    publisher.publish(TOPIC, data).result(timeout=30)
                    published[(run_id, step)] = time.monotonic()
                time.sleep(1.0)
            deadline = time.monotonic() + 60
            while not published.keys() <= seen.keys() and time.monotonic() < deadline:
                time.sleep(0.1)
            watching.set()
            watcher.join()
            freshness = [seen[key] - published[key] for key in published if key in seen]
            missing = len(published) - len(freshness)

            # Throughput: 100 runs x 10 messages x 1,000 steps.
            started = time.monotonic()
            runs = [f"load-{i}" for i in range(100)]
            futures = []
            for chunk in range(10):
                for run_id in runs:
                    data = _message(run_id, 0 if chunk == 0 else chunk * 1000 + 1,
                                    range(chunk * 1000, (chunk + 1) * 1000), start=chunk == 0)
                    futures.append(publisher.publish(TOPIC, data))
            for future in futures:
                future.result(timeout=60)
            deadline = time.monotonic() + 300
            done = False
            while time.monotonic() < deadline:
                steps = _last_steps(database)
                if all(steps.get(run_id) == 9999 for run_id in runs):
                    done = True
                    break
                time.sleep(0.2)
            elapsed = time.monotonic() - started
        finally:
            publisher.stop()
            stream.terminate()
            stream.wait(timeout=60)
    events = 100 * 10_001
    p99 = percentile(freshness, 99) if freshness else float("nan")
    lines = [
        "## Streaming: freshness and throughput (DirectRunner, local Pub/Sub emulator)",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| figure | value |",
        "|---|---|",
        f"| freshness, median (s), {len(freshness)} steps | {statistics.median(freshness):.2f} |",
        f"| freshness, p99 (s) | {p99:.2f} |",
        f"| steps never seen within 60 s | {missing} |",
        f"| throughput: {events:,} events in 1,000 messages (events/s) | "
        f"{events / elapsed:,.0f}{'' if done else ' (did not finish in 300 s)'} |",
        "",
        f"Target: p99 freshness under {INTERVAL_S + 5:g} s (snapshot interval + 5 s) — "
        f"{'met' if p99 < INTERVAL_S + 5 and not missing else 'MISSED'}.",
    ]
    return "\n".join(lines)
