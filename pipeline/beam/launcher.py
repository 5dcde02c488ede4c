"""Runs the pipeline (its graph is ``pipeline.beam.graph``): the batch replay of emitter files,
or the live stream.

Batch replay (Beam's DirectRunner)::

    python -m pipeline --events=events.jsonl [--events=more.jsonl] --duckdb=goodput.duckdb \\
        [--as_of=2026-11-01T12:00:00Z] [--windows=60,300,900,3600] \\
        [--exclude=2026-11-01T09:00:00Z/2026-11-01T09:30:00Z]

A malformed line never stops the run: it lands in the ``dead_letter`` table, exit code 0. A mistake
in the command line (``pipeline.beam.options``, ``pipeline.app.checks``) is one line on stderr and
exit code 2, before anything is read or written.

Backfill: every table rebuilt from the raw events table of a DuckDB file the pipeline wrote
(after a fix to the engine, say, or with other --windows)::

    python -m pipeline --from_duckdb=goodput.duckdb --duckdb=backfill.duckdb

Streaming, from a Pub/Sub subscription (locally: ``PUBSUB_EMULATOR_HOST`` set)::

    python -m pipeline --streaming --runner=BundleBasedDirectRunner \\
        --subscription=projects/P/subscriptions/S --duckdb=goodput.duckdb [--snapshot_interval_s=30]

On Dataflow: ``--runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp``.
A local stream prints a status line every ``--status_interval_s`` on stderr (``status_line``).
Every option may be written with hyphens as well (``--snapshot-interval-s``), none abbreviated.
SIGINT or SIGTERM stops the stream cleanly: within one snapshot interval, every message read
is in a snapshot; a second signal stops it at once. The stop prints its bound and keeps it, a
sink that does not answer included (README.md, "Stopping").
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.runners.runner import PipelineRunner

from pipeline.app.checks import UsageError, check_services
from pipeline.beam import direct_runner
from pipeline.beam.graph import build_pipeline
from pipeline.beam.live import next_snapshot_due
from pipeline.beam.options import GoodputOptions, check_files, help_parser, parse_command_line
from pipeline.sinks.retries import never

DRAIN_GRACE_S = 2.0  # after the reading stops: time for what was read to be written
DRAIN_MAX_S = 60.0  # more of it, on a machine too busy (or a sink too slow) to write it within the grace
DRAIN_POLL_S = 0.05  # how often a stop looks whether it is done
CANCEL_WAIT_S = 1.0  # for the bundle under way when the pipeline is cancelled, within DRAIN_MAX_S
#: The tracker's step, whose keys are the runs held (``pipeline.beam.graph``).
TRACKER_STEP = "TrackRuns/TrackRun"
#: The counters of rows that went to the dead_letter table, of every step that makes them.
DEAD_LETTER_COUNTERS = ("rejected", "engine_failures", "bigquery_rows_dead_lettered",
                        "monitoring_points_refused")


def run_streaming(options: GoodputOptions) -> int:
    """Runs the stream until SIGINT or SIGTERM, then stops it cleanly: every message read so far
    is in a snapshot before the pipeline is cancelled. A second signal cancels at once. If the
    pipeline fails, says so and ends the process with exit code 1; if a step is still busy when
    the stop has to end, says so and ends the process with exit code 0. On a runner that runs
    jobs on its own (Dataflow), submits the job and returns."""
    stop, force = threading.Event(), threading.Event()

    def on_signal(*_: object) -> None:
        (force if stop.is_set() else stop).set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _stream(options, stop, force)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stream(options: GoodputOptions, stop: threading.Event, force: threading.Event) -> int:
    """``run_streaming``'s work: ``stop`` set by the first signal, ``force`` by the second."""
    goodput = options.view_as(GoodputOptions)
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    direct = "Direct" in runner
    if direct:
        direct_runner.install()
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, goodput, stopping=direct_runner.stopping if direct else never)
    result = pipeline.run()
    if not direct:  # e.g. Dataflow, which runs the job on its own: submitted is done
        print(f"submitted the streaming job to {runner}", file=sys.stderr)
        return 0
    errors: list[BaseException] = []

    def failed() -> bool:
        """Whether the pipeline has failed (its runner reports it once)."""
        if not errors:
            error = direct_runner.failure(result)
            if error is not None:
                errors.append(error)
        return bool(errors)

    print(f"streaming from {goodput.subscription}; SIGINT or SIGTERM stops", file=sys.stderr,
          flush=True)
    interval_s = goodput.status_interval_s
    status_due = time.monotonic() + interval_s
    while not stop.wait(min(1.0, interval_s or 1.0)) and not failed():
        if interval_s and time.monotonic() >= status_due:
            status_due = time.monotonic() + interval_s
            line = status_line(result)
            if line is not None:
                print(line, file=sys.stderr, flush=True)
    if not failed():
        # The DirectRunner cannot drain (see pipeline.beam.live): report each new message at once,
        # read on until the interval snapshots pending for the others are due, then read no
        # more, and cancel once what was read is written: every message read is in the tables.
        due_s = next_snapshot_due(round(time.time() * 1e6), goodput.snapshot_interval_s) / 1e6
        if goodput.monitoring_project:  # the last snapshots' points wait for their series' turn
            due_s += goodput.monitoring_min_interval_s
        written_s = due_s + DRAIN_GRACE_S
        # The sinks' requests end a grace before the stop's bound, answered or not, so that what
        # a sink that does not answer could not write is in the dead letters by then.
        requests_by_s = written_s + DRAIN_MAX_S - DRAIN_GRACE_S
        direct_runner.start_stopping(time.monotonic() + requests_by_s - time.time())
        print(f"stopping: final snapshots within {math.ceil(written_s - time.time())} s "
              "(signal again to stop at once)", file=sys.stderr, flush=True)
        _wait_until(due_s, force, failed)
        direct_runner.stop_reading()
        _drain(direct_runner.drained(result), written_s, force, failed)
    if failed():
        print(f"python -m pipeline: the streaming pipeline failed: {errors[0]!r} (see the log above)",
              file=sys.stderr, flush=True)
        # The runner's threads are daemons and may be stuck, or busy inside a library's native
        # code (a sink retrying a file it cannot open): the interpreter's shutdown under them
        # can abort the process (SIGABRT) instead of exiting 1. The process ends here instead.
        sys.stdout.flush()
        os._exit(1)
    if not _cancel(result):
        # The runner's cancel waits for the bundle under way, for ever if it is stuck (a query
        # to a service that does not answer): the stop keeps its bound without it, and the
        # process ends here, as a failed one does, rather than finalize under it.
        print(f"stopping: {', '.join(direct_runner.busy(result)) or 'a step'} did not finish; "
              "stopped without it: what it holds is not written", file=sys.stderr)
        print("stopped", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
    print("stopped", file=sys.stderr, flush=True)
    return 0


def status_line(result: Any) -> str | None:
    """What the local stream of ``result`` has done so far, in a line: the messages read, the
    runs it holds, the snapshots made and the rows sent to the dead_letter table (the pipeline's
    counters, ``goodput`` namespace). None if the runner could not say just now (it was adding a
    counter meanwhile)."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        found = result.metrics().query(MetricsFilter().with_namespace("goodput"))["counters"]
        runs = direct_runner.keys_held(result, TRACKER_STEP)
    except RuntimeError:  # a dict of the runner's changed size while it was read: next time
        return None
    counts: dict[str, int] = {}
    for counter in found:
        counts[counter.key.metric.name] = counts.get(counter.key.metric.name, 0) + (counter.committed or 0)
    held = "" if runs is None else f", {runs} runs held"
    return (f"status: {counts.get('messages', 0)} messages read ({counts.get('events', 0)} events)"
            f"{held}, {counts.get('snapshots', 0)} snapshots, "
            f"{sum(counts.get(name, 0) for name in DEAD_LETTER_COUNTERS)} dead letters")


def _wait_until(time_s: float, force: threading.Event, failed: Callable[[], bool],
                done: Callable[[], bool] = lambda: False) -> bool:
    """Waits until ``time_s`` (the epoch), a second signal, the pipeline's failure, or ``done``;
    whether ``done`` ended it."""
    while time.time() < time_s and not failed():
        if done():
            return True
        if force.wait(DRAIN_POLL_S):
            break
    return False


def _drain(drained: Callable[[], bool], written_s: float, force: threading.Event,
           failed: Callable[[], bool]) -> None:
    """Once the reading stops: waits until what was read is written (``drained``), by
    ``written_s`` (the epoch) as printed. A machine too busy for that gets up to ``DRAIN_MAX_S``
    more, said on stderr, rather than lose what was read (a second signal still stops at once),
    less ``CANCEL_WAIT_S`` for the pipeline's cancel."""
    if _wait_until(written_s, force, failed, drained) or force.is_set() or failed():
        return
    print(f"stopping: still writing what was read; waiting up to {DRAIN_MAX_S:.0f} s more "
          "(signal again to stop at once and lose it)", file=sys.stderr, flush=True)
    if not (_wait_until(written_s + DRAIN_MAX_S - CANCEL_WAIT_S, force, failed, drained)
            or force.is_set() or failed()):
        print("stopping: what was read is still not all written; stopping all the same: the "
              "messages read last may be lost", file=sys.stderr, flush=True)


def _cancel(result: Any) -> bool:
    """Cancels the pipeline of ``result``, waiting up to ``CANCEL_WAIT_S`` for the bundle under
    way to end; whether it did."""
    cancelling = threading.Thread(target=result.cancel, name="cancel", daemon=True)
    cancelling.start()
    cancelling.join(CANCEL_WAIT_S)
    return not cancelling.is_alive()


def _batch_runner(options: GoodputOptions) -> PipelineRunner | None:
    """The runner of a batch replay: for the DirectRunner (the default), the FnApiRunner it ends
    up on anyway; it first tries Prism, whose binary it downloads at run time (a fifth of a
    second offline, and a network fetch online). Any other runner as the options say."""
    if options.view_as(StandardOptions).runner in (None, "DirectRunner"):
        return FnApiRunner()
    return None


def _log_at(level: str) -> None:
    """The pipeline's own loggers (``pipeline.*``) print from ``level`` on, on stderr, each
    record once (the process's other loggers as before)."""
    logger = logging.getLogger("pipeline")
    logger.setLevel(level)
    if not any(getattr(handler, "goodput", False) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.goodput = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False


def _respelled(argv: list[str]) -> list[str]:
    """``argv`` with every option of the pipeline and of Beam spelled as declared, with
    underscores, whichever of ``-`` and ``_`` it was written with (``pipeline.app.spelling``)."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    from pipeline.app.spelling import respell

    parser = _BeamArgumentParser(allow_abbrev=False, add_help=False)
    for cls in {str(cls): cls for cls in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # as pipeline.beam.options.parse_command_line does
    return respell(argv, parser._option_string_actions)


def run(argv: Sequence[str] | None = None, prog: str = "python -m pipeline") -> int:
    """Runs the command line ``argv``; a mistake in it is one line on stderr and exit code 2,
    before anything is read or written (``prog`` is the command's name in it)."""
    argv = _respelled(list(sys.argv[1:] if argv is None else argv))
    if "-h" in argv or "--help" in argv:
        from pipeline.app.spelling import SPELLING_HELP

        help_parser(prog).print_help()
        print(f"\n{SPELLING_HELP}")
        return 0
    try:
        options = parse_command_line(argv)
        check_files(options)
        check_services(options.view_as(GoodputOptions))
    except UsageError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    goodput = options.view_as(GoodputOptions)
    if goodput.log_level:
        _log_at(goodput.log_level)
    if options.view_as(StandardOptions).streaming:
        return run_streaming(goodput)
    with beam.Pipeline(runner=_batch_runner(options), options=options) as pipeline:
        build_pipeline(pipeline, goodput)
    if goodput.duckdb and not os.path.exists(goodput.duckdb):  # the sink opens it for rows alone
        print(f"{prog}: the input held no events: nothing was written to --duckdb={goodput.duckdb}",
              file=sys.stderr)
    elif goodput.duckdb:
        from pipeline.app.summary import print_summary

        print_summary(goodput.duckdb, sys.stdout)
    return 0
