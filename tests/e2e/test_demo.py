"""The live demo (``pipeline.demo``), run short, and the real JAX training example on its own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest

from pipeline.demo import demo, simulated_job
from pipeline.demo.fleet import FLEET
from support import REPO
from support.emitter import read_events

HAS_JAX = importlib.util.find_spec("jax") is not None


def children() -> set[int]:
    """Processes (zombies included) whose parent is this one."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            found.add(int(entry.name))
    return found


def query(database: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql).fetchall()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="counts child processes through /proc")
def test_short_demo_runs_end_to_end_and_leaves_nothing_running(tmp_path: Path, capsys):
    """A short demo exits 0 with at least 8 runs, live numbers equal to the batch replay's, every
    output written, and no process or thread it started still there."""
    before = children()
    output = tmp_path / "demo-output"
    argv = ["--output-dir", str(output), "--duration-s", "10", *([] if HAS_JAX else ["--no-jax"])]
    code = demo.main(argv)
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    assert "the live numbers equal a batch replay of the same events" in printed.out
    assert "points written" in printed.out
    runs = {row[0] for row in query(output / "goodput.duckdb", "SELECT run_id FROM latest_goodput")}
    assert len(runs) >= 8
    assert runs == {row[0] for row in query(output / "batch.duckdb", "SELECT run_id FROM latest_goodput")}
    assert (demo.JAX_RUN in runs) == HAS_JAX
    for name in ("events.jsonl", "batch.duckdb", "stream.log", "batch.log"):
        assert (output / name).stat().st_size > 0, name
    if importlib.util.find_spec("pipeline.app.report") is not None:
        assert "<html" in (output / "report.html").read_text()[:2000].lower()
    assert children() - before == set()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("demo-")]
    assert "PUBSUB_EMULATOR_HOST" not in os.environ


def test_the_hung_run_stalls_and_the_others_end(tmp_path: Path):
    """In the demo's fleet, only the hung run is left without an end, and its rolling goodput is 0."""
    pytest.importorskip("duckdb")
    database = tmp_path / "goodput.duckdb"
    events = tmp_path / "fleet.jsonl"
    for run in FLEET:
        profile = {**run.profile, "hang_for_s": 3600.0} if run.hangs else run.profile
        simulated_job.simulate(f"file:{events}", run_id=run.run_id, steps=max(50, run.steps // 10), seed=1,
                               spool_dir=tmp_path / "spool", profile=simulated_job.JobProfile(**profile))
    subprocess.run([sys.executable, "-m", "pipeline", f"--events={events}", f"--duckdb={database}"],
                   cwd=REPO, env=dict(os.environ), check=True, capture_output=True,
                   timeout=120)
    ended = dict(query(database, "SELECT run_id, ended FROM latest_goodput WHERE window_s = 0"))
    assert {run_id for run_id, done in ended.items() if not done} == {"moe-h100"}
    assert query(database, "SELECT productive_time_s FROM latest_goodput "
                           "WHERE run_id = 'moe-h100' AND window_s = 900") == [(0.0,)]
    accelerators = {row[0] for row in query(database, "SELECT DISTINCT accelerator_type FROM run_metadata")}
    assert len(accelerators) == len(FLEET)


@pytest.mark.skipif(not HAS_JAX, reason="JAX is not installed")
def test_jax_training_events_replay_to_sensible_goodput(tmp_path: Path):
    """The real JAX job records every phase to a file, and its replay gives a finished run with
    every step productive and the startup phases as badput."""
    events = tmp_path / "jax.jsonl"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "GOODPUT_SPOOL_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "pipeline.demo.jax_train", "--destination", f"file:{events}",
                    "--steps", "200", "--run-id", "jax-test", "--checkpoint-every", "50"],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
    recorded = read_events(events)
    kinds = [next(k for k in event if k not in ("run_id", "attempt_id", "seq", "time_us"))
             for event in recorded]
    assert kinds.count("step_start") == 200 and kinds.count("checkpoint_save") == 4
    # The emitter's thread may write the system configs after a batch holding the job end (when it
    # first sees the steps there), but never dates anything later than the job end.
    own = [kind for kind in kinds if kind != "configs"]
    assert own[0] == "job_start" and own[-1] == "job_end" and kinds.count("configs") == 3
    assert max(event["time_us"] for event in recorded) == recorded[kinds.index("job_end")]["time_us"]
    database = tmp_path / "jax.duckdb"
    subprocess.run([sys.executable, "-m", "pipeline", f"--events={events}", f"--duckdb={database}"],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
    [(goodput, total, disruptions, max_step, ended)] = query(
        database, "SELECT goodput_pct, total_time_s, disruptions, max_productive_step, ended "
                  "FROM latest_goodput WHERE run_id = 'jax-test' AND window_s = 0")
    assert 0 < goodput < 100 and 0 < total < 120
    assert (disruptions, max_step, ended) == (0, 199, True)
    badput = dict(query(database, "SELECT badput_source, seconds FROM latest_badput "
                                  "WHERE run_id = 'jax-test' AND window_s = 0"))
    for source in ("TPU_INITIALIZATION", "TRAINING_PREP", "DATA_LOADING_SYNC",
                   "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME", "CUSTOM_BADPUT_EVENTS.EVAL_STEP"):
        assert badput[source] > 0, source
    metadata = json.loads(events.read_text().splitlines()[0])["events"][0]["job_start"]
    assert metadata["accelerator_type"] == "cpu" and metadata["chip_count"] >= 1
