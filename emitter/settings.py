"""Emitter settings: one frozen, validated object, with defaults read from the environment."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from pathlib import Path

from goodput_schemas.limits import MAX_EVENTS_PER_MESSAGE

_LOG = logging.getLogger(__name__)

#: Environment variable naming the default destination (``file:PATH`` or ``projects/P/topics/T``).
DESTINATION_ENV = "GOODPUT_DESTINATION"
#: Environment variable naming the spool root directory.
SPOOL_DIR_ENV = "GOODPUT_SPOOL_DIR"
#: Environment variables turning the collected configs and the workload's discovery off ("0").
COLLECT_CONFIGS_ENV = "GOODPUT_COLLECT_CONFIGS"
DISCOVER_WORKLOAD_ENV = "GOODPUT_DISCOVER_WORKLOAD"
#: Environment variable naming the directory of a Kubernetes downward-API volume.
PODINFO_DIR_ENV = "GOODPUT_PODINFO_DIR"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name, "").strip()
    return Path(value) if value else default


def _default_spool_dir() -> Path:
    """``<tmp>/goodput-spool-<uid>``; ``/tmp`` where no temporary directory can be written (the
    spool then refuses events, logged, and they wait in memory)."""
    try:
        tmp = tempfile.gettempdir()
    except OSError:
        tmp = "/tmp"
    return Path(tmp) / f"goodput-spool-{os.geteuid()}"


def _env_flag(name: str, default: bool) -> bool:
    """A yes/no environment variable; unset, blank or unreadable (logged): ``default``."""
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    if value:
        _LOG.warning("goodput emitter: $%s=%r is neither 1 nor 0; using %s", name, value[:80], int(default))
    return default


@dataclasses.dataclass(frozen=True)
class EmitterSettings:
    """How the emitter batches, buffers and spools events.

    Attributes:
        max_batch_events: Events per message, at most ``MAX_EVENTS_PER_MESSAGE`` (100,000); a
            full batch is sent at once. A batch over Pub/Sub's 10 MB is sent as several messages.
        max_latency_s: A partial batch is sent after waiting at most this long.
        max_queue_events: Events held in memory; beyond this, ``record_*`` calls spill to the
            on-disk spool instead of blocking or dropping.
        spool_dir: Root of the on-disk spool (one subdirectory per run). Point it at a disk that
            survives a restart of the training process to keep unsent events across restarts.
            Defaults to ``$GOODPUT_SPOOL_DIR``, else ``<tmp>/goodput-spool-<uid>``, one per
            user. The spool keeps its run directories private (mode 0700, owned by the user)
            and refuses, logged, a directory another user owns.
        max_spool_bytes: Bound on the spool of one run; when full, the oldest spooled events are
            dropped (counted, logged once).
        spool_segment_bytes: Size at which a spool segment file is closed and a new one begun.
        close_timeout_s: How long ``close()`` and the exit hook wait for delivery by default.
        heartbeat_interval_s: Period of automatic heartbeats while the recorder is idle, or
            ``None`` for none. Heartbeats run only while the caller uses the real clock (passes no
            explicit times): the emitter never invents an event time.
        retry_initial_backoff_s: First wait after a failed send; doubled per failure.
        retry_max_backoff_s: Cap on the wait between send attempts.
        send_timeout_s: How long one send to Pub/Sub retries, inside the client library,
            before it counts as failed and the emitter backs off (the attempt then under way
            may take this long again). The next send starts on a new connection, so a broker
            that comes back is found within about ``send_timeout_s + retry_max_backoff_s``.
        collect_configs: Whether the background thread records each attempt's ``software``
            and ``system`` configs (``emitter.collect``). Defaults to ``$GOODPUT_COLLECT_CONFIGS``
            (``0`` turns it off), else on.
        discover_workload: Whether the recorder looks for the workload it runs in (Kubernetes
            JobSet or Job, pod, cluster, instance; ``emitter.workload``). Defaults to
            ``$GOODPUT_DISCOVER_WORKLOAD`` (``0`` turns it off), else on. A recorder's
            ``workload_uid`` applies either way.
        podinfo_dir: Where a Kubernetes downward-API volume holds the pod's ``labels`` and
            ``annotations`` files. Defaults to ``$GOODPUT_PODINFO_DIR``, else ``/etc/podinfo``.
    """

    max_batch_events: int = 1000
    max_latency_s: float = 2.0
    max_queue_events: int = 100_000
    spool_dir: Path = dataclasses.field(
        default_factory=lambda: _env_path(SPOOL_DIR_ENV, _default_spool_dir()))
    max_spool_bytes: int = 512 * 1024 * 1024
    spool_segment_bytes: int = 4 * 1024 * 1024
    close_timeout_s: float = 10.0
    heartbeat_interval_s: float | None = 60.0
    retry_initial_backoff_s: float = 0.5
    retry_max_backoff_s: float = 30.0
    send_timeout_s: float = 30.0
    collect_configs: bool = dataclasses.field(default_factory=lambda: _env_flag(COLLECT_CONFIGS_ENV, True))
    discover_workload: bool = dataclasses.field(
        default_factory=lambda: _env_flag(DISCOVER_WORKLOAD_ENV, True))
    podinfo_dir: Path = dataclasses.field(
        default_factory=lambda: _env_path(PODINFO_DIR_ENV, Path("/etc/podinfo")))

    def __post_init__(self) -> None:
        object.__setattr__(self, "spool_dir", Path(self.spool_dir))
        object.__setattr__(self, "podinfo_dir", Path(self.podinfo_dir))
        for name in ("collect_configs", "discover_workload"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EmitterSettings.{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("max_batch_events", "max_queue_events", "max_spool_bytes", "spool_segment_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EmitterSettings.{name} must be a positive integer, got {value!r}")
        for name in ("max_latency_s", "close_timeout_s", "retry_initial_backoff_s", "retry_max_backoff_s",
                     "send_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"EmitterSettings.{name} must be a positive number, got {value!r}")
        if self.max_batch_events > MAX_EVENTS_PER_MESSAGE:
            raise ValueError(f"EmitterSettings.max_batch_events must be at most {MAX_EVENTS_PER_MESSAGE} "
                             f"(the pipeline's MAX_EVENTS_PER_MESSAGE), got {self.max_batch_events}")
        hb = self.heartbeat_interval_s
        if hb is not None and (isinstance(hb, bool) or not isinstance(hb, (int, float)) or not hb > 0):
            raise ValueError(f"EmitterSettings.heartbeat_interval_s must be positive or None, got {hb!r}")
        if self.spool_segment_bytes > self.max_spool_bytes:
            raise ValueError("EmitterSettings.spool_segment_bytes must not exceed max_spool_bytes")


def destination_from_env() -> str | None:
    """The destination named by ``$GOODPUT_DESTINATION``, or ``None`` when it is unset or blank."""
    value = os.environ.get(DESTINATION_ENV, "").strip()
    return value or None
