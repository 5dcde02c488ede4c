"""The reference's ``monitoring`` module: ``GoodputMonitor`` writes its TensorBoard scalars from
the pipeline's tables.

The reference's monitor starts up to three processes per job that poll Cloud Logging, recompute,
and upload to Cloud Monitoring and TensorBoard. Here the pipeline computes for every run and
uploads the ``workload/*`` Cloud Monitoring metrics centrally, so the monitor never touches Cloud
Logging or Cloud Monitoring. Given a ``tensorboard_dir``, it writes the reference's TensorBoard
scalars to ``<tensorboard_dir>/goodput``, read through ``goodput.GoodputCalculator``:

* ``goodput/goodput``: goodput % at global step = max productive step, every ``upload_interval``
  seconds (``start_goodput_uploader``);
* ``badput/<bucket>`` and ``badput/custom_badput_events/<type>`` (lower case): badput % per bucket
  at the same step, with ``include_badput_breakdown``;
* ``step_deviation``: |step time - ideal step time| in seconds at global step = the step, every
  ``step_deviation_interval_seconds`` (``start_step_deviation_uploader``, with
  ``include_step_deviation``). The reference rewrites every step's value each time; here a value
  is written again only when it changed.

The reference writes rolling-window goodput and slice efficiency to Cloud Monitoring only, never
to TensorBoard, so ``start_rolling_window_goodput_uploader`` starts nothing: the pipeline uploads
those (its ``--windows``).

Each uploader is one daemon thread that never raises into the training process; a run with no
snapshot yet is polled on quietly. ``stop_*`` wakes the thread, lets it write once more (unless
``skip_final_flush``) and waits at most ``final_flush_timeout_seconds``. As the reference's: with
``monitoring_enabled=False`` nothing starts; here also without a ``tensorboard_dir``, or when the
tables cannot be located (``duckdb_path=``, ``bigquery_dataset=`` or their environment variables,
as for the calculator). Each of those says why once, through ``logging``.

The reference takes its intervals and options as they are, and its worker fails later on one that
is not a number (or spins on zero). Here a number given as text (``"60"``) is that number; an
interval under ``MIN_INTERVAL_S`` (zero, negative) is ``MIN_INTERVAL_S``, so that no uploader
spins; one that is not a number at all is 10 s (the reference's default step-deviation interval);
an infinite one, like None, writes only on stopping. Likewise a ``final_flush_timeout_seconds``
that is not a number is the default, and a ``configured_ideal_step_time`` that is not a positive
number is left out (the run's own is used). Each of those is logged once.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import math
import numbers
import os
import threading
from collections.abc import Callable
from typing import Any

from ml_goodput_measurement.src.goodput import BadputBreakdown, GoodputCalculator
from ml_goodput_measurement.src.goodput_utils import GCPOptions

_LOG = logging.getLogger(__name__)

_TENSORBOARD_SUBDIR = "goodput"
_GOODPUT_LABEL = "goodput"
_BADPUT_LABEL = "badput"
_STEP_DEVIATION_LABEL = "step_deviation"
#: The reference's wait for an uploader that stops without a final flush, and its default
#: ``final_flush_timeout_seconds``.
_TERMINATION_TIMEOUT_S = 10
#: A default equal to the reference's ``GCPOptions()``; it is never modified.
_DEFAULT_GCP_OPTIONS = GCPOptions()

#: tensorboardX writes an event from a queue in its own thread, and its ``flush`` does not wait for
#: the queue; that thread flushes every so many seconds.
_FLUSH_S = 1
_WRITERS = itertools.count()

_CUMULATIVE, _STEP_DEVIATION = "cumulative", "step_deviation"
#: The shortest wait between an uploader's polls: each poll queries the tables (in BigQuery, a
#: billed query), and the pipeline writes a run's snapshot every 30 s by default.
MIN_INTERVAL_S = 1.0
#: The wait of an uploader whose interval is not a number: the reference's default
#: ``step_deviation_interval_seconds``.
_FALLBACK_INTERVAL_S = 10.0
#: Makes an uploader's cycle, writing with the given writer.
_CycleFactory = Callable[["_Writer"], Callable[[], None]]


def _seconds(value: object) -> float | None:
    """A number of seconds given as a number or as its text; None for anything else or NaN."""
    if isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            return None
    elif isinstance(value, numbers.Real):
        seconds = float(value)
    else:
        return None
    return None if math.isnan(seconds) else seconds


def _scalars(breakdown: BadputBreakdown) -> list[tuple[str, float, str]]:
    """(tag, value, display name) of a badput breakdown, named as the reference names them."""
    scalars: list[tuple[str, float, str]] = []
    for bucket, value in breakdown.items():
        name = bucket.name.lower()
        if isinstance(value, dict):
            scalars.extend((f"{_BADPUT_LABEL}/{name}/{sub}".lower(), float(sub_value), sub.lower())
                           for sub, sub_value in value.items())
        else:
            scalars.append((f"{_BADPUT_LABEL}/{name}", float(value), name))
    return scalars


class _Writer:
    """The monitor's one TensorBoard event writer, shared by its uploaders.

    It is made on first use, so an uploader that never has data creates no directory or file,
    and closed when the last uploader using it ends. One writer, and a file name of its own each
    time one is made: tensorboardX names event files by the second and host, so two writers made
    in the same second would write the same file.
    """

    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        self._lock = threading.Lock()
        self._users = 0
        self._writer: Any = None

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._writer is not None:
                self._writer.close()
                self._writer = None

    def scalar(self, tag: str, value: float, step: int, display_name: str = "") -> None:
        with self._lock:
            if self._writer is None:
                from tensorboardX import SummaryWriter

                self._writer = SummaryWriter(self.logdir, flush_secs=_FLUSH_S,
                                             filename_suffix=f".{os.getpid()}.{next(_WRITERS)}")
            self._writer.add_scalar(tag, value, step, display_name=display_name)

    def flush(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.flush()


class _Uploader:
    """One daemon thread that runs ``cycle`` every ``interval_s`` until stopped, and once more on
    a final flush; whatever ``cycle`` raises is logged, never raised."""

    def __init__(self, name: str, interval_s: float | None, cycle: Callable[[], None],
                 close: Callable[[], None]) -> None:
        self.name = name
        self._interval_s = interval_s
        self._cycle = cycle
        self._close = close
        self._stop = threading.Event()
        self._final_flush = threading.Event()
        self._reported: set[str] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def run_once(self, timeout_s: float | None) -> bool:
        """Runs one cycle in the thread; False if it is still running after ``timeout_s``."""
        self._final_flush.set()
        self._stop.set()
        self._thread.start()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, final_flush: bool, timeout_s: float | None) -> bool:
        """Stops the thread (after one more cycle if ``final_flush``); False if it is still
        running after ``timeout_s`` (None: no limit)."""
        if final_flush:
            self._final_flush.set()
        self._stop.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval_s):
                self._safely(self._cycle)
            if self._final_flush.is_set():
                self._safely(self._cycle)
        finally:
            self._safely(self._close)

    def _safely(self, work: Callable[[], None]) -> None:
        try:
            work()
        except ValueError as error:  # the calculator's "nothing to measure yet"
            self._report(logging.INFO, f"{self.name}: nothing to write yet ({error}); polling on")
        except Exception as error:  # noqa: BLE001  (a monitor must never fail the training process)
            self._report(logging.WARNING, f"{self.name}: {type(error).__name__}: {error}")

    def _report(self, level: int, message: str) -> None:
        """Logs a message the first time; its repeats at DEBUG, so a poll does not flood the log."""
        first = message not in self._reported
        self._reported.add(message)
        _LOG.log(level if first else logging.DEBUG, "%s", message)


class GoodputMonitor:
    """The reference's ``GoodputMonitor``: its arguments, its uploaders, its TensorBoard scalars.

    Every argument of the reference is accepted and kept as an attribute; those about Cloud
    Logging, Cloud Monitoring and the reference's cache (``gcp_options``,
    ``gcs_sync_interval_seconds``, ``cache_dir``, ``max_logs_retention_period``,
    ``pathway_enabled``) change nothing. ``duckdb_path``, ``bigquery_dataset`` and
    ``bigquery_client`` say where the pipeline's tables are, as for ``GoodputCalculator``
    (default: ``$GOODPUT_DUCKDB`` or ``$GOODPUT_BIGQUERY_DATASET``).
    """

    _calculator_class: type[GoodputCalculator] = GoodputCalculator

    def __init__(
        self,
        job_name: str,
        logger_name: str,
        tensorboard_dir: str,
        upload_interval: int,
        monitoring_enabled: bool = False,
        pathway_enabled: bool = False,
        include_badput_breakdown: bool = False,
        include_step_deviation: bool = False,
        configured_ideal_step_time: float | None = None,
        step_deviation_interval_seconds: int = 10,
        gcp_options: GCPOptions = _DEFAULT_GCP_OPTIONS,
        skip_final_flush: bool = False,
        final_flush_timeout_seconds: float | None = _TERMINATION_TIMEOUT_S,
        gcs_sync_interval_seconds: int = 3600,
        cache_dir: str = "/tmp",
        max_logs_retention_period: datetime.timedelta | None = None,
        *,
        duckdb_path: str | os.PathLike[str] | None = None,
        bigquery_dataset: str | None = None,
        bigquery_client: Any = None,
    ) -> None:
        self.job_name = job_name
        self.logger_name = logger_name
        self.tensorboard_dir = tensorboard_dir
        self.upload_interval = upload_interval
        self.monitoring_enabled = monitoring_enabled
        self.pathway_enabled = pathway_enabled
        self.include_badput_breakdown = include_badput_breakdown
        self.include_step_deviation = include_step_deviation
        self.configured_ideal_step_time = configured_ideal_step_time
        self.step_deviation_interval_seconds = step_deviation_interval_seconds
        self.gcp_options = gcp_options
        self.skip_final_flush = skip_final_flush
        self.final_flush_timeout_seconds = final_flush_timeout_seconds
        self.gcs_sync_interval_seconds = gcs_sync_interval_seconds
        self.cache_dir = cache_dir
        self.max_logs_retention_period = max_logs_retention_period
        self.rolling_windows_seconds: list[int] = []
        self._lock = threading.Lock()
        self._told: set[str] = set()
        self._uploaders: dict[str, _Uploader] = {}
        self._calculator: GoodputCalculator | None = None
        # Why nothing starts, if nothing does: (level, message), said once.
        self._idle: tuple[int, str] | None = None
        if not monitoring_enabled:
            self._idle = (logging.INFO, "monitoring is disabled (monitoring_enabled=False), so this "
                                        "GoodputMonitor starts no uploader")
        elif not tensorboard_dir:
            self._idle = (logging.INFO, "monitoring is central: the fleet goodput pipeline computes and "
                                        "uploads goodput, badput, rolling windows and step deviation from "
                                        "the recorder's events, and with no tensorboard_dir this "
                                        "GoodputMonitor starts no uploader (query the figures with "
                                        "goodput.GoodputCalculator)")
        else:
            try:
                self._calculator = self._calculator_class(
                    job_name, logger_name, using_pathways=pathway_enabled, gcs_path=tensorboard_dir,
                    cache_dir=cache_dir, max_logs_retention_period=max_logs_retention_period,
                    duckdb_path=duckdb_path, bigquery_dataset=bigquery_dataset,
                    bigquery_client=bigquery_client)
            except ValueError as error:
                self._idle = (logging.WARNING, f"this GoodputMonitor writes no TensorBoard scalars: {error}")
        # Only a monitor that writes needs the path: the reference's disabled one takes any value.
        self._logdir = "" if self._calculator is None else os.path.join(tensorboard_dir, _TENSORBOARD_SUBDIR)
        self._writer = _Writer(self._logdir)

    # -- the reference's API ---------------------------------------------------------------------

    def start_goodput_uploader(self) -> None:
        """Writes goodput (and badput) to TensorBoard every ``upload_interval`` seconds."""
        self._start(_CUMULATIVE, self._interval("upload_interval", self.upload_interval), self._goodput_cycle)

    def stop_goodput_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stops the goodput uploader, after a final write unless ``skip_final_flush``."""
        self._stop(_CUMULATIVE, skip_final_flush, self._goodput_cycle)

    def start_step_deviation_uploader(self) -> None:
        """Writes step deviation to TensorBoard every ``step_deviation_interval_seconds``, with
        ``include_step_deviation``."""
        if self._calculator is not None and not self.include_step_deviation:
            self._tell("Step deviation monitoring is disabled (include_step_deviation=False): no step "
                       "deviation uploader starts", logging.INFO)
            return
        self._start(_STEP_DEVIATION, self._interval("step_deviation_interval_seconds",
                                                    self.step_deviation_interval_seconds),
                    self._step_deviation_cycle)

    def stop_step_deviation_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stops the step deviation uploader, after a final write unless ``skip_final_flush``."""
        self._stop(_STEP_DEVIATION, skip_final_flush,
                   self._step_deviation_cycle if self.include_step_deviation else None)

    def start_rolling_window_goodput_uploader(self, rolling_windows_seconds: list[int]) -> None:
        """Starts nothing: the reference sends rolling windows to Cloud Monitoring only, and the
        pipeline uploads those for every run (its ``--windows``)."""
        try:
            self.rolling_windows_seconds = list(rolling_windows_seconds)
        except TypeError:  # the reference keeps it as it is, and its worker fails on it
            self.rolling_windows_seconds = []
        if self._idle is not None:
            self._tell_idle()
            return
        self._tell("rolling-window goodput goes to Cloud Monitoring only, never to TensorBoard, and "
                   "the pipeline uploads it centrally: no rolling-window uploader starts", logging.INFO)

    def stop_rolling_window_goodput_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stops nothing (none was started); returns at once."""
        if self._idle is not None:
            self._tell_idle()

    # -- uploads ---------------------------------------------------------------------------------

    def _goodput_cycle(self, writer: _Writer) -> Callable[[], None]:
        calculator = self._calculator
        assert calculator is not None
        last: object = None

        def cycle() -> None:
            nonlocal last
            goodput_pct, breakdown, step = calculator.get_job_goodput(
                include_badput_breakdown=self.include_badput_breakdown)
            figures = (goodput_pct, breakdown, step)
            if figures == last:
                return  # no new snapshot since the last write
            writer.scalar(f"{_GOODPUT_LABEL}/{_GOODPUT_LABEL}", float(goodput_pct), step,
                          display_name=_GOODPUT_LABEL)
            if self.include_badput_breakdown:
                for tag, value, name in _scalars(breakdown):
                    writer.scalar(tag, value, step, display_name=name)
            writer.flush()
            last = figures

        return cycle

    def _step_deviation_cycle(self, writer: _Writer) -> Callable[[], None]:
        calculator = self._calculator
        assert calculator is not None
        written: dict[int, float] = {}
        ideal = self._ideal_step_time()

        def cycle() -> None:
            deviations = calculator.get_step_deviation(ideal)
            changed = {step: value for step, value in deviations.items() if written.get(step) != value}
            for step, value in changed.items():
                writer.scalar(_STEP_DEVIATION_LABEL, float(value), step)
            writer.flush()
            written.update(changed)

        return cycle

    # -- lifecycle -------------------------------------------------------------------------------

    def _interval(self, name: str, value: object) -> float | None:
        """The wait between an uploader's polls for the interval argument ``name``; None: no
        periodic write (the reference's for None)."""
        seconds = _seconds(value)
        if value is None or (seconds is not None and seconds > threading.TIMEOUT_MAX):
            self._tell(f"{name}={value!r}: the uploader writes only when it is stopped", logging.INFO)
            return None
        if seconds is None:
            self._tell(f"{name}={value!r} is not a number of seconds: the uploader writes every "
                       f"{_FALLBACK_INTERVAL_S:g} s", logging.WARNING)
            return _FALLBACK_INTERVAL_S
        if seconds < MIN_INTERVAL_S:
            self._tell(f"{name}={value!r} is under {MIN_INTERVAL_S:g} s: the uploader writes every "
                       f"{MIN_INTERVAL_S:g} s", logging.WARNING)
            return MIN_INTERVAL_S
        if isinstance(value, str):
            self._tell(f"{name}={value!r}: the uploader writes every {seconds:g} s", logging.INFO)
        return seconds

    def _final_flush_timeout(self) -> float | None:
        """How long a stop waits for the final write (None: until it is done)."""
        value = self.final_flush_timeout_seconds
        seconds = _seconds(value)
        if value is None or (seconds is not None and seconds > threading.TIMEOUT_MAX):
            return None
        if seconds is None:
            self._tell(f"final_flush_timeout_seconds={value!r} is not a number of seconds: a stop waits "
                       f"{_TERMINATION_TIMEOUT_S} s for the final write", logging.WARNING)
            return _TERMINATION_TIMEOUT_S
        return max(0.0, seconds)

    def _ideal_step_time(self) -> float | None:
        """``configured_ideal_step_time`` as the calculator takes it: a positive number of seconds,
        or None (the run's own)."""
        value = self.configured_ideal_step_time
        seconds = _seconds(value)
        if value is None or (seconds is not None and 0 < seconds < math.inf):
            return seconds
        self._tell(f"configured_ideal_step_time={value!r} is not a positive number of seconds: step "
                   "deviation is against the run's own ideal step time", logging.WARNING)
        return None

    def _start(self, name: str, interval_s: float | None, make_cycle: _CycleFactory) -> None:
        if self._calculator is None:
            self._tell_idle()
            return
        with self._lock:
            running = self._uploaders.get(name)
            if running is not None and running.is_alive():
                _LOG.warning("the %s uploader of %r is already running", name, self.job_name)
                return
            self._writer.acquire()
            uploader = _Uploader(f"goodput-{name}-{self.job_name}", interval_s, make_cycle(self._writer),
                                 self._writer.release)
            self._uploaders[name] = uploader
            uploader.start()
        _LOG.info("%s uploader of %r started: TensorBoard scalars in %s", name, self.job_name, self._logdir)

    def _stop(self, name: str, skip_final_flush: bool | None,
              make_cycle: _CycleFactory | None) -> None:
        if self._calculator is None:
            self._tell_idle()
            return
        skip = self.skip_final_flush if skip_final_flush is None else skip_final_flush
        # As the reference's: the final write may take final_flush_timeout_seconds; a stop
        # without one waits a fixed while for the thread to notice.
        timeout_s = _TERMINATION_TIMEOUT_S if skip else self._final_flush_timeout()
        with self._lock:
            uploader = self._uploaders.pop(name, None)
        if uploader is not None:
            finished = uploader.stop(final_flush=not skip, timeout_s=timeout_s)
        elif skip or make_cycle is None:
            return
        else:  # as the reference's: no uploader ran, so write once now, bounded the same way
            self._writer.acquire()
            finished = _Uploader(f"goodput-final-{name}-{self.job_name}", 0.0, make_cycle(self._writer),
                                 self._writer.release).run_once(timeout_s)
        if not finished:
            _LOG.warning("the %s uploader of %r did not finish within %s s and is abandoned (a daemon "
                         "thread: it does not hold up exit); its final write may be missing",
                         name, self.job_name, timeout_s)

    def _tell_idle(self) -> None:
        assert self._idle is not None
        level, message = self._idle
        self._tell(f"goodput monitoring of {self.job_name!r}: {message}", level)

    def _tell(self, message: str, level: int) -> None:
        with self._lock:
            if message in self._told:
                return
            self._told.add(message)
        _LOG.log(level, "%s", message)


__all__ = ["GCPOptions", "GoodputMonitor"]
