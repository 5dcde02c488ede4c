"""The soak: simulated fleet traffic through the real emitter, the Pub/Sub emulator and the
streaming pipeline, with random faults, checked against clean batch replays at the end.

What runs (everything stopped when it ends):

* in this process, the Pub/Sub emulator (the pipeline's subscription, and a copy subscription
  saved to ``copies.jsonl``: everything published) and the Cloud Monitoring stand-in;
* the streaming pipeline, ``python -m pipeline --streaming`` on the DirectRunner, writing
  ``live.duckdb`` and Cloud Monitoring;
* a fleet of training runs, ``concurrent_runs`` at a time, new ones starting as others end until
  the soak's time is up. Each attempt of a run is a process of its own (``soak_job.py``) on the
  run's paced simulated clock, with its host's clock skew; a run crashes (cleanly) where its
  profile says and is restarted from its last checkpoint or from step 0; every fourth writes to a
  file destination, which a log shipper here publishes to the topic line by line (following the
  file through its rotations, as a node's log agent does); those, and every third run, spool to a
  small disk with a small memory queue, so that an outage makes them spill, and drop events.

The faults, each kind once in the first ``len(FAULTS) * fault_every_s`` seconds, then one every
``fault_every_s`` on average, each logged with its time (``preempt`` and ``spool_removal`` come
during each Pub/Sub outage instead, when jobs spill to their spools):

``pubsub_outage``  the emulator stops for a while and comes back on its port, and the file
                   destinations are away as long (a directory where each file was);
``kill_attempt``   a running attempt is killed with SIGKILL; the scheduler restarts it;
``duplicates``     the next messages published are delivered twice;
``pull_failures``  the next pulls fail (RESOURCE_EXHAUSTED, which the client does not retry);
``bad_messages``   invalid messages are published beside the good ones;
``late_duplicate`` a message of a run that ended long ago is published again;
``monitoring``     Cloud Monitoring refuses the next requests (UNAVAILABLE, quota, INTERNAL);
``restart``        the pipeline is stopped (SIGTERM) and started again on its file;
``preempt``        a running attempt gets SIGTERM (one that spills, if any): its handler records
                   the end and closes, the rest left in the spool;
``spool_removal``  what a tmp cleaner may take from the spool while it is written: each segment
                   being written, the lock files, and each run's directory left empty;
``rotation``       a file destination is rotated (renamed) under its writer.

At the end the faults stop, every run finishes, the stream reads what is left and stops, and
``verify`` holds it to: nothing published valid is missing from the pipeline's events table and
nothing is there that was not published; every bad message is a dead letter; each run's final
snapshot equals a backfill from the events table and the windows the engine computes from
scratch at the same time; the backfill's tables equal a clean batch replay of everything
published; and every event a job recorded is in the table, or counted as dropped by its
emitter (with room on disk, only a segment a cleaner removed), or lost with a killed process's
memory (at most ``max_queue_events``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import grpc
from google.pubsub_v1.types import pubsub as types

from support import REPO
from support.beam import query, table

PROJECT = "goodput-soak"
TOPIC = f"projects/{PROJECT}/topics/goodput"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/pipeline"
COPY = f"projects/{PROJECT}/subscriptions/copy"
FAULTS = ("pubsub_outage", "kill_attempt", "duplicates", "pull_failures", "bad_messages",
          "late_duplicate", "monitoring", "restart", "preempt", "spool_removal", "rotation")
#: The faults that come during each Pub/Sub outage, in this order.
OUTAGE_FAULTS = ("spool_removal", "preempt")
#: What the emitters may hold in memory: the bound on what a killed attempt loses.
MAX_QUEUE_EVENTS = 2000
SMALL_QUEUE_EVENTS, SMALL_SPOOL_BYTES = 100, 16 * 1024
#: Invalid messages a faulty producer might publish, each with what its dead letter must say.
BAD_MESSAGES: tuple[tuple[bytes, str], ...] = (
    (b'{"schema_version":1,"run_id":"soak-bad","attempt_id":"a","events":[{"seq":0', "not valid JSON"),
    (b"\xff\xfe not text", "not UTF-8"),
    (b'{"schema_version":9,"run_id":"soak-bad","attempt_id":"a","events":[]}', "schema_version 9"),
    (b'{"schema_version":1,"run_id":"soak\\u0007bad","attempt_id":"a","events":[{"seq":0,"time_us":'
     b'1750000000000000,"heartbeat":{}}]}', "printable characters"),
    (b'{"schema_version":1,"run_id":"soak-bad","attempt_id":"a","events":[{"seq":0,"time_us":'
     b'1750000000000000,"teleport":{}}]}', "unknown event kind"),
    (b'{"schema_version":1,"run_id":"soak-bad","attempt_id":"a","events":[{"seq":0,"time_us":'
     b'1750000000000000,"checkpoint_save":{"step":1,"blocking_s":"NaN"}}]}', "must be finite"),
    (b'{"schema_version":1,"run_id":"soak-bad","attempt_id":"a","events":[{"seq":0,"time_us":'
     b'1750000000000000,"step_start":{"step":-5}}]}', "step must be >= 0"),
)


@dataclasses.dataclass
class Attempt:
    """One process of a run: how it was started and how it went."""

    index: int
    progress: Path
    process: subprocess.Popen[bytes]
    killed: bool = False
    status: dict[str, Any] | None = None  # its EmitterStats and result, when it exited itself

    def read_progress(self) -> tuple[str, int, int, int]:
        """(attempt id, events recorded, of them dropped, last checkpointed step) as the attempt
        last wrote them."""
        attempt_id, recorded, dropped, checkpoint = self.progress.read_text().split()
        return attempt_id, int(recorded), int(dropped), int(checkpoint)


@dataclasses.dataclass
class Run:
    """One training run of the fleet and its attempts."""

    run_id: str
    profile: dict[str, Any]
    steps: int
    seed: int
    crashes: list[int]
    small_spool: bool
    to_file: bool  # writes a file destination, which the soak's shipper publishes
    anchor_s: float
    anchor_wall: float
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    restart_at: float | None = 0.0  # when its next attempt starts (monotonic); None while one runs
    ended_at: float | None = None  # when its last attempt exited (monotonic)


class SoakError(Exception):
    """A part of the soak failed while it ran (not a finding of ``verify``)."""


@dataclasses.dataclass
class Report:
    """What a soak did and what ``verify`` found; ``problems`` is empty when all held."""

    duration_s: float
    runs: int
    attempts: int
    faults: Counter[str]
    published_messages: int
    recorded: int
    accepted: int
    dropped_counted: int
    lost_to_kills: int
    missing_counted: int
    dead_letters: int
    problems: list[str]

    def summary(self) -> str:
        faults = ", ".join(f"{name} {count}" for name, count in sorted(self.faults.items()))
        return (f"soak of {self.duration_s:.0f} s: {self.runs} runs, {self.attempts} attempts, "
                f"{self.published_messages:,} messages published; faults: {faults}; events recorded "
                f"{self.recorded:,}, in the events table {self.accepted:,}, dropped and counted by "
                f"emitters {self.dropped_counted:,}, lost with killed processes' memory "
                f"{self.lost_to_kills:,}; gaps in sequence numbers (missing_events) "
                f"{self.missing_counted:,}; "
                f"{self.dead_letters:,} dead letters; "
                + ("every check held" if not self.problems else f"{len(self.problems)} problems"))


class Soak:
    """One soak in ``directory``; ``run`` starts everything, and stops it all before it returns."""

    def __init__(self, directory: Path, duration_s: float, seed: int = 1, concurrent_runs: int = 4,
                 speed: float = 60.0, fault_every_s: float = 8.0, steps: tuple[int, int] = (300, 700),
                 log: Callable[[str], None] = print) -> None:
        self.directory, self.duration_s, self.speed = directory, duration_s, speed
        self.concurrent_runs, self.fault_every_s, self.steps = concurrent_runs, fault_every_s, steps
        self.rng = random.Random(seed)
        self.log = log
        self.runs: list[Run] = []
        self.faults: Counter[str] = Counter()
        self.bad_published: list[tuple[bytes, str]] = []
        self.started = time.monotonic()
        self.live = directory / "live.duckdb"
        self.spool = directory / "spool"
        self.restarting: threading.Thread | None = None
        self.restart_error: SoakError | None = None
        self.outage_until: float | None = None
        self.outage_faults: list[tuple[float, str]] = []  # (when, kind) during the outage under way
        self.files = directory / "files"
        self.shipped: dict[tuple[int, int], int] = {}  # bytes shipped of each file, by (device, inode)
        self.rotations = 0

    # -- running ----------------------------------------------------------------------------------

    def run(self) -> Report:
        from pipeline.demo.demo import CopySaver
        from pipeline.emulators.monitoring import MonitoringEmulator
        from pipeline.emulators.pubsub import PubSubEmulator

        self.directory.mkdir(parents=True, exist_ok=True)
        self.pubsub = PubSubEmulator().start()
        broker = self.pubsub.broker
        broker.create_topic(types.Topic(name=TOPIC))
        for name in (SUBSCRIPTION, COPY):
            broker.create_subscription(types.Subscription(name=name, topic=TOPIC, ack_deadline_seconds=60))
        self.monitoring = MonitoringEmulator().start()
        self.saver = CopySaver(broker, self.directory / "copies.jsonl", COPY)
        self.pipelines = 0
        try:
            self.stream = self._start_pipeline()
            self._fleet()
            self._finish()
        finally:
            self._stop_everything()
        return self.verify()

    def _env(self) -> dict[str, str]:
        from pipeline.demo.demo import python_env

        return python_env(self.spool, self.pubsub.host)

    def _start_pipeline(self) -> Any:
        from pipeline.demo.demo import Process

        self.pipelines += 1
        stream = Process(f"pipeline-{self.pipelines}", [
            sys.executable, "-m", "pipeline", "--streaming", "--runner=BundleBasedDirectRunner",
            f"--subscription={SUBSCRIPTION}", f"--duckdb={self.live}", "--snapshot_interval_s=3",
            "--silence_s=15", "--gc_after_s=20", f"--monitoring_project={PROJECT}",
            f"--monitoring_endpoint={self.monitoring.host}", "--monitoring_min_interval_s=5",
            "--monitoring_max_lag_s=1e9", "--log_level=INFO"],
            self._env(), self.directory / f"pipeline-{self.pipelines}.log",
            markers=("streaming from", "stopping:", "stopped"))
        if not stream.seen["streaming from"].wait(120):
            raise SoakError(f"the pipeline did not start; its log ends:\n{stream.tail()}")
        return stream

    def _say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.started:7.1f} s] {text}"
        self.log(line)
        with (self.directory / "soak.log").open("a") as out:
            out.write(line + "\n")

    def _fleet(self) -> None:
        """Runs the fleet and the faults until the soak's time is up and every run has ended."""
        end = self.started + self.duration_s
        # Each kind once first, every fault_every_s, in a random order (a late duplicate last: it
        # needs a run forgotten since it ended); then kinds at random, at random times.
        schedule = [kind for kind in FAULTS if kind not in (*OUTAGE_FAULTS, "late_duplicate")]
        self.rng.shuffle(schedule)
        schedule.append("late_duplicate")
        next_fault = self.started + self.fault_every_s
        next_report = self.started + 30
        while True:
            now = time.monotonic()
            if self.restart_error is not None:
                raise self.restart_error
            if self.stream.popen.poll() is not None and self.restarting is None:
                raise SoakError(f"the pipeline exited (code {self.stream.popen.returncode}); its log "
                                f"ends:\n{self.stream.tail()}")
            for due in [due for due in self.outage_faults if now >= due[0]]:
                if self._fault(due[1]):  # else again, until the outage ends
                    self.outage_faults.remove(due)
            if self.outage_until is not None and now >= self.outage_until:
                self._end_outage()
            if now < end:
                while sum(run.ended_at is None for run in self.runs) < self.concurrent_runs:
                    self._new_run()
                if now >= next_fault:
                    scheduled = bool(schedule)
                    kind = schedule.pop(0) if scheduled else self.rng.choice(FAULTS)
                    if self._fault(kind):
                        next_fault = now + (self.fault_every_s if schedule
                                            else self.rng.expovariate(1 / self.fault_every_s))
                    else:  # not possible now (Pub/Sub away, no run forgotten yet): after the next
                        if scheduled:  # a kind drawn at random is not kept: another is drawn
                            schedule.insert(1, kind)
                        next_fault = now + 2.0
            for run in self.runs:
                self._tend(run)
            self._ship()
            if now >= next_report:
                self._progress()
                next_report = now + 30
            if now >= end and all(run.ended_at is not None for run in self.runs):
                return
            if now > end + 600:
                raise SoakError("the fleet did not finish within 10 minutes of the soak's end")
            time.sleep(0.1)

    def _progress(self) -> None:
        active = sum(run.ended_at is None for run in self.runs)
        self._say(f"{len(self.runs)} runs ({active} active), {self.saver.messages:,} messages "
                  f"published, {self.pubsub.broker.unacknowledged(SUBSCRIPTION):,} not yet read; faults "
                  f"so far: {sum(self.faults.values())}")

    def _new_run(self) -> None:
        rng, index = self.rng, len(self.runs)
        steps = rng.randint(*self.steps)
        crashes = sorted(rng.sample(range(steps // 5, steps - 10), rng.choice((0, 1, 1, 2))))
        profile = {
            "accelerator_type": rng.choice(("v5p", "v5e", "v6e", "h100", "a100")),
            "chip_count": rng.choice((8, 16, 64, 256, 1024)), "run_group": rng.choice(("llm", "vision")),
            "location": rng.choice(("us-east5-a", "europe-west4-b")), "labels": [["team", "soak"]],
            "step_time_s": rng.uniform(0.8, 2.0), "checkpoint_every": rng.choice((25, 50, 100)),
            "eval_every": rng.choice((0, 100, 150)), "crashes_at": [], "restart_delay_s": [60, 120],
            "restore_checkpoint": rng.random() < 0.8,
        }
        # Simulated time runs ``speed`` times faster than the wall clock, so it starts a day
        # behind it: an event dated more than MAX_CLOCK_AHEAD_S after the pipeline's clock is a
        # dead letter.
        now = time.time()
        to_file = index % 4 == 1
        run = Run(f"soak-{index:04d}", profile, steps, rng.randrange(1 << 30), crashes,
                  small_spool=to_file or index % 3 == 2, to_file=to_file, anchor_s=now - 86_400,
                  anchor_wall=now)
        self.runs.append(run)

    def _tend(self, run: Run) -> None:
        """Starts a run's next attempt when it is due; notes how a finished attempt ended."""
        if run.ended_at is not None:
            return
        if run.restart_at is not None:
            if time.monotonic() >= run.restart_at:
                self._start_attempt(run)
            return
        attempt = run.attempts[-1]
        code = attempt.process.poll()
        if code is None:
            return
        if not attempt.killed:
            if code != 0:
                raise SoakError(f"attempt {attempt.index} of {run.run_id} failed (exit {code}); see "
                                f"{attempt.progress}.log")
            attempt.status = json.loads(Path(f"{attempt.progress}.json").read_text())
            if attempt.status["ended"]:
                run.ended_at = time.monotonic()
                return
        run.restart_at = time.monotonic() + self.rng.uniform(0.5, 2.0)  # the scheduler's delay

    def _start_attempt(self, run: Run) -> None:
        index, first_step = len(run.attempts), 0
        if index and run.profile["restore_checkpoint"]:  # from the last checkpoint
            last = run.attempts[-1]
            first_step = last.status["resume_step"] if last.status else last.read_progress()[3]
        crash = next((step for step in run.crashes if step > first_step), None)
        if crash is not None:
            run.crashes.remove(crash)
        progress = self.directory / "attempts" / f"{run.run_id}-{index}"
        progress.parent.mkdir(parents=True, exist_ok=True)
        settings = {"spool_dir": str(self.spool), "max_latency_s": 0.25, "heartbeat_interval_s": None,
                    "close_timeout_s": 300.0, "retry_initial_backoff_s": 0.05, "retry_max_backoff_s": 0.5,
                    "send_timeout_s": 2.0,
                    "max_queue_events": SMALL_QUEUE_EVENTS if run.small_spool else MAX_QUEUE_EVENTS}
        if run.small_spool:
            settings.update(max_spool_bytes=SMALL_SPOOL_BYTES, spool_segment_bytes=4096)
        destination = f"file:{self.files / run.run_id}.jsonl" if run.to_file else TOPIC
        spec = {"run_id": run.run_id, "destination": destination, "profile": run.profile,
                "settings": settings, "steps": run.steps, "first_step": first_step, "crash_at_step": crash,
                "restore": index > 0 and run.profile["restore_checkpoint"], "seed": run.seed + index,
                "anchor_s": run.anchor_s, "anchor_wall": run.anchor_wall, "speed": self.speed,
                "skew_s": self.rng.uniform(-20, 20) if index else 0.0, "progress": str(progress)}
        Path(f"{progress}.spec.json").write_text(json.dumps(spec))
        with Path(f"{progress}.log").open("wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "support.soak_job", f"{progress}.spec.json"],
                                       cwd=REPO, env={**self._env(), "PYTHONPATH": str(REPO / "tests")},
                                       stdout=log, stderr=subprocess.STDOUT)
        run.attempts.append(Attempt(index, progress, process))
        run.restart_at = None

    # -- faults -----------------------------------------------------------------------------------

    def _fault(self, kind: str) -> bool:
        """Injects a fault of ``kind``; False if it cannot be now."""
        applied = getattr(self, f"_{kind}")()
        if applied:
            self.faults[kind] += 1
            self._say(f"fault {kind}: {applied}")
        return bool(applied)

    def _pubsub_outage(self) -> str | None:
        # While a job writing a file runs: it spills as long (see OUTAGE_FAULTS).
        writing = [run for run, _ in self._running() if run.to_file]
        if self.outage_until is not None or not writing:
            return None
        # In a long soak the first outage and every fifth outlasts the client's 60 s of retries.
        long = self.duration_s >= 600 and self.faults["pubsub_outage"] % 5 == 0
        seconds = 75.0 if long else self.rng.uniform(6, 12)
        self.pubsub.stop(grace_s=0.2)
        for run in writing:
            self._rotate(run)
            (self.files / f"{run.run_id}.jsonl").mkdir()
        now = time.monotonic()
        self.outage_until = now + seconds
        # While jobs spill: the spool cleaned under them, then one preempted as it spills.
        self.outage_faults = [(now + seconds * share, kind) for share, kind in zip((0.4, 0.7), OUTAGE_FAULTS,
                                                                                    strict=True)]
        return f"Pub/Sub away for {seconds:.0f} s"

    def _end_outage(self) -> None:
        from pipeline.emulators.pubsub import PubSubEmulator

        self.pubsub = PubSubEmulator(port=self.pubsub.port, broker=self.pubsub.broker).start()
        for path in self.files.glob("*.jsonl"):
            if path.is_dir():
                path.rmdir()
        self.outage_until = None
        self.outage_faults = []
        self._say("Pub/Sub and the file destinations are back")

    def _running(self) -> list[tuple[Run, Attempt]]:
        """The attempts running now that have written their progress (their handlers are set)."""
        return [(run, run.attempts[-1]) for run in self.runs if run.ended_at is None
                and run.restart_at is None and run.attempts[-1].process.poll() is None
                and run.attempts[-1].progress.exists() and run.attempts[-1].progress.stat().st_size]

    def _kill_attempt(self) -> str | None:
        running = self._running()
        if not running:
            return None
        run, attempt = self.rng.choice(running)
        attempt.process.send_signal(signal.SIGKILL)
        attempt.killed = True
        return f"killed attempt {attempt.index} of {run.run_id}"

    def _preempt(self) -> str | None:
        from emitter.spool import run_directory

        running = self._running()
        spilling = [(run, attempt) for run, attempt in running
                    if any(map(_being_written, run_directory(self.spool, run.run_id).glob("*.seg")))]
        if not running or (self.outage_until is not None and not spilling):
            return None
        run, attempt = self.rng.choice(spilling or running)
        attempt.process.send_signal(signal.SIGTERM)
        return f"SIGTERM to attempt {attempt.index} of {run.run_id}"

    def _spool_removal(self) -> str | None:
        """Removes what a cleaner may remove without losing a live writer's events: segments being
        written (their writers write them again from their descriptors), lock files, and the
        directories that are then empty. Sealed segments, which no process holds, stay."""
        removed = Counter[str]()
        for directory in self.spool.iterdir() if self.spool.is_dir() else ():
            for path in list(directory.iterdir()):
                if path.suffix == ".lock" or (path.suffix == ".seg" and _being_written(path)):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        removed[path.suffix] += 1
            with contextlib.suppress(OSError):  # not empty: it holds sealed segments
                directory.rmdir()
                removed["directories"] += 1
        if not removed:
            return None
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(removed.items()))
        return f"removed from the spool {kinds}"

    def _rotation(self) -> str | None:
        writing = [run for run, _ in self._running() if run.to_file
                   and (self.files / f"{run.run_id}.jsonl").is_file()]
        if not writing:
            return None
        run = self.rng.choice(writing)
        self._rotate(run)
        return f"{run.run_id}.jsonl rotated under its writer"

    def _rotate(self, run: Run) -> None:
        path = self.files / f"{run.run_id}.jsonl"
        if path.is_file():
            self.rotations += 1
            path.rename(path.with_name(f"{path.name}.{self.rotations}"))

    def _ship(self) -> None:
        """Publishes the whole lines the file destinations gained since last time, each file
        followed by its inode through its renames, as a node's log agent ships a job's log."""
        if self.outage_until is not None or not self.files.is_dir():
            return
        for path in sorted(self.files.iterdir()):
            if path.is_dir():  # a destination that is away
                continue
            try:
                with path.open("rb") as handle:
                    info = os.fstat(handle.fileno())
                    key = (info.st_dev, info.st_ino)
                    handle.seek(self.shipped.get(key, 0))
                    data = handle.read()
            except FileNotFoundError:
                continue
            whole = data[:data.rfind(b"\n") + 1]
            for line in whole.splitlines():
                self._publish(line)
            self.shipped[key] = self.shipped.get(key, 0) + len(whole)

    def _duplicates(self) -> str:
        count = self.rng.randint(5, 40)
        self.pubsub.broker.duplicate_next(count)
        return f"the next {count} messages are delivered twice"

    def _pull_failures(self) -> str:
        count = self.rng.randint(2, 6)
        self.pubsub.broker.fail_pulls_next(count, grpc.StatusCode.RESOURCE_EXHAUSTED, SUBSCRIPTION)
        return f"the next {count} pulls fail with RESOURCE_EXHAUSTED"

    def _publish(self, data: bytes) -> bool:
        if self.outage_until is not None:
            return False
        self.pubsub.broker.publish(TOPIC, [types.PubsubMessage(data=data)])
        return True

    def _bad_messages(self) -> str | None:
        chosen = self.rng.sample(BAD_MESSAGES, self.rng.randint(1, 3))
        if not all(self._publish(data) for data, _ in chosen):
            return None
        self.bad_published.extend(chosen)
        return f"{len(chosen)} invalid messages published"

    def _late_duplicate(self) -> str | None:
        ended = {run.run_id for run in self.runs if run.ended_at is not None
                 and time.monotonic() - run.ended_at > 25}  # forgotten by the pipeline (gc_after_s)
        lines = self._copies()
        old = [line for line in lines if _run_of(line) in ended]
        if not old:
            return None
        line = self.rng.choice(old)
        return f"a message of {_run_of(line)} published again" if self._publish(line) else None

    def _copies(self) -> list[bytes]:
        """Every message saved from the copy subscription so far."""
        path = self.directory / "copies.jsonl"
        return path.read_bytes().split(b"\n")[:-1] if path.exists() else []

    def _monitoring(self) -> str:
        # A few failures: retried within seconds. (On the DirectRunner a write waiting out
        # Cloud Monitoring's retries holds up the whole stream, up to a minute per bundle.)
        count = self.rng.randint(1, 6)
        code = self.rng.choice((grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED))
        self.monitoring.store.fail_next(count, code)
        return f"Cloud Monitoring fails the next {count} requests with {code.name}"

    def _restart(self) -> str | None:
        if self.restarting is not None and self.restarting.is_alive():
            return None
        self.restarting = threading.Thread(target=self._restart_pipeline, name="soak-restart", daemon=True)
        self.restarting.start()
        return "the pipeline is stopped (SIGTERM) and started again"

    def _restart_pipeline(self) -> None:
        try:
            self._stop_pipeline(self.stream)
            self.stream = self._start_pipeline()
        except SoakError as error:
            self.restart_error = error
        self.restarting = None

    def _stop_pipeline(self, stream: Any) -> None:
        stream.stop(((signal.SIGTERM, 120.0),))
        if stream.popen.returncode != 0 or not stream.seen["stopped"].is_set():
            raise SoakError(f"the pipeline did not stop cleanly (exit {stream.popen.returncode}); its "
                            f"log ends:\n{stream.tail()}")
        self._note_events(stream.name)

    def _note_events(self, pipeline: str) -> None:
        """What the events table holds once ``pipeline`` has stopped, by run and attempt (count of
        seqs, lowest and highest), in ``<pipeline>.events.json``: where a run ends short of
        events, these say which pipeline's writes held them."""
        if self.live.is_file():
            held = query(self.live, "SELECT run_id, attempt_id, count(DISTINCT seq), min(seq), max(seq) "
                                    "FROM events GROUP BY ALL ORDER BY ALL")
            (self.directory / f"{pipeline}.events.json").write_text(json.dumps(held))

    # -- the end ----------------------------------------------------------------------------------

    def _finish(self) -> None:
        """Waits until the stream has read everything, then stops it cleanly."""
        if self.restarting is not None:
            self.restarting.join(timeout=300)
        if self.outage_until is not None:
            self._end_outage()
        self._ship()
        deadline = time.monotonic() + 300
        while self.pubsub.broker.unacknowledged(SUBSCRIPTION) and time.monotonic() < deadline:
            time.sleep(0.5)
        if self.pubsub.broker.unacknowledged(SUBSCRIPTION):
            raise SoakError("the pipeline did not read every message within 5 minutes of the end")
        self._stop_pipeline(self.stream)  # after the interval snapshots that are pending
        self.saver.close()
        self._say(f"the fleet is done and the stream stopped; {self.saver.messages:,} messages published")

    def _stop_everything(self) -> None:
        for run in self.runs:
            for attempt in run.attempts:
                if attempt.process.poll() is None:
                    attempt.process.kill()
                attempt.process.wait()
        stream = getattr(self, "stream", None)
        if stream is not None and stream.popen.poll() is None:
            stream.stop(((signal.SIGINT, 0.5), (signal.SIGINT, 10.0)))
        self.saver.close()
        self.monitoring.stop()
        if self.outage_until is None:
            self.pubsub.stop()

    # -- verifying --------------------------------------------------------------------------------

    def verify(self) -> Report:
        from pipeline.core.events import parse_batch

        problems: list[str] = []
        backfill, replay = self.directory / "backfill.duckdb", self.directory / "replay.duckdb"
        for arguments in ([f"--from_duckdb={self.live}", f"--duckdb={backfill}"],
                          [f"--events={self.directory / 'copies.jsonl'}", f"--duckdb={replay}"]):
            done = subprocess.run([sys.executable, "-m", "pipeline", *arguments], cwd=REPO, env=self._env(),
                                  capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                raise SoakError(f"python -m pipeline {' '.join(arguments)} failed:\n{done.stderr[-3000:]}")

        # Nothing valid that was published is missing from the events table, nothing more is there.
        published: set[tuple[str, str, int]] = set()
        for line in self._copies():
            batch, _ = parse_batch(line)
            if batch is not None:
                published.update((batch.run_id, batch.attempt_id, e.seq) for e in batch.events())
        accepted = {(str(r), str(a), int(s)) for r, a, s in
                    query(self.live, "SELECT DISTINCT run_id, attempt_id, seq FROM events")}
        if accepted != published:
            problems.append(f"the events table differs from what was published: {len(published - accepted)} "
                            f"published events missing, {len(accepted - published)} never published")

        # Every bad message is a dead letter with its reason; the engine never failed.
        letters = query(self.live, "SELECT source, reason FROM dead_letter")
        for reason, count in Counter(reason for _, reason in self.bad_published).items():
            found = sum(reason in text for _, text in letters)
            if found < count:
                problems.append(f"{count} messages published that the parser refuses with {reason!r}, "
                                f"{found} such dead letters")
        if any(source == "engine" for source, _ in letters):
            problems.append("the engine failed on some input (see the dead_letter rows of source engine)")

        problems += _compare_final_snapshots(self.live, backfill)
        problems += _compare_windows(self.live)
        for name in ("goodput_snapshots", "badput_snapshots", "step_stats", "disruptions"):
            if table(backfill, name) != table(replay, name):
                problems.append(f"{name}: the backfill from the events table differs from a clean replay "
                                "of everything published")
        counts, loss_problems = self._losses(accepted)
        problems += loss_problems
        return Report(time.monotonic() - self.started, len(self.runs),
                      sum(len(run.attempts) for run in self.runs), self.faults, self.saver.messages,
                      counts["recorded"], len(accepted), counts["dropped"], counts["lost_to_kills"],
                      counts["missing"], len(letters), problems)

    def _losses(self, accepted: set[tuple[str, str, int]]) -> tuple[Counter[str], list[str]]:
        """Every event each attempt recorded is in the table, counted as dropped by its emitter
        (or, left in the spool, by a later attempt of its run, to make room: its backlog_dropped),
        or lost with a killed attempt's memory (at most its max_queue_events)."""
        counts: Counter[str] = Counter()
        problems: list[str] = []
        by_attempt: dict[str, list[int]] = {}
        for _, attempt_id, seq in accepted:
            by_attempt.setdefault(attempt_id, []).append(seq)
        missing = dict(query(self.live, "SELECT run_id, missing_events FROM latest_goodput "
                                         "WHERE window_s = 0"))
        for run in self.runs:
            gaps = 0
            left = 0  # events left in the spool that no attempt delivered: a later one's backlog_dropped
            for attempt in run.attempts:
                attempt_id, recorded, dropped, _ = attempt.read_progress()
                seqs = sorted(by_attempt.get(attempt_id, []))
                gaps += (seqs[-1] + 1 - len(seqs)) if seqs else 0
                if attempt.status is not None:
                    status = attempt.status
                    recorded, dropped = status["recorded"], status["dropped"]
                    counts["dropped"] += dropped + status["backlog_dropped"]
                    left += recorded - dropped - len(seqs)
                    if not 0 <= recorded - dropped - len(seqs) <= status["kept"]:
                        problems.append(f"{run.run_id} attempt {attempt.index}: {recorded} recorded, "
                                        f"{dropped} dropped, {status['kept']} left in the spool, but "
                                        f"{len(seqs)} in the events table")
                    if dropped - status["dropped_removed"] and not run.small_spool:
                        problems.append(f"{run.run_id} attempt {attempt.index} dropped {dropped} events "
                                        "with room in memory and on disk")
                    # close() says whether all arrived; a preempted attempt left some in the spool
                    if status["delivered"] != (not dropped and not status["kept"]):
                        problems.append(f"{run.run_id} attempt {attempt.index} ended with close() "
                                        f"{status['delivered']}, {dropped} dropped and {status['kept']} "
                                        "kept in the spool")
                else:  # killed: what it recorded and dropped after its last progress line is not known
                    counts["dropped"] += dropped
                    lost = max(0, recorded - dropped - len(seqs))
                    counts["lost_to_kills"] += lost
                    limit = SMALL_QUEUE_EVENTS if run.small_spool else MAX_QUEUE_EVENTS
                    if lost > limit:
                        problems.append(f"{run.run_id} attempt {attempt.index}, killed, lost {lost} events: "
                                        f"more than its memory holds ({limit})")
                counts["recorded"] += recorded
            backlog_dropped = sum(attempt.status["backlog_dropped"] for attempt in run.attempts
                                  if attempt.status is not None)
            if left > backlog_dropped:
                problems.append(f"{run.run_id}: {left} events its attempts left in the spool are not in "
                                f"the events table, and its later attempts dropped {backlog_dropped}")
            counts["missing"] += gaps
            if missing.get(run.run_id) != gaps:
                problems.append(f"{run.run_id}: missing_events is {missing.get(run.run_id)}, the gaps in "
                                f"its attempts' sequence numbers are {gaps}")
        return counts, problems


def _being_written(path: Path) -> bool:
    """Whether a process holds the spool segment ``path`` open for writing (its flock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _run_of(line: bytes) -> str | None:
    try:
        run_id = json.loads(line).get("run_id")
    except (ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) else None


#: The columns of a snapshot's rows that are not its numbers: when it was taken.
_TIME_COLUMNS = frozenset({"snapshot_time"})


def _final_rows(database: Path, name: str, where: str = "TRUE") -> dict[str, list[tuple[Any, ...]]]:
    """Each run's rows of table ``name`` at its latest snapshot, without the snapshot time, sorted."""
    with duckdb.connect(str(database), read_only=True) as connection:
        cursor = connection.execute(
            f"SELECT * FROM {name} WHERE {where} QUALIFY snapshot_time = "
            "max(snapshot_time) OVER (PARTITION BY run_id)")
        columns = [column[0] for column in cursor.description]
        rows: dict[str, list[tuple[Any, ...]]] = {}
        for row in cursor.fetchall():
            record = dict(zip(columns, row, strict=True))
            rows.setdefault(record["run_id"], []).append(
                tuple(value for column, value in record.items() if column not in _TIME_COLUMNS))
    return {run_id: sorted(found, key=repr) for run_id, found in rows.items()}


def _compare_final_snapshots(live: Path, backfill: Path) -> list[str]:
    """Each run's final cumulative goodput row, badput rows, disruptions and step statistics in
    the live tables equal the backfill's, but for the time they were taken."""
    problems = []
    for name, where in (("goodput_snapshots", "window_s = 0"), ("badput_snapshots", "window_s = 0"),
                        ("disruptions", "TRUE"), ("step_stats", "TRUE")):
        ours, theirs = _final_rows(live, name, where), _final_rows(backfill, name, where)
        for run_id in sorted(set(ours) | set(theirs)):
            if ours.get(run_id) != theirs.get(run_id):
                problems.append(f"{name}, {run_id}: live {ours.get(run_id)} != backfill "
                                f"{theirs.get(run_id)}")
    return problems


def _compare_windows(live: Path) -> list[str]:
    """Each run's final snapshot in the live tables, rolling windows included, equals the
    engine's from scratch on the events table at the same time."""
    from goodput_schemas import table_schema
    from pipeline.core import engine
    from pipeline.core.events import parse_batch
    from pipeline.core.rows import BADPUT, GOODPUT, snapshot_rows
    from pipeline.sinks import raw_events

    problems = []
    finals = query(live, "SELECT run_id, epoch_us(max(snapshot_time)) FROM goodput_snapshots "
                          "GROUP BY run_id")
    sizes = {size for size, in query(live, "SELECT DISTINCT window_s FROM goodput_snapshots")}
    windows = tuple(sorted(sizes - {0}))
    ours = {GOODPUT: _final_rows(live, "goodput_snapshots"), BADPUT: _final_rows(live, "badput_snapshots")}
    for run_id, as_of_us in finals:
        state = engine.RunState(run_id)
        for source, data in raw_events.DuckDBEvents(str(live)).run_history(run_id)[0]:
            batch, _ = parse_batch(data, source)
            assert batch is not None
            state.add_batch(batch)
        snapshot = state.snapshot(int(as_of_us), windows)
        assert snapshot is not None
        expected: dict[str, list[tuple[Any, ...]]] = {GOODPUT: [], BADPUT: []}
        for name, row in snapshot_rows(snapshot):
            if name in expected:
                expected[name].append(tuple(_stored(row.get(field["name"])) for field in table_schema(name)
                                             if field["name"] not in _TIME_COLUMNS))
        for name, rows in expected.items():
            if sorted(rows, key=repr) != ours[name].get(run_id, []):
                problems.append(f"{name}, {run_id}: the live final snapshot differs from the engine's from "
                                "scratch at the same time")
    return problems


def _stored(value: Any) -> Any:
    """A row's value as DuckDB gives it back (timestamps without their zone)."""
    import datetime

    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return value
