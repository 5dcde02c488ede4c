"""Runs every benchmark and writes BENCHMARKS.md: ``make bench`` or ``python -m benchmarks``.

``python -m benchmarks NAME ...`` runs only the named sections (emitter, engine, restarts, replay,
fleet, streaming, costs, profile); BENCHMARKS.md then holds only those. ``python -m
benchmarks.restarts`` prints that one section and writes nothing.
"""

from __future__ import annotations

import datetime
import importlib
import logging
import sys
import time
from pathlib import Path

from benchmarks.common import machine

SECTIONS = {"emitter": "benchmarks.emitter_overhead", "engine": "benchmarks.engine",
            "restarts": "benchmarks.restarts", "replay": "benchmarks.replay", "fleet": "benchmarks.fleet",
            "streaming": "benchmarks.streaming",
            "costs": "benchmarks.costs", "profile": "benchmarks.profile"}
OUTPUT = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def main(argv: list[str]) -> int:
    names = argv or list(SECTIONS)
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)  # quiet: only problems are logged
    parts = []
    for name in names:
        started = time.perf_counter()
        print(f"benchmark {name} ...", file=sys.stderr, flush=True)
        parts.append(importlib.import_module(SECTIONS[name]).run())
        print(f"benchmark {name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    today = datetime.date.today().isoformat()
    header = (f"# Benchmarks\n\nMeasured by `make bench` on {today}: {machine()}.\n"
              "Timings are medians with (min–max) spread; every ratio compares figures measured "
              "in the same run.\n")
    OUTPUT.write_text(header + "\n" + "\n\n".join(parts) + "\n")
    print(f"wrote {OUTPUT}", file=sys.stderr)
    return 0


sys.exit(main(sys.argv[1:]))
