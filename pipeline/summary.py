"""Reads emitter files, validates every message, and summarizes each run's events.

    python -m pipeline --events events.jsonl [--events more.jsonl ...]

Each line of an input file is one message (the JSON encoding of an ``EventBatch``). Invalid
lines and events are counted and their reasons printed; they never stop the run.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from pipeline.events import DeadLetter, Event, parse_message


@dataclasses.dataclass
class RunSummary:
    """What one run's valid events say, before any goodput computation."""

    run_id: str
    attempts: set[str] = dataclasses.field(default_factory=set)
    events: int = 0
    kinds: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    first_time_us: int | None = None
    last_time_us: int | None = None
    last_step: int | None = None
    seen: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    duplicates: int = 0

    def add(self, event: Event) -> None:
        key = (event.attempt_id, event.seq)
        if key in self.seen:
            self.duplicates += 1
            return
        self.seen.add(key)
        self.attempts.add(event.attempt_id)
        self.events += 1
        self.kinds[event.kind] += 1
        t = event.time_us
        self.first_time_us = t if self.first_time_us is None else min(self.first_time_us, t)
        self.last_time_us = t if self.last_time_us is None else max(self.last_time_us, t)
        if event.kind == "step_start":
            step = int(event.body.get("step", 0))
            self.last_step = step if self.last_step is None else max(self.last_step, step)


def read_messages(paths: Iterable[Path]) -> Iterator[tuple[bytes, str]]:
    """(line, "file:line") for every non-empty line of the files, in order."""
    for path in paths:
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                line = line.rstrip(b"\r\n")
                if line.strip():
                    yield line, f"{path}:{number}"


def summarize(paths: Iterable[Path]) -> tuple[dict[str, RunSummary], list[DeadLetter], int]:
    """Per-run summaries, dead letters and the number of messages read."""
    runs: dict[str, RunSummary] = {}
    dead: list[DeadLetter] = []
    messages = 0
    for line, source in read_messages(paths):
        messages += 1
        events, rejected = parse_message(line, source)
        dead.extend(rejected)
        for event in events:
            runs.setdefault(event.run_id, RunSummary(event.run_id)).add(event)
    return runs, dead, messages


def _time(us: int | None) -> str:
    if us is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(us / 1e6, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def print_report(runs: dict[str, RunSummary], dead: list[DeadLetter], messages: int,
                 out: TextIO) -> None:
    """A plain-text table of the runs, then the dead letters."""
    total = sum(run.events for run in runs.values())
    out.write(f"{messages} messages, {total} valid events, {len(runs)} runs, "
              f"{len(dead)} rejected\n\n")
    header = ("run", "attempts", "events", "steps", "last step", "first event (UTC)",
              "span (s)", "ended")
    rows = [header]
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        span = ("-" if run.first_time_us is None or run.last_time_us is None
                else f"{(run.last_time_us - run.first_time_us) / 1e6:.1f}")
        rows.append((run.run_id, str(len(run.attempts)), str(run.events),
                     str(run.kinds["step_start"]),
                     "-" if run.last_step is None else str(run.last_step),
                     _time(run.first_time_us), span, "yes" if run.kinds["job_end"] else "no"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")
    for run in sorted(runs.values(), key=lambda r: r.run_id):
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(run.kinds.items()))
        out.write(f"\n{run.run_id}: {kinds}")
        if run.duplicates:
            out.write(f" ({run.duplicates} duplicates ignored)")
    out.write("\n")
    if dead:
        out.write(f"\nrejected input ({len(dead)}):\n")
        for letter in dead[:20]:
            out.write(f"  {letter.source}: {letter.reason}\n")
        if len(dead) > 20:
            out.write(f"  ... and {len(dead) - 20} more\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="Validate goodput event files and summarize each run.",
    )
    parser.add_argument("--events", action="append", required=True, type=Path, metavar="FILE",
                        help="an emitter file (one JSON message per line); repeat for more files")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.events if not path.is_file()]
    if missing:
        parser.error("no such file: " + ", ".join(missing))
    runs, dead, messages = summarize(args.events)
    print_report(runs, dead, messages, sys.stdout)
    return 0
