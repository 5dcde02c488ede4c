"""A new user's first hour, as the README and docs/migrating.md write it: the README's quick start
in a fresh shell after a demo, the MaxText recipe of migrating.md with no cloud, and, in one line
each, the mistakes a newcomer meets first: no Google credentials, a subscription that does not
exist, a DuckDB file that a stream is writing."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.app import checks, cli
from pipeline.emulators.pubsub import PubSubEmulator, create
from pipeline.sinks import duckdb as duckdb_sink
from support import REPO
from support.history import replay
from support.runs import recorded, write_events

#: The environment the tests run in, which a user who followed the docs has too.
VENV = Path(sys.prefix)


def sh_block(document: Path, heading: str) -> list[str]:
    """The lines of the first ``sh`` block after ``heading`` in ``document``, as written."""
    text = document.read_text()
    section = text[text.index(heading + "\n"):]
    start = section.index("```sh\n") + len("```sh\n")
    return [line for line in section[start:section.index("\n```", start)].splitlines() if line.strip()]


def fresh_environment(home: Path, *, active: bool = False) -> dict[str, str]:
    """A new shell's environment: no Google credentials or gcloud configuration, no metadata
    server (a closed local port answers at once), none of this project's settings, and this
    virtual environment's commands on PATH only if ``active``."""
    kept = {name: value for name, value in os.environ.items()
            if not name.startswith(("GOODPUT_", "PUBSUB_", "BIGQUERY_", "GOOGLE_", "GCLOUD_", "CLOUDSDK_"))
            and name not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    path = [entry for entry in kept.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if entry and not Path(entry).resolve().is_relative_to(VENV.resolve())]
    kept["PATH"] = os.pathsep.join([str(VENV / "bin")] * active + path)
    home.mkdir(parents=True, exist_ok=True)
    return {**kept, "CLOUDSDK_CONFIG": str(home / "gcloud"), "GCE_METADATA_HOST": "127.0.0.1:9",
            "GCE_METADATA_IP": "127.0.0.1:9"}


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An emitter file of one run that ended."""
    path = tmp_path_factory.mktemp("events") / "events.jsonl"
    write_events(recorded("ended")[0], path)
    return path


@pytest.fixture(scope="module")
def database(events: Path) -> Path:
    """The DuckDB file a replay of ``events`` writes."""
    path = events.with_name("goodput.duckdb")
    replay([events], path)
    return path


# -- The README's quick start ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def after_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory as ``make demo`` leaves the repository's root: ``.venv`` and the demo's
    outputs in ``demo-output/`` (of a shorter demo, without the JAX job)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the quick start activates the virtual environment make creates; none is in use")
    root = tmp_path_factory.mktemp("checkout")
    (root / ".venv").symlink_to(VENV, target_is_directory=True)
    done = subprocess.run([sys.executable, "-m", "pipeline.demo", "--duration-s", "20", "--no-jax"],
                          cwd=root, capture_output=True, text=True, timeout=600, check=False,
                          env=fresh_environment(root / "home"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root


def test_the_readme_quick_start_runs_in_a_fresh_shell_after_the_demo(after_demo: Path):
    """Every command after ``make demo`` runs, in order, in a new login shell with nothing
    activated: each exits 0, none prints a traceback, and the last prints a run's goodput."""
    commands = sh_block(REPO / "README.md", "## Quick start")
    assert commands[0].split("#")[0].split() == ["make", "demo"]
    assert not shutil.which("goodput", path=fresh_environment(after_demo / "home")["PATH"])
    done = subprocess.run(["bash", "-lc", "set -e\n" + "\n".join(commands[1:])], cwd=after_demo,
                          env=fresh_environment(after_demo / "home"), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "badput_ranking" in done.stdout
    assert (after_demo / "demo-output" / "replayed.duckdb").stat().st_size > 0
    goodput_pct = re.fullmatch(r"\((\d+\.\d+), \{.*\}, \d+\)", done.stdout.splitlines()[-1])
    assert goodput_pct is not None and 0 < float(goodput_pct.group(1)) <= 100, done.stdout[-500:]


# -- docs/migrating.md: numbers on a workstation ---------------------------------------------------

#: MaxText's training entry as far as goodput goes (``support/clients.py``: its recorder, its
#: monitor and their calls, unchanged), for the recipe's ``MaxText.train`` line.
MAXTEXT_TRAIN = """
import sys, time
import clients

run_name, tensorboard_dir = sys.argv[1:]
config = clients.maxtext_config(run_name, tensorboard_dir)
recorder = clients.maxtext_create_goodput_recorder(config)
clients.maxtext_record_goodput(recorder, "record_job_start_time")
with clients.maxtext_maybe_monitor_goodput(config):
    with clients.maxtext_maybe_record_goodput(recorder, clients.GoodputEvent.TPU_INIT):
        time.sleep(0.2)
    with clients.maxtext_maybe_record_goodput(recorder, clients.GoodputEvent.TRAINING_PREPARATION):
        time.sleep(0.1)
    for step in range(20):
        clients.maxtext_record_goodput(recorder, "record_step_start_time", step)
        time.sleep(0.05)
clients.maxtext_record_goodput(recorder, "record_job_end_time")
assert recorder.close()
"""


def scalars(logdir: Path) -> dict[str, list[float]]:
    """The scalars TensorBoard shows of a directory and those below it: {tag: [values]}."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    runs = EventMultiplexer().AddRunsFromDirectory(str(logdir))
    runs.Reload()
    found: dict[str, list[float]] = {}
    for run, tags in runs.Runs().items():
        for tag in tags["scalars"]:
            found.setdefault(tag, []).extend(event.value for event in runs.Scalars(run, tag))
    return found


def test_the_maxtext_recipe_shows_goodput_from_the_calculator_and_in_tensorboard(tmp_path: Path):
    """migrating.md's block, as written, with MaxText's goodput calls in place of its training:
    the calculator prints the run's goodput, and TensorBoard shows the same figure."""
    commands = sh_block(REPO / "docs" / "migrating.md", "## See your numbers on a workstation")
    train = next(i for i, line in enumerate(commands) if line.startswith("python3 -m MaxText.train "))
    run_name = re.search(r"\brun_name=(\S+)", commands[train]).group(1)  # type: ignore[union-attr]
    output = re.search(r"\bbase_output_directory=(\S+)", commands[train]).group(1)  # type: ignore[union-attr]
    shutil.copy(REPO / "tests" / "support" / "clients.py", tmp_path / "clients.py")
    (tmp_path / "maxtext_train.py").write_text(MAXTEXT_TRAIN)
    commands[train] = f"python maxtext_train.py {run_name} {output}/{run_name}/tensorboard"
    assert commands[-1].startswith("tensorboard --logdir ")
    logdir = tmp_path / commands[-1].split()[-1]
    done = subprocess.run(["bash", "-c", "set -e\n" + "\n".join(commands[:-1])], cwd=tmp_path,
                          env=fresh_environment(tmp_path / "home", active=True), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = re.match(r"\((\d+\.\d+), \{", done.stdout.splitlines()[-1])
    assert printed is not None, done.stdout[-1000:]
    goodput_pct = float(printed.group(1))
    assert 0 < goodput_pct < 100
    shown = scalars(logdir)
    assert shown["goodput/goodput"][-1] == pytest.approx(goodput_pct, abs=1e-4)
    assert "badput/tpu_initialization" in shown


# -- No Google credentials --------------------------------------------------------------------------

GOODPUT = str(VENV / "bin" / "goodput")
PIPELINE = (sys.executable, "-m", "pipeline")


@pytest.mark.parametrize("credentials", [None, "nowhere.json"], ids=["unset", "a-missing-file"])
@pytest.mark.parametrize(("command", "said"), [
    ((GOODPUT, "productivity", "--project", "my-project", "--duckdb", "{database}"),
     "goodput productivity: writing to Cloud Monitoring of --project=my-project needs Google credentials"),
    ((GOODPUT, "import", "gke-metrics", "--project", "my-project", "--duckdb", "{new}"),
     "goodput import gke-metrics: reading GKE's metrics of --project=my-project needs Google credentials"),
    ((GOODPUT, "replay", "--events={events}", "--duckdb={new}", "--bigquery_dataset=my-project:goodput"),
     "goodput replay: --bigquery_dataset=my-project:goodput needs Google credentials"),
    ((*PIPELINE, "--events={events}", "--duckdb={new}", "--monitoring_project=my-project"),
     "python -m pipeline: --monitoring_project=my-project needs Google credentials"),
    ((*PIPELINE, "--streaming", "--runner=BundleBasedDirectRunner",
      "--subscription=projects/my-project/subscriptions/goodput", "--duckdb={new}"),
     "python -m pipeline: --subscription=projects/my-project/subscriptions/goodput needs Google credentials"),
], ids=["productivity", "gke-metrics", "replay-to-bigquery", "replay-to-monitoring", "stream-from-pubsub"])
def test_without_credentials_a_command_says_so_in_one_line(tmp_path: Path, events: Path, database: Path,
                                                           credentials: str | None, command: tuple[str, ...],
                                                           said: str):
    """One line on stderr naming what needs the credentials and what to do, exit code 2, and no
    output written (the replay wrote its DuckDB file before BigQuery's traceback)."""
    new = tmp_path / "new.duckdb"
    env = fresh_environment(tmp_path / "home")
    if credentials is not None:
        env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / credentials)
    argv = [part.format(database=database, events=events, new=new) for part in command]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(said), lines[0]
    assert "gcloud auth application-default login" in lines[0]
    assert (str(tmp_path / credentials) in lines[0]) if credentials else ("none were found" in lines[0])
    assert not new.exists()


# -- Pub/Sub: the emulator's topic and subscription, and one that does not exist -------------------

TOPIC = "projects/goodput-local/topics/goodput"
SUBSCRIPTION = "projects/goodput-local/subscriptions/goodput"

@pytest.fixture
def emulator_command(tmp_path: Path) -> Iterator[str]:
    """``goodput emulator pubsub`` holding a topic and a subscription of it, on a free port; the
    address it prints. Stopped as a user stops it (SIGINT)."""
    process = subprocess.Popen(
        [GOODPUT, "emulator", "pubsub", "--port", "0", "--topic", TOPIC, "--subscription", SUBSCRIPTION],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=fresh_environment(tmp_path / "home"))
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("export PUBSUB_EMULATOR_HOST="), first + process.stderr.read()  # type: ignore[union-attr]
        assert process.stdout.readline() == f"export GOODPUT_DESTINATION={TOPIC}\n"
        yield first.strip().split("=", 1)[1]
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def test_the_emulator_starts_with_the_topic_and_subscription_it_is_given(emulator_command: str,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """A message published to the topic is pulled from the subscription, which a stream's
    check finds; a subscription it was not given is refused in one line."""
    from google.cloud import pubsub_v1

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator_command)
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    try:
        publisher.publish(TOPIC, b"hello").result(timeout=30)
        pulled = subscriber.pull(subscription=SUBSCRIPTION, max_messages=10, timeout=30)
        assert [m.message.data for m in pulled.received_messages] == [b"hello"]
    finally:
        subscriber.close()
    checks.check_subscription(SUBSCRIPTION)
    with pytest.raises(checks.UsageError, match=f"{SUBSCRIPTION}-2 does not exist on the Pub/Sub "
                                                f"emulator at {emulator_command}"):
        checks.check_subscription(f"{SUBSCRIPTION}-2")


@pytest.mark.parametrize(("options", "said"), [
    (("--subscription", "projects/goodput-local/subscriptions/s"),
     "--subscription needs --topic, the topic it is a subscription of"),
    (("--topic", "goodput"), "--topic=goodput is not projects/P/topics/T"),
    (("--topic", "projects/local/topics/t"), "--topic=projects/local/topics/t is not projects/P/topics/T"),
    (("--topic", "projects/goodput-local/topics/t", "--subscription", "projects/goodput-local/topics/t"),
     "--subscription=projects/goodput-local/topics/t is not projects/P/subscriptions/S"),
], ids=["subscription-alone", "bare-topic", "short-project", "topic-as-subscription"])
def test_the_emulators_topic_options_are_checked_in_one_line(capsys, options: tuple[str, ...], said: str):
    """Each mistake in one line, exit code 2; a name is refused where the stream could not read it."""
    assert cli.main(["emulator", "pubsub", "--port", "0", *options]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"goodput emulator: {said}"), lines


def test_a_subscription_beams_read_refuses_is_one_line():
    """Beam's Pub/Sub read takes only project ids of 6 characters or more (``projects/local/...``
    would fail in its traceback once the stream starts)."""
    with pytest.raises(checks.UsageError, match=r"^--subscription=projects/local/subscriptions/s: Invalid "
                                                r"PubSub project name: 'local', which Beam's Pub/Sub read "
                                                r"refuses \(a project id is 6 or more"):
        checks.check_subscription("projects/local/subscriptions/s")


def test_the_bigquery_emulator_refuses_a_topic(capsys):
    assert cli.main(["emulator", "bigquery", "--port", "0", "--topic", TOPIC]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "goodput emulator: --topic is for the pubsub emulator, which holds topics and subscriptions"]


def test_a_stream_of_a_subscription_that_does_not_exist_exits_2_in_one_line(tmp_path: Path):
    """It says so at once, before anything is written, instead of waiting for it for ever."""
    with PubSubEmulator() as emulator:
        create(emulator.broker, TOPIC, None)
        env = {**fresh_environment(tmp_path / "home"), "PUBSUB_EMULATOR_HOST": emulator.host}
        done = subprocess.run([*PIPELINE, "--streaming", "--runner=BundleBasedDirectRunner",
                               f"--subscription={SUBSCRIPTION}",
                               f"--duckdb={tmp_path / 'goodput.duckdb'}"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"python -m pipeline: --subscription={SUBSCRIPTION} does not exist on the Pub/Sub emulator at "
        f"{emulator.host}: goodput emulator pubsub --topic projects/P/topics/T --subscription "
        f"{SUBSCRIPTION} starts an emulator that has it"]
    assert not (tmp_path / "goodput.duckdb").exists()


# -- A DuckDB file another process holds -----------------------------------------------------------

def hold(path: Path) -> subprocess.Popen[str]:
    """A process that holds ``path`` open for writing, as a stream does while it writes a bundle,
    until its standard input closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys\nconnection = duckdb.connect(sys.argv[1])\n"
                               "print('held', flush=True)\nsys.stdin.read()\n", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    assert holder.wait(timeout=30) == 0


def test_a_report_waits_while_a_stream_takes_the_file_between_two_openings(
        tmp_path: Path, database: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    """``goodput report`` opens the file twice (its check, then the report's read): a writer that
    takes the file in between is waited for, and the report is written."""
    real_open, opened, holders = duckdb_sink.open_reader, [], []

    def open_reader(path: str | Path) -> object:
        opened.append(path)
        if len(opened) == 2:  # the report's own opening: a stream's bundle takes the file first
            holders.append(hold(database))
        elif len(opened) == 3:  # the retry: the bundle is written
            release(holders[0])
        return real_open(path)

    monkeypatch.setattr(duckdb_sink, "open_reader", open_reader)
    try:
        code = cli.main(["report", "--duckdb", str(database), "--output", str(tmp_path / "report.html")])
    finally:
        for holder in holders:
            if holder.poll() is None:
                release(holder)
    assert code == 0, capsys.readouterr().err
    assert len(opened) >= 3
    assert (tmp_path / "report.html").stat().st_size > 0


def test_a_report_of_a_file_held_throughout_is_one_line(tmp_path: Path, database: Path, capsys):
    """A writer that keeps the file past the wait: one line, exit code 2, no report."""
    holder = hold(database)
    try:
        code = cli.main(["report", "--duckdb", str(database), "--output", str(tmp_path / "report.html")])
    finally:
        release(holder)
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"goodput report: --duckdb={database} is held by another process for longer than "
        f"{checks.LOCK_WAIT_S:g} s: try again once it is done"]
    assert not (tmp_path / "report.html").exists()
