"""``python -m pipeline --events``: the simulated job's file, summarized; bad lines never stop it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO, check=False)


def test_simulated_job_summary_shows_both_attempts(tmp_path: Path):
    """The demo's two commands: a simulated job with a restart, then its summary."""
    events = tmp_path / "events.jsonl"
    job = run("examples/simulated_job.py", "--output", str(events), "--steps", "300")
    assert job.returncode == 0, job.stderr
    with events.open("a") as handle:
        handle.write('{"schema_version": 1, "run_id": "broken"\n')
    summary = run("-m", "pipeline", "--events", str(events))
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0].endswith("1 runs, 1 rejected")
    row = next(line.split() for line in lines if line.startswith("demo-llm-run "))
    attempts, _events, steps, last_step = row[1:5]
    assert attempts == "2"
    assert last_step == "299"
    assert int(steps) > 300  # the steps lost to the crash were run twice
    assert f"{events}:" in summary.stdout and "not valid JSON" in summary.stdout


def test_missing_input_file_is_a_usage_error(tmp_path: Path):
    """A missing input is reported clearly, with the usage, and a non-zero exit."""
    result = run("-m", "pipeline", "--events", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 2
    assert "no such file" in result.stderr
