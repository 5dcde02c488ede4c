"""The alert policies of terraform/monitoring.tf on the snapshot history of a real batch replay."""

from __future__ import annotations

import datetime
from pathlib import Path

import duckdb

from pipeline.app.alerts import evaluate_file
from support.history import replay, simulate


def test_a_replayed_crash_fires_the_hang_and_disruption_alerts(tmp_path: Path):
    """Replays of a simulated run as of times around its crash: the crashed job's silence is a
    hang, which fires as it is found; the first snapshot after the restart fires the disruption
    alert; nothing else fires."""
    events = simulate(tmp_path, [("crashy", 300, 1)])
    full = tmp_path / "full.duckdb"
    replay(events, full)
    with duckdb.connect(str(full), read_only=True) as connection:
        restart = connection.execute("SELECT restart_time FROM disruptions").fetchone()
    assert restart is not None
    history = tmp_path / "history.duckdb"
    times = [restart[0] + datetime.timedelta(seconds=s) for s in (-120, -60, 30, 90)]
    for time in times:
        replay(events, history, f"--as_of={time.isoformat()}Z", "--no_raw_events")
    with duckdb.connect(str(history), read_only=True) as connection:
        hangs = connection.execute(
            "SELECT DISTINCT detected_at FROM run_anomalies WHERE kind = 'hang'").fetchall()
    assert len(hangs) == 1 and hangs[0][0] < restart[0]
    found = evaluate_file(history)
    assert [(a.policy, a.run_id, a.fired_at, a.value) for a in found] == [
        ("anomaly_hang", "crashy", hangs[0][0], 1), ("disruption", "crashy", times[2], 1)]
