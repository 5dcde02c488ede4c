"""The distributions as a user installs them: wheels built from this checkout's files, installed
into virtual environments outside it.

A training image installs the emitter alone: it imports the emitter and the contract, and finds no
``pipeline``. The pipeline's wheel carries everything its ``goodput`` command runs, the demo's
training jobs included. Building and installing takes the package index, as ``make`` does."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from goodput_schemas import saved_queries
from support import REPO

DISTRIBUTIONS = {"fleet-goodput-schemas": "goodput_schemas", "fleet-goodput-emitter": "emitter",
                 "fleet-goodput": "."}


def run(*command: str | Path, cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A wheel of each distribution, built from a copy of the files git knows, as from a fresh
    clone (nothing built here before counts)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the files of a clone are not known")
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO)
    clone = tmp_path_factory.mktemp("clone")
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
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


def test_the_emitter_alone_imports_the_emitter_and_no_pipeline(wheels, tmp_path):
    """The emitter and the contract install with their own dependencies; ``pipeline`` is not there."""
    python = new_environment(tmp_path / "venv")
    run(python, "-m", "pip", "install", "--quiet", wheels["fleet-goodput-emitter"],
        wheels["fleet-goodput-schemas"], cwd=tmp_path)
    events = tmp_path / "events.jsonl"
    script = ("from emitter import GoodputRecorder\n"
              f"recorder = GoodputRecorder('run-1', logging_enabled=True, destination='file:{events}')\n"
              "recorder.record_job_start_time()\n"
              "assert recorder.close()\n"
              "import importlib.util\n"
              "print([name for name in ('pipeline', 'apache_beam') if importlib.util.find_spec(name)])\n")
    assert run(python, "-c", script, cwd=tmp_path).strip() == "[]"
    assert '"job_start"' in events.read_text()


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
                             "--sql"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == saved_queries()["badput_ranking"]
