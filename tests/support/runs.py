"""Runs for tests: the recorder calls of a run of any shape on a simulated clock
(``TraceBuilder``), the named shapes every suite uses (``shape``), the events the emitter records
for them and the messages it sends, and a run's snapshots."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from emitter import ElasticGoodputRecorder, EmitterSettings
from emitter.testing import capture_events
from goodput_schemas.limits import CONFIG_SOURCES, MAX_COUNT
from goodput_schemas.wire import Message, Record, encode_batch
from pipeline.core import engine
from pipeline.core.events import EVENT_KINDS, Batch, Event, encode_events, parse_batch, parse_message
from pipeline.core.snapshot import Snapshot, WindowFigures

S = 1_000_000
T0 = datetime.datetime(2026, 11, 1, 8, 0, tzinfo=datetime.timezone.utc)
#: One recorder call: (method, arguments).
Call = tuple[str, tuple[Any, ...]]


def at(seconds: float) -> datetime.datetime:
    """The simulated time ``seconds`` after T0."""
    return T0 + datetime.timedelta(seconds=seconds)


def record_ours(attempts: Sequence[Sequence[Call]]) -> list[Event]:
    settings = EmitterSettings(heartbeat_interval_s=None, collect_configs=False, discover_workload=False)
    with capture_events() as captured:
        for calls in attempts:
            recorder = ElasticGoodputRecorder("run", "log", True, settings=settings)
            for method, args in calls:
                if method == "orbax_save":
                    step, start, seconds, *persistent = args
                    recorder.record_checkpoint_save(step, start, start + datetime.timedelta(seconds=seconds),
                                                    *persistent)
                elif method == "orbax_restore":
                    step, start, seconds = args[:3]
                    end = start + datetime.timedelta(seconds=seconds)
                    recorder.record_checkpoint_restore(step, start, end)
                else:
                    getattr(recorder, method)(*args)
            recorder.close()
        messages = captured.messages
    return events_of(messages)


def events_of(messages: Iterable[Message]) -> list[Event]:
    """The events of delivered messages, every one of them valid."""
    events: list[Event] = []
    for message in messages:
        parsed, dead = parse_message(message.data)
        assert not dead, dead
        events.extend(parsed)
    return events



@dataclasses.dataclass
class TraceBuilder:
    """Builds recorder calls on a simulated clock, attempt by attempt."""

    seed: int = 0
    clock: float = 0.0
    attempts: list[list[Call]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def now(self) -> datetime.datetime:
        return T0 + datetime.timedelta(seconds=self.clock)

    def call(self, method: str, *args: Any) -> None:
        self.attempts[-1].append((method, args))

    def span(self, name: str, seconds: float) -> None:
        self.call(f"record_{name}_start_time", self.now())
        self.clock += seconds
        self.call(f"record_{name}_end_time", self.now())

    def start_attempt(self, *, init_s: float = 20, prep_s: float = 10, load_s: float = 5) -> None:
        self.attempts.append([])
        self.call("record_job_start_time", self.now())
        self.span("tpu_init", init_s)
        self.span("training_preparation", prep_s)
        self.span("data_loading", load_s)

    def steps(self, first: int, last: int, step_s: float = 2.0, noise: float = 0.0,
              compile_s: float = 0.0, eval_every: int = 0, eval_s: float = 5.0,
              save_every: int = 0, save_s: float = 3.0, every: int = 1) -> None:
        """Steps first..last-1, recording every ``every``-th step start."""
        for step in range(first, last):
            if (step - first) % every == 0:
                self.call("record_step_start_time", step, self.now())
            self.clock += step_s * (1 + self.rng.uniform(-noise, noise))
            if step == first:
                self.clock += compile_s
            if eval_every and step % eval_every == eval_every - 1:
                self.clock += 0.1
                self.call("record_custom_badput_event_start_time", self.now(), "eval_step")
                self.clock += eval_s
                self.call("record_custom_badput_event_end_time", self.now(), "eval_step")
                self.clock += 0.1
            if save_every and step % save_every == save_every - 1:
                self.clock += 0.05
                self.save(step, save_s)

    def save(self, step: int, seconds: float, persistent: bool = True) -> None:
        """An Orbax-style checkpoint save that blocks the training loop for ``seconds``."""
        self.call("orbax_save", step, self.now(), seconds, persistent)
        self.clock += seconds

    def restore(self, step: int, seconds: float) -> None:
        self.call("orbax_restore", step, self.now(), seconds)
        self.clock += seconds

    def end(self) -> None:
        self.call("record_job_end_time", self.now())

    def wait(self, seconds: float) -> None:
        self.clock += seconds

    def as_of_us(self) -> int:
        return micros(self.now())


def micros(moment: datetime.datetime) -> int:
    """Microseconds since the epoch."""
    return (moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)) // datetime.timedelta(
        microseconds=1)


def training_run(seed: int = 0, *, every: int = 1, rollback_to: int | None = None,
                 planned_stop: bool = False, restart: bool = False, ended: bool = True,
                 hung_s: float = 0.0) -> TraceBuilder:
    """A run of 120 steps (noisy, a slow first step, an eval every 40, a save every 50), then:

    ``rollback_to``: in the same process, back to that step and on to 140 (an in-process rollback);
    ``planned_stop``: an end, 15 minutes off, a resume that restores step 100 and runs to 160 (the
    end says nothing, and the resume re-runs steps it ran, so the engine counts a crash: a stop
    stays planned when its end says ``failed: false`` or the resume re-runs nothing);
    ``restart``: a crash, 60 s down, a restart that restores step 100 and runs to 180;
    then its end if ``ended``, or ``hung_s`` more seconds without a step. ``every``: only every
    ``every``-th step start is recorded.
    """
    run = TraceBuilder(seed=seed)
    run.start_attempt()
    run.steps(0, 120, noise=0.2, compile_s=15, eval_every=40, save_every=50, every=every)
    if rollback_to is not None:
        run.steps(rollback_to, 140, noise=0.2)
    if planned_stop:
        run.end()
        run.wait(900)
        run.start_attempt()
        run.restore(100, 5.0)
        run.steps(100, 160, noise=0.2, compile_s=10, every=every)
    if restart:
        run.wait(60)
        run.start_attempt()
        run.restore(100, 6.0)
        run.steps(100, 180, noise=0.2, compile_s=15, save_every=50)
    if ended:
        run.end()
    else:
        run.wait(hung_s)
    return run


def _long_clean_run(seed: int) -> TraceBuilder:
    run = TraceBuilder(seed=seed)
    run.start_attempt()
    run.steps(0, 420, noise=0.1, compile_s=40, eval_every=50, save_every=100, save_s=3.0)
    run.wait(0.5)
    run.end()
    return run


def _outage_run(seed: int) -> TraceBuilder:
    run = TraceBuilder(seed=seed)
    run.start_attempt()
    run.steps(0, 250, noise=0.05, compile_s=30, eval_every=60)
    run.wait(1.0)  # dies mid-step
    run.wait(180)  # outage
    run.start_attempt(init_s=25, prep_s=15)
    run.steps(200, 450, noise=0.05, compile_s=30, eval_every=60)
    run.end()
    return run


#: The shapes of run the suites share, by name.
SHAPES: dict[str, Callable[[int], TraceBuilder]] = {
    "ended": training_run,  # one attempt that ended
    "restarted": functools.partial(training_run, restart=True),  # a crash, a restart with a restore, an end
    "running": functools.partial(training_run, restart=True, ended=False),  # restarted, still running
    # an in-process rollback, then a crash and a restart still running, and hung
    "rolled_back": functools.partial(training_run, rollback_to=105, restart=True, ended=False, hung_s=200),
    # steps recorded sparsely, an end and a resume that re-runs steps (so a crash after all), then a
    # crash and a restart still running, hung
    "sparse": functools.partial(training_run, every=4, planned_stop=True, restart=True, ended=False,
                                hung_s=200),
    # where the reference library is right, at more length (its calculator is compared on them)
    "long_clean": _long_clean_run,
    "outage": _outage_run,  # a process dying mid-step, three minutes down, a restart without a restore
}


def shape(name: str, seed: int = 0) -> TraceBuilder:
    """A run of the shape ``name`` (``SHAPES``); ``seed`` draws its step times."""
    return SHAPES[name](seed)


#: The shapes the property and fault suites go through: each exercises other parts of the engine.
SHAPE_NAMES = ("ended", "restarted", "rolled_back", "sparse")
#: The runs of the replayed fleet: run id -> shape.
FLEET = {"run-a": "restarted", "run-b": "sparse", "run-c": "rolled_back"}


@functools.cache
def recorded(name: str) -> tuple[tuple[Event, ...], int]:
    """The events of a run of shape ``name`` as the emitter records them, with model metrics
    every other step and a heartbeat a minute; and the time to take its snapshot at."""
    run = shape(name, seed=100 + SHAPE_NAMES.index(name))
    events = record_ours(run.attempts)
    extra: list[Event] = []
    for attempt in sorted({e.attempt_id for e in events}):
        own = [e for e in events if e.attempt_id == attempt]
        seq = max(e.seq for e in own) + 1
        for event in own:
            if event.kind == "step_start" and event.body["step"] % 2:
                body = {"step": event.body["step"], "loss": 2.0 / (1 + event.body["step"]), "mfu": 0.4}
                extra.append(Event("run", attempt, seq, event.time_us + S // 2, "model_metrics", body))
                seq += 1
        first, last = min(e.time_us for e in own), max(e.time_us for e in own)
        for t in range(first + 60 * S, last, 60 * S):
            extra.append(Event("run", attempt, seq, t, "heartbeat", {}))
            seq += 1
    # Plain attempt ids, numbered in start order, keep the tables readable.
    starts = sorted({e.attempt_id: e.time_us for e in reversed(events) if e.kind == "job_start"}.items(),
                    key=lambda item: item[1])
    names = {attempt: f"attempt-{index}" for index, (attempt, _) in enumerate(starts)}
    renamed = tuple(dataclasses.replace(e, attempt_id=names[e.attempt_id]) for e in events + extra)
    return renamed, run.as_of_us()


def as_run(events: Iterable[Event], run_id: str) -> list[Event]:
    """The same events, of another run."""
    return [dataclasses.replace(e, run_id=run_id) for e in events]


def skewed(events: Iterable[Event], attempt_id: str, offset_s: float) -> list[Event]:
    """The events with one attempt's clock ``offset_s`` seconds off."""
    offset = round(offset_s * S)
    return [dataclasses.replace(e, time_us=e.time_us + offset) if e.attempt_id == attempt_id else e
            for e in events]


def messages(events: Iterable[Event], size: int) -> list[bytes]:
    """The messages of ``size`` events the emitter would send: per attempt, in seq order; the
    attempts in start order."""
    by_attempt: dict[tuple[str, str], list[Event]] = {}
    for event in sorted(events, key=lambda e: (e.run_id, e.attempt_id, e.seq)):
        by_attempt.setdefault((event.run_id, event.attempt_id), []).append(event)
    ordered = sorted(by_attempt.values(), key=lambda own: min(e.time_us for e in own))
    return [encode_events(own[i:i + size]) for own in ordered for i in range(0, len(own), size)]


def workload_messages(events: Iterable[Event], run_name: str, uid: str, size: int = 1000) -> list[bytes]:
    """The messages of ``size`` events a workload's emitter would send: under the run id
    ``run_name``, each naming the workload ``uid``; per attempt, in seq order, the attempts in
    start order."""
    by_attempt: dict[str, list[Event]] = {}
    for event in sorted(events, key=lambda e: (e.attempt_id, e.seq)):
        by_attempt.setdefault(event.attempt_id, []).append(event)
    ordered = sorted(by_attempt.values(), key=lambda own: min(e.time_us for e in own))
    return [encode_events(own[i:i + size], run_name, uid)
            for own in ordered for i in range(0, len(own), size)]


#: Two workloads' uids (JobSets'), for runs they give one name.
FIRST_UID, SECOND_UID = "3f2a9c1e-5b1d-4a7e-9c1e-000000000001", "8d04b7aa-11c2-4f0e-8d04-000000000002"


def reused_name() -> tuple[list[Event], list[Event], int]:
    """Two workloads' events, for runs of one name: the restarted run's (a crash and a restart),
    and an ended run of other attempts starting an hour after it; and the time to take both
    runs' snapshots at."""
    first, first_as_of = recorded("restarted")
    events, as_of = recorded("ended")
    offset = first_as_of + 3600 * S - min(e.time_us for e in events)
    second = [dataclasses.replace(e, attempt_id=f"second-{e.attempt_id}", time_us=e.time_us + offset)
              for e in events]
    return list(first), second, as_of + offset


def with_configs_and_metrics(events: Iterable[Event], configs: dict[str, str]) -> list[Event]:
    """The events, and in each attempt after them: ``configs`` as its user configs at its first
    event's time, and LOSS (NaN at step 5) and LEARNING_RATE at every 5th step's start."""
    events = list(events)
    extra: list[Event] = []
    for attempt in sorted({e.attempt_id for e in events}):
        own = sorted((e for e in events if e.attempt_id == attempt), key=lambda e: e.seq)
        seq = own[-1].seq + 1
        extra.append(Event(own[0].run_id, attempt, seq, own[0].time_us, "configs",
                           {"source": "user", "values": dict(configs)}))
        for event in own:
            step = event.body.get("step") if event.kind == "step_start" else None
            if step is not None and step % 5 == 0:
                seq += 1
                loss = float("nan") if step == 5 else 4.0 / (1 + step)
                extra.append(Event(event.run_id, attempt, seq, event.time_us + 1, "metrics",
                                   {"step": step, "values": {"LOSS": loss, "LEARNING_RATE": 0.01}}))
    return events + extra


def write_events(events: Iterable[Event], path: Path) -> None:
    """The events as an emitter file: one message per attempt."""
    path.write_bytes(b"".join(message + b"\n" for message in messages(events, 1_000_000)))


def batch_of(data: bytes) -> Batch:
    """The parsed message, which must be valid."""
    batch, dead = parse_batch(data)
    assert batch is not None and not dead, dead
    return batch


def state_of(batches: Iterable[Batch]) -> engine.RunState:
    """A run's state fed message by message, as the pipeline feeds it."""
    state = engine.RunState("run")
    for batch in batches:
        state.add_batch(batch)
    return state


def final(delivered: Iterable[bytes], as_of_us: int, along_the_way: bool = False) -> Snapshot:
    """The snapshot after the delivered messages, as of ``as_of_us``; with ``along_the_way``, a
    snapshot was taken after every message too, as of the latest time seen (as a live pipeline's)."""
    state, latest = engine.RunState("run"), 0
    for data in delivered:
        batch = batch_of(data)
        state.add_batch(batch)
        if along_the_way:
            latest = max(latest, batch.max_time_us)
            state.snapshot(latest)
    snapshot = state.snapshot(as_of_us)
    assert snapshot is not None
    return snapshot


def fleet_events() -> list[Event]:
    """Every event of the replayed fleet's runs."""
    return [e for run_id, name in FLEET.items() for e in as_run(recorded(name)[0], run_id)]


_BODIES: dict[str, st.SearchStrategy[dict[str, object]]] = {
    "job_start": st.fixed_dictionaries({"chip_count": st.integers(0, 10**6)},
                                       optional={"configured_ideal_step_time_s": st.floats(1e-6, 1e6)}),
    "step_start": st.fixed_dictionaries({"step": st.integers(0, 50) | st.sampled_from([2**52, MAX_COUNT])}),
    "checkpoint_save": st.fixed_dictionaries({"step": st.integers(0, 50), "blocking_s": st.floats(0, 1e9)}),
    "checkpoint_restore": st.fixed_dictionaries({"step": st.integers(0, 50),
                                                 "blocking_s": st.floats(0, 1e9)}),
    "custom_badput_start": st.fixed_dictionaries({"badput_type": st.sampled_from(["eval", "sync", ""])}),
    "custom_badput_end": st.fixed_dictionaries({"badput_type": st.sampled_from(["eval", "sync", ""])}),
    "elastic_slice_counts": st.integers(0, 4).flatmap(lambda total: st.fixed_dictionaries(
        {"active_slices": st.integers(0, total), "total_slices": st.just(total),
         "available_slices": st.integers(0, total)})),
    "elastic_wait_start": st.fixed_dictionaries({"event_type": st.sampled_from(["scale_up", "slice_down"])}),
    "elastic_wait_end": st.fixed_dictionaries({"event_type": st.sampled_from(["scale_up", "slice_down"])}),
    "model_metrics": st.fixed_dictionaries({"step": st.integers(0, 50)}),
    "host_steps": st.floats(0, 100).flatmap(lambda mean: st.fixed_dictionaries(
        {"host": st.sampled_from(["h0", "h1"]), "count": st.integers(1, 100), "mean_s": st.just(mean),
         "max_s": st.floats(mean, 200)})),
    "configs": st.fixed_dictionaries({"source": st.sampled_from(CONFIG_SOURCES), "values": st.dictionaries(
        st.sampled_from(["seed", "optimizer.lr"]), st.sampled_from(["1", "0.5", "adam"]), max_size=2)}),
    "metrics": st.fixed_dictionaries(
        {"values": st.dictionaries(st.sampled_from(["LOSS", "mine"]), st.floats(-1e3, 1e3) | st.just("NaN"),
                                   min_size=1, max_size=2)},
        optional={"step": st.integers(0, 50)}),
}


def _odd_event(kind: str) -> st.SearchStrategy[tuple[str, int, str, dict[str, object]]]:
    return st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 60), st.just(kind),
                     _BODIES.get(kind, st.just({})))


#: Valid but odd runs: up to three attempts, any kinds at any of 60 seconds, in any combination
#: (spans never closed or closed twice, ends before starts, steps anywhere, restores of any step).
odd_runs = st.lists(st.sampled_from(EVENT_KINDS).flatmap(_odd_event), min_size=1, max_size=40)
#: The time odd runs start at.
ODD_T0 = micros(T0)


def odd_messages(run: list[tuple[str, int, str, dict[str, object]]]) -> list[bytes]:
    """One message per attempt of an odd run, its events numbered in the order given."""
    records: dict[str, list[Record]] = {}
    for seq, (attempt, second, kind, body) in enumerate(run):
        records.setdefault(attempt, []).append((seq, ODD_T0 + second * S, kind, body))
    return [encode_batch("run", attempt, own).data for attempt, own in records.items()]


def snapshot_at(at: datetime.datetime, run_id: str, badput_s: dict[str, float] | None = None,
                windows_s: tuple[int, ...] = (), **metadata: Any) -> Snapshot:
    """A snapshot taken at ``at`` of a run 90 % productive over its 100 s on 8 chips, with the
    given badput (in every window) and metadata."""
    at_us = round(at.timestamp() * 1e6)

    def figures(window_s: int) -> WindowFigures:
        return WindowFigures(window_s, at_us - 100_000_000, at_us, 100.0, 90.0, dict(badput_s or {}), 0,
                             800.0, 720.0)

    return Snapshot(run_id, at_us, at_us - 100_000_000, False, figures(0), windows_s,
                    tuple(map(figures, windows_s)), (), 10, 10, 1.0, 1.0, 0.1, 8, metadata, None, None)


def run_snapshot(run_id: str = "run-1", after_s: float = 0.0, accelerator: str | None = "v5p",
                 windows: tuple[int, ...] = (300, 3600)) -> Snapshot:
    """A snapshot of a run with a restart, ``after_s`` after its last event."""
    run = shape("running", seed=4)
    state = engine.RunState(run_id)
    for event in record_ours(run.attempts):
        state.add(dataclasses.replace(event, run_id=run_id))
    latest = max(a.last_event_us for a in state.attempts.values())
    snapshot = state.snapshot(latest + round(after_s * 1e6), windows)
    assert snapshot is not None
    return dataclasses.replace(snapshot, metadata={**snapshot.metadata, "accelerator_type": accelerator,
                                                   "location": "us-central2-b"})
