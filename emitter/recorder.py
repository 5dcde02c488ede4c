"""``GoodputRecorder``: a drop-in for ``ml_goodput_measurement``'s recorder that emits events.

Every ``record_*`` method of the reference's ``GoodputRecorder`` and ``ElasticGoodputRecorder``
is here with the same name and arguments. Instead of writing Cloud Logging entries, each call
appends one event to an in-memory queue and returns in microseconds; a background thread sends
batches to the destination (see ``emitter.worker``).

No call ever raises into the training job, whatever its arguments (a training loop must not die
of its metrics): what the reference accepts is recorded as the reference records it (a step
``5.0`` or ``"5"`` is step 5, a naive datetime is local time, a ``None`` badput type is
``"unknown"``), and what cannot be recorded (anything the pipeline would refuse: a negative step,
a time outside 2000..2200, a name with control characters or over ``MAX_TEXT_LENGTH``
characters, more than ``MAX_LABELS`` labels) records nothing, is logged once per method and is
counted in ``stats.invalid_calls``, so that nothing a job records ends up in the ``dead_letter``
table. ``strict=True`` raises ``ValueError`` instead, for tests. Transport and disk problems never
raise either: they are logged and counted in ``stats``; so is a missing destination (see
``emitter.discovery``). No call blocks past its timeout, from a signal handler or an ``atexit``
hook either, whatever the destination does.

One recorder instance is one attempt of the run (a new process start, a new attempt id), until it
records a second job start: as in the reference's own tests, that starts a new attempt.

Beyond the reference, a recorder says which workload it runs in (``emitter.workload``: every
message carries the workload's uid, and the job start the workload), records the job's own
configuration (``record_configs``) and metrics by name (``record_metrics``, ``emitter.metrics``),
and its background thread records the software and system configs of each attempt
(``emitter.collect``).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import datetime
import functools
import logging
import math
import operator
import os
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from emitter import testing
from emitter.collect import AttemptCollector
from emitter.configs import fit_configs
from emitter.discovery import DiscoveredTransport
from emitter.lane import FastPath
from emitter.settings import EmitterSettings, destination_from_env
from emitter.spool import Spool
from emitter.transports import Transport, Undeliverable, transport_for
from emitter.worker import BatchWorker, EmitterStats, SendCancelled
from emitter.workload import WorkloadDiscovery, read_local_sources, uid_of
from goodput_schemas.limits import (
    MAX_COUNT,
    MAX_DURATION_S,
    MAX_LABELS,
    MAX_METRIC_NAMES,
    MAX_METRICS_PER_EVENT,
    MAX_TIME_US,
    MIN_TIME_US,
    host_steps_problem,
    id_problem,
    int_limit,
    int_name,
    metrics_problem,
    text_problem,
    workload_uid_problem,
)
from goodput_schemas.wire import MODEL_METRICS, Message, json_double

__version__ = "0.1.0"

_LOG = logging.getLogger("emitter")
#: Earlier attempts of one recorder that deliver at once after restarts, at most (see
#: ``GoodputRecorder._start_new_attempt``).
MAX_RETIRING = 4
#: How often a send waiting for another looks whether its worker stopped.
_SHARED_POLL_S = 0.05
_UTC = datetime.timezone.utc
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)
_Method = TypeVar("_Method", bound=Callable[..., Any])
_T = TypeVar("_T")


def _time_us(value: object, name: str) -> int:
    if isinstance(value, datetime.datetime) and value.tzinfo is _UTC:
        time_us = (value - _EPOCH) // _MICROSECOND  # the common case, without utcoffset()
    elif not isinstance(value, datetime.datetime):
        raise ValueError(
            f"{name} must be a datetime.datetime or None, got {type(value).__name__}"
        )
    elif value.utcoffset() is None:
        # As the reference's ``.timestamp()``: a naive datetime is the host's local time.
        time_us = (value.astimezone(_UTC) - _EPOCH) // _MICROSECOND
    else:
        time_us = (value - _EPOCH) // _MICROSECOND
    if not MIN_TIME_US <= time_us < MAX_TIME_US:
        raise ValueError(f"{name} must be in 2000-01-01..2200-01-01 UTC, got {value!r}")
    return time_us


def _count(value: object, name: str) -> int:
    """A count as the reference takes it, ``int(value)``: ``5.0`` and ``"5"`` are 5."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        if not isinstance(value, (float, str, bytes)) and not hasattr(value, "__int__"):
            raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
        try:
            number = int(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{name} must be an integer, got {value!r:.80}") from None
    limit = int_limit(name)
    if not 0 <= number <= limit:
        raise ValueError(f"{name} must be >= 0 and at most {int_name(limit)}, got {number}")
    return number


def _labels(labels: object) -> dict[str, str]:
    if not labels:
        return {}
    if not isinstance(labels, Mapping):
        raise ValueError(f"labels must be a mapping of str to str, got {type(labels).__name__}")
    if len(labels) > MAX_LABELS:
        raise ValueError(f"labels has {len(labels)} labels, more than MAX_LABELS ({MAX_LABELS})")
    return {_text(k, "label key"): _text(v, f"label {k!r}", free_form=True)
            for k, v in labels.items()}


def _ideal_step_time(value: object) -> float | None:
    if value is None:
        return None
    ideal = _number(value, "configured_ideal_step_time")
    if not (math.isfinite(ideal) and 0 < ideal <= MAX_DURATION_S):
        raise ValueError(f"configured_ideal_step_time must be > 0 s and at most "
                         f"{MAX_DURATION_S:.0f} s, got {ideal}")
    return ideal


def _step_seconds(value: object, name: str) -> float:
    """A duration in seconds the pipeline accepts: finite, >= 0, at most ``MAX_DURATION_S``."""
    seconds = _number(value, name)
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION_S):
        raise ValueError(f"{name} must be >= 0 s and at most {MAX_DURATION_S:.0f} s, got {seconds}")
    return seconds


def _settings(value: object) -> EmitterSettings:
    if value is None:
        return EmitterSettings()
    if not isinstance(value, EmitterSettings):
        raise ValueError(f"settings must be an EmitterSettings, got {type(value).__name__}")
    return value


def _badput_type(value: object, name: str) -> str:
    """A custom badput or elastic event type: ``None`` is the reference's default, ``unknown``."""
    if value is None:
        return "unknown"
    return _text(value if isinstance(value, str) else str(value), name)


def _workload_uid(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"workload_uid must be a str, got {type(value).__name__}")
    problem = workload_uid_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _metric_name(name: object) -> str:
    """A metric name the pipeline accepts (``limits.metrics_problem``)."""
    if not isinstance(name, str):
        raise ValueError(f"a metric name must be a str, got {type(name).__name__}")
    problem = metrics_problem({name: 0.0})
    if problem is not None:
        raise ValueError(problem)
    return name


def _guarded_as(name: str) -> Callable[[_Method], _Method]:
    """Makes a method of the recorder never raise: what the public method ``name`` cannot record
    is logged (once per method) and counted, unless the recorder is strict."""

    def guard(method: _Method) -> _Method:
        @functools.wraps(method)
        def guarded(self: GoodputRecorder, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - never into the training job: counted, logged
                return self._invalid_call(name, error)

        return guarded  # type: ignore[return-value]

    return guard


def _guarded(method: _Method) -> _Method:
    """``_guarded_as`` the method's own name."""
    return _guarded_as(method.__name__)(method)


def _text(value: object, name: str, free_form: bool = False) -> str:
    """A string the pipeline accepts: a name of printable characters, or free text (a label's
    value), each at most ``MAX_TEXT_LENGTH`` characters."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, got {type(value).__name__}")
    problem = text_problem(name, value, free_form)
    if problem is not None:
        raise ValueError(problem)
    return value


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # type: ignore[arg-type]  # numpy and jax scalars
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {type(value).__name__}") from None
    return float(value)


def _metric(value: object, name: str) -> float | str:
    """A model metric as the event carries it: a finite float as it is, a non-finite one as its
    proto3 JSON string, anything else converted (numpy and jax scalars) or refused."""
    if type(value) is float and value - value == 0.0:  # finite: inf - inf and nan - nan are nan
        return value
    return json_double(_number(value, name))


class GoodputRecorder(FastPath):
    """Records the goodput events of one attempt of a training run.

    Example::

        from emitter import GoodputRecorder   # was: from ml_goodput_measurement.goodput import ...

        recorder = GoodputRecorder(
            job_name="llama-70b-run-7",
            logger_name="goodput_llama-70b-run-7",   # accepted for compatibility, unused
            logging_enabled=jax.process_index() == 0,
            destination="file:/var/log/goodput/events.jsonl",
            accelerator_type="v5p", chip_count=512, run_group="llama-70b",
        )
        recorder.record_job_start_time()
        for step in range(start_step, num_steps):
            recorder.record_step_start_time(step)
            ...
        recorder.record_job_end_time()
        recorder.close()

    Args:
        job_name: The run id. Every attempt (restart) of the run uses the same name.
        logger_name: The reference's Cloud Logging log name; accepted and ignored.
        logging_enabled: As in the reference: ``False`` (the default) makes every call a no-op,
            so that only one process of a job (e.g. ``jax.process_index() == 0``) records.
        cloud_logger: The reference's test hook; accepted and ignored.
        destination: ``file:PATH`` (one JSON line per message; a path object is a file too) or
            ``projects/P/topics/T``; defaults to ``$GOODPUT_DESTINATION``, else the fleet's topic
            in the project the job runs in (``emitter.discovery``; found in the background, never
            an error). An object with the ``emitter.transports.Transport`` methods is used as it
            is. One not understood is logged, and events wait in the spool for a process of the
            run that has a destination it understands.
        configured_ideal_step_time: The ideal step time in seconds, if the user knows it.
        run_group: Groups runs in fleet queries (an experiment, a team, a model family).
        accelerator_type: E.g. ``"v5p"`` or ``"h100"``.
        chip_count: Accelerator chips the attempt holds (weights fleet figures).
        labels: Free-form string labels of the run.
        location: Zone or region of the job (the Cloud Monitoring resource's location).
        workload_uid: The uid every message carries (``EventBatch.workload_uid``): a run id
            reused by another workload is another run. ``None`` (the default): the JobSet's
            uid, else the Job's, as ``emitter.workload`` finds them; ``""``: none.
        settings: Batching, spooling, retry and collection settings (``EmitterSettings``).
        background_grace_period_s: The reference's keyword; sets ``close_timeout_s``.
        background_batch_size: The reference's keyword; sets ``max_batch_events``.
        background_max_latency_s: The reference's keyword; sets ``max_latency_s``.
        wall_clock_ns: The clock that dates a call passing no time, in nanoseconds since the
            Unix epoch (``time.time_ns``, the default). Event times follow it wherever it
            jumps; batching, retries and heartbeats are paced by the monotonic clock, so a jump
            neither stalls nor hurries them. For tests of a host whose clock misbehaves.
        strict: Raise ``ValueError`` for an argument that cannot be recorded, here and at every
            call, instead of logging and counting it (for tests; never in a training job).

    Raises:
        ValueError: Only with ``strict=True``: an argument cannot be recorded (``TypeError``: an
            argument it does not take). Otherwise a ``job_name`` the pipeline would refuse, or
            anything else that keeps the recorder from starting, disables recording (logged);
            invalid run metadata or settings are left out, and arguments it does not take are
            ignored (logged, counted in ``stats.invalid_calls``).
    """

    def __init__(
        self,
        job_name: str = "",
        logger_name: str | None = None,
        logging_enabled: bool = False,
        cloud_logger: object = None,
        *unexpected_args: Any,
        destination: str | os.PathLike[str] | Transport | None = None,
        configured_ideal_step_time: float | None = None,
        run_group: str = "",
        accelerator_type: str = "",
        chip_count: int = 0,
        labels: Mapping[str, str] | None = None,
        location: str = "",
        workload_uid: str | None = None,
        settings: EmitterSettings | None = None,
        background_grace_period_s: float | None = None,
        background_batch_size: int | None = None,
        background_max_latency_s: float | None = None,
        wall_clock_ns: Callable[[], int] | None = None,
        strict: bool = False,
        **unexpected_keywords: Any,
    ) -> None:
        self._strict = strict is True
        self._worker: BatchWorker | None = None
        # The per-step calls record into the worker's lane themselves (``emitter.lane``) while
        # recording on the real clock; None when disabled or closed, or on an injected clock.
        self._lane = None
        self._closed = False
        self._closed_at_exit = False
        self._dropped_after_close = False
        self._close_lock = threading.RLock()  # a signal handler may close while close() runs
        self._explicit_time = False
        self._in_job = False
        self._job_started = False
        self._invalid: dict[str, int] = {}
        self._dropped_values: collections.Counter[str] = collections.Counter()  # by EmitterStats field
        self._dropped_logged: set[str] = set()  # methods
        self._dropped_lock = threading.Lock()  # the background thread counts collected entries
        self._metric_names: set[str] = set()  # of this attempt
        self.workload_uid = ""
        self.job_name = job_name
        self.logger_name = logger_name
        self.destination = "none"
        self.settings = EmitterSettings()
        self._now_ns = wall_clock_ns if callable(wall_clock_ns) else time.time_ns
        if unexpected_args or unexpected_keywords:
            given = [f"{len(unexpected_args)} positional after cloud_logger"] if unexpected_args else []
            given += [repr(name) for name in unexpected_keywords]
            unexpected = f"GoodputRecorder() got arguments it does not take: {', '.join(given)}"
            if self._strict:
                raise TypeError(unexpected)
            self._invalid["GoodputRecorder"] = 1
            _LOG.error("goodput recorder for %r: %s; ignored them (counted in stats.invalid_calls)",
                       job_name, unexpected)
        # Nothing a job's arguments, environment, files or process do may end it: a recorder
        # that cannot start records nothing (logged), unless it is strict.
        try:
            problem = (id_problem("job_name", job_name) if isinstance(job_name, str)
                       else f"job_name must be a str, got {type(job_name).__name__}")
            if problem is not None:
                if self._strict:
                    raise ValueError(problem)
                _LOG.error("goodput recording is disabled: %s", problem)
                logging_enabled = False
            self._metadata = self._job_start_body(configured_ideal_step_time, run_group,
                                                  accelerator_type, chip_count, labels, location)
            self.settings = self._lenient(
                lambda: _with_reference_keywords(
                    _settings(settings), background_grace_period_s, background_batch_size,
                    background_max_latency_s),
                EmitterSettings(), "settings")
            if not logging_enabled:
                _LOG.debug("goodput recording is disabled in this process (logging_enabled=False)")
                return
            self._start(destination, workload_uid)
        except Exception as error:
            if self._strict:
                raise
            _LOG.error("goodput recording is disabled: the recorder for %r could not start: %s: %s",
                       job_name, type(error).__name__, error)
            self._abandon()

    def _start(self, destination: object, workload_uid: str | None) -> None:
        """Starts recording: the workload, the destination, the first attempt's worker."""
        self._workload = self._discover_workload(workload_uid)
        settings = self.settings
        capture = testing.active_capture()
        transport: Transport
        if capture is not None:
            transport = capture.transport()
            self.destination = "memory:capture"
            self.settings = dataclasses.replace(settings, spool_dir=Path(capture.spool_dir))
        elif destination is not None and not isinstance(destination, (str, os.PathLike)):
            if not callable(getattr(destination, "send", None)):
                raise ValueError(f"destination must be a str, a path or a Transport, got "
                                 f"{type(destination).__name__}")
            transport = destination  # type: ignore[assignment]
            self.destination = repr(destination)
        else:
            resolved = (f"file:{os.fspath(destination)}" if isinstance(destination, os.PathLike)
                        else destination or destination_from_env())
            if resolved is None:
                transport = DiscoveredTransport(send_timeout_s=settings.send_timeout_s)
                self.destination = "discovered"
            else:
                self.destination = resolved
                try:
                    transport = transport_for(resolved, send_timeout_s=settings.send_timeout_s)
                except ValueError as error:
                    if self._strict:
                        raise
                    _LOG.error("goodput recorder for %r: %s; events are kept in memory and in the "
                               "spool, for a process of the run with a destination it understands "
                               "to send", self.job_name, error)
                    transport = Undeliverable(str(error))
        self._transport = _Shared(transport, settings.send_timeout_s)
        self._retired: list[BatchWorker] = []  # earlier attempts' workers, still delivering
        self._closed_stats = EmitterStats()  # of earlier attempts closed and forgotten
        self._worker = self._new_worker()
        self._open_lane()
        if capture is not None:
            capture.attach(self)
        atexit.register(self._exit_hook)
        reference = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork_in_child(reference))

    def _abandon(self) -> None:
        """Records nothing from now on: what a recorder that failed to start does."""
        worker, self._worker, self._lane = self._worker, None, None
        if worker is not None:
            with contextlib.suppress(Exception):
                worker.close(0.0)

    def _lenient(self, build: Callable[[], _T], fallback: _T, what: str) -> _T:
        """``build()``; its fallback, logged, if it raises and the recorder is not strict."""
        try:
            return build()
        except Exception as error:
            if self._strict:
                raise
            _LOG.error("goodput recorder for %r: invalid %s, %s: %s", self.job_name, what,
                       "left out" if fallback is None else f"using {fallback!r} instead", error)
            return fallback

    def _discover_workload(self, uid: str | None) -> WorkloadDiscovery | None:
        """The workload as the local sources show it (the background thread asks the metadata
        server later), put on the job start, and the uid every message carries."""
        discovery = None
        if self.settings.discover_workload:
            local, ask_server = read_local_sources(self.settings.podinfo_dir)
            discovery = WorkloadDiscovery(local, ask_server)
            if local:
                self._metadata["workload"] = local
            if uid is None:
                uid = uid_of(local)
        self.workload_uid = self._lenient(lambda: _workload_uid(uid or ""), "", "workload_uid")
        return discovery

    def _count_dropped(self, field: str, method: str, count: int, reason: str) -> None:
        """Counts (in ``stats.<field>``) and logs (once per method) values a call left out."""
        with self._dropped_lock:
            self._dropped_values[field] += count
            first = method not in self._dropped_logged
            self._dropped_logged.add(method)
        if first:
            _LOG.warning("goodput recorder for %r: %s left out %d values: %s (logged once; counted in "
                         "stats.%s)", self.job_name, method, count, reason, field)

    def _invalid_call(self, method: str, error: Exception) -> Any:
        """Counts and logs (once per method) a call that recorded nothing, and returns what the
        call returns then; raises ``error`` instead if the recorder is strict."""
        if self._strict:
            raise error
        count = self._invalid.get(method, 0)
        self._invalid[method] = count + 1
        if not count:
            _LOG.error("goodput recorder for %r: %s recorded nothing: %s (logged once; "
                       "counted in stats.invalid_calls)", self.job_name, method, error)
        return False if method in ("flush", "close") else None

    def _job_start_body(
        self,
        configured_ideal_step_time: float | None,
        run_group: str,
        accelerator_type: str,
        chip_count: int,
        labels: Mapping[str, str] | None,
        location: str,
    ) -> dict[str, Any]:
        """The metadata the job start carries; a field that cannot be recorded is left out and
        logged (a strict recorder raises)."""
        fields: dict[str, Callable[[], Any]] = {
            "run_group": lambda: _text(run_group, "run_group"),
            "accelerator_type": lambda: _text(accelerator_type, "accelerator_type"),
            "location": lambda: _text(location, "location"),
            "chip_count": lambda: _count(chip_count, "chip_count"),
            "labels": lambda: _labels(labels),
            "configured_ideal_step_time_s": lambda: _ideal_step_time(configured_ideal_step_time),
        }
        body: dict[str, Any] = {"emitter_version": __version__}
        for name, build in fields.items():
            value = self._lenient(build, None, name)
            if value:  # an empty name, no chips, no labels: nothing to say
                body[name] = value
        return body

    # -- plumbing ---------------------------------------------------------------------------

    def _open_lane(self) -> None:
        """Lets the per-step calls record into the current attempt's lane themselves: on the real
        clock only, which they read."""
        self._lane = self._worker.lane if self._worker is not None and self._now_ns is time.time_ns else None

    def _new_worker(self) -> BatchWorker:
        """A worker for a new attempt of the run, with an attempt id of its own."""
        self.attempt_id = uuid.uuid4().hex
        self._metric_names = set()
        settings = self.settings
        if self._worker is None:
            spool = Spool(settings.spool_dir, self.job_name, self.attempt_id, self._now_ns(),
                          max_bytes=settings.max_spool_bytes,
                          segment_bytes=settings.spool_segment_bytes, workload_uid=self.workload_uid)
        else:
            spool = self._worker.spool.next_attempt(self.attempt_id, self._now_ns(), self.workload_uid)
        return BatchWorker(self.job_name, self.attempt_id, self._transport, spool, settings,
                           heartbeat=self._automatic_heartbeat, workload_uid=self.workload_uid,
                           derive=self._collector(), may_start=self._may_start_thread,
                           restart=self._worker is not None)

    def _may_start_thread(self) -> bool:
        """Whether a worker's thread may start: fewer than MAX_RETIRING earlier attempts still
        deliver (their threads end first)."""
        return sum(not worker.done() for worker in self._retired) < MAX_RETIRING

    def _collector(self) -> AttemptCollector:
        """What the background thread adds to a new attempt's events (``emitter.collect``)."""
        return AttemptCollector(self._workload, self.settings.collect_configs, __version__,
                                functools.partial(self._count_dropped, "dropped_config_entries",
                                                  "collected configs"))

    def _start_new_attempt(self) -> None:
        """Has the current attempt's worker retire (deliver within the close timeout, from its own
        thread, the rest to the spool) and records from now on under a new attempt."""
        assert self._worker is not None
        # Attempts that ended leave only their counters, so many restarts hold little; and at
        # most MAX_RETIRING deliver at once: the oldest spools what it holds instead, and a new
        # attempt's thread starts once fewer deliver, so that restarts, however fast, start no
        # more threads than that.
        done = [worker for worker in self._retired if worker.done()]
        self._closed_stats = _summed([self._closed_stats, *(worker.stats for worker in done)])
        self._retired = [worker for worker in self._retired if worker not in done]
        for worker in self._retired[:len(self._retired) + 1 - MAX_RETIRING]:
            worker.retire_now()
        self._worker.retire(self.settings.close_timeout_s)
        if self._worker.done():  # it had no thread: it spooled what it held at once
            self._closed_stats = _summed([self._closed_stats, self._worker.stats])
        else:
            self._retired.append(self._worker)
        self._worker = self._new_worker()
        self._open_lane()

    def _record(self, kind: str, when: object, name: str, body: dict[str, Any],
                clock_hint: bool = True) -> None:
        if when is None:
            time_us = self._now_ns() // 1000
        else:
            time_us = _time_us(when, name)
            # An explicit time may be a simulated or backfilled clock: no more invented heartbeats.
            # A checkpoint's start is always explicit, so it says nothing about the clock.
            self._explicit_time = self._explicit_time or clock_hint
        worker = self._worker
        if worker is None:
            return
        if self._closed:
            if self._closed_at_exit:  # an exit hook that ran after the recorder's (the job's end)
                worker.deliver_late(time_us, kind, body, self.settings.close_timeout_s)
                return
            worker.count_dropped_after_close()
            if not self._dropped_after_close:
                self._dropped_after_close = True
                _LOG.warning("goodput recorder for %r is closed; dropping %s event and any later one "
                             "(logged once; counted in stats.dropped)", self.job_name, kind)
            return
        worker.put(time_us, kind, body)

    def _automatic_heartbeat(self) -> None:
        # Called from the worker thread while idle: only on the real clock, only mid-job.
        if self._in_job and not self._explicit_time and not self._closed and self._worker:
            self._worker.put(self._now_ns() // 1000, "heartbeat", {})

    # -- the reference's API ----------------------------------------------------------------

    @_guarded
    def record_job_start_time(self, start_time: datetime.datetime | None = None) -> None:
        """Records the start of this attempt, with the run's metadata.

        A second job start on one recorder is a restart: it begins a new attempt.
        """
        if self._worker is None:
            return
        if start_time is not None:
            _time_us(start_time, "start_time")  # a call that cannot be recorded starts nothing
        if self._job_started and not self._closed:
            self._start_new_attempt()
        self._record("job_start", start_time, "start_time", dict(self._metadata))
        self._job_started = self._in_job = True

    @_guarded
    def record_job_end_time(
        self, end_time: datetime.datetime | None = None, *, failed: bool | None = None
    ) -> None:
        """Records the end of this attempt.

        Args:
            end_time: When it ended (``None``: now).
            failed: Whether the attempt failed (a crash: the pipeline counts a disruption and the
                time until the next attempt as recovery) or stopped as planned. ``None`` (the
                default) infers it: a call made while an exception other than
                ``SystemExit(0)`` propagates (from a ``finally`` or an ``except`` block) records
                a failure; otherwise the pipeline decides from whether the next attempt re-runs
                steps this one ran.
        """
        if self._worker is None:
            return
        if failed is None:
            failed = _exception_propagating()
        body = {} if failed is None else {"failed": bool(failed)}
        self._record("job_end", end_time, "end_time", body)
        self._in_job = False

    # record_step_start_time, record_data_loading_start_time, record_data_loading_end_time and
    # record_model_metrics are the base class's (``emitter.lane``): a plain call records there,
    # every other one here.

    @_guarded_as("record_step_start_time")
    def _slow_step_start(self, step: Any, start_time: Any = None) -> None:
        if self._worker is not None:
            self._record("step_start", start_time, "start_time", {"step": _count(step, "step")})

    @_guarded
    def record_tpu_init_start_time(self, start_time: datetime.datetime | None = None) -> None:
        """Records the start of accelerator initialization."""
        if self._worker is not None:
            self._record("tpu_init_start", start_time, "start_time", {})

    @_guarded
    def record_tpu_init_end_time(self, end_time: datetime.datetime | None = None) -> None:
        """Records the end of accelerator initialization."""
        if self._worker is not None:
            self._record("tpu_init_end", end_time, "end_time", {})

    @_guarded
    def record_training_preparation_start_time(
        self, start_time: datetime.datetime | None = None
    ) -> None:
        """Records the start of training preparation (model setup, checkpoint load)."""
        if self._worker is not None:
            self._record("training_prep_start", start_time, "start_time", {})

    @_guarded
    def record_training_preparation_end_time(
        self, end_time: datetime.datetime | None = None
    ) -> None:
        """Records the end of training preparation."""
        if self._worker is not None:
            self._record("training_prep_end", end_time, "end_time", {})

    @_guarded_as("record_data_loading_start_time")
    def _slow_data_loading_start(self, start_time: Any = None) -> None:
        if self._worker is not None:
            self._record("data_loading_start", start_time, "start_time", {})

    @_guarded_as("record_data_loading_end_time")
    def _slow_data_loading_end(self, end_time: Any = None) -> None:
        if self._worker is not None:
            self._record("data_loading_end", end_time, "end_time", {})

    @_guarded
    def record_custom_badput_event_start_time(
        self,
        start_time: datetime.datetime | None = None,
        custom_badput_event_type: str = "unknown",
    ) -> None:
        """Records the start of a user-defined badput event (e.g. an eval step)."""
        if self._worker is not None:
            body = {"badput_type": _badput_type(custom_badput_event_type,
                                                "custom_badput_event_type")}
            self._record("custom_badput_start", start_time, "start_time", body)

    @_guarded
    def record_custom_badput_event_end_time(
        self,
        end_time: datetime.datetime | None = None,
        custom_badput_event_type: str = "unknown",
    ) -> None:
        """Records the end of a user-defined badput event."""
        if self._worker is not None:
            body = {"badput_type": _badput_type(custom_badput_event_type,
                                                "custom_badput_event_type")}
            self._record("custom_badput_end", end_time, "end_time", body)

    @_guarded
    def record_checkpoint_progress(self, step: int, checkpoint_start_time: object) -> None:
        """Does nothing, as in the reference; use ``record_checkpoint_save`` instead."""

    # -- the elastic recorder's API ---------------------------------------------------------

    @_guarded
    def record_elastic_slice_counts(
        self,
        active_slices: int,
        total_slices: int,
        available_slices: int,
        timestamp: datetime.datetime | None = None,
    ) -> None:
        """Records the slice counts of an elastic job."""
        if self._worker is not None:
            body = {
                "active_slices": _count(active_slices, "active_slices"),
                "total_slices": _count(total_slices, "total_slices"),
                "available_slices": _count(available_slices, "available_slices"),
            }
            if max(body["active_slices"], body["available_slices"]) > body["total_slices"]:
                raise ValueError(f"active_slices and available_slices must be at most "
                                 f"total_slices, got {body}")
            self._record("elastic_slice_counts", timestamp, "timestamp", body)

    @_guarded
    def record_elastic_wait_start_time(
        self, event_type: str, start_time: datetime.datetime | None = None
    ) -> None:
        """Records the start of an elastic wait (slice down or scale up)."""
        if self._worker is not None:
            body = {"event_type": _badput_type(event_type, "event_type")}
            self._record("elastic_wait_start", start_time, "start_time", body)

    @_guarded
    def record_elastic_wait_end_time(
        self, event_type: str, end_time: datetime.datetime | None = None
    ) -> None:
        """Records the end of an elastic wait."""
        if self._worker is not None:
            body = {"event_type": _badput_type(event_type, "event_type")}
            self._record("elastic_wait_end", end_time, "end_time", body)

    @_guarded
    def record_elastic_reinit_start_time(self, start_time: datetime.datetime | None = None) -> None:
        """Records the start of an elastic re-initialization."""
        if self._worker is not None:
            self._record("elastic_reinit_start", start_time, "start_time", {})

    @_guarded
    def record_elastic_reinit_end_time(self, end_time: datetime.datetime | None = None) -> None:
        """Records the end of an elastic re-initialization."""
        if self._worker is not None:
            self._record("elastic_reinit_end", end_time, "end_time", {})

    # -- beyond the reference ---------------------------------------------------------------

    @_guarded
    def record_checkpoint_save(
        self,
        step: int,
        start_time: datetime.datetime,
        end_time: datetime.datetime | None = None,
        persistent: bool = True,
    ) -> None:
        """Records a checkpoint save that blocked training from ``start_time`` to ``end_time``.

        Args:
            step: The last step included in the checkpoint.
            start_time: When training blocked.
            end_time: When training resumed (``None``: now).
            persistent: ``True`` for persistent storage, ``False`` for a local or in-memory tier.
        """
        if self._worker is not None:
            body = {"step": _count(step, "step"),
                    "blocking_s": self._blocking_s(start_time, end_time, "checkpoint save"),
                    "persistent": bool(persistent)}
            self._record("checkpoint_save", start_time, "start_time", body, clock_hint=False)

    @_guarded
    def record_checkpoint_restore(
        self,
        step: int,
        start_time: datetime.datetime,
        end_time: datetime.datetime | None = None,
    ) -> None:
        """Records a checkpoint restore of ``step`` that ran from ``start_time`` to ``end_time``."""
        if self._worker is not None:
            body = {"step": _count(step, "step"),
                    "blocking_s": self._blocking_s(start_time, end_time, "checkpoint restore")}
            self._record("checkpoint_restore", start_time, "start_time", body, clock_hint=False)

    @_guarded
    def record_heartbeat(self, time_: datetime.datetime | None = None) -> None:
        """Records that the job is alive (automatic while idle on the real clock)."""
        if self._worker is not None:
            self._record("heartbeat", time_, "time_", {})

    @_guarded_as("record_model_metrics")
    def _slow_model_metrics(self, step: Any, *, loss: Any = None, step_time_s: Any = None,
                            tokens_per_s: Any = None, samples_per_s: Any = None, mfu: Any = None,
                            tflops_per_device: Any = None, time_: Any = None) -> None:
        if self._worker is None:
            return
        body: dict[str, Any] = {"step": _count(step, "step")}
        metrics = (loss, step_time_s, tokens_per_s, samples_per_s, mfu, tflops_per_device)
        for name, value in zip(MODEL_METRICS, metrics, strict=True):
            if value is not None:
                body[name] = _metric(value, name)
        self._record("model_metrics", time_, "time_", body)

    @_guarded
    def record_configs(self, configs: Mapping[str, Any], time_: datetime.datetime | None = None) -> None:
        """Records the job's own configuration (source ``user``), flat or nested (``emitter.configs``
        says how it is flattened and made text): model sizes, optimizer settings, batch size,
        seed... Pass ``vars(args)``, ``dataclasses.asdict(config)`` or a config's ``to_dict()``.

        Entries the contract's limits refuse, and those past ``MAX_CONFIG_ENTRIES``, are left
        out, counted in ``stats.dropped_config_entries`` and logged once (a strict recorder
        raises ``ValueError`` instead).
        """
        if self._worker is None:
            return
        if not isinstance(configs, Mapping):
            raise ValueError(f"configs must be a mapping, got {type(configs).__name__}")
        if time_ is not None:
            _time_us(time_, "time_")  # before the work of flattening
        fitted = fit_configs(configs)
        if fitted.dropped:
            if self._strict:
                raise ValueError(fitted.reason)
            self._count_dropped("dropped_config_entries", "record_configs", fitted.dropped, fitted.reason)
        self._record("configs", time_, "time_", {"source": "user", "values": fitted.values})

    @_guarded
    def record_metrics(self, values: Mapping[str, float], step: int | None = None,
                       time_: datetime.datetime | None = None) -> None:
        """Records named metrics at ``step`` (``None``: at the event time alone), dated ``time_``
        (``None``: now)::

            recorder.record_metrics({metrics.LOSS: loss, metrics.LEARNING_RATE: lr}, step=step)

        Names are ML Diagnostics' (``emitter.metrics``) or the job's own. A value is any
        number (numpy and jax scalars too), non-finite ones included (a diverged loss). An
        attempt records at most ``MAX_METRIC_NAMES`` distinct names: values of further names
        are left out, counted in ``stats.dropped_metric_values`` and logged once (a strict
        recorder raises ``ValueError``). More than ``MAX_METRICS_PER_EVENT`` values make
        several events.
        """
        if self._worker is None:
            return
        if not isinstance(values, Mapping) or not values:
            raise ValueError(f"values must be a non-empty mapping of metric names to numbers, got "
                             f"{values!r:.80}")
        if step is not None and (type(step) is not int or not 0 <= step <= MAX_COUNT):
            step = _count(step, "step")
        if time_ is not None:
            _time_us(time_, "time_")
        known = self._metric_names
        checked = {(name if name in known else _metric_name(name)):
                   (value if type(value) is float and value - value == 0.0 else _metric(value, name))
                   for name, value in values.items()}
        new = [name for name in checked if name not in known]
        room = MAX_METRIC_NAMES - len(known)
        if len(new) > room:
            over = new[room:]
            reason = (f"{len(known) + len(new)} metric names in this attempt, more than "
                      f"MAX_METRIC_NAMES ({MAX_METRIC_NAMES}): left out {over[0]!r:.80}")
            if self._strict:
                raise ValueError(reason)
            for name in over:
                del checked[name]
            self._count_dropped("dropped_metric_values", "record_metrics", len(over), reason)
            new = new[:room]
        known.update(new)
        names = list(checked)
        for first in range(0, len(names), MAX_METRICS_PER_EVENT):
            body: dict[str, Any] = {"values": {name: checked[name]
                                               for name in names[first:first + MAX_METRICS_PER_EVENT]}}
            if step is not None:
                body["step"] = step
            self._record("metrics", time_, "time_", body)

    @_guarded
    def record_host_steps(self, host: str, count: int, mean_s: float, max_s: float,
                          time_: datetime.datetime | None = None) -> None:
        """Records a summary of one host's own step times since its previous summary: ``count``
        steps, their mean and longest time in seconds, ending at ``time_`` (``None``: now).
        ``HostStepTimer`` makes these summaries; the pipeline compares a run's hosts with each
        other to find a straggler."""
        if self._worker is None:
            return
        name, steps = _text(host, "host"), _count(count, "count")
        mean, longest = _step_seconds(mean_s, "mean_s"), _step_seconds(max_s, "max_s")
        problem = host_steps_problem(name, steps, mean, longest)
        if problem is not None:
            raise ValueError(problem)
        self._record("host_steps", time_, "time_", {"host": name, "count": steps, "mean_s": mean,
                                                     "max_s": longest})

    def _seconds(self, timeout: object, method: str) -> float:
        """A timeout as given, if it is a number of seconds >= 0; else counted, and the default."""
        try:
            seconds = _number(timeout, "timeout")
            if math.isnan(seconds) or seconds < 0:
                raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r:.80}")
        except ValueError as error:
            self._invalid_call(method, error)
            return self.settings.close_timeout_s
        return min(seconds, threading.TIMEOUT_MAX)

    def _blocking_s(self, start_time: object, end_time: object, what: str) -> float:
        if start_time is None:
            raise ValueError("start_time is required")
        start = _time_us(start_time, "start_time")
        if end_time is not None:
            end = _time_us(end_time, "end_time")
            if end < start:
                raise ValueError(f"end_time is before start_time by {(start - end) / 1e6:.6f} s")
            return (end - start) / 1e6
        end = self._now_ns() // 1000
        if end < start:
            # "Now" is before the caller's start: the wall clock jumped back in between. Not
            # the caller's mistake, so no error; the true duration is unknown.
            _LOG.warning("goodput recorder for %r: the clock is %.6f s before the %s's "
                         "start_time; recording it as not blocking", self.job_name,
                         (start - end) / 1e6, what)
            return 0.0
        return (end - start) / 1e6

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def stats(self) -> EmitterStats:
        """Counters of this recorder, over all its attempts: recorded, sent, spilled, dropped
        events and send errors."""
        with self._dropped_lock:
            invalid = EmitterStats(invalid_calls=sum(self._invalid.values()), **self._dropped_values)
        if self._worker is None:
            return invalid
        return _summed([self._closed_stats, *(worker.stats for worker in self._retired),
                        self._worker.stats, invalid])

    @_guarded
    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every event recorded so far is delivered or counted as dropped; False if
        ``timeout`` ran out (an invalid one is counted, and ``close_timeout_s`` applies)."""
        if self._worker is None:
            return True
        if timeout is not None:
            timeout = self._seconds(timeout, "flush")
        deadline = None if timeout is None else time.monotonic() + timeout
        delivered = self._worker.flush(timeout)
        return all([worker.wait(deadline) for worker in self._retired]) and delivered

    @_guarded
    def close(self, timeout: float | None = None) -> bool:
        """Delivers what it can within ``timeout`` and stops; idempotent.

        Events still undelivered at the deadline stay in the spool, and the next process of
        the run sends them. Returns whether everything was delivered. An invalid ``timeout`` is
        counted, and ``close_timeout_s`` applies.
        """
        limit = self.settings.close_timeout_s if timeout is None else self._seconds(timeout, "close")
        with self._close_lock:
            if self._closed or self._worker is None:
                return True
            self._closed = True
            self._lane = None
        atexit.unregister(self._exit_hook)
        delivery_time = getattr(self._transport.inner, "delivery_time", None)
        if delivery_time is not None:  # nowhere to deliver: to the spool at once
            limit = delivery_time(limit)
        deadline = time.monotonic() + limit
        delivered = self._worker.close(limit)
        for worker in self._retired:  # earlier attempts: delivered by the deadline, else spooled
            if not worker.wait(deadline):
                delivered = False
                if not worker.done():
                    worker.retire_now()
                    worker.close(max(0.0, deadline - time.monotonic()))
        self._transport.close_inner(max(0.0, deadline - time.monotonic()))
        stats = self.stats
        if stats.dropped:
            _LOG.warning("goodput recorder for %r lost %d of %d events", self.job_name,
                         stats.dropped, stats.recorded)
        return delivered

    def _exit_hook(self) -> None:
        # An exit hook the job registered before the recorder was made runs after this one: what
        # it records (the job's end) is sent at once (``BatchWorker.deliver_late``), not dropped.
        self._closed_at_exit = not self._closed
        self.close()

    def __enter__(self) -> GoodputRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _after_fork(self) -> None:
        if self._worker is None or self._closed:
            return
        self._close_lock = threading.RLock()
        self._retired, self._closed_stats = [], EmitterStats()  # the parent delivers its own
        self.attempt_id = uuid.uuid4().hex
        self._metric_names = set()
        self._dropped_lock = threading.Lock()
        if self._workload is not None:
            self._workload.after_fork()
        self._worker.after_fork(self.attempt_id, self._now_ns(), self._collector())
        self._open_lane()
        self._in_job = self._job_started = False


#: The reference's elastic recorder; every elastic method is on ``GoodputRecorder`` already.
ElasticGoodputRecorder = GoodputRecorder


def _summed(parts: list[EmitterStats]) -> EmitterStats:
    return EmitterStats(**{field.name: sum(getattr(part, field.name) for part in parts)
                           for field in dataclasses.fields(EmitterStats)})


class _Shared:
    """One recorder's transport, shared by the workers of its attempts: one send at a time,
    closed once, when the recorder closes. A send waits for another at most ``wait_s``, and
    gives up once its worker stops (``send_unless``): a send stuck on its destination holds no
    other worker's thread."""

    def __init__(self, inner: Transport, wait_s: float) -> None:
        self.inner = inner
        self._wait_s = wait_s
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        self.send_unless(message, lambda: False)

    def send_unless(self, message: Message, stopping: Callable[[], bool]) -> None:
        """Sends ``message``; raises ``SendCancelled`` if ``stopping()`` while another send holds
        the transport, ``TimeoutError`` if it holds it for ``wait_s``."""
        deadline = time.monotonic() + self._wait_s
        while not self._lock.acquire(timeout=_SHARED_POLL_S):
            if stopping():
                raise SendCancelled
            if time.monotonic() >= deadline:
                raise TimeoutError(f"another send to {self.inner!r} has been under way for "
                                   f"{self._wait_s:g} s")
        try:
            self.inner.send(message)
        finally:
            self._lock.release()

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self.inner.after_fork()

    def close(self) -> None:
        """A worker is done with it; the recorder closes it with ``close_inner``."""

    def close_inner(self, timeout: float) -> None:
        """Closes the transport, waiting ``timeout`` at most: a send stuck on its destination (a
        FIFO nobody reads, a hung mount) may hold it, and must not hold up the job's exit."""
        try:
            closer = threading.Thread(target=self._close_inner, name="goodput-emitter-close",
                                      daemon=True)
            closer.start()
        except RuntimeError:  # no new threads at interpreter shutdown: the process is ending
            return
        closer.join(timeout)
        if closer.is_alive():
            _LOG.warning("goodput emitter: %r did not close within %.1f s (a send is stuck on "
                         "it); leaving it", self.inner, timeout)

    def _close_inner(self) -> None:
        try:
            self.inner.close()
        except Exception as error:  # noqa: BLE001 - a transport must not break close()
            _LOG.warning("goodput emitter: closing %r failed: %s", self.inner, error)

    def __repr__(self) -> str:
        return repr(self.inner)


def _exception_propagating() -> bool | None:
    """True while an exception other than a clean ``SystemExit`` is being raised or handled;
    None (unknown) otherwise."""
    error = sys.exc_info()[1]
    if error is None or (isinstance(error, SystemExit) and error.code in (None, 0)):
        return None
    return True


def _after_fork_in_child(reference: weakref.ref[GoodputRecorder]) -> None:
    recorder = reference()
    if recorder is not None:
        recorder._after_fork()


def _with_reference_keywords(
    settings: EmitterSettings,
    grace_period_s: float | None,
    batch_size: int | None,
    max_latency_s: float | None,
) -> EmitterSettings:
    changes: dict[str, Any] = {}
    if grace_period_s is not None:
        changes["close_timeout_s"] = grace_period_s
    if batch_size is not None:
        changes["max_batch_events"] = batch_size
    if max_latency_s is not None:
        changes["max_latency_s"] = max_latency_s
    return dataclasses.replace(settings, **changes) if changes else settings
