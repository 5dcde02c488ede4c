"""The demo's simulated fleet: runs of different shapes, each a ``simulated_job`` on its own
thread, on clocks paced to the wall clock (``SPEED`` simulated seconds a second), so hours of a
fleet pass in a minute or two."""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from emitter import EmitterSettings
from pipeline.demo import simulated_job

SPEED = 120.0  # simulated seconds per wall-clock second
DEFAULT_DURATION_S = 90.0  # of the demo's training, in wall-clock seconds: the runs' steps scale with it


@dataclasses.dataclass(frozen=True)
class FleetRun:
    """One simulated run of the fleet: its profile (``simulated_job.JobProfile``
    arguments), its steps in a demo of the default duration, and where its clock starts (in
    simulated seconds after the fleet's)."""

    run_id: str
    steps: int
    profile: dict[str, Any]
    start_s: float = 0.0

    @property
    def hangs(self) -> bool:
        return self.profile.get("hang_at") is not None


FLEET = (
    FleetRun("llm-pretrain-v5p", 2200, dict(
        accelerator_type="v5p", chip_count=256, run_group="llm", labels=(("team", "llm"),),
        step_time_s=4.0, checkpoint_every=200, eval_every=500, crashes_at=(0.6,))),
    FleetRun("llm-finetune-v5e", 2100, dict(
        accelerator_type="v5e", chip_count=16, run_group="llm", labels=(("team", "llm"),),
        step_time_s=2.0, checkpoint_every=250, eval_every=100, crashes_at=()), start_s=1500),
    FleetRun("vision-v4", 2600, dict(
        accelerator_type="v4", chip_count=64, run_group="vision", labels=(("team", "vision"),),
        step_time_s=3.0, checkpoint_every=500, eval_every=1000, crashes_at=(0.3, 0.7))),
    FleetRun("diffusion-a100", 2100, dict(
        accelerator_type="a100", chip_count=8, run_group="vision", labels=(("team", "vision"),),
        step_time_s=3.0, checkpoint_every=200, eval_every=400, crashes_at=(), slowdown=2.5,
        slowdown_from=0.4)),
    FleetRun("moe-h100", 3000, dict(
        accelerator_type="h100", chip_count=64, run_group="llm", labels=(("team", "llm"),),
        step_time_s=3.0, checkpoint_every=100, eval_every=0, crashes_at=(), hang_at=0.4,
        hang_for_s=None)),
    FleetRun("ranker-v6e", 1450, dict(
        accelerator_type="v6e", chip_count=128, run_group="ads", labels=(("team", "ads"),),
        step_time_s=4.0, checkpoint_every=0, eval_every=300, crashes_at=(0.5,), restore_checkpoint=False),
        start_s=600),
    FleetRun("asr-h200", 2600, dict(
        accelerator_type="h200", chip_count=16, run_group="speech", labels=(("team", "speech"),),
        step_time_s=2.5, checkpoint_every=100, eval_every=500, crashes_at=(0.2, 0.45, 0.7),
        restart_delay_s=(60.0, 120.0)), start_s=1200),
    FleetRun("embed-l4", 1700, dict(
        accelerator_type="l4", chip_count=4, run_group="search", labels=(("team", "search"),),
        step_time_s=2.0, checkpoint_every=200, eval_every=200, crashes_at=())),
)

class _Aborted(Exception):
    """Raised in a simulated job's thread when the demo stops early."""


class FleetControl:
    """Tells the simulated jobs' clocks when to stop: ``abort`` at once (an error, Ctrl-C), or
    ``wind_down`` at the end of the demo, after which the hung job records one last heartbeat at
    ``final_time`` once ``release`` is set."""

    def __init__(self) -> None:
        self.abort = threading.Event()
        self.wind_down = threading.Event()
        self.release = threading.Event()
        self.wake = threading.Event()  # set with any of the above: a waiting clock looks again
        self.final_time: datetime.datetime | None = None

    def set(self, event: threading.Event) -> None:
        event.set()
        self.wake.set()


class PacedClock:
    """A simulated job's clock (``simulated_job.Clock``) that keeps pace with the wall
    clock: ``SPEED`` simulated seconds a second from a shared origin, so that every event is
    published when its simulated time comes. At the wind-down a job still running catches up at
    once, but a hung job waits for ``release`` and then jumps to the final time and stops."""

    def __init__(self, origin: datetime.datetime, origin_wall: float, speed: float, start_s: float,
                 control: FleetControl, hangs: bool) -> None:
        self.now = origin + datetime.timedelta(seconds=start_s)
        self._origin, self._origin_wall, self._speed = origin, origin_wall, speed
        self._control, self._hangs = control, hangs
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def advance(self, seconds: float) -> datetime.datetime:
        self.now += datetime.timedelta(seconds=seconds)
        self.wait()
        return self.now

    def wait(self) -> None:
        """Returns when the wall clock has reached ``now``."""
        control = self._control
        due = self._origin_wall + (self.now - self._origin).total_seconds() / self._speed
        while True:
            if control.abort.is_set():
                raise _Aborted
            if control.wind_down.is_set():
                if not self._hangs:
                    return
                while not control.release.wait(0.2):
                    if control.abort.is_set():
                        raise _Aborted
                assert control.final_time is not None
                self.now = max(self.now, control.final_time)
                self._stopped = True
                return
            remaining = due - time.monotonic()
            if remaining <= 0:
                return
            control.wake.wait(min(remaining, 1.0))


class SimulatedJob:
    """One simulated run on its own thread; ``stats`` sums its recorders' emitter counters."""

    def __init__(self, run: FleetRun, thread_body: Callable[[SimulatedJob], None]) -> None:
        self.run = run
        self.recorders: list[Any] = []
        self.error: BaseException | None = None
        self.clock: PacedClock | None = None
        self.thread = threading.Thread(target=thread_body, args=(self,), name=f"demo-job-{run.run_id}",
                                       daemon=True)

    def stats(self) -> tuple[int, int]:
        """(events recorded, events sent) over its attempts so far."""
        recorded = sent = 0
        for recorder in list(self.recorders):
            stats = recorder.stats
            recorded, sent = recorded + stats.recorded, sent + stats.sent
        return recorded, sent


def fleet_runs(count: int) -> list[FleetRun]:
    """``count`` runs: the fleet's, then again with new names and seeds for more."""
    runs = []
    for index in range(count):
        base = FLEET[index % len(FLEET)]
        suffix = "" if index < len(FLEET) else f"-{index // len(FLEET) + 1}"
        runs.append(dataclasses.replace(base, run_id=base.run_id + suffix))
    return runs


def longest_s(duration_s: float) -> float:
    """The longest the fleet of a ``duration_s`` demo may train, in wall-clock seconds, before the
    demo gives up on it."""
    return duration_s * 1.5 + 60


def start_fleet(runs: Sequence[FleetRun], topic: str, duration_s: float, control: FleetControl,
                spool_dir: Path) -> list[SimulatedJob]:
    """Starts every simulated job on its thread, publishing to ``topic``. Simulated time, ``SPEED``
    times faster than the wall clock, reaches the wall clock's only at the latest the fleet may
    end (``longest_s``): a fleet slower than planned would otherwise date its events ahead of the
    wall clock, and the pipeline dead-letters an event more than ``MAX_CLOCK_AHEAD_S`` ahead."""
    settings = EmitterSettings(max_latency_s=0.25, heartbeat_interval_s=None, spool_dir=spool_dir,
                               close_timeout_s=5.0, retry_initial_backoff_s=0.05, retry_max_backoff_s=1.0)
    scale = duration_s / DEFAULT_DURATION_S
    origin_wall = time.monotonic()
    longest = longest_s(duration_s)
    end = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=longest)
    origin = end - datetime.timedelta(seconds=longest * SPEED)

    def body(job: SimulatedJob) -> None:
        run = job.run
        clock = job.clock = PacedClock(origin, origin_wall, SPEED, run.start_s * scale, control, run.hangs)
        try:
            clock.wait()
            simulated_job.simulate(topic, run_id=run.run_id, steps=max(50, round(run.steps * scale)),
                                   seed=sum(map(ord, run.run_id)), spool_dir=None,
                                   profile=simulated_job.JobProfile(**run.profile), clock=clock,
                                   settings=settings, on_attempt=job.recorders.append)
        except _Aborted:
            pass
        except Exception as error:  # noqa: BLE001 -- the demo reports it and stops
            job.error = error

    jobs = [SimulatedJob(run, body) for run in runs]
    for job in jobs:
        job.thread.start()
    return jobs
