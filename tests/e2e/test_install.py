"""The distributions as a user installs them: wheels built from this checkout's files, installed
into virtual environments outside it.

A training image installs the emitter alone: it imports the emitter and the contract, and finds no
``pipeline``. The pipeline's wheel carries everything its ``goodput`` command runs, the demo's
training jobs included. Building and installing takes the package index, as ``make`` does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from goodput_schemas import saved_queries
from support import REPO

DISTRIBUTIONS = {"fleet-goodput-schemas": "goodput_schemas", "fleet-goodput-emitter": "emitter",
                 "fleet-goodput-measurement": "ml_goodput_measurement", "fleet-goodput": "."}


def run(*command: str | Path, cwd: Path, timeout: float = 600, env_destination: str | None = None,
        environment: dict[str, str] | None = None) -> str:
    env = {**os.environ, **(environment or {})}
    if env_destination is not None:
        env["GOODPUT_DESTINATION"] = env_destination
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False, env=env)
    assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the files git knows, as a fresh clone (nothing built here before counts)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the files of a clone are not known")
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO)
    clone = tmp_path_factory.mktemp("clone")
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    return clone


@pytest.fixture(scope="module")
def wheels(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A wheel of each distribution, built from the clone."""
    out = tmp_path_factory.mktemp("wheels")
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", out,
        *(clone / folder for folder in DISTRIBUTIONS.values()), cwd=clone)
    built = {path.name.split("-")[0].replace("_", "-"): path for path in out.glob("*.whl")}
    assert set(built) == set(DISTRIBUTIONS)
    return built


def new_environment(path: Path, *, beside: Path | None = None) -> Path:
    """A virtual environment's python; with ``beside``, another environment's packages come after
    its own (so that a test need not download what this one has installed)."""
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    if beside is not None:
        site = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=path).strip()
        (Path(site) / "beside.pth").write_text(f"{beside}\n")
    return python


def _record_a_job(python: Path, cwd: Path) -> str:
    """Runs a job start and a plain step start through the installed emitter; what it prints: the
    modules of the pipeline it finds (none, for a training image), whether the compiled fast path
    is in use, and the events' kinds."""
    events = cwd / "events.jsonl"
    script = ("from emitter import GoodputRecorder, lane\n"
              f"recorder = GoodputRecorder('run-1', logging_enabled=True, destination='file:{events}')\n"
              "recorder.record_job_start_time()\n"
              "recorder.record_step_start_time(0)\n"
              "assert recorder.close()\n"
              "import importlib.util, json\n"
              "print([name for name in ('pipeline', 'apache_beam') if importlib.util.find_spec(name)],\n"
              "      lane.COMPILED,\n"
              f"      [kind for line in open({str(events)!r}) for event in json.loads(line)['events']\n"
              "       for kind in event if kind not in ('seq', 'time_us')])\n")
    return run(python, "-c", script, cwd=cwd).strip()


def test_the_emitter_alone_imports_the_emitter_and_no_pipeline(wheels, tmp_path):
    """The emitter and the contract install with their own dependencies, the emitter's compiled fast
    path built; ``pipeline`` is not there."""
    python = new_environment(tmp_path / "venv")
    run(python, "-m", "pip", "install", "--quiet", wheels["fleet-goodput-emitter"],
        wheels["fleet-goodput-schemas"], cwd=tmp_path)
    assert _record_a_job(python, tmp_path) == "[] True ['job_start', 'step_start', 'configs', 'configs']"


def test_the_emitter_builds_without_a_c_compiler_and_records_all_the_same(clone, wheels, tmp_path):
    """Where the compiler fails, the emitter's wheel is built without its compiled fast path, and
    the installed emitter records through the Python one."""
    source, out = tmp_path / "emitter", tmp_path / "wheel"
    shutil.copytree(clone / "emitter", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", out, source,
        cwd=tmp_path, environment={"CC": "false", "LDSHARED": "false"})
    [wheel] = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as built:
        assert "emitter/lane.py" in built.namelist()
        assert not [name for name in built.namelist() if name.startswith("emitter/_lane")]
    python = new_environment(tmp_path / "venv")
    run(python, "-m", "pip", "install", "--quiet", wheel, wheels["fleet-goodput-schemas"], cwd=tmp_path)
    assert _record_a_job(python, tmp_path) == "[] False ['job_start', 'step_start', 'configs', 'configs']"


def test_training_code_written_for_the_reference_runs_unchanged(wheels, tmp_path):
    """Only the drop-in installed: MaxText's and AXLearn's calls (``support/clients.py``, copied
    out) import ``ml_goodput_measurement`` and run, recording to the destination in the
    environment; nothing of the pipeline or Beam is loaded."""
    python = new_environment(tmp_path / "venv", beside=Path(sysconfig.get_path("purelib")))
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", wheels["fleet-goodput-measurement"],
        wheels["fleet-goodput-emitter"], wheels["fleet-goodput-schemas"], cwd=tmp_path)
    shutil.copy(REPO / "tests" / "support" / "clients.py", tmp_path / "clients.py")
    events = tmp_path / "events.jsonl"
    script = f"""
import importlib.util, time
import clients
from ml_goodput_measurement import goodput_utils
from ml_goodput_measurement.src.goodput import GoodputRecorder

config = clients.maxtext_config("mt", {str(tmp_path / "tb")!r}, goodput_upload_interval_seconds=1)
recorder = clients.maxtext_create_goodput_recorder(config)
clients.maxtext_record_goodput(recorder, "record_job_start_time")
with clients.maxtext_maybe_monitor_goodput(config):
    with clients.maxtext_maybe_record_goodput(recorder, clients.GoodputEvent.TPU_INIT):
        pass
    for step in range(5):
        clients.maxtext_record_goodput(recorder, "record_step_start_time", step)
clients.maxtext_record_goodput(recorder, "record_job_end_time")
assert recorder.close()

axlearn = clients.AXLearnGoodputRecorder("axl", {str(tmp_path / "tb")!r}, upload_interval=1,
                                         rolling_window_size=[3600])
with axlearn.maybe_monitor_goodput(), axlearn.maybe_monitor_rolling_window_goodput():
    with axlearn.record_event(clients.Event.JOB):
        for step in range(5):
            with axlearn.record_event(clients.Event.STEP, step):
                pass
assert axlearn._recorder.close()
assert isinstance(recorder, GoodputRecorder) and goodput_utils.BadputType.OTHER.value == 11
import ml_goodput_measurement, sys
print(ml_goodput_measurement.__file__)
print(importlib.util.find_spec("pipeline"),
      [name for name in ("apache_beam", "pipeline") if name in sys.modules])
"""
    output = run(python, "-c", script, cwd=tmp_path, env_destination=f"file:{events}")
    where, modules = output.strip().splitlines()[-2:]
    assert str(tmp_path / "venv") in where
    assert modules == "None []"  # the drop-in neither has the pipeline nor loads Beam
    lines = events.read_text()
    assert lines.count('"step_start"') == 10 and lines.count('"job_end"') == 2


def test_goodput_demo_runs_from_the_installed_wheels(wheels, tmp_path):
    """``goodput demo`` from the wheels, run far from the checkout, ends with the live numbers equal
    to the batch replay's (its exit status says so)."""
    python = new_environment(tmp_path / "venv", beside=Path(sysconfig.get_path("purelib")))
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", *wheels.values(), cwd=tmp_path)
    where = run(python, "-c", "import pipeline, emitter; print(pipeline.__file__, emitter.__file__)",
                cwd=tmp_path)
    assert str(REPO) not in where and str(tmp_path / "venv") in where
    output = run(python.with_name("goodput"), "demo", "--no-jax", "--duration-s", "30", "--quiet",
                 "--output-dir", tmp_path / "demo", cwd=tmp_path, timeout=300)
    assert "the live numbers equal a batch replay" in output
    assert (tmp_path / "demo" / "report.html").stat().st_size > 0


def test_goodput_is_an_installed_command():
    result = subprocess.run([str(Path(sys.executable).with_name("goodput")), "query", "badput_ranking",
                             "--sql", "--dataset", "my-project.goodput"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == saved_queries("`my-project.goodput`")["badput_ranking"]
