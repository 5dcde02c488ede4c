"""Who a run is: the workload the emitter finds (environment, downward-API files, a local stand-in
for the metadata server), its uid on every message header (spooled ones too), and the job
start's workload, each message valid against the schema."""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

import emitter.workload
from emitter import EmitterSettings, GoodputRecorder
from emitter.testing import capture_events
from emitter.workload import from_metadata_server, local_workload, on_google_cloud
from goodput_schemas.goodput_event_pb2 import EventBatch
from goodput_schemas.wire import encode_batch
from support.emitter import FlakyTransport, read_events
from support.runs import at

JOBSET_UID = "5f0c8a1e-2b64-4c35-9a4e-0d7d3c9e1b22"
JOB_UID = "0b6e2d4c-81a1-4f7e-b2c9-6e5a7d1f3c40"
KUBERNETES = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "GOODPUT_JOBSET_NAME": "llama-70b",
              "GOODPUT_JOBSET_UID": JOBSET_UID, "GOODPUT_JOB_NAME": "llama-70b-workers-0",
              "GOODPUT_JOB_UID": JOB_UID, "GOODPUT_NAMESPACE": "training",
              "GOODPUT_POD_NAME": "llama-70b-0-x7k2p"}
#: What the job start says of the workload KUBERNETES describes.
POD = {"platform": "kubernetes", "namespace": "training", "jobset_name": "llama-70b",
       "jobset_uid": JOBSET_UID, "job_name": "llama-70b-workers-0", "job_uid": JOB_UID,
       "pod": "llama-70b-0-x7k2p"}
ENVIRONMENT = (*emitter.workload.ENVIRONMENT.values(), "KUBERNETES_SERVICE_HOST",
               *emitter.workload.METADATA_HOST_ENV)


@pytest.fixture(autouse=True)
def off_any_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Whatever machine the tests run on, the emitter sees no pod and no metadata server of it."""
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOODPUT_PODINFO_DIR", str(tmp_path / "no-podinfo"))
    monkeypatch.setattr(emitter.workload, "NAMESPACE_FILE", tmp_path / "no-namespace")
    monkeypatch.setattr(emitter.workload, "DMI_PRODUCT_NAME", tmp_path / "no-product-name")


class MetadataServer:
    """A local stand-in for the Compute Engine metadata server: what it holds, by path."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.requests: list[tuple[str, str | None]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append((self.path, self.headers.get("Metadata-Flavor")))
                value = outer.values.get(self.path.removeprefix("/computeMetadata/v1/"))
                body = (value or "not found").encode()
                self.send_response(200 if value is not None else 404)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


GKE = {"project/project-id": "fleet-prod", "instance/name": "gke-tpu-pool-7f3a-abcd",
       "instance/zone": "projects/123456789/zones/us-east5-a",
       "instance/attributes/cluster-name": "tpu-cluster",
       "instance/attributes/kube-labels": "cloud.google.com/gke-boot-disk=pd-balanced,"
                                          "cloud.google.com/gke-nodepool=tpu-v5p-pool,kubernetes.io/arch=amd64"}


@pytest.fixture
def metadata_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[MetadataServer]:
    """A stand-in holding a GKE node's values, named by $GCE_METADATA_HOST as google-auth reads it."""
    server = MetadataServer(dict(GKE))
    monkeypatch.setenv("GCE_METADATA_HOST", server.host)
    yield server
    server.stop()


def delivered(make_settings: Callable[..., EmitterSettings], record: Callable[[GoodputRecorder], None],
              **kwargs: Any) -> tuple[list[dict[str, Any]], GoodputRecorder]:
    """The messages one recorder that looks for its workload sends, each checked against the
    schema, as JSON objects."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True,
                                   settings=make_settings(discover_workload=True), **kwargs)
        record(recorder)
        assert recorder.close()
    for message in captured.messages:
        json_format.Parse(message.data, EventBatch())  # strict: unknown fields are errors
    return [json.loads(message.data) for message in captured.messages], recorder


def job_start_and_steps(recorder: GoodputRecorder) -> None:
    """A job start and 25 steps, in 25 messages."""
    recorder.record_job_start_time(at(0))
    for step in range(25):
        recorder.record_step_start_time(step, at(step + 1))
        recorder.flush()  # one message each


def workloads(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [event["job_start"].get("workload") for message in messages for event in message["events"]
            if "job_start" in event]


def test_the_workload_comes_from_the_environment_and_its_uid_heads_every_message(make_settings, monkeypatch):
    """The downward API's environment variables give the workload on the job start, and the
    JobSet's uid on the header of every message."""
    for name, value in KUBERNETES.items():
        monkeypatch.setenv(name, value)
    messages, recorder = delivered(make_settings, job_start_and_steps)
    assert len(messages) == 25 and all(message["workload_uid"] == JOBSET_UID for message in messages)
    assert workloads(messages) == [POD]
    assert recorder.workload_uid == JOBSET_UID


def test_the_workload_comes_from_a_downward_api_directory(make_settings, monkeypatch, tmp_path):
    """The labels and annotations files name the Job (older clusters' keys too); with no JobSet,
    the Job's uid heads the messages; the hostname is the pod's name."""
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "labels").write_text(f'controller-uid="{JOB_UID}"\njob-name="train-\\"quoted\\""\n'
                                    'app.kubernetes.io/name="trainer"\nnot a label line\n')
    (podinfo / "annotations").write_text('kubectl.kubernetes.io/default-container="main"\n')
    (tmp_path / "namespace").write_text("research\n")
    monkeypatch.setattr(emitter.workload, "NAMESPACE_FILE", tmp_path / "namespace")
    monkeypatch.setattr(emitter.workload.socket, "gethostname", lambda: "train-0-abcde")
    messages, _ = delivered(lambda **s: make_settings(podinfo_dir=podinfo, **s), job_start_and_steps)
    assert {message["workload_uid"] for message in messages} == {JOB_UID}
    assert workloads(messages) == [{"platform": "kubernetes", "namespace": "research",
                                    "job_name": 'train-"quoted"', "job_uid": JOB_UID, "pod": "train-0-abcde"}]


def test_jobset_labels_in_the_downward_api_directory_win_over_the_jobs(tmp_path):
    """A JobSet's pod carries both: the JobSet names the workload."""
    (tmp_path / "labels").write_text(f'batch.kubernetes.io/controller-uid="{JOB_UID}"\n'
                                     f'jobset.sigs.k8s.io/jobset-uid="{JOBSET_UID}"\n'
                                     'jobset.sigs.k8s.io/jobset-name="llama"\n'
                                     'batch.kubernetes.io/job-name="llama-workers-0"\n')
    found = local_workload(tmp_path, environ={})
    assert emitter.workload.uid_of(found) == JOBSET_UID
    assert (found["jobset_name"], found["job_name"]) == ("llama", "llama-workers-0")
    assert found["job_uid"] == JOB_UID


def test_the_metadata_server_completes_the_workload_before_the_job_start_is_sent(make_settings, monkeypatch,
                                                                                 metadata_server):
    """On GKE the background thread asks the metadata server (with Metadata-Flavor: Google) for
    the project, instance, zone, cluster and node pool, and the job start carries them."""
    for name, value in KUBERNETES.items():
        monkeypatch.setenv(name, value)
    messages, _ = delivered(make_settings, job_start_and_steps)
    (workload,) = workloads(messages)
    assert workload == {**POD, "platform": "gke", "project": "fleet-prod", "cluster": "tpu-cluster",
                        "node_pool": "tpu-v5p-pool", "instance": "gke-tpu-pool-7f3a-abcd",
                        "zone": "us-east5-a"}
    assert list(workload) == [field for field in emitter.workload.FIELDS if field in workload]
    assert {flavor for _, flavor in metadata_server.requests} == {"Google"}
    assert len(metadata_server.requests) == len(emitter.workload.METADATA_PATHS)


def test_a_compute_engine_vm_is_a_gce_workload_without_a_uid(make_settings, metadata_server):
    """Off Kubernetes, the metadata server's fields make a gce workload; no uid heads the messages."""
    del metadata_server.values["instance/attributes/cluster-name"]
    del metadata_server.values["instance/attributes/kube-labels"]
    messages, recorder = delivered(make_settings, job_start_and_steps)
    assert workloads(messages) == [{"platform": "gce", "project": "fleet-prod",
                                    "instance": "gke-tpu-pool-7f3a-abcd", "zone": "us-east5-a"}]
    assert recorder.workload_uid == "" and not any("workload_uid" in message for message in messages)


def test_the_metadata_server_is_asked_only_on_google_cloud(monkeypatch, tmp_path):
    """Only a named metadata server or a machine whose DMI product name says Google is asked."""
    assert not on_google_cloud()
    product = tmp_path / "product_name"
    product.write_text("Google Compute Engine\n")
    monkeypatch.setattr(emitter.workload, "DMI_PRODUCT_NAME", product)
    assert on_google_cloud()
    product.write_text("Standard PC (Q35 + ICH9, 2009)\n")
    assert not on_google_cloud()
    monkeypatch.setenv("GCE_METADATA_ROOT", "127.0.0.1:9")
    assert on_google_cloud() and emitter.workload.metadata_host() == "127.0.0.1:9"


def test_nothing_is_asked_of_the_network_off_google_cloud(make_settings, monkeypatch):
    """A recorder off Google Cloud opens no connection to find its workload."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the emitter asked the network for its workload")

    monkeypatch.setattr("http.client.HTTPConnection", refuse)
    messages, recorder = delivered(make_settings, job_start_and_steps)
    assert workloads(messages) == [None] and recorder.workload_uid == ""


def test_a_metadata_server_that_does_not_answer_ends_the_search_at_once(tmp_path):
    """A refused connection ends the search after one request; what answers without the
    Metadata-Flavor header is no metadata server."""
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert from_metadata_server(f"127.0.0.1:{port}", timeout_s=0.5) == {}

    class NotMetadata(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"hi")

        def log_message(self, *args: Any) -> None:
            """Quiet."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMetadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert from_metadata_server(f"127.0.0.1:{server.server_address[1]}") == {}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_workload_uid_keyword_overrides_what_is_found_and_an_empty_one_means_none(make_settings,
                                                                                   monkeypatch):
    """workload_uid= names the workload whatever the environment says; "" sends no uid."""
    for name, value in KUBERNETES.items():
        monkeypatch.setenv(name, value)
    messages, _ = delivered(make_settings, job_start_and_steps, workload_uid="slurm-4242")
    assert {message["workload_uid"] for message in messages} == {"slurm-4242"}
    assert workloads(messages)[0]["jobset_uid"] == JOBSET_UID
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True, settings=make_settings(),
                                   workload_uid="w-1")
        recorder.record_heartbeat(at(0))
        assert recorder.close()
    assert [event.workload_uid for event in captured.events] == ["w-1"]
    messages, _ = delivered(make_settings, job_start_and_steps, workload_uid="")
    assert not any("workload_uid" in message for message in messages)


@pytest.mark.parametrize("uid", ["u" * 129, "tab\there", 42],
                         ids=["too long", "control character", "not text"])
def test_an_invalid_workload_uid_is_logged_and_left_out_unless_strict(make_settings, caplog, uid):
    """A uid the pipeline would refuse is logged and left out (the messages carry none); a
    strict recorder raises ValueError."""
    with caplog.at_level(logging.ERROR, logger="emitter"):
        messages, recorder = delivered(make_settings, job_start_and_steps, workload_uid=uid)
    assert recorder.workload_uid == "" and not any("workload_uid" in message for message in messages)
    assert any("workload_uid" in record.getMessage() for record in caplog.records)
    with pytest.raises(ValueError, match="workload_uid"):
        GoodputRecorder("run-1", logging_enabled=True, settings=make_settings(), workload_uid=uid,
                        strict=True)


def test_spooled_events_are_sent_under_the_uid_of_the_attempt_that_recorded_them(make_recorder, events_file,
                                                                                 spool_dir):
    """A later attempt (of a new workload) sends what an earlier one left in the spool under the
    earlier one's uid, and its own under its own."""
    first = make_recorder(destination=FlakyTransport(failures=10**9), workload_uid="workload-a")
    first.record_job_start_time(at(0))
    first.record_step_start_time(0, at(1))
    assert first.close(timeout=0.3) is False
    assert list(spool_dir.rglob("*.seg"))
    second = make_recorder(workload_uid="workload-b")
    second.record_job_start_time(at(100))
    assert second.close()
    messages = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert [(m["attempt_id"], m["workload_uid"], len(m["events"])) for m in messages] == [
        (first.attempt_id, "workload-a", 2), (second.attempt_id, "workload-b", 1)]
    assert len(read_events(events_file)) == 3


def test_encode_batch_writes_the_uid_only_when_there_is_one():
    """No uid, no header key: the message is byte for byte what it was before the field existed."""
    records = [(0, 1_790_000_000_000_000, "step_start", 5)]
    plain = encode_batch("run", "a", records).data
    assert plain == (b'{"schema_version":1,"run_id":"run","attempt_id":"a","events":'
                     b'[{"seq":0,"time_us":1790000000000000,"step_start":{"step":5}}]}')
    assert encode_batch("run", "a", records, "").data == plain
    named = json.loads(encode_batch("run", "a", records, JOBSET_UID).data)
    assert named["workload_uid"] == JOBSET_UID
    assert json_format.Parse(json.dumps(named), EventBatch()).workload_uid == JOBSET_UID
