"""A recorder with no destination configured: found from the job's project, or spooled, never an
error. Each job runs in a process of its own: google.auth reads its environment at import."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emitter.discovery import DEFAULT_TOPIC_ID
from support.emitter import decode, read_events

PROJECT = "found-project"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/check"

JOB = """
    import logging, sys, time
    logging.basicConfig(level=logging.INFO)
    from emitter import EmitterSettings, GoodputRecorder
    settings = EmitterSettings(spool_dir=sys.argv[1], max_latency_s=0.05, collect_configs=False,
                               retry_initial_backoff_s=0.05, retry_max_backoff_s=0.1)
    recorder = GoodputRecorder("run-d", "goodput_run-d", True, settings=settings)
    recorder.record_job_start_time()
    for step in range(int(sys.argv[2])):
        recorder.record_step_start_time(step)
    time.sleep(float(sys.argv[3]))
    began = time.monotonic()
    delivered = recorder.close()
    print(delivered, recorder.stats.sent, recorder.stats.recorded, round(time.monotonic() - began, 3))
"""


def run_job(spool: Path, steps: int, pause_s: float, **env: str) -> subprocess.CompletedProcess[str]:
    """The job in a process with none of the usual ways to find a project, but ``env``."""
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("GOODPUT_DESTINATION", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT",
                                   "GOOGLE_APPLICATION_CREDENTIALS")}
    environment["CLOUDSDK_CONFIG"] = str(spool.parent / "gcloud")  # no gcloud configuration
    # No metadata server: a closed local port answers at once.
    environment["GCE_METADATA_HOST"] = environment["GCE_METADATA_IP"] = "127.0.0.1:9"
    environment.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(JOB), str(spool), str(steps), str(pause_s)],
                          capture_output=True, text=True, timeout=120, env=environment, check=False)


def test_with_nowhere_to_send_the_job_runs_and_its_events_wait_in_the_spool(tmp_path):
    """No destination, no project: no error, one log line, a prompt exit, and the events reach
    the destination that the next process of the run has."""
    spool = tmp_path / "spool"
    first = run_job(spool, steps=50, pause_s=0.0)
    assert first.returncode == 0, first.stderr
    delivered, sent, recorded, close_s = first.stdout.split()
    assert (delivered, sent, recorded) == ("False", "0", "51")
    # The search (google.auth's retries) takes seconds, then nothing waits out the 10 s timeout.
    assert float(close_s) < 7.0
    assert first.stderr.count("no destination") == 1, first.stderr

    out = tmp_path / "events.jsonl"
    second = run_job(spool, steps=0, pause_s=0.0, GOODPUT_DESTINATION=f"file:{out}")
    assert second.returncode == 0, second.stderr
    events = read_events(out)
    assert sum("step_start" in e for e in events) == 50
    assert sum("job_start" in e for e in events) == 2


class _MetadataServer(http.server.BaseHTTPRequestHandler):
    """The parts of the GCE metadata server that google.auth reads to find the project."""

    def do_GET(self) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            self.send_error(403)
            return
        body = PROJECT.encode() if self.path.startswith("/computeMetadata/v1/project/project-id") else b""
        self.send_response(200)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def metadata_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetadataServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def fleet_topic(monkeypatch):
    """The Pub/Sub emulator with the topic the Terraform module creates, in PROJECT."""
    from google.pubsub_v1.types import pubsub as types

    from pipeline.emulators.pubsub import PubSubEmulator

    emulator = PubSubEmulator(port=0).start()
    topic = f"projects/{PROJECT}/topics/{DEFAULT_TOPIC_ID}"
    emulator.broker.create_topic(types.Topic(name=topic))
    emulator.broker.create_subscription(types.Subscription(name=SUBSCRIPTION, topic=topic))
    yield emulator
    emulator.stop()


def _delivered_steps(emulator) -> int:
    steps = 0
    while batch := emulator.broker.pull(SUBSCRIPTION, 100, wait_s=0.2):
        emulator.broker.acknowledge(SUBSCRIPTION, [m.ack_id for m in batch])
        steps += sum(1 for m in batch for event in decode(m.message.data) if event[3] == "step_start")
    return steps


def test_the_project_comes_from_the_metadata_server(tmp_path, metadata_server, fleet_topic):
    """On Google Cloud with nothing set, events go to the fleet's topic in the VM's project."""
    result = run_job(tmp_path / "spool", steps=20, pause_s=0.0, PUBSUB_EMULATOR_HOST=fleet_topic.host,
                     GCE_METADATA_HOST=metadata_server, GCE_METADATA_IP=metadata_server)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:3] == ["True", "21", "21"]
    assert _delivered_steps(fleet_topic) == 20


def test_the_project_comes_from_the_environment(tmp_path, fleet_topic):
    """$GOOGLE_CLOUD_PROJECT names the project, as for Google's own client libraries."""
    began = time.monotonic()
    result = run_job(tmp_path / "spool", steps=5, pause_s=0.0, PUBSUB_EMULATOR_HOST=fleet_topic.host,
                     GOOGLE_CLOUD_PROJECT=PROJECT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:3] == ["True", "6", "6"]
    assert _delivered_steps(fleet_topic) == 5
    assert time.monotonic() - began < 60
