"""A simulated training job instrumented with the emitter, for the demo and for tests.

It records what a real JAX job records, with explicit event times on a simulated clock, so a
run of hours takes a second: accelerator init, training preparation, data loading, steps with
noisy step times and a slow first (compile) step, an eval every few hundred steps (a custom
badput event), checkpoint saves, a crash that loses the steps since the last checkpoint, a
restart (a new recorder: a new attempt) that restores the checkpoint, and the job end.

    python examples/simulated_job.py --output demo-output/events.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import logging
import random
import sys
from pathlib import Path

from emitter import GoodputRecorder

_LOG = logging.getLogger("simulated_job")


class SimulatedClock:
    """A clock that only moves when told to."""

    def __init__(self, start: datetime.datetime) -> None:
        self.now = start

    def advance(self, seconds: float) -> datetime.datetime:
        self.now += datetime.timedelta(seconds=seconds)
        return self.now


def run_attempt(
    recorder: GoodputRecorder,
    clock: SimulatedClock,
    rng: random.Random,
    *,
    first_step: int,
    last_step: int,
    crash_at_step: int | None,
    checkpoint_every: int,
    eval_every: int,
    step_time_s: float,
    restore: bool,
) -> int:
    """Records one attempt; returns the last checkpointed step (where a restart resumes)."""
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
    for step in range(first_step, last_step):
        if step == crash_at_step:
            _LOG.info("attempt %s crashes at step %d", recorder.attempt_id, step)
            clock.advance(step_time_s / 2)  # dies mid-step; nothing more is recorded
            return checkpointed
        recorder.record_step_start_time(step, clock.now)
        duration = step_time_s * rng.lognormvariate(0, 0.03)
        if step == first_step:
            duration += rng.uniform(30, 60)  # compilation
        clock.advance(duration)
        recorder.record_model_metrics(step, loss=3.0 * 0.999**step + rng.uniform(0, 0.01),
                                      step_time_s=duration, mfu=0.45, time_=clock.now)
        if step > first_step and step % eval_every == 0:
            start = clock.now
            recorder.record_custom_badput_event_start_time(start, "EVAL_STEP")
            recorder.record_custom_badput_event_end_time(clock.advance(rng.uniform(8, 12)), "EVAL_STEP")
        if step > first_step and step % checkpoint_every == 0:
            start = clock.now
            recorder.record_checkpoint_save(step, start, clock.advance(rng.uniform(2, 4)))
            checkpointed = step
    recorder.record_job_end_time(clock.now)
    return checkpointed


def simulate(destination: str, *, run_id: str, steps: int, seed: int, spool_dir: Path | None) -> None:
    """Records a whole run with one crash and one restart to ``destination``."""
    from emitter import EmitterSettings

    rng = random.Random(seed)
    clock = SimulatedClock(datetime.datetime(2026, 11, 1, 8, 0, tzinfo=datetime.timezone.utc))
    settings = EmitterSettings(heartbeat_interval_s=None,
                               **({"spool_dir": spool_dir} if spool_dir else {}))
    common = dict(destination=destination, settings=settings, run_group="demo",
                  accelerator_type="v5p", chip_count=256, location="us-east5-a",
                  labels={"team": "llm"})
    crash_at = steps * 6 // 10
    with GoodputRecorder(run_id, f"goodput_{run_id}", True, **common) as first:
        resume = run_attempt(first, clock, rng, first_step=0, last_step=steps, crash_at_step=crash_at,
                             checkpoint_every=100, eval_every=250, step_time_s=1.5, restore=False)
    clock.advance(rng.uniform(120, 300))  # the scheduler notices, reschedules, the job restarts
    with GoodputRecorder(run_id, f"goodput_{run_id}", True, **common) as second:
        run_attempt(second, clock, rng, first_step=resume, last_step=steps, crash_at_step=None,
                    checkpoint_every=100, eval_every=250, step_time_s=1.5, restore=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("demo-output/events.jsonl"),
                        help="file the emitter appends messages to (default: %(default)s)")
    parser.add_argument("--destination", default=None,
                        help="publish here instead (e.g. projects/P/topics/T, with "
                             "PUBSUB_EMULATOR_HOST for a local emulator)")
    parser.add_argument("--run-id", default="demo-llm-run", help="the run id (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=2000, help="training steps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.steps < 10:
        parser.error("--steps must be at least 10")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.destination is None:
        args.output.unlink(missing_ok=True)
    destination = args.destination or f"file:{args.output}"
    simulate(destination, run_id=args.run_id, steps=args.steps, seed=args.seed,
             spool_dir=args.output.parent / "spool")
    print(f"simulated run {args.run_id!r}: events sent to {destination}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
