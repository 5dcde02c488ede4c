"""Where the time goes: the hot paths under a sampling profiler (pyinstrument).

* Batch replay: the whole ``python -m pipeline`` process on the 100,000-step run of the replay
  section, under ``python -m pyinstrument`` (a sample every 0.5 ms). Each row is the time of
  every sample inside that function (nested calls of it counted once); "Beam's runner" is the
  rest of the pipeline's run, outside this project's code.
* Engine: ``parse_batch`` and ``RunState.add_batch`` on the engine section's mixed messages, in
  this process under ``pyinstrument.Profiler``; the functions with the most samples of their own.

A profiler slows what it watches, so the shares matter more than the seconds; the benchmark
sections give the unprofiled figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# (row, function, the file it is in): the replay's phases.
PHASES = [
    ("imports (Beam, the pipeline)", "<module>", "pipeline/beam/launcher.py"),
    ("building the graph", "build_pipeline", "pipeline/beam/graph.py"),
    ("parsing messages", "parse_batch", "pipeline/core/events.py"),
    ("adding events to run state", "add_batch", "pipeline/core/engine.py"),
    ("computing snapshots", "snapshot", "pipeline/core/engine.py"),
    ("writing DuckDB (open, insert, close)", "append", "pipeline/sinks/duckdb.py"),
    ("printing the summary", "print_summary", "pipeline/app/summary.py"),
]
RUNNER = ("run", "apache_beam/pipeline.py")  # Pipeline.run: the whole graph, executed


def _frames(frame: dict[str, Any], inside: frozenset[tuple[str, str]] = frozenset()
            ) -> Iterator[tuple[dict[str, Any], frozenset[tuple[str, str]]]]:
    """Every frame of the tree, with the (function, file) pairs of its callers."""
    yield frame, inside
    key = (frame["function"], frame["file_path"])
    for child in frame["children"]:
        yield from _frames(child, inside | {key})


def _time_in(root: dict[str, Any], function: str, file_suffix: str) -> float:
    """Seconds of samples inside ``function`` (recursion counted once)."""
    total = 0.0
    for frame, callers in _frames(root):
        if (frame["function"] == function and frame["file_path"].endswith(file_suffix)
                and not any(f == function and path.endswith(file_suffix) for f, path in callers)):
            total += frame["time"]
    return total


def _replay_profile(events: Path, directory: Path) -> dict[str, Any]:
    output = directory / "replay.json"
    subprocess.run([sys.executable, "-m", "pyinstrument", "--interval=0.0005", "--renderer=json",
                    f"--outfile={output}", "-m", "pipeline", f"--events={events}",
                    f"--duckdb={directory / 'out.duckdb'}"],
                   check=True, capture_output=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    root: dict[str, Any] = json.loads(output.read_text())["root_frame"]
    return root


def _replay_rows(root: dict[str, Any]) -> list[str]:
    total = root["time"]
    phases = [(name, _time_in(root, function, path)) for name, function, path in PHASES]
    inside_run = sum(seconds for (name, seconds), (_, function, _) in zip(phases, PHASES, strict=True)
                     if function not in ("<module>", "build_pipeline", "print_summary"))
    phases.insert(-1, ("Beam's runner (the rest of the run)", _time_in(root, *RUNNER) - inside_run))
    rows = [f"| {name} | {seconds:.3f} | {100 * seconds / total:.0f} % |" if seconds else
            f"| {name} | under 1 % (the profiler leaves such frames out) | |" for name, seconds in phases]
    rows.append(f"| whole process (profiled) | {total:.3f} | 100 % |")
    return rows


def _engine_rows(messages: list[bytes], top: int = 8) -> list[str]:
    from pyinstrument import Profiler

    from pipeline.core import engine
    from pipeline.core.events import parse_batch

    profiler = Profiler(interval=0.0005)
    with profiler:
        for _ in range(3):
            state = engine.RunState("run")
            for message in messages:
                batch, _ = parse_batch(message)
                assert batch is not None
                state.add_batch(batch)
    root = profiler.last_session.root_frame() if profiler.last_session else None
    assert root is not None
    own: dict[str, float] = {}
    stack = [root]
    while stack:
        frame = stack.pop()
        stack.extend(frame.children)
        if not frame.is_synthetic:
            name = f"`{frame.function}` ({frame.file_path_short})"
            own[name] = own.get(name, 0.0) + frame.total_self_time
    total = root.time
    ranked = sorted(own.items(), key=lambda item: -item[1])[:top]
    return [f"| {name} | {100 * seconds / total:.0f} % |" for name, seconds in ranked]


def run() -> str:
    from benchmarks.engine import _mixed_messages
    from benchmarks.replay import STEPS, _write_run

    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        events = directory / "run100k.jsonl"
        _write_run(events, STEPS, None)
        replay = _replay_rows(_replay_profile(events, directory))
    engine_rows = _engine_rows(_mixed_messages())
    lines = [
        "## Profile: where the time goes",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        f"Batch replay of the {STEPS:,}-step run:",
        "",
        "| phase | seconds | share |",
        "|---|---|---|",
        *replay,
        "",
        "Engine on mixed messages (own time of each function):",
        "",
        "| function | share |",
        "|---|---|",
        *engine_rows,
    ]
    return "\n".join(lines)
