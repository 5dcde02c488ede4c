"""The engine: one snapshot of a run that restarted 1,000 and 10,000 times.

Every attempt is a process start: a job start, TPU initialization, a data load, three to five
steps (the first compiles, and the first re-runs the step the attempt before ended on, so progress
was lost), an eval (a custom badput span) every fifth attempt, a checkpoint save every fourth,
and a job end for two attempts of three, one of them failed; two of three attempts are thus
disruptions. The run's events are added to a fresh ``engine.RunState`` (not timed) and its first
snapshot is timed, as of a minute after the last event: the full computation, which a worker
does for every run whose state it has just decoded. Each pass starts with a full garbage
collection, so that it pays only for the collections its own allocations trigger. Median of nine
passes at 1,000 attempts and of seven at 10,000, in one thread pinned to one core.

A snapshot's cost should grow with the run's attempts, disruptions and events, not with their
square: ten times the attempts, about ten times the time, where quadratic work would take a
hundred. The target allows twice the linear growth, since a ten times larger state costs more
per object (caches, collections) and a shared machine's timings spread.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time

from benchmarks.common import summary
from benchmarks.engine import _on_one_core
from pipeline.core import engine
from pipeline.core.events import Event

SIZES = ((1_000, 9), (10_000, 7))  # attempts, passes
S = 1_000_000
T0_US = 1_750_000_000 * S
#: Most the 10× longer run's snapshot may cost, as a multiple of the shorter one's (linear: 10×).
TARGET_GROWTH = 20.0


def restarted_run(attempts: int) -> tuple[list[Event], int]:
    """The events of a run of ``attempts`` attempts as described above, and a minute after the
    last of them."""
    events: list[Event] = []
    t, step = T0_US, 0
    for index in range(attempts):
        attempt = f"attempt-{index:06d}"
        records: list[tuple[float, str, dict[str, object]]] = [  # seconds after the last, kind, body
            (30, "job_start", {"chip_count": 256}),
            (0, "tpu_init_start", {}), (20, "tpu_init_end", {}),
            (0, "data_loading_start", {}), (5, "data_loading_end", {}),
        ]
        step = max(0, step - 1)
        for k in range(3 + index % 3):
            records.append((1.5 + (15 if k == 1 else 0) + (index * 7 + k) % 5 / 10, "step_start",
                            {"step": step}))
            step += 1
        if index % 5 == 0:
            records += [(0.5, "custom_badput_start", {"badput_type": "EVAL_STEP"}),
                        (10, "custom_badput_end", {"badput_type": "EVAL_STEP"})]
        if index % 4 == 0:
            records.append((0.5, "checkpoint_save", {"step": step, "blocking_s": 2.0, "persistent": True}))
        if index % 3 != 2:
            records.append((1, "job_end", {"failed": index % 3 == 0}))
        for seq, (after_s, kind, body) in enumerate(records):
            t += round(after_s * S)
            events.append(Event("run", attempt, seq, t, kind, body))
    return events, t + 60 * S


def snapshot_seconds(events: list[Event], as_of_us: int, passes: int) -> list[float]:
    """The seconds of the run's first snapshot, once per pass."""
    seconds = []
    for _ in range(passes):
        state = engine.RunState("run")
        state.add_all(events)
        gc.collect()
        started = time.perf_counter()
        snapshot = state.snapshot(as_of_us)
        seconds.append(time.perf_counter() - started)
        assert snapshot is not None and snapshot.disruptions
    return seconds


def run() -> str:
    measured = []
    for attempts, passes in SIZES:
        events, as_of_us = restarted_run(attempts)
        seconds = _on_one_core(functools.partial(snapshot_seconds, events, as_of_us, passes))
        measured.append((attempts, len(events), seconds))
    (small, _, small_s), (large, _, large_s) = measured
    growth = statistics.median(large_s) / statistics.median(small_s)
    lines = [
        "## Engine: one snapshot of a run with 1,000 and 10,000 restarts",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| attempts | events | one snapshot (s): median (min–max) | per attempt (µs) |",
        "|---|---|---|---|",
        *(f"| {attempts:,} | {events:,} | {summary(seconds, digits=3)} | "
          f"{statistics.median(seconds) / attempts * 1e6:.0f} |" for attempts, events, seconds in measured),
        "",
        f"{large:,} attempts against {small:,}: {growth:.1f}× the time for {large // small}× the "
        f"attempts. Target: at most {TARGET_GROWTH:.0f}× — {'met' if growth <= TARGET_GROWTH else 'MISSED'}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
