"""Shared helpers: the machine, summary statistics, processes, the reference library's offline stand-ins."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any


def machine() -> str:
    """One line saying what the figures were measured on."""
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in
                         ("apache-beam", "duckdb", "ml-goodput-measurement", "protobuf"))
    return (f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}, "
            f"Python {sys.version.split()[0]}; {versions}")


def summary(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """'median (min–max)' of ``values`` times ``scale``."""
    scaled = [v * scale for v in values]
    return (f"{statistics.median(scaled):,.{digits}f} "
            f"({min(scaled):,.{digits}f}–{max(scaled):,.{digits}f})")


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of the CPU times in /proc/PID/stat


def cpu_s(pid: int | str) -> float:
    """User + system CPU seconds of process ``pid`` (or "self") so far, all its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def stop(process: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """Terminates ``process`` and waits for it; kills it if it does not end within a minute."""
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class InMemoryCloudLogging:
    """The reference's Cloud Logging writer and reader over a list, for offline runs of its code.

    ``read_cloud_logging_entries`` returns the entries after the cursor, as the real reader does
    with its ``last_entry_info`` cursor.
    """

    def __init__(self, job_name: str = "run") -> None:
        self.job_name = job_name
        self.entries: list[dict[str, Any]] = []
        self.job_start_time = None

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    def flush(self) -> None:
        """Writes are synchronous."""

    def read_cloud_logging_entries(self, start_time: Any = None, end_time: Any = None,
                                   last_entry_info: Any = None) -> tuple[list[Any], tuple[Any, Any]]:
        done = int(last_entry_info[1]) + 1 if last_entry_info and last_entry_info[1] else 0
        new = self.entries[done:]
        if not new:
            return [], (None, None)
        stamp = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
        return list(new), (stamp, str(len(self.entries) - 1))
