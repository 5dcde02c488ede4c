"""``HostStepTimer``: every host's own step times, summarized, so that the pipeline can find a
straggler (one host slower than the run's others).

In synchronous training every host's step lasts as long as the slowest host's, so the step
starts the goodput recorder records cannot tell which host is slow. Each host times its own part
of a step instead (its input pipeline, or its compute measured before the collective), and
sends one small ``host_steps`` event per ``interval_s`` (count, mean and longest time) from every
host, ``logging_enabled`` or not::

    timer = HostStepTimer("llama-70b-run-7", host=f"worker-{jax.process_index()}")
    for step in range(start_step, num_steps):
        with timer.measure():
            batch = next(batches)  # this host's own part of the step
        state = train_step(state, batch)
    timer.close()

A call costs about a microsecond and never raises or blocks: like ``GoodputRecorder``, what it
cannot record is logged once and counted. The summaries travel through a ``GoodputRecorder`` of
their own (an attempt of their own), so they never change the run's goodput.
"""

from __future__ import annotations

import contextlib
import math
import socket
import time
from collections.abc import Callable, Iterator

from emitter.recorder import GoodputRecorder
from emitter.settings import EmitterSettings
from emitter.transports import Transport
from emitter.worker import EmitterStats

#: Seconds between a host's summaries: the pipeline scores hosts per minute.
DEFAULT_INTERVAL_S = 60.0


class HostStepTimer:
    """Summarizes this host's own step times and records one summary per ``interval_s``.

    Args:
        job_name: The run id, as the run's ``GoodputRecorder`` has it.
        host: This host's name in the run (default: the hostname).
        destination: As ``GoodputRecorder`` takes it (default: ``$GOODPUT_DESTINATION``, else
            the fleet's topic).
        interval_s: Seconds between summaries; a summary is recorded at the first step after.
        settings: Batching, spooling and retry settings (``EmitterSettings``).
        enabled: ``False`` makes every call a no-op.
        clock: Monotonic seconds (``time.perf_counter``); for tests.
        strict: Raise ``ValueError`` for an argument that cannot be recorded (for tests).
    """

    def __init__(self, job_name: str, host: str | None = None, *,
                 destination: str | Transport | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 settings: EmitterSettings | None = None, enabled: bool = True,
                 clock: Callable[[], float] = time.perf_counter, strict: bool = False) -> None:
        self.recorder = GoodputRecorder(job_name, logging_enabled=enabled, destination=destination,
                                        settings=settings, strict=strict)
        self.host = socket.gethostname() if host is None else host
        if not (isinstance(interval_s, (int, float)) and 0 < interval_s < math.inf):
            self.recorder._invalid_call("HostStepTimer", ValueError(
                f"interval_s must be a number of seconds > 0, got {interval_s!r:.80}"))
            interval_s = DEFAULT_INTERVAL_S
        self.interval_s = float(interval_s)
        self._clock = clock
        self._count, self._total, self._longest = 0, 0.0, 0.0
        self._due = clock() + self.interval_s

    def record(self, seconds: float) -> None:
        """Adds one step's time on this host, in seconds; records the summary when it is due."""
        try:
            if type(seconds) is not float:
                seconds = float(seconds)
            if not 0 <= seconds < math.inf:
                raise ValueError(f"a step time must be a finite number of seconds >= 0, got {seconds}")
            self._count += 1
            self._total += seconds
            if seconds > self._longest:
                self._longest = seconds
            if self._clock() >= self._due:
                self._summarize()
        except Exception as error:  # noqa: BLE001 - never into the training job: counted, logged
            self.recorder._invalid_call("HostStepTimer.record", error)

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        """Times the block as one step's time on this host (``record``)."""
        started = self._clock()
        yield
        self.record(self._clock() - started)

    @property
    def stats(self) -> EmitterStats:
        """The counters of the recorder the summaries travel through."""
        return self.recorder.stats

    def close(self, timeout: float | None = None) -> bool:
        """Records the summary of the steps since the last one and closes the recorder (as
        ``GoodputRecorder.close``); idempotent."""
        if self._count:
            self._summarize()
        return self.recorder.close(timeout)

    def __enter__(self) -> HostStepTimer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _summarize(self) -> None:
        count, total, longest = self._count, self._total, self._longest
        self._count, self._total, self._longest = 0, 0.0, 0.0
        self._due = self._clock() + self.interval_s
        self.recorder.record_host_steps(self.host, count, min(total / count, longest), longest)
