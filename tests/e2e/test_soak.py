"""The soak, short: a minute and a half of fleet traffic with every kind of fault, ending equal to
clean batch replays (see ``soak.py``). ``make soak`` runs it for thirty minutes:
``GOODPUT_SOAK_S=1800``; ``GOODPUT_SOAK_SEED`` picks another random course of faults."""

from __future__ import annotations

import os
from pathlib import Path

from support.soak import FAULTS, Soak


def test_a_fleet_under_random_faults_ends_with_the_numbers_of_a_clean_replay(tmp_path: Path):
    """Every kind of fault at least once; then nothing published is missing, every bad message is
    a dead letter, each run's final snapshot equals a backfill and the engine from scratch, the
    backfill equals a clean replay, and every lost event is counted or within a killed process's
    memory."""
    duration_s = float(os.environ.get("GOODPUT_SOAK_S", "90"))
    long = duration_s >= 600
    soak = Soak(tmp_path / "soak", duration_s, seed=int(os.environ.get("GOODPUT_SOAK_SEED", "1")),
                concurrent_runs=6 if long else 4, fault_every_s=20 if long else 6,
                steps=(1000, 4000) if long else (300, 700))
    report = soak.run()
    print(report.summary())
    assert report.problems == [], "\n".join(report.problems)
    assert set(report.faults) == set(FAULTS), report.faults
    assert report.recorded > 0 and report.accepted > 0
