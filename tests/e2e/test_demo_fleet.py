"""The live demo looks like one fleet: every run on one clock, each run its own MFU, the report's
MPG and ongoing hang as they are; and a second demo in its directory is refused while it runs.

One short demo, run as a user runs it, serves every test here."""

from __future__ import annotations

import dataclasses
import html
import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from pipeline.demo import demo
from pipeline.demo.fleet import FLEET, SPEED
from support import REPO
from support.history import section

HAS_JAX = importlib.util.find_spec("jax") is not None
HUNG = next(run.run_id for run in FLEET if run.hangs)


@dataclasses.dataclass(frozen=True)
class DemoRun:
    output: Path
    pid: int
    code: int
    out: str
    err: str
    wall_s: float  # from its start to its exit
    second: subprocess.CompletedProcess[str]
    first_running: bool  # whether the first demo was still running when the second had exited


def query(database: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql).fetchall()


@pytest.fixture(scope="module")
def fleet_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """A 10-second demo; once it holds its directory, a second demo is started there."""
    output = tmp_path_factory.mktemp("fleet") / "demo-output"
    command = [sys.executable, "-m", "pipeline.demo", "--output-dir", str(output), "--duration-s", "10",
               "--quiet", *([] if HAS_JAX else ["--no-jax"])]
    started = time.monotonic()
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        holding = f"pid {first.pid} writes here now".encode()
        while not ((output / demo.MARKER).exists() and holding in (output / demo.MARKER).read_bytes()):
            assert first.poll() is None and time.monotonic() < deadline, "the demo never held its directory"
            time.sleep(0.1)
        second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
        first_running = first.poll() is None
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    return DemoRun(output, first.pid, first.returncode, out, err, time.monotonic() - started, second,
                   first_running)


def test_a_second_demo_in_its_directory_exits_2_in_one_line_and_the_first_ends_well(fleet_demo: DemoRun):
    """The second demo exits 2 at once with one line naming the first's pid; the first, still
    running then, ends with its live numbers equal to the replay's."""
    second = fleet_demo.second
    assert second.returncode == 2 and second.stdout == ""
    assert second.stderr.splitlines() == [
        f"goodput demo: another demo is writing {fleet_demo.output.resolve()} (pid {fleet_demo.pid}): wait "
        "for it to end, or name another --output-dir"]
    assert fleet_demo.first_running
    assert fleet_demo.code == 0, fleet_demo.out + fleet_demo.err
    assert "the live numbers equal a batch replay of the same events" in fleet_demo.out


def test_every_run_is_on_the_fleets_clock(fleet_demo: DemoRun):
    """Every run's lifetime lies within the fleet's span, which is no longer than the demo's wall
    time at SPEED: the hung run hangs until the fleet's last moment, not until the wall clock's, and
    the JAX run starts and ends among the simulated runs."""
    database = fleet_demo.output / "goodput.duckdb"
    runs = {row[0]: row[1:] for row in query(
        database, "SELECT run_id, window_start, window_end, total_time_s FROM latest_goodput "
                  "WHERE window_s = 0")}
    simulated = {run: times for run, times in runs.items() if run != demo.JAX_RUN}
    start = min(times[0] for times in simulated.values())
    end = max(times[1] for times in simulated.values())
    span_s = (end - start).total_seconds()
    assert span_s <= fleet_demo.wall_s * SPEED
    assert runs[HUNG][1] == end  # the hung run is the last one heard from
    others_end = max(times[1] for run, times in simulated.items() if run != HUNG)
    assert (end - others_end).total_seconds() <= 60 * SPEED  # hung until the demo stopped, no more
    for run, (run_start, run_end, total_s) in runs.items():
        assert start <= run_start <= run_end <= end, run
        assert total_s <= span_s + 1e-6, run
    if HAS_JAX:
        assert runs[demo.JAX_RUN][2] > 60  # its seconds of training, SPEED times as long
    [(latest_event,)] = query(database, "SELECT max(event_time) FROM events")
    assert latest_event <= end


def test_each_simulated_run_has_its_own_mfu(fleet_demo: DemoRun):
    """Each run's mean MFU is its profile's (lower for the run that slows down), and they differ."""
    mfu = dict(query(fleet_demo.output / "goodput.duckdb",
                     "SELECT run_id, avg(value) FROM model_metrics WHERE name = 'MFU' GROUP BY run_id"))
    assert set(mfu) == {run.run_id for run in FLEET}
    for run in FLEET:
        expected = run.profile["mfu"]
        if run.profile.get("slowdown", 1.0) > 1.0:
            assert 0.5 * expected < mfu[run.run_id] < expected, run.run_id
        else:
            assert mfu[run.run_id] == pytest.approx(expected, abs=0.01), run.run_id
    assert len({round(value, 2) for value in mfu.values()}) == len(FLEET)


def test_the_report_shows_the_ongoing_hang_so_far_and_ranks_a_run_missing_a_factor_apart(fleet_demo: DemoRun):
    """The hung run's hang is shown as ≥ its time with no step up to its latest snapshot, more than
    it had lost when found; the JAX run, with no MFU, is among the runs missing a factor."""
    page = (fleet_demo.output / "report.html").read_text()
    [(found_lost_s,)] = query(fleet_demo.output / "goodput.duckdb",
                              f"SELECT lost_s FROM latest_anomalies WHERE run_id = '{HUNG}' AND kind='hang'")
    rows = re.findall(r"<tr>(.*?)</tr>", section(page, "anomalies"))
    row = next(row for row in rows if f">{HUNG}<" in row and ">hang<" in row)
    lost = html.unescape(re.findall(r"<td[^>]*>(.*?)</td>", row)[-1])
    assert lost.startswith("≥ ")
    assert float(lost[2:].replace(",", "")) > found_lost_s
    productivity = section(page, "productivity")
    complete = re.search(r'<div id="productivity-runs">(.*?)</table>', productivity, re.S)
    assert complete and all(f">{run.run_id}<" in complete.group(1) for run in FLEET)
    if HAS_JAX:
        missing = re.search(r'<div id="productivity-missing">(.*?)</table>', productivity, re.S)
        assert missing and f">{demo.JAX_RUN}<" in missing.group(1)
        assert demo.JAX_RUN not in complete.group(1)
