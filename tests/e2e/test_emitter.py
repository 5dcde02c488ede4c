"""The emitter in a process of its own: delivery at interpreter exit, nothing on stdout or stderr."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from support.emitter import read_events


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, env=environment, check=False)


def test_events_are_delivered_at_interpreter_exit(tmp_path):
    """A job that never calls close() still delivers its events when the interpreter exits."""
    out = tmp_path / "events.jsonl"
    result = run_python(f"""
        from emitter import EmitterSettings, GoodputRecorder
        r = GoodputRecorder("run-1", logging_enabled=True, destination="file:{out}",
                            settings=EmitterSettings(spool_dir="{tmp_path / 'spool'}",
                                                     max_latency_s=60))
        for step in range(100):
            r.record_step_start_time(step)
    """)
    assert result.returncode == 0, result.stderr
    assert [e["seq"] for e in read_events(out)] == list(range(100))


def test_emitter_never_writes_to_stdout_or_stderr(tmp_path):
    """Even failing to deliver, the emitter prints nothing unless the application configures logging."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result = run_python(f"""
        from emitter import EmitterSettings, GoodputRecorder
        r = GoodputRecorder("run-1", logging_enabled=True, destination="file:{blocker}/x.jsonl",
                            settings=EmitterSettings(spool_dir="{tmp_path / 'spool'}",
                                                     retry_initial_backoff_s=0.01))
        r.record_job_start_time()
        assert r.close(timeout=0.5) is False
        assert r.stats.send_errors >= 1
    """)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")
