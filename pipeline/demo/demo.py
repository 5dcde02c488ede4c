"""The live local demo: a fleet of training jobs, end to end, on one machine in about two minutes.

    python -m pipeline.demo [--output-dir demo-output] [--duration-s 90] [--runs 8] [--no-jax] [--quiet]

What it starts, and stops when it ends (on success, on an error and on Ctrl-C alike):

* in this process, the local Pub/Sub emulator (a topic, the pipeline's subscription, and a copy
  subscription whose messages are saved to ``events.jsonl``) and the Cloud Monitoring stand-in;
* the streaming pipeline, as a subprocess: ``python -m pipeline --streaming
  --runner=BundleBasedDirectRunner`` reading the subscription, writing ``goodput.duckdb`` and
  Cloud Monitoring, exactly as one runs it by hand;
* a fleet of simulated training jobs (``pipeline.demo.fleet``), one thread each, publishing
  through the real emitter in real time: their simulated clocks run ``SPEED`` times faster than
  the wall clock, so hours of a fleet pass in a minute or two. Different accelerators and chip
  counts, each its own MFU; crashes and restarts that lose progress, one that restarts from step
  0; checkpoints; evals (custom badput); one run slows down; one hangs (it stops stepping but does
  not end: its rolling goodput falls to zero, a stall) until the demo stops;
* when JAX is installed (``pip install 'jax[cpu]'``), ``pipeline.demo.jax_train``: a real, small
  JAX training job, as a subprocess, dating its events on the fleet's clock too (its measured
  durations ``SPEED`` times as long), so that every run's elapsed time is a part of the fleet's.

Meanwhile it shows the fleet's live goodput, read from the DuckDB file. Then it stops the stream
(SIGINT: the pipeline reports what it has read and stops), replays the saved messages in batch
into ``batch.duckdb``, checks that each run's live numbers equal the replay's, writes
``report.html``, and prints the fleet summary. Exit status: 0 when all is well, 1 when the live and
batch numbers differ or a part failed, 2 for a usage mistake (nothing is started), 130 when
interrupted.

The output directory is the demo's own: it writes only into a new or empty directory, which it
marks with a ``.goodput-demo`` file, or into one it marked before, where it replaces its earlier
outputs (``OUTPUTS``) and nothing else. Any other directory is refused, untouched: a user's
``report.html`` in the current directory is never a demo output. One demo at a time writes in a
directory: it holds an flock on the marker file (``DirectoryLock``) from before it replaces
anything until it ends, and a second demo there exits 2 at once, naming the first one's pid.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.demo.fleet import (
    DEFAULT_DURATION_S,
    FLEET,
    SPEED,
    FleetClock,
    FleetControl,
    SimulatedJob,
    fleet_runs,
    longest_s,
    start_fleet,
)

if TYPE_CHECKING:
    from pipeline.app.alerts import AlertThresholds

PROJECT = "goodput-demo"
TOPIC = f"projects/{PROJECT}/topics/goodput"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/pipeline"
COPY = f"projects/{PROJECT}/subscriptions/copy"  # the same messages, saved for the batch replay
SNAPSHOT_INTERVAL_S = 2.0
MONITORING_MIN_INTERVAL_S = 5.0


JAX_RUN = "jax-mlp-cpu"

#: The file that marks a directory as one the demo made, and its first line; the demo writing
#: there holds an flock on it and writes its pid on its second line.
MARKER = ".goodput-demo"
MARKER_TEXT = b"goodput demo output directory"
MARKER_LINE = MARKER_TEXT + b": the goodput demo writes here and replaces its own outputs on each run\n"
#: What the demo writes in its directory; a new run replaces these (and ``spool/``), nothing else.
OUTPUTS = ("goodput.duckdb", "goodput.duckdb.wal", "batch.duckdb", "batch.duckdb.wal", "events.jsonl",
           "report.html", "stream.log", "batch.log", "jax_train.log")


class DemoError(Exception):
    """A part of the demo failed; the message says which and where its log is."""


class _Interrupted(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: everything started is stopped."""


# -- processes ----------------------------------------------------------------------------------


class Process:
    """A subprocess in its own session (Ctrl-C in a terminal reaches only the demo, which stops
    it), its output in a log file and watched for marker lines."""

    def __init__(self, name: str, command: Sequence[str], env: dict[str, str], log: Path,
                 markers: Sequence[str] = ()) -> None:
        self.name, self.log = name, log
        self.seen = {marker: threading.Event() for marker in markers}
        self.popen = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"demo-{name}-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        with self.log.open("w") as out:
            for line in self.popen.stdout:
                out.write(line)
                out.flush()
                for marker, event in self.seen.items():
                    if marker in line:
                        event.set()

    def output(self) -> str:
        self._reader.join(timeout=5)
        return self.log.read_text() if self.log.exists() else ""

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def stop(self, plan: Sequence[tuple[signal.Signals, float]] = ((signal.SIGTERM, 10.0),)) -> None:
        """Sends each signal of ``plan`` in turn, waiting its time for an exit; then kills it."""
        try:
            for signum, wait_s in plan:
                if self.popen.poll() is not None:
                    break
                self.popen.send_signal(signum)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(wait_s)
        finally:
            if self.popen.poll() is None:
                self.popen.kill()
            self.popen.wait()
            self._reader.join(timeout=5)


def python_env(spool_dir: Path, host: str | None = None) -> dict[str, str]:
    """The environment of a Python subprocess: the demo's spool, and the Pub/Sub emulator's
    address when given. It runs this interpreter, so it imports what the demo imports."""
    env = {**os.environ, "GOODPUT_SPOOL_DIR": str(spool_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("PUBSUB_EMULATOR_HOST", None)
    return env if host is None else {**env, "PUBSUB_EMULATOR_HOST": host}


def jax_available() -> bool:
    return importlib.util.find_spec("jax") is not None


# -- reading the results ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LiveRun:
    goodput_pct: float | None
    last_hour_pct: float | None
    last_step: int | None
    disruptions: int
    ended: bool
    stalled: bool


def read_live(database: Path) -> tuple[dict[str, LiveRun], int] | None:
    """Each run's latest figures and the count of cumulative snapshots, or None while the
    stream holds the file (it opens it for each write) or has not created it yet."""
    import duckdb

    from pipeline.sinks.duckdb import open_reader

    if not database.exists():
        return None
    try:
        with open_reader(database) as connection:
            rows = connection.execute(
                "SELECT run_id, window_s, goodput_pct, productive_time_s, last_step, disruptions, ended "
                "FROM latest_goodput WHERE window_s IN (0, 900, 3600)").fetchall()
            count = connection.execute("SELECT count(*) FROM goodput_snapshots WHERE window_s = 0").fetchone()
    except (duckdb.IOException, duckdb.CatalogException):
        return None
    by_run: dict[str, dict[int, tuple[Any, ...]]] = {}
    for run_id, window_s, *values in rows:
        by_run.setdefault(run_id, {})[window_s] = tuple(values)
    runs = {}
    for run_id, windows in by_run.items():
        cumulative = windows.get(0)
        if cumulative is None:
            continue
        goodput, _, last_step, disruptions, ended = cumulative
        hour, quarter = windows.get(3600), windows.get(900)
        runs[run_id] = LiveRun(goodput, hour[0] if hour else None, last_step, disruptions, bool(ended),
                               bool(quarter and not ended and quarter[1] == 0))
    return runs, int(count[0]) if count else 0


def latest_cumulative(database: Path) -> dict[str, tuple[Any, ...]]:
    """Each run's latest (goodput, total time, disruptions, max productive step, ended)."""
    from pipeline.sinks.duckdb import open_reader

    with open_reader(database) as connection:
        rows = connection.execute(
            "SELECT run_id, goodput_pct, total_time_s, disruptions, max_productive_step, ended "
            "FROM latest_goodput WHERE window_s = 0").fetchall()
    return {row[0]: tuple(row[1:]) for row in rows}


def compare(live: dict[str, tuple[Any, ...]], batch: dict[str, tuple[Any, ...]]) -> list[str]:
    """The differences between the live and the batch figures of each run; [] when equal."""
    differences = [f"{run_id}: only in the {where}" for where, mine, other in
                   (("live tables", live, batch), ("batch replay", batch, live))
                   for run_id in sorted(set(mine) - set(other))]
    names = ("goodput %", "total time s", "disruptions", "max productive step", "ended")
    tolerances = (1e-9, 1e-6, 0, 0, 0)
    for run_id in sorted(set(live) & set(batch)):
        for name, tolerance, ours, theirs in zip(names, tolerances, live[run_id], batch[run_id], strict=True):
            if ours is None or theirs is None:
                equal = ours is theirs
            else:
                equal = abs(ours - theirs) <= tolerance if tolerance else ours == theirs
            if not equal:
                differences.append(f"{run_id}: {name} live {ours} != batch {theirs}")
    return differences


# -- the console ---------------------------------------------------------------------------------


class Console:
    """The live view: a block of lines redrawn in place on a terminal, a few plain lines every
    ``plain_every_s`` otherwise; nothing when quiet."""

    def __init__(self, out: TextIO, quiet: bool, plain_every_s: float = 15.0) -> None:
        self.out, self.quiet = out, quiet
        self.tty = out.isatty() and os.environ.get("TERM") != "dumb"
        self.plain_every_s = plain_every_s
        self._drawn = 0
        self._last_plain = 0.0

    def say(self, text: str) -> None:
        if not self.quiet:
            self._drawn = 0
            self.out.write(text + "\n")
            self.out.flush()

    def result(self, text: str) -> None:
        """Shown even when quiet."""
        self._drawn = 0
        self.out.write(text + "\n")
        self.out.flush()

    def show(self, lines: list[str], force: bool = False) -> None:
        if self.quiet:
            return
        if self.tty:
            width = shutil.get_terminal_size().columns - 1  # a wrapped line would break the redraw
            up = f"\x1b[{self._drawn}F" if self._drawn else ""
            self.out.write(up + "".join(f"\x1b[2K{line[:width]}\n" for line in lines))
            self._drawn = len(lines)
            self.out.flush()
        elif force or time.monotonic() - self._last_plain >= self.plain_every_s:
            self._last_plain = time.monotonic()
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def view_lines(elapsed_s: float, duration_s: float, runs: Sequence[tuple[str, str, int]],
               live: dict[str, LiveRun], snapshots: int, recorded: int, sent: int, messages: int,
               events: int) -> list[str]:
    lines = [f"fleet goodput demo · {elapsed_s:5.1f} s of ~{duration_s:.0f} s "
             f"(≈ {elapsed_s * SPEED / 3600:.1f} simulated hours) · {len(live)} runs seen · "
             f"{snapshots} snapshots written",
             f"  emitters: {recorded:,} events recorded, {sent:,} published · "
             f"Pub/Sub: {messages:,} messages, {events:,} events (all runs)",
             f"  {'run':20} {'accelerator':>11} {'chips':>5} {'step':>6} {'goodput':>8} {'last hour':>9} "
             f"{'disruptions':>11}  status"]
    for run_id, accelerator, chips in runs:
        run = live.get(run_id)
        if run is None:
            lines.append(f"  {run_id:20} {accelerator:>11} {chips:>5} {'-':>6} {'-':>8} {'-':>9} {'-':>11}  "
                         "waiting")
            continue
        status = "ended" if run.ended else "STALLED (no step for 15 min)" if run.stalled else "training"
        step = "-" if run.last_step is None else str(run.last_step)
        lines.append(f"  {run_id:20} {accelerator:>11} {chips:>5} {step:>6} {_percent(run.goodput_pct):>8} "
                      f"{_percent(run.last_hour_pct):>9} {run.disruptions:>11}  {status}")
    return lines


# -- the copy subscription --------------------------------------------------------------------------


class CopySaver:
    """Saves every message of the copy subscription to a file (an emitter file: one message a
    line), as it arrives, for the batch replay; counts messages and events."""

    def __init__(self, broker: Any, path: Path, subscription: str = COPY) -> None:
        self.broker, self.path, self.subscription = broker, path, subscription
        self.messages = self.events = 0
        self._stop = threading.Event()
        self._out = path.open("wb")
        self._thread = threading.Thread(target=self._run, name="demo-copy-saver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(wait_s=0.2)

    def _drain(self, wait_s: float) -> int:
        batch = self.broker.pull(self.subscription, 500, wait_s=wait_s)
        if batch:
            self.broker.acknowledge(self.subscription, [m.ack_id for m in batch])
            for received in batch:
                data = received.message.data
                self._out.write(data + b"\n")
                self.messages += 1
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self.events += len(json.loads(data)["events"])
            self._out.flush()
        return len(batch)

    def close(self) -> None:
        """Saves what is left and closes the file; idempotent."""
        if self._out.closed:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        while self._drain(wait_s=0.2):
            pass
        self._out.close()


# -- the demo ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from pipeline.app.checks import OneLineParser

    parser = OneLineParser(
        prog="goodput demo",
        description="Run a live local fleet end to end in about two minutes: simulated training jobs "
                    "(and a real JAX one) publish goodput events through the emitter to a local Pub/Sub "
                    "emulator; the streaming pipeline writes DuckDB and a local Cloud Monitoring; a batch "
                    "replay of the same events checks the live numbers; an HTML report is written.",
        epilog="Outputs in the output directory: goodput.duckdb (the live tables), events.jsonl (every "
               "message), batch.duckdb (their batch replay), report.html, and the logs of the stream, "
               f"the replay and the JAX job. The demo marks a directory it writes with a {MARKER} file; "
               "it refuses, touching nothing, a directory that holds files and lacks that mark. Query "
               "the tables with: goodput query --list.")
    parser.add_argument("--output-dir", type=Path, default=Path("demo-output"),
                        help="where the outputs go: a new or empty directory, or one an earlier demo "
                             "made, whose demo outputs are replaced (other files there are kept); any "
                             "other directory, and one another demo is writing in, is refused, untouched "
                             "(default: %(default)s)")
    parser.add_argument("--runs", type=int, default=len(FLEET),
                        help=f"simulated runs (default: %(default)s; beyond {len(FLEET)} the fleet repeats "
                             "under new names)")
    parser.add_argument("--duration-s", type=float, default=DEFAULT_DURATION_S,
                        help="how long the fleet trains, in wall-clock seconds; the runs' steps scale with "
                             f"it, {SPEED:.0f} simulated seconds a second (default: %(default)s; the whole "
                             "demo takes about 20 s more)")
    parser.add_argument("--no-jax", action="store_true",
                        help="leave out the real JAX training job (left out anyway when JAX is not "
                             "installed)")
    parser.add_argument("--quiet", action="store_true",
                        help="no live view and no fleet summary: only the outcome")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 100:
        parser.error("--runs must be between 1 and 100")
    if not 10 <= args.duration_s <= 3600:
        parser.error("--duration-s must be between 10 and 3600")
    return args


def _marked(directory: Path) -> bool:
    """Whether the demo made ``directory`` (its marker file is there, and says so)."""
    marker = directory / MARKER
    if marker.is_symlink() or not marker.is_file():  # never open a FIFO, nor follow a link out
        return False
    try:
        with marker.open("rb") as handle:
            return handle.read(len(MARKER_TEXT)) == MARKER_TEXT
    except OSError:
        return False


class DirectoryLock:
    """What keeps two demos from writing in one directory: an flock on its marker file, held
    while a demo writes there and released by the kernel when the process ends, however it ends.
    The holder writes its pid on the marker's second line, for the message of a demo refused."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._kept = 0  # the marker's bytes before the holder's line

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self, directory: Path, create: bool) -> None:
        """Takes the lock on ``directory``'s marker, which is made (with its first line) when
        ``create``; a ``UsageError`` when another demo holds it."""
        from pipeline.app.checks import UsageError

        marker = directory / MARKER
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            try:
                fd = os.open(marker, flags | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)
                made = create
            except FileExistsError:  # another demo made it since the directory was found empty
                fd, made = os.open(marker, flags), False
        except OSError as error:
            raise UsageError(f"cannot lock --output-dir={directory}: {error.strerror} ({MARKER})") from None
        try:
            # Blocking only on a marker it made: another process holds that one for a moment at most.
            fcntl.flock(fd, fcntl.LOCK_EX if made else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise UsageError(f"another demo is writing {directory}{f' (pid {holder})' if holder else ''}: "
                             "wait for it to end, or name another --output-dir") from None
        if made:
            os.write(fd, MARKER_LINE)
        first = os.pread(fd, len(MARKER_LINE) + 4096, 0).split(b"\n", 1)[0]
        if not first.startswith(MARKER_TEXT):  # its maker was between making it and locking it
            os.close(fd)
            raise UsageError(f"another demo is writing {directory}: wait for it to end, or name another "
                             "--output-dir")
        self._fd, self._kept = fd, len(first) + 1
        os.ftruncate(fd, self._kept)
        os.pwrite(fd, f"pid {os.getpid()} writes here now\n".encode(), self._kept)

    @staticmethod
    def _holder(fd: int) -> int | None:
        for line in os.pread(fd, 4096, 0).splitlines()[1:]:
            words = line.split()
            if len(words) > 1 and words[0] == b"pid" and words[1].isdigit():
                return int(words[1])
        return None

    def release(self) -> None:
        """Takes the holder's line off the marker and unlocks it; idempotent."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, self._kept)
        os.close(fd)


def prepare_output_dir(path: Path, lock: DirectoryLock | None = None) -> Path:
    """The demo's output directory, ready to write: ``path`` made and marked when it is new or
    empty, or cleared of the demo's earlier outputs when the demo made it. Anything else is a
    ``UsageError``, and nothing in ``path`` is touched. ``lock`` is taken on it before anything
    is replaced, and held on return (without one, a lock is held while it prepares): a directory
    another demo writes in is a ``UsageError`` too."""
    from pipeline.app.checks import UsageError

    option = f"--output-dir={path}"
    if os.path.lexists(path) and not path.is_dir():
        raise UsageError(f"{option} exists and is not a directory: nothing was touched; name a new "
                         "directory, e.g. --output-dir demo-output")
    directory = path.resolve()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        marked = _marked(directory)
        empty = not marked and next(directory.iterdir(), None) is None
    except OSError as error:
        raise UsageError(f"cannot create or read {option}: {error.strerror}") from None
    if not (marked or empty):
        raise UsageError(f"{option} holds files and is not a directory the demo made (no {MARKER} in it): "
                         "nothing was touched; name a new or empty directory (an older demo's output: "
                         "remove it first)")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write in {option}: permission denied")
    held = lock or DirectoryLock()
    held.acquire(directory, create=not marked)
    try:
        if marked:
            for name in OUTPUTS:
                (directory / name).unlink(missing_ok=True)
            spool = directory / "spool"
            if spool.is_symlink() or spool.is_file():
                spool.unlink()
            elif spool.is_dir():
                shutil.rmtree(spool)
    except OSError as error:
        held.release()
        raise UsageError(f"cannot replace the demo's outputs in {option}: {error.strerror} "
                         f"({error.filename})") from None
    finally:
        if lock is None:
            held.release()
    return directory


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the main thread, so the demo stops what it started."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Demo:
    """One run of the demo; ``run`` starts everything, and stops it all before it returns."""

    def __init__(self, args: argparse.Namespace, out: TextIO, directory: Path) -> None:
        """``directory``: the output directory, as ``prepare_output_dir`` gives it."""
        self.args = args
        self.directory = directory
        self.console = Console(out, args.quiet)
        self.control = FleetControl()
        self.jobs: list[SimulatedJob] = []
        self.jax: Process | None = None
        self.stream: Process | None = None
        self.clock: FleetClock | None = None  # the fleet's, once it starts
        self.started = time.monotonic()

    @property
    def live_db(self) -> Path:
        return self.directory / "goodput.duckdb"

    def run(self) -> int:
        args, console = self.args, self.console
        use_jax = not args.no_jax and jax_available()
        if args.no_jax:
            console.say("--no-jax: the demo goes on without the real JAX training job")
        elif not use_jax:
            console.result("JAX is not installed: the demo goes on without the real JAX training job "
                           "(pip install 'jax[cpu]' to add it)")
        spool = self.directory / "spool"
        with contextlib.ExitStack() as stack:
            from google.pubsub_v1.types import pubsub as types

            from pipeline.emulators.monitoring import MonitoringEmulator
            from pipeline.emulators.pubsub import PubSubEmulator

            pubsub = stack.enter_context(PubSubEmulator())
            pubsub.broker.create_topic(types.Topic(name=TOPIC))
            for name in (SUBSCRIPTION, COPY):
                pubsub.broker.create_subscription(types.Subscription(name=name, topic=TOPIC,
                                                                     ack_deadline_seconds=60))
            monitoring = stack.enter_context(MonitoringEmulator())
            saver = CopySaver(pubsub.broker, self.directory / "events.jsonl")
            stack.callback(saver.close)
            stack.enter_context(_environment("PUBSUB_EMULATOR_HOST", pubsub.host))
            env = python_env(spool, pubsub.host)
            console.say(f"Pub/Sub emulator on {pubsub.host}, Cloud Monitoring stand-in on {monitoring.host}; "
                        "starting the streaming pipeline …")
            self.stream = self._start_stream(env, monitoring.host)
            # Stopping early: a second signal stops the stream at once, without its final snapshots.
            stack.callback(self.stream.stop, ((signal.SIGINT, 0.5), (signal.SIGINT, 10.0)))
            stack.callback(self._stop_jobs)
            self._wait_for_stream()
            runs = fleet_runs(args.runs)
            clock = self.clock = FleetClock.meeting_in(longest_s(args.duration_s))
            self.jobs = start_fleet(runs, TOPIC, args.duration_s, self.control, spool, clock)
            if use_jax:
                # On the fleet's clock too: its real durations, SPEED times as long, like the others'.
                self.jax = Process("jax_train", [
                    sys.executable, "-m", "pipeline.demo.jax_train", "--destination", TOPIC,
                    "--run-id", JAX_RUN, "--steps", str(max(200, round(1500 * args.duration_s
                                                                        / DEFAULT_DURATION_S))),
                    f"--clock-speed={clock.speed:g}", f"--clock-meets={clock.meets.isoformat()}"],
                    {**env, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
                    self.directory / "jax_train.log")
            shown = [(run.run_id, str(run.profile["accelerator_type"]), int(run.profile["chip_count"]))
                     for run in runs] + ([(JAX_RUN, "cpu", 1)] if use_jax else [])
            console.say(f"{len(runs)} simulated runs{' and a real JAX run' if use_jax else ''} are training "
                        f"({SPEED:.0f}× simulated time); snapshots every {SNAPSHOT_INTERVAL_S:.0f} s")
            self._watch(shown, saver)
            self._stop_stream_after_drain()
            saver.close()
            from pipeline.sinks.monitoring import METRICS

            points = sum(len(monitoring.store.points(metric)) for metric in METRICS)
        stream_output = self.stream.output()
        return self._finish(points, stream_output, saver)

    def _start_stream(self, env: dict[str, str], monitoring_host: str) -> Process:
        # Simulated time: hours compressed into the demo, ending behind the wall clock (start_fleet).
        lag_s = longest_s(self.args.duration_s) * SPEED + 3600
        return Process("stream", [
            sys.executable, "-m", "pipeline", "--streaming", "--runner=BundleBasedDirectRunner",
            f"--subscription={SUBSCRIPTION}", f"--duckdb={self.live_db}",
            f"--snapshot_interval_s={SNAPSHOT_INTERVAL_S}", f"--monitoring_project={PROJECT}",
            f"--monitoring_endpoint={monitoring_host}",
            f"--monitoring_min_interval_s={MONITORING_MIN_INTERVAL_S}",
            f"--monitoring_max_lag_s={lag_s:.0f}"],
            env, self.directory / "stream.log", markers=("streaming from", "stopping:", "stopped"))

    def _wait_for_stream(self) -> None:
        assert self.stream is not None
        deadline = time.monotonic() + 90
        while not self.stream.seen["streaming from"].wait(0.2):
            if self.stream.popen.poll() is not None or time.monotonic() > deadline:
                raise DemoError(f"the streaming pipeline did not start; its log ({self.stream.log}) ends:\n"
                                f"{self.stream.tail()}")

    def _watch(self, runs: Sequence[tuple[str, str, int]], saver: CopySaver) -> None:
        """The live view, until every job but a hung one is done."""
        assert self.stream is not None
        fleet_started = time.monotonic()
        live: dict[str, LiveRun] = {}
        snapshots = 0
        deadline = fleet_started + longest_s(self.args.duration_s)
        while True:
            for job in self.jobs:
                if job.error is not None:
                    raise DemoError(f"simulated run {job.run.run_id} failed: {job.error!r}")
            if self.stream.popen.poll() is not None:
                raise DemoError(f"the streaming pipeline exited; its log ({self.stream.log}) ends:\n"
                                f"{self.stream.tail()}")
            jax_done = self.jax is None or self.jax.popen.poll() is not None
            done = jax_done and all(not job.thread.is_alive() for job in self.jobs if not job.run.hangs)
            read = read_live(self.live_db)
            if read is not None:
                live, snapshots = read
            counts = [job.stats() for job in self.jobs]
            recorded, sent = sum(c[0] for c in counts), sum(c[1] for c in counts)
            self.console.show(view_lines(time.monotonic() - fleet_started, self.args.duration_s, runs, live,
                                         snapshots, recorded, sent, saver.messages, saver.events), force=done)
            if done:
                break
            if time.monotonic() > deadline:
                raise DemoError("the fleet did not finish in time")
            time.sleep(1.0)
        if self.jax is not None and self.jax.popen.returncode != 0:
            raise DemoError(f"the JAX training job failed (exit {self.jax.popen.returncode}); its log "
                            f"({self.jax.log}) ends:\n{self.jax.tail()}")

    def _stop_stream_after_drain(self) -> None:
        """Stops the stream cleanly; the hung job's last heartbeat comes while it drains, so the
        live tables hold its state as of its last event, as a replay does."""
        assert self.stream is not None
        control = self.control
        control.set(control.wind_down)
        hung = [job.run.run_id for job in self.jobs if job.run.hangs]
        self.console.say(f"the fleet is done{f' ({len(hung)} hung, still not stepping)' if hung else ''}; "
                         "stopping the stream …")
        self.stream.popen.send_signal(signal.SIGINT)
        if not self.stream.seen["stopping:"].wait(60):
            raise DemoError(f"the streaming pipeline did not begin to stop; its log ({self.stream.log}) "
                            f"ends:\n{self.stream.tail()}")
        # The hung job hangs until now on the fleet's clock, the clock of every other event.
        clocks = [job.clock.now for job in self.jobs if job.clock is not None]
        assert self.clock is not None
        control.final_time = max([*clocks, self.clock.now()]) + datetime.timedelta(milliseconds=1)
        control.set(control.release)
        for job in self.jobs:
            job.thread.join(timeout=30)
            if job.thread.is_alive() or job.error is not None:
                raise DemoError(f"simulated run {job.run.run_id} did not stop cleanly: {job.error!r}")
        try:
            self.stream.popen.wait(timeout=90)
        except subprocess.TimeoutExpired:
            raise DemoError("the streaming pipeline did not stop within 90 s") from None
        if self.stream.popen.returncode != 0 or not self.stream.seen["stopped"].wait(5):
            raise DemoError(f"the streaming pipeline failed (exit {self.stream.popen.returncode}); its log "
                            f"({self.stream.log}) ends:\n{self.stream.tail()}")

    def _stop_jobs(self) -> None:
        """Stops the simulated jobs and the JAX job, at once; idempotent."""
        self.control.set(self.control.abort)
        for job in self.jobs:
            job.thread.join(timeout=15)
        if self.jax is not None:
            self.jax.stop()

    def _finish(self, points: int, stream_output: str, saver: CopySaver) -> int:
        console, directory = self.console, self.directory
        live_s = time.monotonic() - self.started
        console.say(f"stream stopped after {live_s:.0f} s: {saver.messages:,} messages, {saver.events:,} "
                    f"events saved to {directory / 'events.jsonl'}; replaying them in batch …")
        batch_db = directory / "batch.duckdb"
        with (directory / "batch.log").open("w") as log:
            replay = subprocess.run(
                [sys.executable, "-m", "pipeline", f"--events={directory / 'events.jsonl'}",
                 f"--duckdb={batch_db}"],
                env=python_env(directory / "spool"), stdout=log, stderr=subprocess.STDOUT,
                timeout=300, check=False)
        if replay.returncode != 0:
            raise DemoError(f"the batch replay failed (exit {replay.returncode}); "
                            f"see {directory / 'batch.log'}")
        live, batch = latest_cumulative(self.live_db), latest_cumulative(batch_db)
        differences = compare(live, batch)
        reported = self._report()
        failed = bool(differences) or not reported
        if not self.args.quiet:
            from pipeline.app.summary import print_summary

            console.say("")
            print_summary(str(self.live_db), console.out)
        console.result("")
        if differences:
            console.result("the live numbers differ from a batch replay of the same events:")
            for difference in differences:
                console.result(f"  {difference}")
        else:
            console.result(f"the live numbers equal a batch replay of the same events ({len(live)} runs: "
                           "goodput, total time, disruptions, max productive step)")
        refused = stream_output.count("Cloud Monitoring refused")
        console.result(f"Cloud Monitoring stand-in: {points:,} points written"
                       + (f", {refused} refusals logged (see stream.log)" if refused else ""))
        console.result(f"outputs in {directory}/: goodput.duckdb (live), batch.duckdb, events.jsonl, "
                       f"{'report.html' if reported else 'no report'}, stream.log, batch.log"
                       + (", jax_train.log" if self.jax is not None else ""))
        console.result(f"demo {'FAILED' if failed else 'done'} in {time.monotonic() - self.started:.0f} s; "
                       f"try: goodput query badput_ranking --duckdb {self.live_db}")
        return 1 if failed else 0

    def _report(self) -> bool:
        """Writes report.html; False (and says why) when it failed."""
        from pipeline.app.report import write_report

        try:
            write_report(self.live_db, self.directory / "report.html", alert_thresholds())
        except Exception as error:  # noqa: BLE001 -- reported; the demo's own checks still stand
            self.console.result(f"the HTML report failed: {error!r}")
            return False
        return True


def alert_thresholds() -> AlertThresholds:
    """The alert policies as the report evaluates them on the demo's live history: its stream
    snapshots a run every ``SNAPSHOT_INTERVAL_S`` of the wall clock, which is ``SPEED`` times as
    long on the fleet's clock, the clock of the snapshots' times. Its points are that far apart,
    so the stall condition is aligned as it is for a stream that snapshots that seldom (with the
    default 60 s, most minutes of a stall would hold no point, and the stalled run never fired)."""
    from pipeline.app.alerts import AlertThresholds

    return AlertThresholds(snapshot_interval_s=SNAPSHOT_INTERVAL_S * SPEED)


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """Sets an environment variable (the emitter's Pub/Sub client reads it) for the demo only."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.app.checks import UsageError

    args = parse_args(argv)
    lock = DirectoryLock()
    try:
        directory = prepare_output_dir(args.output_dir, lock)
    except UsageError as error:
        print(f"goodput demo: {error}", file=sys.stderr)
        return 2
    demo = Demo(args, sys.stdout, directory)
    try:
        with lock, _terminate_as_interrupt():
            return demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started is stopped", file=sys.stderr)
        return 130
    except DemoError as error:
        print(f"goodput demo: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
