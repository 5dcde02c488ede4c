"""The HTML report of a varied fleet of 10,000 runs over 48 hours (16 run groups, 8 accelerator
types, 4 to 512 chips; crashes, restarts from step 0, hangs that go on and hangs that end,
slowdowns), replayed by the batch pipeline: the first screen names the runs losing the most
chip-hours, the list of runs that need attention is whole, any run has a page, and the page stays
light and quick to open in chromium."""

from __future__ import annotations

import html
import random
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

from goodput_schemas.wire import encode_batch
from pipeline.app.cli import main
from pipeline.app.fleet_sql import run_saved
from pipeline.app.report import MAX_TABLE_ROWS, write_report
from support.browser import opened
from support.history import replay, section

RUNS = 10_000
GROUPS = [f"team-{index:02d}" for index in range(16)]
#: Six with a price in accelerator_prices, two without.
ACCELERATORS = ["v4", "v5e", "v5p", "v6e", "a100", "h100", "tpu7x", "b200"]
CHIPS = [4, 8, 16, 32, 64, 128, 256, 512]
T0_US = 1_793_520_000 * 1_000_000  # 2026-11-01 08:00 UTC
S = 1_000_000
#: The shape of run ``index``: ``SHAPES[index % len(SHAPES)]``.
SHAPES = ("clean", "clean", "clean", "clean", "crash", "hang", "slowdown", "restart_from_zero", "clean",
          "hang_that_ends")
#: How many of each shape's runs the run page test opens.
PAGES_PER_SHAPE = 2

Record = tuple[int, int, str, dict[str, Any]]


def run_id(index: int) -> str:
    return f"run-{index:05d}"


class _Attempt:
    """One attempt's records on a clock of microseconds."""

    def __init__(self, clock: int, metadata: dict[str, Any]) -> None:
        self.clock = clock
        self.records: list[Record] = []
        self.add("job_start", metadata)
        for name, seconds in (("tpu_init", 30), ("training_prep", 20), ("data_loading", 10)):
            self.add(f"{name}_start", {})
            self.clock += seconds * S
            self.add(f"{name}_end", {})

    def add(self, kind: str, body: dict[str, Any]) -> None:
        self.records.append((len(self.records), self.clock, kind, body))

    def steps(self, first: int, last: int, step_s: float, rng: random.Random, slow: range = range(0)) -> None:
        for step in range(first, last):
            self.add("step_start", {"step": step})
            if step % 5 == 0:
                self.add("metrics", {"step": step, "values": {"LOSS": 5.0 / (1 + step)}})
            self.clock += round(step_s * (3.0 if step in slow else 1.0) * rng.uniform(0.95, 1.05) * S)
            if step % 25 == 24:
                self.add("custom_badput_start", {"badput_type": "eval_step"})
                self.clock += 8 * S
                self.add("custom_badput_end", {"badput_type": "eval_step"})
            if step % 20 == 19:
                self.add("checkpoint_save", {"step": step, "blocking_s": 4.0, "persistent": True})
                self.clock += 4 * S

    def silence(self, seconds: int) -> None:
        """No step for ``seconds``: heartbeats only, one a minute."""
        for _ in range(seconds // 60):
            self.clock += 60 * S
            self.add("heartbeat", {})


def fleet_messages(index: int) -> list[bytes]:
    """Run ``index``'s messages, one per attempt."""
    rng = random.Random(index)
    shape = SHAPES[index % len(SHAPES)]
    metadata = {"run_group": GROUPS[index % len(GROUPS)], "accelerator_type": ACCELERATORS[index * 7 % 8],
                "chip_count": CHIPS[rng.randrange(len(CHIPS))]}
    steps, step_s = rng.randrange(40, 90), rng.choice([1.5, 3.0, 6.0, 12.0])
    first = _Attempt(T0_US + index * 17 * S, metadata)  # the fleet's runs start over 47 hours
    first.add("configs", {"source": "user", "values": {"learning_rate": str(rng.choice([1e-4, 3e-4])),
                                                       "batch_size": str(rng.choice([256, 512]))}})
    attempts = [first]
    if shape == "clean":
        first.steps(0, steps, step_s, rng)
        first.add("job_end", {})
    elif shape == "slowdown":  # after a baseline the detector can take (5 + 32 steps, 300 s at least)
        first.steps(0, 130, 6.0, rng, slow=range(60, 95))
        first.add("job_end", {})
    elif shape == "hang":  # stops stepping for good: heartbeats for half an hour, no end
        first.steps(0, steps // 2, step_s, rng)
        first.silence(1800)
    elif shape == "hang_that_ends":
        first.steps(0, steps // 2, step_s, rng)
        first.silence(900)
        first.steps(steps // 2, steps, step_s, rng)
        first.add("job_end", {})
    else:  # a crash after 60 % of its steps, and a restart minutes later
        crash_at = 3 * steps // 5
        first.steps(0, crash_at, step_s, rng)
        second = _Attempt(first.clock + rng.randrange(120, 600) * S, metadata)
        if shape == "crash":
            restored = crash_at // 20 * 20 - 1
            if restored >= 0:
                second.add("checkpoint_restore", {"step": restored, "blocking_s": 12.0})
                second.clock += 12 * S
            second.steps(restored + 1, steps, step_s, rng)
        else:
            second.steps(0, steps, step_s, rng)
        second.add("job_end", {})
        attempts.append(second)
    return [encode_batch(run_id(index), f"{run_id(index)}-attempt-{number}", attempt.records).data
            for number, attempt in enumerate(attempts, start=1)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet's events, replayed by the batch pipeline into a DuckDB file."""
    directory = tmp_path_factory.mktemp("fleet10k")
    events = directory / "events.jsonl"
    with events.open("wb") as handle:
        for index in range(RUNS):
            for message in fleet_messages(index):
                handle.write(message + b"\n")
    database = directory / "goodput.duckdb"
    replay([events], database)
    return database


@pytest.fixture(scope="module")
def report(fleet: Path) -> tuple[Path, str]:
    output = fleet.with_name("report.html")
    write_report(fleet, output)
    return output, output.read_text()


def sql(database: Path, query: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(query).fetchall()


#: Each run's latest cumulative snapshot and what it lost, the costliest first.
COSTLIEST = """
SELECT run_id, total_chip_s - productive_chip_s AS lost_chip_s FROM goodput_snapshots WHERE window_s = 0
QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
ORDER BY lost_chip_s DESC, total_time_s - productive_time_s DESC, run_id
"""


def runs_of(table_html: str) -> list[str]:
    return [html.unescape(run) for run in re.findall(r'<td class="run">(.*?)</td>', table_html)]


def test_the_report_ranks_runs_by_the_chip_hours_they_lose(fleet: Path, report: tuple[Path, str]):
    """The summary's table lists the MAX_TABLE_ROWS runs losing the most chip-hours in the order SQL
    on the tables gives, and says what the others lose."""
    _, page = report
    costliest = sql(fleet, COSTLIEST)
    assert len(costliest) == RUNS
    table = page.split('id="top-runs"')[1].split("</table>")[0]
    assert runs_of(table) == [run for run, _ in costliest[:MAX_TABLE_ROWS]]
    rest = sum(lost for _, lost in costliest[MAX_TABLE_ROWS:]) / 3600
    more = re.search(r'id="top-runs-more">and ([\d,]+) more runs losing ([\d,.]+) chip-hours', page)
    assert more and int(more.group(1).replace(",", "")) == RUNS - MAX_TABLE_ROWS
    assert float(more.group(2).replace(",", "")) == pytest.approx(rest, abs=0.05)
    # Goodput % alone would have put others first: a small run at low goodput is not the costliest.
    (by_pct,), = sql(fleet, "SELECT arg_min(run_id, goodput_pct) FROM latest_goodput WHERE window_s = 0")
    assert by_pct != costliest[0][0]


def test_the_list_of_runs_that_need_attention_is_whole(fleet: Path, report: tuple[Path, str]):
    """Every row of stalled_or_regressed is in the summary's list and in the query's table, though
    they are more than MAX_TABLE_ROWS; every hung run of the fleet is among them, stalled."""
    _, page = report
    with duckdb.connect(str(fleet), read_only=True) as connection:
        columns, rows = run_saved("stalled_or_regressed", connection)
    flagged = sorted(row[columns.index("run_id")] for row in rows)
    hung = [run_id(index) for index in range(RUNS) if SHAPES[index % len(SHAPES)] == "hang"]
    stalled = {row[columns.index("run_id")] for row in rows if row[columns.index("stalled")]}
    assert len(flagged) > MAX_TABLE_ROWS and set(hung) <= stalled
    attention = page.split('id="attention"')[1].split("</table>")[0]
    assert sorted(runs_of(attention)) == flagged
    query = section(page, "fleet-queries").split('id="query-stalled_or_regressed"')[1].split("</table>")[0]
    assert query.count("<tr>") == len(rows) + 1
    assert "more rows not shown" not in query


def test_hung_time_is_named_apart_from_other(report: tuple[Path, str]):
    """The badput breakdown shows HANG, in its own fixed colour, apart from OTHER."""
    _, page = report
    badput = section(page, "badput")
    assert re.search(r'<span class="swatch" style="background:#7d1d2c"></span>HANG</li>', badput)
    assert re.search(r'<span class="swatch" style="background:#bab0ac"></span>OTHER</li>', badput)


def test_a_run_page_exists_for_any_run(fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """``goodput report --run RUN`` writes the page of runs of every shape: a lane per attempt in
    run_metadata, each attempt's spans, the crash of a crashed run, the hang of a hung one and the
    slowdown of a slowed one; a run the file does not know is one line and exit code 2."""
    rng = random.Random(7)
    for shape in dict.fromkeys(SHAPES):
        runs_of_shape = [index for index in range(RUNS) if SHAPES[index % len(SHAPES)] == shape]
        for index in rng.sample(runs_of_shape, PAGES_PER_SHAPE):
            run = run_id(index)
            output = tmp_path / f"{run}.html"
            assert main(["report", "--duckdb", str(fleet), "--run", run, "--output", str(output)]) == 0
            page = output.read_text()
            (attempts,), = sql(fleet, "SELECT count(DISTINCT attempt_id) FROM run_metadata "
                                      f"WHERE run_id = '{run}'")
            gantt = page.split('<svg class="gantt"')[1].split("</svg>")[0]
            lanes = [int(number) for number in re.findall(r">attempt (\d+)</text>", gantt)]
            assert lanes == list(range(1, attempts + 1))
            for kind in ("init", "prep", "data loading", "steps", "checkpoint save", "eval_step"):
                assert f'data-kind="{kind}"' in gantt, (shape, kind)
            assert ('class="crash"' in gantt) == (shape in ("crash", "restart_from_zero")), shape
            if shape.startswith("hang"):
                assert 'data-kind="hang"' in gantt
            if shape == "slowdown":
                assert 'data-kind="slowdown"' in gantt
            assert '<svg class="goodput-line"' in page and "learning_rate" in page and "LOSS" in page
    capsys.readouterr()
    assert main(["report", "--duckdb", str(fleet), "--run", "no-such-run", "--output",
                 str(tmp_path / "none.html")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_report_is_light_and_opens_quickly_with_the_costliest_runs_first(
        fleet: Path, report: tuple[Path, str]):
    """The page is under 10 MB, and chromium opens it in under 5 s with no error: the first screen
    shows the ten runs losing the most chip-hours, and the tables sort and filter."""
    output, _ = report
    assert output.stat().st_size < 10_000_000
    top = [run for run, _ in sql(fleet, COSTLIEST)[:10]]
    with opened(output) as (page, problems):
        loaded = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd") / 1000
        rows = page.locator("#top-runs tbody tr")
        for index, run in enumerate(top):
            box = rows.nth(index).bounding_box()
            assert rows.nth(index).locator("td.run").inner_text() == run
            assert box is not None and box["y"] + box["height"] <= 900, (index, box)
        page.locator("#top-runs thead th", has_text="chips").click()
        chips = [int(text) for text in page.locator("#top-runs tbody td:nth-child(9)").all_inner_texts()]
        assert chips == sorted(chips, reverse=True)
        flagged = page.locator("#attention tbody tr").count()
        first = page.locator("#attention tbody tr td.run").first.inner_text()
        page.locator("#attention-filter").fill(first)
        assert page.locator("#attention tbody tr:visible").count() == 1 < flagged
    assert problems == []
    assert loaded < 5.0, loaded
