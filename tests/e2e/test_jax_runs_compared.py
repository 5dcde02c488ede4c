"""The example JAX job run twice under one name, by two JobSets with other settings, to a file each
and replayed: two runs, their configs (their own and those the emitter collected), their metrics,
and the saved query that sets them side by side."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from goodput_schemas.wire import workload_run_id
from pipeline.app.fleet_sql import run_saved
from support import REPO

#: Two JobSets' uids, and the settings each runs the job with: (hidden width, seed).
JOBSETS = {"6b1f3c2a-0d7e-4a51-9f00-000000000001": (32, 0), "c84e90d1-52aa-4e3b-8a11-000000000002": (64, 1)}
STEPS = 60
METRICS = {"LOSS", "LEARNING_RATE", "GRADIENT_NORM", "STEP_TIME", "SAMPLE_THROUGHPUT"}


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The replay of both runs' files: the job run as "jax-compare" in each JobSet, on the CPU."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed")
    directory = tmp_path_factory.mktemp("jax")
    files = []
    for uid, (hidden, seed) in JOBSETS.items():
        events = directory / f"{uid}.jsonl"
        # As a pod spec maps the JobSet's labels (the README's downward-API snippet); nothing else of
        # this machine's environment tells the emitter where it runs.
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("GOODPUT_", "GCE_METADATA", "KUBERNETES_"))}
        env.update(JAX_PLATFORMS="cpu", GOODPUT_SPOOL_DIR=str(directory / f"spool-{seed}"),
                   GOODPUT_PODINFO_DIR=str(directory / "no-podinfo"), GOODPUT_JOBSET_NAME="jax-compare",
                   GOODPUT_JOBSET_UID=uid, GOODPUT_NAMESPACE="ml")
        subprocess.run([sys.executable, "-m", "pipeline.demo.jax_train", "--destination", f"file:{events}",
                        "--run-id", "jax-compare", "--steps", str(STEPS), "--hidden", str(hidden), "--seed",
                        str(seed), "--checkpoint-every", "0", "--eval-every", "0"],
                       cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
        files.append(events)
    replayed = directory / "jax.duckdb"
    subprocess.run([sys.executable, "-m", "pipeline", *(f"--events={path}" for path in files),
                    f"--duckdb={replayed}"], cwd=REPO, check=True, capture_output=True, timeout=300)
    return replayed


def query(database: Path, sql: str) -> list[tuple[object, ...]]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql).fetchall()


RUNS = {uid: workload_run_id("jax-compare", uid) for uid in JOBSETS}


def test_each_jobset_is_a_run_of_its_own_named_as_the_job_named_it(database: Path):
    """The two JobSets' runs are two runs, each with its name, uid and JobSet in run_metadata."""
    assert sorted(query(database, "SELECT run_id, run_name, workload_uid, jobset_name, namespace, run_group "
                                  "FROM run_metadata")) == sorted(
        (run, "jax-compare", uid, "jax-compare", "ml", "examples") for uid, run in RUNS.items())


def test_run_configs_hold_the_jobs_own_and_the_collected_configs(database: Path):
    """Each run's user configs are its settings; the software configs name Python and JAX, the
    system ones the platform JAX was told to use."""
    configs = {(run, source, key): value for run, source, key, value in
               query(database, "SELECT run_id, source, key, value FROM run_configs")}
    for uid, (hidden, seed) in JOBSETS.items():
        run = RUNS[uid]
        assert configs[run, "user", "model.hidden"] == str(hidden)
        assert configs[run, "user", "seed"] == str(seed)
        assert configs[run, "user", "optimizer.learning_rate"] == "0.01"
        assert configs[run, "software", "python.version"].startswith(f"{sys.version_info[0]}.")
        assert configs[run, "software", "packages.jax"]
        assert configs[run, "system", "env.JAX_PLATFORMS"] == "cpu"


def test_model_metrics_hold_each_runs_metrics_by_step(database: Path):
    """Every step's metrics are rows at their step, and the model's size at step 0."""
    counts = query(database, "SELECT run_id, name, count(DISTINCT step), min(step), max(step) "
                             "FROM model_metrics GROUP BY ALL ORDER BY ALL")
    for run in RUNS.values():
        own = {name: tuple(rest) for run_id, name, *rest in counts if run_id == run}
        assert {name: own[name] for name in METRICS} == dict.fromkeys(METRICS, (STEPS, 0, STEPS - 1))
        assert own["TOTAL_WEIGHTS"] == (1, 0, 0)


def test_run_group_comparison_sets_the_two_runs_side_by_side(database: Path):
    """The saved query compares the group's two runs: the settings that differ (and the model's size
    with them), not those that do not; each metric's last value at the last step; their goodput."""
    with duckdb.connect(str(database), read_only=True) as connection:
        columns, rows = run_saved("run_group_comparison", connection)
    rows = [dict(zip(columns, row, strict=True)) for row in rows]
    assert {row["run_group"] for row in rows} == {"examples"}
    configs = {(row["name"], row["run_id"]): row["value"] for row in rows if row["item"] == "config"}
    assert {name for name, _ in configs} == {"model.hidden", "model.weights", "seed"}
    assert [configs["model.hidden", RUNS[uid]] for uid in JOBSETS] == ["32", "64"]
    last = {(row["name"], row["run_id"]): row["last_step"] for row in rows if row["item"] == "metric"}
    assert {name for name, _ in last} >= METRICS
    assert all(last[name, run] == STEPS - 1 for name in METRICS for run in RUNS.values())
    goodput = [row["last_value"] for row in rows if row["item"] == "goodput"]
    assert len(goodput) == 2 and all(0 < value < 100 for value in goodput)
