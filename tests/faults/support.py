"""Shared by the fault tests: recorded runs, their messages as the emitter sends them, the
engine fed message by message, and the batch replay of a file into DuckDB tables."""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import duckdb
from hypothesis import strategies as st
from reference_harness import T0, TraceBuilder, micros, record_ours

from goodput_schemas.wire import Record, encode_batch
from pipeline.core import engine
from pipeline.core.events import EVENT_KINDS, Batch, Event, encode_events, parse_batch
from pipeline.core.snapshot import Snapshot, WindowFigures

S = 1_000_000
#: Shapes of run (see ``trace``): each exercises different parts of the engine.
SHAPES = (0, 1, 2, 3)
#: The snapshot tables: every number the pipeline computes.
SNAPSHOT_TABLES = ("goodput_snapshots", "badput_snapshots", "step_stats", "disruptions")
#: The runs of the replayed fleet: run id -> shape.
FLEET = {"run-a": 1, "run-b": 3, "run-c": 2}


def trace(shape: int) -> TraceBuilder:
    """0: one attempt that ended; 1: a crash, a restart with a restore, an end; 2: an in-process
    rollback, then a crash and a restart still running; 3: steps recorded sparsely, a planned stop
    and resume, then a crash and a restart still running."""
    run = TraceBuilder(seed=100 + shape)
    run.start_attempt()
    every = 4 if shape == 3 else 1
    run.steps(0, 120, noise=0.2, compile_s=15, eval_every=40, save_every=50, every=every)
    if shape == 2:
        run.steps(105, 140, noise=0.2)  # back to step 105 in the same process
    if shape == 3:
        run.end()
        run.wait(900)
        run.start_attempt()
        run.restore(100, 5.0)
        run.steps(100, 160, noise=0.2, compile_s=10, every=every)
    if shape in (1, 2, 3):
        run.wait(60)
        run.start_attempt()
        run.restore(100, 6.0)
        run.steps(100, 180, noise=0.2, compile_s=15, save_every=50)
    if shape in (0, 1):
        run.end()
    else:
        run.wait(200)  # still running, and hung
    return run


@functools.cache
def recorded(shape: int) -> tuple[tuple[Event, ...], int]:
    """The events of a run of ``shape`` as the emitter records them, with model metrics every
    other step and a heartbeat a minute; and the time to take its snapshot at."""
    run = trace(shape)
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
    return [e for run_id, shape in FLEET.items() for e in as_run(recorded(shape)[0], run_id)]


def run_batch(*arguments: str) -> None:
    """The batch pipeline (Beam's DirectRunner) with these options, in this process."""
    import apache_beam as beam

    from pipeline.beam.graph import build_pipeline
    from pipeline.beam.launcher import _batch_runner
    from pipeline.beam.options import GoodputOptions

    options = GoodputOptions(list(arguments))
    with beam.Pipeline(runner=_batch_runner(options), options=options) as pipeline:
        build_pipeline(pipeline, options)


def replay(lines: Sequence[bytes], directory: Path) -> Path:
    """The DuckDB file of a batch replay of a file holding ``lines``."""
    directory.mkdir(parents=True, exist_ok=True)
    events, database = directory / "events.jsonl", directory / "goodput.duckdb"
    events.write_bytes(b"".join(line + b"\n" for line in lines))
    run_batch(f"--events={events}", f"--duckdb={database}")
    return database


def query(database: Path, sql: str) -> list[tuple[object, ...]]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql).fetchall()


def table(database: Path, name: str, where: str = "TRUE") -> list[tuple[object, ...]]:
    """Every row of a table, in a canonical order."""
    return query(database, f"SELECT * FROM {name} WHERE {where} ORDER BY ALL")


_BODIES: dict[str, st.SearchStrategy[dict[str, object]]] = {
    "job_start": st.fixed_dictionaries({"chip_count": st.integers(0, 10**6)},
                                       optional={"configured_ideal_step_time_s": st.floats(1e-6, 1e6)}),
    "step_start": st.fixed_dictionaries({"step": st.integers(0, 50) | st.sampled_from([2**62, 2**63 - 1])}),
    "checkpoint_save": st.fixed_dictionaries({"step": st.integers(0, 50), "blocking_s": st.floats(0, 1e9)}),
    "checkpoint_restore": st.fixed_dictionaries({"step": st.integers(0, 50),
                                                 "blocking_s": st.floats(0, 1e9)}),
    "custom_badput_start": st.fixed_dictionaries({"badput_type": st.sampled_from(["eval", "sync", ""])}),
    "custom_badput_end": st.fixed_dictionaries({"badput_type": st.sampled_from(["eval", "sync", ""])}),
    "elastic_slice_counts": st.fixed_dictionaries(
        {name: st.integers(0, 4) for name in ("active_slices", "total_slices", "available_slices")}),
    "elastic_wait_start": st.fixed_dictionaries({"event_type": st.sampled_from(["scale_up", "slice_down"])}),
    "elastic_wait_end": st.fixed_dictionaries({"event_type": st.sampled_from(["scale_up", "slice_down"])}),
    "model_metrics": st.fixed_dictionaries({"step": st.integers(0, 50)}),
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
