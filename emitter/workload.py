"""Where an attempt runs: its workload (``JobStart.workload``) and the uid that names it on every
message (``EventBatch.workload_uid``).

A run name reused by a new workload (a new JobSet of the same name) is a new run, not a restart of
the old one: the pipeline tells them apart by the workload uid, the JobSet's, else the Job's, else
what the recorder's ``workload_uid`` says. Every message header carries it, so it must be known
when the recorder is built, and is found then from cheap local sources only:

- the environment variables ``GOODPUT_JOBSET_NAME``, ``GOODPUT_JOBSET_UID``, ``GOODPUT_JOB_NAME``,
  ``GOODPUT_JOB_UID``, ``GOODPUT_POD_NAME`` and ``GOODPUT_NAMESPACE``, which a pod spec sets from
  the downward API (a pod sees its own labels only where its spec maps them: see the README);
- a downward-API volume's ``labels`` and ``annotations`` files (lines ``key="value"``) in
  ``EmitterSettings.podinfo_dir``: JobSet's ``jobset.sigs.k8s.io/jobset-name`` and ``-uid``, a
  Job's ``batch.kubernetes.io/job-name`` and ``controller-uid`` (``job-name``,
  ``controller-uid`` on older clusters);
- the service account's namespace file, and the hostname (the pod's name, on Kubernetes).

The rest comes from the Compute Engine metadata server, asked by the recorder's background
thread before it sends the attempt's job start: the project, the instance's name and zone, the
GKE cluster's name and the node pool (from the ``kube-labels`` attribute, where the server shows
it). It is asked only on Google Cloud (``$GCE_METADATA_HOST`` or ``$GCE_METADATA_ROOT`` set, as
google-auth reads them, or a machine whose DMI product name says Google), once per recorder,
with a timeout of ``METADATA_TIMEOUT_S`` a request; the first request that fails ends the search.

The files are the platform's, not the job's: one may be a FIFO or lie on a mount that hangs. So
only regular files are read, without ever waiting for a writer, and ``read_local_sources`` reads
them on a thread of its own, waited for ``LOCAL_SOURCES_TIMEOUT_S`` at most: past that, the
recorder goes on with what the environment variables say (logged).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

from goodput_schemas.limits import text_problem

_LOG = logging.getLogger(__name__)

#: The fields of ``JobStart.workload``, in the proto's order.
FIELDS = ("platform", "project", "cluster", "namespace", "jobset_name", "jobset_uid", "job_name", "job_uid",
          "pod", "node_pool", "instance", "zone")
#: The environment variables a pod spec sets from the downward API, by the field they fill.
ENVIRONMENT = {"jobset_name": "GOODPUT_JOBSET_NAME", "jobset_uid": "GOODPUT_JOBSET_UID",
               "job_name": "GOODPUT_JOB_NAME", "job_uid": "GOODPUT_JOB_UID", "pod": "GOODPUT_POD_NAME",
               "namespace": "GOODPUT_NAMESPACE"}
#: The pod labels and annotations (JobSet and the Job controller put them on every pod), by field.
POD_KEYS = {"jobset_name": ("jobset.sigs.k8s.io/jobset-name",),
            "jobset_uid": ("jobset.sigs.k8s.io/jobset-uid",),
            "job_name": ("batch.kubernetes.io/job-name", "job-name"),
            "job_uid": ("batch.kubernetes.io/controller-uid", "controller-uid")}
#: The namespace of the pod's service account, where Kubernetes mounts its token.
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: What Compute Engine (and so GKE) machines say they are.
DMI_PRODUCT_NAME = Path("/sys/class/dmi/id/product_name")
#: The metadata server, as google-auth finds it.
METADATA_HOST_ENV = ("GCE_METADATA_HOST", "GCE_METADATA_ROOT")
METADATA_DEFAULT_HOST = "metadata.google.internal"
#: Seconds one request to the metadata server may take.
METADATA_TIMEOUT_S = 1.0
#: The metadata server's paths, by the field they fill (in the order asked).
METADATA_PATHS = {"project": "project/project-id", "instance": "instance/name", "zone": "instance/zone",
                  "cluster": "instance/attributes/cluster-name",
                  "node_pool": "instance/attributes/kube-labels"}
#: The GKE node label naming the node pool, in ``kube-labels``.
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
#: How long a recorder waits for the local sources' files (see the module docstring).
LOCAL_SOURCES_TIMEOUT_S = 1.0
_MAX_FILE_BYTES = 1 << 20


def local_workload(podinfo_dir: Path, environ: Mapping[str, str] = os.environ, *,
                   files: bool = True) -> dict[str, str]:
    """What the local sources say of the workload: only fields found, none of them empty.
    ``files=False``: the environment variables alone."""
    pod_info = ({**_key_values(podinfo_dir / "annotations"), **_key_values(podinfo_dir / "labels")}
                if files else {})
    found: dict[str, str] = {}
    for field in FIELDS:
        value = environ.get(ENVIRONMENT[field], "").strip() if field in ENVIRONMENT else ""
        value = value or next((pod_info[key] for key in POD_KEYS.get(field, ()) if pod_info.get(key)), "")
        if value:
            found[field] = value
    if "namespace" not in found and files:
        namespace = _read(NAMESPACE_FILE).strip()
        if namespace:
            found["namespace"] = namespace
    if found or environ.get("KUBERNETES_SERVICE_HOST"):
        found["platform"] = "kubernetes"
        if "pod" not in found:
            found["pod"] = socket.gethostname()
    return _valid(found)


def read_local_sources(podinfo_dir: Path,
                       timeout_s: float = LOCAL_SOURCES_TIMEOUT_S) -> tuple[dict[str, str], bool]:
    """``(local_workload(podinfo_dir), on_google_cloud())``, read on a thread of its own and
    waited for ``timeout_s`` at most; past that (a hung mount), what the environment says alone."""
    found: list[tuple[dict[str, str], bool]] = []

    def read() -> None:
        try:
            found.append((local_workload(podinfo_dir), on_google_cloud()))
        except Exception as error:  # noqa: BLE001 - a platform's odd files must not stop a job
            _LOG.warning("goodput emitter: reading the pod's files failed (%s); going on with what "
                         "the environment variables say of the workload", error)
            found.append((local_workload(podinfo_dir, files=False), on_google_cloud(dmi=False)))

    try:
        reader = threading.Thread(target=read, name="goodput-emitter-workload", daemon=True)
        reader.start()
    except RuntimeError:  # no threads here (an isolated subinterpreter): FIFOs are safe anyway
        read()
    else:
        reader.join(timeout_s)
    if found:
        return found[0]
    _LOG.warning("goodput emitter: the pod's files (%s, %s) could not be read within %.1f s (a hung "
                 "mount?); going on with what the environment variables say of the workload",
                 podinfo_dir, NAMESPACE_FILE, timeout_s)
    return local_workload(podinfo_dir, files=False), on_google_cloud(dmi=False)


def uid_of(workload: Mapping[str, str]) -> str:
    """The uid that names a workload: its JobSet's, else its Job's; empty if neither is known."""
    return workload.get("jobset_uid") or workload.get("job_uid") or ""


def on_google_cloud(environ: Mapping[str, str] = os.environ, *, dmi: bool = True) -> bool:
    """Whether a metadata server is worth asking: one is named, or the machine is Google's
    (``dmi=False``: the environment alone)."""
    named = any(environ.get(name) for name in METADATA_HOST_ENV)
    return named or (dmi and _read(DMI_PRODUCT_NAME).startswith("Google"))


def metadata_host(environ: Mapping[str, str] = os.environ) -> str:
    """The metadata server's ``host[:port]``, as google-auth finds it."""
    return next((environ[name] for name in METADATA_HOST_ENV if environ.get(name)), METADATA_DEFAULT_HOST)


def from_metadata_server(host: str, timeout_s: float = METADATA_TIMEOUT_S) -> dict[str, str]:
    """What the metadata server at ``host`` says of the machine: only fields found. A field the
    server does not have is left out; the first request that fails ends the search."""
    found: dict[str, str] = {}
    for field, path in METADATA_PATHS.items():
        try:
            value = _metadata(host, path, timeout_s)
        except OSError as error:  # refused, timed out, no such host: not there to ask
            _LOG.debug("goodput emitter: the metadata server at %s did not answer (%s)", host, error)
            break
        if value is None:
            continue
        if field == "zone":
            value = value.rsplit("/", 1)[-1]  # projects/NUMBER/zones/ZONE
        elif field == "node_pool":
            labels = dict(item.partition("=")[::2] for item in value.split(","))
            value = labels.get(NODE_POOL_LABEL, "")
        if value.strip():
            found[field] = value.strip()
    return _valid(found)


class WorkloadDiscovery:
    """The workload of one recorder: the local sources' fields at construction, completed from
    the metadata server once, by whichever background thread asks first.

    Args:
        local: What ``local_workload`` found.
        ask_server: Whether to ask the metadata server (``on_google_cloud``).
    """

    def __init__(self, local: dict[str, str], ask_server: bool) -> None:
        self.local = local
        self._ask_server = ask_server
        self._complete: dict[str, str] | None = None if ask_server else local
        self._lock = threading.Lock()

    def complete(self) -> dict[str, str]:
        """Every field found: the local ones, and the metadata server's (asked on the first call;
        a thread calling meanwhile waits for that answer). The platform is ``gke`` where the
        server names a cluster, else ``kubernetes`` where the local sources found a pod, else
        ``gce`` where the server answered."""
        with self._lock:
            if self._complete is None:
                server = from_metadata_server(metadata_host())
                merged = {**server, **self.local}
                if "cluster" in server:
                    merged["platform"] = "gke"
                elif server and "platform" not in merged:
                    merged["platform"] = "gce"
                self._complete = {field: merged[field] for field in FIELDS if field in merged}
            return self._complete

    def after_fork(self) -> None:
        """A forked child asks again if its parent had not finished asking."""
        self._lock = threading.Lock()


def _metadata(host: str, path: str, timeout_s: float) -> str | None:
    """The metadata server's value at ``path``; None if it has none.

    Raises:
        OSError: The server cannot be reached, or what answered is not a metadata server.
    """
    import http.client  # on the background thread only: it is not needed before

    connection = http.client.HTTPConnection(host, timeout=timeout_s)
    try:
        connection.request("GET", f"/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"})
        response = connection.getresponse()
        body = response.read(_MAX_FILE_BYTES)
        if response.getheader("Metadata-Flavor") != "Google":
            raise OSError(f"{host} is not a metadata server (no Metadata-Flavor header)")
        if response.status != 200:
            return None
        return body.decode("utf-8", "replace")
    except http.client.HTTPException as error:
        raise OSError(f"{host}: {type(error).__name__}: {error}") from error
    finally:
        connection.close()


def _key_values(path: Path) -> dict[str, str]:
    """The ``key="value"`` lines of a downward-API file (values quoted as Go quotes them)."""
    found = {}
    for line in _read(path).splitlines():
        key, sep, quoted = line.partition("=")
        try:
            value = json.loads(quoted) if sep else None
        except ValueError:
            continue
        if isinstance(value, str):
            found[key.strip()] = value
    return found


def _read(path: Path) -> str:
    """A small regular file's content; empty if it is missing, cannot be read, or is no regular
    file (a FIFO is never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as handle:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                _LOG.debug("goodput emitter: %s is not a regular file; not read", path)
                return ""
            return handle.read(_MAX_FILE_BYTES).decode("utf-8", "replace")
        except OSError:
            return ""


def _valid(found: dict[str, str]) -> dict[str, str]:
    """``found`` without the fields the pipeline would refuse (logged)."""
    valid = {}
    for field, value in found.items():
        problem = text_problem(f"workload.{field}", value)
        if problem is None:
            valid[field] = value
        else:
            _LOG.warning("goodput emitter: leaving %s out of the workload: %s", field, problem)
    return valid
