"""A simulated training job instrumented with the emitter, for the demo and for tests.

It records what a real JAX job records, with explicit event times on a simulated clock, so a
run of hours takes a second: accelerator init, training preparation, data loading, steps with
noisy step times and a slow first (compile) step, an eval every few hundred steps (a custom
badput event), checkpoint saves, a crash that loses the steps since the last checkpoint, a
restart (a new recorder: a new attempt) that restores the checkpoint, and the job end.

    python -m pipeline.demo.simulated_job --output demo-output/events.jsonl

A ``JobProfile`` shapes other runs: the accelerator and chip count, the step time, how often it
checkpoints and evaluates, where it crashes and whether a restart restores a checkpoint or
begins again at step 0, a slowdown (the step time grows), a hang (it stops stepping, only its
heartbeats go on, and it never ends). ``pipeline.demo`` runs a fleet of them on a clock paced
to the wall clock; the defaults are the run above.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from emitter import EmitterSettings, GoodputRecorder

_LOG = logging.getLogger("simulated_job")
START = datetime.datetime(2026, 11, 1, 8, 0, tzinfo=datetime.timezone.utc)


class SimulatedClock:
    """A clock that only moves when told to.

    ``stopped`` turns true when whoever drives the clock wants a hung job to stop waiting (the
    demo's paced clock does, when the demo ends); this one never stops.
    """

    def __init__(self, start: datetime.datetime) -> None:
        self.now = start

    def advance(self, seconds: float) -> datetime.datetime:
        self.now += datetime.timedelta(seconds=seconds)
        return self.now

    @property
    def stopped(self) -> bool:
        return False


class Clock(Protocol):
    """What a simulated job needs of its clock: ``SimulatedClock``, or the demo's paced one."""

    now: datetime.datetime

    def advance(self, seconds: float) -> datetime.datetime: ...

    @property
    def stopped(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class JobProfile:
    """The shape of a simulated run; the defaults are the run the command line simulates.

    Attributes:
        accelerator_type: E.g. ``"v5p"``, ``"h100"``.
        chip_count: Chips each attempt holds.
        run_group: The run group of fleet queries.
        location: The zone the job runs in.
        labels: The run's labels, as (key, value) pairs.
        step_time_s: The typical step time at the start of the run.
        checkpoint_every: A checkpoint every this many steps; 0 for none.
        eval_every: An eval (the custom badput ``EVAL_STEP``) every this many steps; 0 for none.
        crashes_at: Fractions of the steps at which an attempt crashes, one crash each; the next
            attempt starts after a scheduler delay.
        restart_delay_s: Range of that delay.
        restore_checkpoint: Whether a restart restores the last checkpoint; otherwise it begins
            again at step 0, and every step before the crash is lost.
        slowdown: Step time at the last step, relative to ``step_time_s``; it grows linearly
            from ``slowdown_from`` (a fraction of the steps) on.
        slowdown_from: See ``slowdown``.
        hang_at: Fraction of the steps at which the job hangs: it takes no more steps and never
            ends; only its heartbeats go on, every ``heartbeat_every_s``.
        hang_for_s: How long the hang lasts, in simulated seconds, unless the clock stops it
            sooner; ``None``: until the clock stops it.
        heartbeat_every_s: See ``hang_at``.
        mfu: The model FLOPs utilization of a step of ``step_time_s``; a step's own is this over
            how much longer it took (a step does the same work however long it takes), the
            first step's compilation left out.
    """

    accelerator_type: str = "v5p"
    chip_count: int = 256
    run_group: str = "demo"
    location: str = "us-east5-a"
    labels: tuple[tuple[str, str], ...] = (("team", "llm"),)
    step_time_s: float = 1.5
    checkpoint_every: int = 100
    eval_every: int = 250
    crashes_at: tuple[float, ...] = (0.6,)
    restart_delay_s: tuple[float, float] = (120.0, 300.0)
    restore_checkpoint: bool = True
    slowdown: float = 1.0
    slowdown_from: float = 0.5
    hang_at: float | None = None
    hang_for_s: float | None = 3600.0
    heartbeat_every_s: float = 30.0
    mfu: float = 0.45

    def __post_init__(self) -> None:
        hang = () if self.hang_at is None else (self.hang_at,)
        fractions = (*self.crashes_at, self.slowdown_from, *hang)
        if any(not 0 <= f <= 1 for f in fractions):
            raise ValueError("crashes_at, slowdown_from and hang_at are fractions of the steps, in [0, 1]")
        if self.step_time_s <= 0 or self.slowdown <= 0 or self.heartbeat_every_s <= 0:
            raise ValueError("step_time_s, slowdown and heartbeat_every_s must be positive")
        if self.checkpoint_every < 0 or self.eval_every < 0 or self.chip_count < 0:
            raise ValueError("checkpoint_every, eval_every and chip_count must not be negative")
        if not 0 < self.mfu <= 1:
            raise ValueError("mfu is a fraction, in (0, 1]")

    def step_time_factor(self, step: int, steps: int) -> float:
        """How much slower than ``step_time_s`` the step is (1 unless the run slows down)."""
        start = self.slowdown_from * steps
        if self.slowdown == 1.0 or step < start:
            return 1.0
        return 1.0 + (self.slowdown - 1.0) * (step - start) / max(1.0, steps - 1 - start)


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended: ``resume_step`` is where a restart resumes (the last checkpoint)."""

    resume_step: int
    ended: bool = False
    hung: bool = False


def _at(steps: int, fraction: float) -> int:
    return int(steps * fraction + 1e-9)


def run_attempt(
    recorder: GoodputRecorder,
    clock: Clock,
    rng: random.Random,
    profile: JobProfile,
    *,
    first_step: int,
    steps: int,
    crash_at_step: int | None,
    restore: bool,
) -> AttemptResult:
    """Records one attempt, from its start to its end, its crash or its hang."""
    recorder.record_job_start_time(clock.now)
    recorder.record_tpu_init_start_time(clock.now)
    recorder.record_tpu_init_end_time(clock.advance(rng.uniform(20, 40)))
    recorder.record_training_preparation_start_time(clock.now)
    if restore:
        restore_start = clock.advance(5)
        recorder.record_checkpoint_restore(first_step, restore_start, clock.advance(rng.uniform(10, 20)))
    recorder.record_training_preparation_end_time(clock.advance(rng.uniform(10, 20)))
    recorder.record_data_loading_start_time(clock.now)
    recorder.record_data_loading_end_time(clock.advance(rng.uniform(5, 10)))
    checkpointed = first_step
    hang_at_step = None if profile.hang_at is None else _at(steps, profile.hang_at)
    for step in range(first_step, steps):
        if step == crash_at_step:
            _LOG.info("attempt %s crashes at step %d", recorder.attempt_id, step)
            clock.advance(profile.step_time_s / 2)  # dies mid-step; nothing more is recorded
            return AttemptResult(checkpointed)
        if step == hang_at_step:
            _hang(recorder, clock, profile, step)
            return AttemptResult(checkpointed, hung=True)
        recorder.record_step_start_time(step, clock.now)
        duration = profile.step_time_s * profile.step_time_factor(step, steps) * rng.lognormvariate(0, 0.03)
        mfu = min(1.0, profile.mfu * profile.step_time_s / duration)
        if step == first_step:
            duration += rng.uniform(30, 60)  # compilation
        clock.advance(duration)
        recorder.record_model_metrics(step, loss=3.0 * 0.999**step + rng.uniform(0, 0.01),
                                      step_time_s=duration, mfu=round(mfu, 4), time_=clock.now)
        if profile.eval_every and step > first_step and step % profile.eval_every == 0:
            start = clock.now
            recorder.record_custom_badput_event_start_time(start, "EVAL_STEP")
            recorder.record_custom_badput_event_end_time(clock.advance(rng.uniform(8, 12)), "EVAL_STEP")
        if profile.checkpoint_every and step > first_step and step % profile.checkpoint_every == 0:
            start = clock.now
            recorder.record_checkpoint_save(step, start, clock.advance(rng.uniform(2, 4)))
            checkpointed = step
    recorder.record_job_end_time(clock.now)
    return AttemptResult(checkpointed, ended=True)


def _hang(recorder: GoodputRecorder, clock: Clock, profile: JobProfile, step: int) -> None:
    """Stuck before ``step``: the process lives on, so its heartbeats do; no step, no end."""
    _LOG.info("attempt %s hangs before step %d", recorder.attempt_id, step)
    until = None if profile.hang_for_s is None else clock.now + datetime.timedelta(seconds=profile.hang_for_s)
    while not clock.stopped and (until is None or clock.now < until):
        recorder.record_heartbeat(clock.advance(profile.heartbeat_every_s))


def simulate(
    destination: str,
    *,
    run_id: str,
    steps: int,
    seed: int,
    spool_dir: Path | None,
    profile: JobProfile | None = None,
    clock: Clock | None = None,
    settings: EmitterSettings | None = None,
    on_attempt: Callable[[GoodputRecorder], None] | None = None,
) -> None:
    """Records a whole run to ``destination``: with the default profile, one crash and one restart.

    ``clock`` defaults to a simulated clock at 2026-11-01 08:00 UTC; ``settings`` to settings
    without automatic heartbeats, spooling under ``spool_dir``; ``on_attempt`` is called with
    each attempt's recorder before it records anything (the demo reads its counters).
    """
    profile = profile or JobProfile()
    rng = random.Random(seed)
    clock = clock or SimulatedClock(START)
    if settings is None:
        settings = EmitterSettings(heartbeat_interval_s=None)
        if spool_dir:
            settings = dataclasses.replace(settings, spool_dir=spool_dir)
    crashes = sorted(_at(steps, fraction) for fraction in profile.crashes_at)
    resume, attempt = 0, 0
    while True:
        crash = crashes.pop(0) if crashes else None
        with GoodputRecorder(run_id, f"goodput_{run_id}", True, destination=destination, settings=settings,
                             run_group=profile.run_group, accelerator_type=profile.accelerator_type,
                             chip_count=profile.chip_count, location=profile.location,
                             labels=dict(profile.labels)) as recorder:
            if on_attempt is not None:
                on_attempt(recorder)
            result = run_attempt(recorder, clock, rng, profile, first_step=resume, steps=steps,
                                 crash_at_step=crash, restore=attempt > 0 and profile.restore_checkpoint)
        if result.ended or result.hung:
            return
        resume = result.resume_step if profile.restore_checkpoint else 0
        attempt += 1
        clock.advance(rng.uniform(*profile.restart_delay_s))  # the scheduler notices and restarts the job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("demo-output/events.jsonl"),
                        help="file the emitter appends messages to (default: %(default)s)")
    parser.add_argument("--destination", default=None,
                        help="publish here instead (e.g. projects/P/topics/T, with "
                             "PUBSUB_EMULATOR_HOST for a local emulator)")
    parser.add_argument("--run-id", default="demo-llm-run", help="the run id (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=2000, help="training steps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default: %(default)s)")
    parser.add_argument("--accelerator-type", default=JobProfile.accelerator_type,
                        help="accelerator type (default: %(default)s)")
    parser.add_argument("--chip-count", type=int, default=JobProfile.chip_count,
                        help="chips per attempt (default: %(default)s)")
    parser.add_argument("--crashes-at", type=lambda text: tuple(float(f) for f in text.split(",") if f),
                        default=JobProfile.crashes_at, metavar="F,F,...",
                        help="fractions of the steps at which an attempt crashes; '' for none "
                             "(default: 0.6)")
    parser.add_argument("--no-restore", action="store_true",
                        help="a restart begins again at step 0 instead of restoring a checkpoint")
    parser.add_argument("--slowdown", type=float, default=1.0,
                        help="step time at the last step relative to the first, growing from half way "
                             "(default: %(default)s)")
    parser.add_argument("--hang-at", type=float, default=None, metavar="F",
                        help="the job hangs at this fraction of the steps: an hour of heartbeats, no end")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.steps < 10:
        parser.error("--steps must be at least 10")
    try:
        profile = JobProfile(accelerator_type=args.accelerator_type, chip_count=args.chip_count,
                             crashes_at=args.crashes_at, restore_checkpoint=not args.no_restore,
                             slowdown=args.slowdown, hang_at=args.hang_at)
    except ValueError as error:
        parser.error(str(error))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.destination is None:
        args.output.unlink(missing_ok=True)
    destination = args.destination or f"file:{args.output}"
    simulate(destination, run_id=args.run_id, steps=args.steps, seed=args.seed,
             spool_dir=args.output.parent / "spool", profile=profile)
    print(f"simulated run {args.run_id!r}: events sent to {destination}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
