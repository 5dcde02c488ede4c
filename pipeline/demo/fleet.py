"""The demo's simulated fleet: runs of different shapes, each a ``simulated_job`` on its own
thread, on clocks paced to the wall clock (``SPEED`` simulated seconds a second), so hours of a
fleet pass in a minute or two.

Every job of the demo dates its events on one clock, the fleet's (``FleetClock``): the simulated
jobs, the hung job's last heartbeat, and the real JAX job (``jax_train --clock-speed
--clock-meets``), so that each run's elapsed time is a part of the fleet's span."""

from __future__ import annotations

import dataclasses
import datetime
import random
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
        mfu=0.52, accelerator_type="v5p", chip_count=256, run_group="llm", labels=(("team", "llm"),),
        step_time_s=4.0, checkpoint_every=200, eval_every=500, crashes_at=(0.6,))),
    FleetRun("llm-finetune-v5e", 2100, dict(
        mfu=0.41, accelerator_type="v5e", chip_count=16, run_group="llm", labels=(("team", "llm"),),
        step_time_s=2.0, checkpoint_every=250, eval_every=100, crashes_at=()), start_s=1500),
    FleetRun("vision-v4", 2600, dict(
        mfu=0.37, accelerator_type="v4", chip_count=64, run_group="vision", labels=(("team", "vision"),),
        step_time_s=3.0, checkpoint_every=500, eval_every=1000, crashes_at=(0.3, 0.7))),
    FleetRun("diffusion-a100", 2100, dict(
        mfu=0.33, accelerator_type="a100", chip_count=8, run_group="vision", labels=(("team", "vision"),),
        step_time_s=3.0, checkpoint_every=200, eval_every=400, crashes_at=(), slowdown=2.5,
        slowdown_from=0.4)),
    FleetRun("moe-h100", 3000, dict(
        mfu=0.38, accelerator_type="h100", chip_count=64, run_group="llm", labels=(("team", "llm"),),
        step_time_s=3.0, checkpoint_every=100, eval_every=0, crashes_at=(), hang_at=0.4,
        hang_for_s=None)),
    FleetRun("ranker-v6e", 1450, dict(
        mfu=0.26, accelerator_type="v6e", chip_count=128, run_group="ads", labels=(("team", "ads"),),
        step_time_s=4.0, checkpoint_every=0, eval_every=300, crashes_at=(0.5,), restore_checkpoint=False),
        start_s=600),
    FleetRun("asr-h200", 2600, dict(
        mfu=0.44, accelerator_type="h200", chip_count=16, run_group="speech", labels=(("team", "speech"),),
        step_time_s=2.5, checkpoint_every=100, eval_every=500, crashes_at=(0.2, 0.45, 0.7),
        restart_delay_s=(60.0, 120.0)), start_s=1200),
    FleetRun("embed-l4", 1700, dict(
        mfu=0.23, accelerator_type="l4", chip_count=4, run_group="search", labels=(("team", "search"),),
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


@dataclasses.dataclass(frozen=True)
class FleetClock:
    """The fleet's time: ``speed`` seconds a wall-clock second, equal to the wall clock (UTC) at
    ``meets``, which is ``meets_monotonic`` on ``time.monotonic()``. Before ``meets`` it is behind
    the wall clock, so no event is dated in the future."""

    meets: datetime.datetime
    meets_monotonic: float
    speed: float

    @classmethod
    def meeting_in(cls, seconds: float, speed: float = SPEED) -> FleetClock:
        """A clock that reaches the wall clock ``seconds`` from now."""
        wall, monotonic = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
        return cls(wall + datetime.timedelta(seconds=seconds), monotonic + seconds, speed)

    def at(self, monotonic: float) -> datetime.datetime:
        """The fleet's time when ``time.monotonic()`` is ``monotonic``."""
        return self.meets + datetime.timedelta(seconds=(monotonic - self.meets_monotonic) * self.speed)

    def now(self) -> datetime.datetime:
        return self.at(time.monotonic())

    def due(self, when: datetime.datetime) -> float:
        """The ``time.monotonic()`` at which the fleet's time is ``when``."""
        return self.meets_monotonic + (when - self.meets).total_seconds() / self.speed


class PacedClock:
    """A simulated job's clock (``simulated_job.Clock``) that keeps pace with the fleet's
    (``FleetClock``), so that every event is published when its time comes on the fleet's clock.
    At the wind-down a job still running catches up at once, but a hung job waits for
    ``release`` and then jumps to the final time and stops."""

    def __init__(self, fleet: FleetClock, start: datetime.datetime, control: FleetControl,
                 hangs: bool) -> None:
        self.now = start
        self._fleet = fleet
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
        due = self._fleet.due(self.now)
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
    """``count`` runs: the fleet's, then again with new names and seeds for more, each repeat's
    MFU drawn within 15 % of its model's (the same for the same name, demo after demo)."""
    runs = []
    for index in range(count):
        base = FLEET[index % len(FLEET)]
        if index < len(FLEET):
            runs.append(base)
            continue
        run_id = f"{base.run_id}-{index // len(FLEET) + 1}"
        mfu = base.profile["mfu"] * random.Random(run_id).uniform(0.85, 1.15)
        runs.append(dataclasses.replace(base, run_id=run_id, profile={**base.profile, "mfu": round(mfu, 3)}))
    return runs


def longest_s(duration_s: float) -> float:
    """The longest the fleet of a ``duration_s`` demo may train, in wall-clock seconds, before the
    demo gives up on it."""
    return duration_s * 1.5 + 60


def start_fleet(runs: Sequence[FleetRun], topic: str, duration_s: float, control: FleetControl,
                spool_dir: Path, clock: FleetClock | None = None) -> list[SimulatedJob]:
    """Starts every simulated job on its thread, publishing to ``topic``, each from its
    ``start_s`` after now on the fleet's ``clock``. That clock, ``SPEED`` times faster than the
    wall clock, reaches the wall clock's time only at the latest the fleet may end (``longest_s``;
    the default clock): a fleet slower than planned would otherwise date its events ahead of the
    wall clock, and the pipeline dead-letters an event more than ``MAX_CLOCK_AHEAD_S`` ahead."""
    settings = EmitterSettings(max_latency_s=0.25, heartbeat_interval_s=None, spool_dir=spool_dir,
                               close_timeout_s=5.0, retry_initial_backoff_s=0.05, retry_max_backoff_s=1.0)
    scale = duration_s / DEFAULT_DURATION_S
    fleet = clock or FleetClock.meeting_in(longest_s(duration_s))
    origin = fleet.now()

    def body(job: SimulatedJob) -> None:
        run = job.run
        start = origin + datetime.timedelta(seconds=run.start_s * scale)
        clock = job.clock = PacedClock(fleet, start, control, run.hangs)
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
