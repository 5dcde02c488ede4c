"""One attempt of a soak run, as its own process, so that the soak can kill it with SIGKILL.

The attempt records through the real emitter to the Pub/Sub emulator (``PUBSUB_EMULATOR_HOST``)
what ``pipeline.demo.simulated_job`` records, on a clock paced to the wall clock: simulated time is
``anchor + (time.time() - anchor_wall) * speed``, shared by the run's attempts, plus this host's
skew, to the destination the spec names (the topic, or a file the soak ships to it). While it runs
it keeps ``PROGRESS`` up to date (a fixed-width line: events recorded so far, the last checkpointed
step), so that the soak knows what a killed attempt had recorded and where its restart resumes.
When it ends or crashes it closes the recorder (delivering everything) and writes its
``EmitterStats`` as JSON to ``PROGRESS.json``. SIGTERM preempts it as a scheduler would: its
handler records the end, closes the recorder within ``PREEMPTION_CLOSE_S`` (the rest stays in the
spool for the next attempt) and writes the same before the process exits.

    PYTHONPATH=tests python -m support.soak_job SPEC.json   (the spec: see ``AttemptSpec`` in soak.py)
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from emitter import EmitterSettings, GoodputRecorder
from pipeline.demo import simulated_job

_UTC = datetime.timezone.utc
_PROGRESS_WIDTH = 80
#: How long a preempted attempt's close waits for delivery.
PREEMPTION_CLOSE_S = 2.0


class PacedClock:
    """The run's simulated clock: it moves with the wall clock, ``speed`` times faster, from
    ``anchor_s`` (simulated) at ``anchor_wall`` (wall), plus the host's ``skew_s``."""

    def __init__(self, anchor_s: float, anchor_wall: float, speed: float, skew_s: float) -> None:
        self.anchor_s, self.anchor_wall, self.speed, self.skew_s = anchor_s, anchor_wall, speed, skew_s
        self.now = datetime.datetime.fromtimestamp(
            anchor_s + (time.time() - anchor_wall) * speed + skew_s, _UTC)
        self.on_advance = lambda: None

    def advance(self, seconds: float) -> datetime.datetime:
        self.now += datetime.timedelta(seconds=seconds)
        due = self.anchor_wall + (self.now.timestamp() - self.skew_s - self.anchor_s) / self.speed
        time.sleep(max(0.0, due - time.time()))  # read once: the clock moves between two reads
        self.on_advance()
        return self.now

    @property
    def stopped(self) -> bool:
        return False


class Progress:
    """A fixed-width line rewritten in place: the attempt, events recorded and dropped (as its
    emitter counts them: a killed attempt says nothing more), the last checkpointed step."""

    def __init__(self, path: Path, attempt_id: str, checkpoint: int) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.attempt_id, self.checkpoint = attempt_id, checkpoint

    def write(self, recorded: int, dropped: int) -> None:
        line = f"{self.attempt_id} {recorded} {dropped} {self.checkpoint}"
        os.pwrite(self.fd, line.ljust(_PROGRESS_WIDTH).encode(), 0)


def main(spec_path: str) -> int:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    profile = simulated_job.JobProfile(**{k: tuple(v) if isinstance(v, list) else v
                                          for k, v in spec["profile"].items()})
    settings = EmitterSettings(**{**spec["settings"], "spool_dir": Path(spec["settings"]["spool_dir"])})
    clock = PacedClock(spec["anchor_s"], spec["anchor_wall"], spec["speed"], spec["skew_s"])
    progress: Progress | None = None

    class Recorder(GoodputRecorder):
        def record_checkpoint_save(self, step: int, *args: Any, **kwargs: Any) -> None:
            super().record_checkpoint_save(step, *args, **kwargs)
            if progress is not None:
                progress.checkpoint = step

    recorder = Recorder(spec["run_id"], logging_enabled=True, destination=spec["destination"],
                        settings=settings, run_group=profile.run_group,
                        accelerator_type=profile.accelerator_type, chip_count=profile.chip_count,
                        location=profile.location, labels=dict(profile.labels))

    def finish(delivered: bool, ended: bool, resume_step: int) -> None:
        status = {**dataclasses.asdict(recorder.stats), "attempt_id": recorder.attempt_id,
                  "ended": ended, "resume_step": resume_step, "delivered": delivered}
        Path(spec["progress"] + ".json").write_text(json.dumps(status))

    def preempted(signum: int, frame: object) -> None:
        recorder.record_job_end_time(clock.now)
        assert progress is not None
        finish(recorder.close(timeout=PREEMPTION_CLOSE_S), False, progress.checkpoint)
        sys.exit(0)

    signal.signal(signal.SIGTERM, preempted)  # before the progress line: the soak signals after it
    progress = Progress(Path(spec["progress"]), recorder.attempt_id, spec["first_step"])
    progress.write(0, 0)

    def advanced() -> None:
        stats = recorder.stats
        progress.write(stats.recorded, stats.dropped)

    clock.on_advance = advanced
    result = simulated_job.run_attempt(
        recorder, clock, random.Random(spec["seed"]), profile, first_step=spec["first_step"],
        steps=spec["steps"], crash_at_step=spec["crash_at_step"], restore=spec["restore"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ending anyway: the status must be written whole
    finish(recorder.close(timeout=settings.close_timeout_s), result.ended, result.resume_step)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
