"""Batch replay of a 100,000-step run, and one incremental update, against the reference.

The same recorder calls (a job start, accelerator init, preparation, a data load, 100,000 steps of
about 1.5 s, an eval every 5,000 steps, the job end) go through the reference's recorder into an
in-memory stand-in for Cloud Logging, and through this project's emitter into a file. The
reference runs in its own venv (``tools.reference_runner``) and its calls are timed there.

* Reference, full computation: a fresh ``GoodputCalculator`` (empty cache) answering
  ``get_job_goodput(include_badput_breakdown=True)``: one read of every entry, its JSONL cache
  written and re-read, the whole computation.
* Ours, whole process: ``python -m pipeline --events=FILE --duckdb=OUT`` on the DirectRunner; the
  fixed start-up (Python, Beam import, pipeline construction) is the same command on a one-step
  run, timed right after it; processing is the median of the 15 differences (a pair's two runs
  are seconds apart, so a slow spell of the machine hits both). Start-up is split by timing
  ``python -c pass`` and ``python -c "import pipeline.beam.launcher"``; the rest of it is building and
  running the graph and creating, writing and closing the DuckDB file.
* One new step of the still-running job: the reference reads the one new entry and recomputes
  goodput, badput and step deviation from its whole cache; ours adds the event to the run's
  state and computes the same figures (a cumulative snapshot with its step statistics; rolling
  windows, which the reference computes with separate queries, are not asked for).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import summary
from tools.reference_runner import Call, ReferenceRunner

STEPS = 100_000
REPEATS = 3
PROCESS_REPEATS = 15
ROUNDS = 7
TARGET_PROCESSING_RATIO = 0.25
TARGET_INCREMENTAL_RATIO = 10_000
REPO = Path(__file__).resolve().parent.parent


def _calls(steps: int, seed: int = 1) -> list[Call]:
    """The run's recorder calls."""
    rng = random.Random(seed)
    t = datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)
    calls: list[Call] = []

    def call(method: str, *args: object) -> None:
        calls.append((method, args))

    call("record_job_start_time", t)
    for name, seconds in (("tpu_init", 30), ("training_preparation", 20), ("data_loading", 8)):
        call(f"record_{name}_start_time", t)
        t += datetime.timedelta(seconds=seconds)
        call(f"record_{name}_end_time", t)
    for step in range(steps):
        call("record_step_start_time", step, t)
        t += datetime.timedelta(seconds=1.5 * (1 + rng.uniform(-0.05, 0.05)) + (40 if step == 0 else 0))
        if step % 5000 == 2499:
            call("record_custom_badput_event_start_time", t, "EVAL_STEP")
            t += datetime.timedelta(seconds=10)
            call("record_custom_badput_event_end_time", t, "EVAL_STEP")
    call("record_job_end_time", t)
    return calls


def _write_run(path: Path, steps: int, reference: ReferenceRunner | None) -> str | None:
    """The run through our recorder into the file ``path`` and, given the reference's worker,
    through the reference's recorder into a new log there: that log's handle."""
    from emitter import EmitterSettings, GoodputRecorder

    calls = _calls(steps)
    ours = GoodputRecorder("bench-run", logging_enabled=True, destination=f"file:{path}",
                           settings=EmitterSettings(spool_dir=path.parent / "spool",
                                                    heartbeat_interval_s=None))
    for method, args in calls:
        getattr(ours, method)(*args)
    ours.close()
    if reference is None:
        return None
    log = reference.log(job_name="bench-run")
    reference.record(log, [calls], recorder="goodput.GoodputRecorder", job_name="bench-run",
                     logger_name="goodput_bench")
    return log


def _process(*args: str) -> float:
    """Wall seconds of ``python ARGS`` from this checkout."""
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - started


def _whole_process(events: Path, out: Path) -> float:
    out.unlink(missing_ok=True)
    return _process("-m", "pipeline", f"--events={events}", f"--duckdb={out}")


def run() -> str:
    with ReferenceRunner() as reference:
        return _run(reference)


def _run(reference: ReferenceRunner) -> str:
    from pipeline.core import engine
    from pipeline.core.events import Event, parse_batch, read_lines

    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        big, small = directory / "run100k.jsonl", directory / "run1.jsonl"
        log = _write_run(big, STEPS, reference)
        assert log is not None
        _write_run(small, 1, None)

        reference_full = []
        for attempt in range(REPEATS):
            calculator = reference.calculator(log, directory / f"cache{attempt}", job_name="bench-run",
                                              logger_name="goodput_bench")
            (reference_goodput, _, _), seconds = reference.call_timed(
                calculator, "get_job_goodput", include_badput_breakdown=True)
            reference_full.append(seconds)

        whole, startup, interpreter, imports = [], [], [], []
        for _ in range(PROCESS_REPEATS):  # interleaved, so that drift hits all alike
            whole.append(_whole_process(big, directory / "big.duckdb"))
            startup.append(_whole_process(small, directory / "small.duckdb"))
            interpreter.append(_process("-c", "pass"))
            imports.append(_process("-c", "import pipeline.beam.launcher"))
        differences = [w - s for w, s in zip(whole, startup, strict=True)]
        processing = statistics.median(differences)

        # Goodput of the whole run, then one new step of the run while it is still running.
        state, running = engine.RunState("bench-run"), engine.RunState("bench-run")
        for _, line in read_lines(str(big)):
            batch, _ = parse_batch(line)
            assert batch is not None
            state.add_batch(batch)
            running.add_batch(dataclasses.replace(
                batch, others=tuple(e for e in batch.others if e.kind != "job_end")))
        end_us = max(a.end_us or 0 for a in state.attempts.values())
        ours_goodput = state.snapshot(end_us).cumulative.goodput_pct  # type: ignore[union-attr]
        attempt_id = next(iter(running.attempts))
        next_seq = running.events + 1  # the job_end's seq stays unused
        running.snapshot(end_us, windows_s=())
        # Interleaved rounds: one reference recompute, then 200 of our updates; a round's ratio
        # compares figures taken seconds apart, so a slow spell of the machine hits both.
        ours_update, reference_update, ratios = [], [], []
        step = 0
        for round_ in range(ROUNDS):
            reference.append(log, [{"job_name": "bench-run", "step_count": STEPS + round_,
                                    "step_start_time": 2e9 + round_}])
            _, seconds = reference.call_timed(calculator, "get_job_goodput", include_badput_breakdown=True)
            reference_update.append(seconds)
            timings = []
            for _ in range(200):
                step += 1
                now = end_us + step * 1_500_000
                event = Event("bench-run", attempt_id, next_seq + step, now, "step_start",
                              {"step": STEPS + step})
                started = time.perf_counter()
                running.add(event)
                running.snapshot(now, windows_s=())
                timings.append(time.perf_counter() - started)
            ours_update += timings
            ratios.append(reference_update[-1] / statistics.median(timings))

    full_ref = statistics.median(reference_full)
    update_ratio = statistics.median(ratios)
    lines = [
        "## Batch replay of a 100,000-step run, and one new step",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| figure (seconds) | median (min–max) |",
        "|---|---|",
        f"| reference: full computation from its log entries | {summary(reference_full, digits=3)} |",
        f"| ours: whole process, 100,000-step run | {summary(whole, digits=3)} |",
        f"| ours: whole process, one-step run (fixed start-up) | {summary(startup, digits=3)} |",
        f"| ours: processing (whole minus start-up, per pair) | {summary(differences, digits=3)} |",
        f"| start-up, of which: Python alone (`python -c pass`) | {summary(interpreter, digits=3)} |",
        f"| start-up, of which: Python and imports (Beam, the pipeline) | {summary(imports, digits=3)} |",
        f"| reference: recompute after one new entry | {summary(reference_update, digits=3)} |",
        f"| ours: one new step, added and snapshotted ({len(ours_update):,} steps) | "
        f"{summary(ours_update, digits=6)} |",
        "",
        f"Goodput on these events: reference {reference_goodput:.4f} %, ours {ours_goodput:.4f} %.",
        "",
        f"Processing against the reference's full computation: {processing / full_ref:.2f}× "
        f"(target at most {TARGET_PROCESSING_RATIO}×: "
        f"{'met' if processing / full_ref <= TARGET_PROCESSING_RATIO else 'MISSED'}). "
        f"One new step: {update_ratio:,.0f}× cheaper than the reference's recompute "
        f"(median of {ROUNDS} interleaved rounds, {min(ratios):,.0f}–{max(ratios):,.0f}×) "
        f"(target at least {TARGET_INCREMENTAL_RATIO:,}×: "
        f"{'met' if update_ratio >= TARGET_INCREMENTAL_RATIO else 'MISSED'}).",
    ]
    return "\n".join(lines)
