"""Snapshot histories for tests: hand-made rows written through the DuckDB sink, and real ones
from simulated runs replayed by the batch pipeline."""

from __future__ import annotations

import dataclasses
import datetime
import html
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pipeline.app.report import SECTIONS
from pipeline.demo.simulated_job import JobProfile
from pipeline.demo.simulated_job import simulate as simulate_job
from pipeline.sinks.duckdb import DuckDBSink
from support import REPO

T0 = datetime.datetime(2026, 11, 1, 8, 0)  # UTC, as DuckDB returns it


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def goodput_row(run_id: str, seconds: float, window_s: int = 0, **values: Any) -> dict[str, Any]:
    """A ``goodput_snapshots`` row of ``run_id`` as of T0 + ``seconds``: 90 % goodput unless told."""
    total = float(values.pop("total_time_s", min(seconds, window_s) if window_s else seconds))
    goodput_pct = values.pop("goodput_pct", 90.0)
    productive = float(values.pop("productive_time_s", total * (goodput_pct or 0) / 100))
    chips = values.pop("chip_count", 8)
    row: dict[str, Any] = {
        "run_id": run_id, "snapshot_time": at(seconds), "window_s": window_s,
        "window_start": at(seconds - total), "window_end": at(seconds), "goodput_pct": goodput_pct,
        "productive_time_s": productive, "total_time_s": total, "disruptions": 0,
        "max_productive_step": int(seconds), "last_step": int(seconds), "ideal_step_time_s": 1.0,
        "step_time_deviation_s": 0.1, "chip_count": chips, "productive_chip_s": productive * chips,
        "total_chip_s": total * chips, "run_group": "tests", "accelerator_type": "v5p",
        "location": "us-east5-a", "ended": False,
    }
    row.update(values)
    return row


def anomaly_row(run_id: str, kind: str, started: float, detected: float, ended: float | None = None,
                changed: float | None = None, **values: Any) -> dict[str, Any]:
    """A ``run_anomalies`` row of ``run_id``, its times T0 + seconds: the row of the anomaly found
    (``ended`` None), or of its end, found at ``changed`` (default: ``ended``)."""
    row: dict[str, Any] = {
        "run_id": run_id, "kind": kind, "host": None, "started_at": at(started), "detected_at": at(detected),
        "ended_at": None if ended is None else at(ended),
        "changed_at": at(changed if changed is not None else detected if ended is None else ended),
        "baseline_step_s": 1.0, "observed_step_s": 1.5, "lost_s": 0.5 * (detected - started),
    }
    row.update(values)
    return row


def write_rows(path: Path, rows_by_table: dict[str, Iterable[dict[str, Any]]]) -> Path:
    sink = DuckDBSink(path)
    try:
        for table, rows in rows_by_table.items():
            sink.write(table, rows)
    finally:
        sink.close()
    return path


def simulate(directory: Path, runs: Sequence[tuple[str, int, int]]) -> list[Path]:
    """Event files of simulated runs, one per (run id, steps, seed)."""
    files = []
    for run_id, steps, seed in runs:
        events = directory / f"{run_id}.jsonl"
        subprocess.run([sys.executable, "-m", "pipeline.demo.simulated_job", "--output", str(events),
                        "--run-id", run_id, "--steps", str(steps), "--seed", str(seed)],
                       cwd=REPO, check=True, capture_output=True, timeout=120)
        files.append(events)
    return files


@dataclasses.dataclass(frozen=True)
class SlowStretch(JobProfile):
    """A simulated run whose steps ``slow_from`` to ``slow_until - 1`` take ``slow_factor`` times
    as long: a slowdown that ends, which ``JobProfile.slowdown`` (growing to the last step) is not."""

    slow_from: int = 0
    slow_until: int = 0
    slow_factor: float = 1.0

    def step_time_factor(self, step: int, steps: int) -> float:
        return self.slow_factor if self.slow_from <= step < self.slow_until else 1.0


def simulate_profile(directory: Path, run_id: str, steps: int, seed: int, profile: JobProfile) -> Path:
    """The event file of a simulated run of the shape ``profile``, recorded in this process."""
    events = directory / f"{run_id}.jsonl"
    simulate_job(f"file:{events}", run_id=run_id, steps=steps, seed=seed, spool_dir=directory / "spool",
                 profile=profile)
    return events


def replay(events: Sequence[Path], database: Path, *options: str) -> None:
    """The batch pipeline: ``python -m pipeline --events ... --duckdb database``."""
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", *(f"--events={path}" for path in events), f"--duckdb={database}",
         *options], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr



#: The report's sections, in page order.
SECTION_IDS = ["summary", *(key for key, _ in SECTIONS)]


def section(page: str, key: str) -> str:
    """The HTML of the section (or header) with id ``key``."""
    match = re.search(rf'<(section|header) id="{key}">(.*?)</\1>', page, re.S)
    assert match, key
    return match.group(2)


def table_rows(page: str, element_id: str) -> list[list[str]]:
    """The body cells of the table in the element ``element_id``, as text."""
    match = re.search(rf'<div id="{element_id}">(.*?)</tbody>', page, re.S)
    assert match, element_id
    body = match.group(1).split("<tbody>", 1)[1]
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]
