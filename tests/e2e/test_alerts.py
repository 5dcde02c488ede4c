"""The alert policies of terraform/monitoring.tf on the snapshot history of a real batch replay,
and on the live history of the demo's fleet."""

from __future__ import annotations

import datetime
from pathlib import Path

import duckdb

from pipeline.app.alerts import evaluate_file
from pipeline.demo import demo
from pipeline.demo.fleet import FLEET
from support.history import replay, simulate


def test_a_replayed_crash_fires_the_disruption_alert_and_a_hang_only_while_it_is_unexplained(tmp_path: Path):
    """Replays of a simulated run as of times around its crash: before the restart, the crashed
    job's silence is all a replay can see, a hang, which fires as it is found; the replays after
    the restart find no hang there (the crash explains the silence), and the first of them fires
    the disruption alert; nothing else fires."""
    events = simulate(tmp_path, [("crashy", 300, 1)])
    full = tmp_path / "full.duckdb"
    replay(events, full)
    with duckdb.connect(str(full), read_only=True) as connection:
        restart = connection.execute("SELECT restart_time FROM disruptions").fetchone()
        assert connection.execute("SELECT count(*) FROM run_anomalies").fetchone() == (0,)
    assert restart is not None
    history = tmp_path / "history.duckdb"
    times = [restart[0] + datetime.timedelta(seconds=s) for s in (-120, -60, 30, 90)]
    for time in times:
        replay(events, history, f"--as_of={time.isoformat()}Z", "--no_raw_events")
    with duckdb.connect(str(history), read_only=True) as connection:
        hangs = connection.execute(
            "SELECT DISTINCT detected_at, ended_at FROM run_anomalies WHERE kind = 'hang'").fetchall()
    assert len(hangs) == 1 and hangs[0][0] < restart[0] and hangs[0][1] is None
    found = evaluate_file(history)
    assert [(a.policy, a.run_id, a.fired_at, a.value) for a in found] == [
        ("anomaly_hang", "crashy", hangs[0][0], 1), ("disruption", "crashy", times[2], 1)]


def test_the_demo_fleets_alerts_are_one_per_crash_and_the_stalled_runs_stall(tmp_path: Path, capsys):
    """A 30 s demo (its runs' shapes, paced 120 times faster than the wall clock): each crash of
    the fleet fires its run's disruption alert, and no hang alert; the run that hangs fires its
    hang alert and, once it has made no progress for stall_after_s, its stall alert, once."""
    output = tmp_path / "demo-output"
    code = demo.main(["--output-dir", str(output), "--duration-s", "30", "--no-jax", "--quiet"])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    alerts = evaluate_file(output / "goodput.duckdb", demo.alert_thresholds())
    for run in FLEET:
        policies = [alert.policy for alert in alerts if alert.run_id == run.run_id]
        assert policies.count("disruption") == len(run.profile["crashes_at"]), (run.run_id, policies)
        hangs = int(run.hangs)
        assert policies.count("anomaly_hang") == policies.count("stalled") == hangs, (run.run_id, policies)
