"""Runs every benchmark and writes BENCHMARKS.md: ``make bench`` or ``python -m benchmarks``.

``python -m benchmarks NAME ...`` runs only the named sections (emitter, training_loop, engine,
restarts, replay, fleet, streaming, state, costs, detection, profile) and rewrites only those in
BENCHMARKS.md, keeping the others and the header as they are (a comment line,
``<!-- section: NAME -->``, opens each section there). ``python -m benchmarks.restarts`` prints
that one section and writes nothing.
"""

from __future__ import annotations

import datetime
import importlib
import logging
import re
import sys
import time
from pathlib import Path

from benchmarks.common import machine

SECTIONS = {"emitter": "benchmarks.emitter_overhead", "training_loop": "benchmarks.training_loop",
            "engine": "benchmarks.engine",
            "restarts": "benchmarks.restarts", "replay": "benchmarks.replay", "fleet": "benchmarks.fleet",
            "streaming": "benchmarks.streaming", "state": "benchmarks.state_io",
            "costs": "benchmarks.costs", "detection": "benchmarks.detection",
            "profile": "benchmarks.profile"}
OUTPUT = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
MARKER = re.compile(r"^<!-- section: (\w+) -->$", re.MULTILINE)


def split(text: str) -> tuple[str, dict[str, str]]:
    """BENCHMARKS.md's header (everything before the first section) and its sections by name."""
    found = list(MARKER.finditer(text))
    if not found:
        return text, {}
    sections = {match[1]: text[match.end():end].strip("\n")
                for match, end in zip(found, [m.start() for m in found[1:]] + [len(text)], strict=True)}
    return text[:found[0].start()], sections


def join(header: str, sections: dict[str, str]) -> str:
    """The file: the header, then the sections in ``SECTIONS`` order, each after its marker."""
    ordered = [name for name in SECTIONS if name in sections]
    ordered += [name for name in sections if name not in SECTIONS]  # from an older checkout: kept
    return header.rstrip("\n") + "\n\n" + "\n\n".join(f"<!-- section: {name} -->\n{sections[name]}"
                                                      for name in ordered) + "\n"


def main(argv: list[str]) -> int:
    names = argv or list(SECTIONS)
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)  # quiet: only problems are logged
    parts = {}
    for name in names:
        started = time.perf_counter()
        print(f"benchmark {name} ...", file=sys.stderr, flush=True)
        parts[name] = importlib.import_module(SECTIONS[name]).run()
        print(f"benchmark {name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    if argv and OUTPUT.exists():
        header, sections = split(OUTPUT.read_text())
        if not sections and header.strip():
            print(f"{OUTPUT} has no section markers: its text is kept as the header", file=sys.stderr)
        sections.update(parts)
    else:
        today = datetime.date.today().isoformat()
        header = (f"# Benchmarks\n\nMeasured by `make bench` on {today}: {machine()}.\n"
                  "Timings are medians with (min–max) spread; every ratio compares figures measured "
                  "in the same run.\n")
        sections = parts
    OUTPUT.write_text(join(header, sections))
    print(f"wrote {OUTPUT}", file=sys.stderr)
    return 0


sys.exit(main(sys.argv[1:]))
