"""Shared helpers: the machine, summary statistics, processes.

The reference library runs in a venv of its own (``make .venv-reference``), driven through
``tools.reference_runner``: the sections that measure it start its worker, and its offline
stand-in for Cloud Logging lives there."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from tools.reference_runner import missing_reason, reference_version


def machine() -> str:
    """One line saying what the figures were measured on."""
    reference = "not installed" if missing_reason() else reference_version()
    versions = ", ".join([f"apache-beam {metadata.version('apache-beam')}",
                          f"duckdb {metadata.version('duckdb')}",
                          f"ml-goodput-measurement {reference} (.venv-reference)",
                          f"protobuf {metadata.version('protobuf')}"])
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
