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


def test_a_replayed_crash_fires_its_disruption_alert_and_no_hang(tmp_path: Path):
    """Replays of a simulated run as of times around its crash: before the restart the crashed
    job is silent, which a replay cannot tell from dead, and after it the crash explains the
    silence: no replay finds a hang, and the first snapshot after the restart fires the
    disruption alert, the only one."""
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
    for database in (full, history):
        with duckdb.connect(str(database), read_only=True) as connection:
            assert connection.execute("SELECT count(*) FROM run_anomalies").fetchone() == (0,)
    found = evaluate_file(history)
    assert [(a.policy, a.run_id, a.fired_at, a.value) for a in found] == [
        ("disruption", "crashy", times[2], 1)]


def test_the_demo_fleets_alerts_are_one_per_crash_and_the_stalled_runs_stall(tmp_path: Path, capsys):
    """A 45 s demo (its runs' shapes, paced 120 times faster than the wall clock): each crash of
    the fleet fires its run's disruption alert, and no hang alert; the run that hangs fires its
    hang alert and, once it has made no progress for stall_after_s, its stall alert, once."""
    output = tmp_path / "demo-output"
    code = demo.main(["--output-dir", str(output), "--duration-s", "45", "--no-jax", "--quiet"])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    alerts = evaluate_file(output / "goodput.duckdb", demo.alert_thresholds())
    for run in FLEET:
        policies = [alert.policy for alert in alerts if alert.run_id == run.run_id]
        assert policies.count("disruption") == len(run.profile["crashes_at"]), (run.run_id, policies)
        hangs = int(run.hangs)
        assert policies.count("anomaly_hang") == policies.count("stalled") == hangs, (run.run_id, policies)
