"""What the emitter's background thread adds to an attempt, never the caller's thread: the
workload on its job start (``emitter.workload``), and the configs it collects itself.

Once per attempt, dated at the job start, a ``configs`` event of source ``software``: the Python
version and implementation, the OS, the emitter's version, the framework the job imported
(``framework``, ``framework.version``), and the installed versions of ``PACKAGES``, read from
their distributions' metadata without importing them (``packages.jax``, ...).

Once per attempt too, one of source ``system``: the host's name and CPU count, the environment
settings of ``SYSTEM_ENVIRONMENT`` that are set (``env.NAME``; the flag lists ``XLA_FLAGS`` and
``LIBTPU_INIT_ARGS`` one entry per flag, ``XLA_FLAGS.xla_dump_to``, so that runs compare flag by
flag), and, where JAX is imported and its backends are up, the devices: ``device.platform``,
``device.kind``, ``device.count``, ``device.local_count``, ``process.count``,
``process.index``, and on multislice TPUs ``slice.count`` and ``slice.size``. It is dated at the
job start where JAX is not imported, or its backends are up, when the thread sees the job start.
The emitter never initializes a JAX backend (that would break a job that calls
``jax.distributed.initialize`` later): where JAX is imported but its backends are not up yet, the
thread looks again at the first later batch of events holding a step start, and records the
system configs then, dated at that batch's last step start (or at the job end, if that comes
first), with the devices if the backends are up by then and without them otherwise.

``EmitterSettings.collect_configs`` (``$GOODPUT_COLLECT_CONFIGS=0``) turns the configs off.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from emitter.configs import fit_configs
from emitter.workload import WorkloadDiscovery
from goodput_schemas.wire import Record

_LOG = logging.getLogger(__name__)

#: Distributions whose installed version the software configs name, where installed.
PACKAGES = ("jax", "jaxlib", "libtpu", "flax", "optax", "orbax-checkpoint", "maxtext", "axlearn",
            "tensorflow", "torch")
#: Frameworks, in the order one is named the job's when it imported several.
FRAMEWORKS = ("jax", "torch", "tensorflow")
#: Environment settings the system configs name, where set. Nothing else of the environment is
#: read: it may hold secrets.
SYSTEM_ENVIRONMENT = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS", "JAX_ENABLE_X64",
                      "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                      "TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY", "TPU_WORKER_ID", "MEGASCALE_NUM_SLICES",
                      "MEGASCALE_SLICE_ID", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG")
#: Of those, the flag lists, recorded one entry per flag.
FLAG_LISTS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")

#: What the thread adds: (time_us, kind, body) of each event.
Derived = list[tuple[int, str, dict[str, Any]]]


class AttemptCollector:
    """Called by the worker's thread with each batch of an attempt's own events before it sends
    them: completes the job start's workload and returns the configs events to record, or None
    once it has recorded all it will.

    Args:
        workload: The recorder's workload, or None where it looks for none.
        collect_configs: Whether to collect the software and system configs.
        emitter_version: The emitter's version, for the software configs.
        dropped: Called with (entries, reason) for collected entries the limits refuse.
    """

    def __init__(self, workload: WorkloadDiscovery | None, collect_configs: bool, emitter_version: str,
                 dropped: Callable[[int, str], None]) -> None:
        self._workload = workload
        self._collect = collect_configs
        self._version = emitter_version
        self._dropped = dropped
        self._started = False
        self._system_pending = False

    def __call__(self, batch: list[Record]) -> Derived | None:
        if self._started and not self._system_pending:
            return None  # done: the worker stops asking
        if self._started:
            return self._look_again(batch)
        start = next((record for record in batch if record[2] == "job_start"), None)
        if start is None:
            return []
        self._started = True
        if self._workload is not None:
            workload = self._workload.complete()
            if workload:
                start[3]["workload"] = workload
        if not self._collect:
            return []
        derived = [self._configs(start[1], "software", software_configs(self._version))]
        backends = jax_backends_up()
        if backends is False:
            self._system_pending = True
        else:
            derived.append(self._configs(start[1], "system", system_configs(devices=bool(backends))))
        return derived

    def _look_again(self, batch: list[Record]) -> Derived:
        """The system configs, once a batch after the job start's holds a step start or the job end."""
        steps = [record[1] for record in batch if record[2] == "step_start"]
        end = next((record[1] for record in batch if record[2] == "job_end"), None)
        if not steps and end is None:
            return []
        self._system_pending = False
        when = steps[-1] if steps else end
        assert when is not None
        return [self._configs(when, "system", system_configs(devices=jax_backends_up() is True))]

    def _configs(self, time_us: int, source: str, values: dict[str, str]) -> tuple[int, str, dict[str, Any]]:
        fitted = fit_configs(values)
        if fitted.dropped:
            self._dropped(fitted.dropped, f"{source} configs: {fitted.reason}")
        return time_us, "configs", {"source": source, "values": fitted.values}


@functools.cache
def _installed() -> dict[str, str]:
    """The versions of ``PACKAGES`` installed, by distribution name (read once per process)."""
    import importlib.metadata

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def software_configs(emitter_version: str) -> dict[str, str]:
    """The software configs of this process (see the module docstring)."""
    import platform

    installed = _installed()
    values = {"python.version": platform.python_version(),
              "python.implementation": platform.python_implementation(),
              "os.system": platform.system(), "os.release": platform.release(),
              "os.machine": platform.machine(),
              "emitter.version": emitter_version}
    framework = next((name for name in FRAMEWORKS if name in sys.modules), None)
    if framework is not None:
        values["framework"] = framework
        if framework in installed:
            values["framework.version"] = installed[framework]
    values.update((f"packages.{name}", version) for name, version in installed.items())
    return values


def system_configs(devices: bool) -> dict[str, str]:
    """The system configs of this process, with JAX's devices if ``devices`` (whose backends
    must be up: see ``jax_backends_up``)."""
    import socket

    values = {"host.name": socket.gethostname(), "host.cpu_count": str(os.cpu_count() or 0)}
    for name in SYSTEM_ENVIRONMENT:
        setting = os.environ.get(name, "").strip()
        if not setting:
            continue
        if name in FLAG_LISTS:
            values.update(flag_entries(name, setting))
        else:
            values[f"env.{name}"] = setting
    if devices:
        values.update(jax_devices())
    return values


def flag_entries(name: str, flags: str) -> dict[str, str]:
    """One entry per flag of a flag list: ``--xla_foo=1 --xla_bar`` in ``XLA_FLAGS`` is
    ``XLA_FLAGS.xla_foo = "1"`` and ``XLA_FLAGS.xla_bar = "true"``."""
    entries = {}
    for flag in flags.split():
        key, sep, value = flag.lstrip("-").partition("=")
        entries[f"{name}.{key}"] = value if sep else "true"
    return entries


def jax_backends_up() -> bool | None:
    """Whether JAX's backends are initialized, asked without initializing them; None where JAX
    is not imported. A backend being initialized at this moment is not up yet."""
    if "jax" not in sys.modules:
        return None
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None)
    lock = getattr(bridge, "_backend_lock", None)
    locked = getattr(lock, "locked", None)
    return bool(backends) and not (callable(locked) and locked())


def jax_devices() -> dict[str, str]:
    """JAX's devices and processes, of backends already up (see ``jax_backends_up``)."""
    jax = sys.modules["jax"]
    try:
        devices = jax.devices()
        values = {"device.platform": devices[0].platform, "device.kind": devices[0].device_kind,
                  "device.count": str(len(devices)), "device.local_count": str(jax.local_device_count()),
                  "process.count": str(jax.process_count()), "process.index": str(jax.process_index())}
    except Exception as error:  # noqa: BLE001 - a private API that moved, a backend that failed
        _LOG.debug("goodput emitter: JAX's devices could not be read: %s", error)
        return {}
    slices = {getattr(device, "slice_index", None) for device in devices} - {None}
    if slices:
        values["slice.count"] = str(len(slices))
        values["slice.size"] = str(len(devices) // len(slices))
    return values
