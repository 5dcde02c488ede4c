"""The HTML report (pipeline.app.report) of a real batch replay's tables, checked as text and in a
real headless browser."""

from __future__ import annotations

import colorsys
import html
import re
import struct
from pathlib import Path
from typing import Any

import duckdb
import pytest

from goodput_schemas import saved_queries
from pipeline.app.alerts import evaluate_file
from pipeline.app.fleet_sql import run_saved
from pipeline.app.report import BUCKET_COLORS, bucket_color, write_report
from pipeline.app.run_page import write_run_report
from support.browser import opened
from support.history import SECTION_IDS, SlowStretch, replay, section, simulate, simulate_profile

RUNS = [("run-a", 300, 1), ("run-b", 200, 2), ("run-c<&>", 500, 3)]
#: A run of 1 s steps that are half as slow again from step 150 to 549, then hangs at step 760 for
#: the 5 minutes until its events end: a slowdown that ended and a hang that goes on.
ANOMALOUS = ("run-slow", 800, 4, SlowStretch(step_time_s=1.0, crashes_at=(), slow_from=150, slow_until=550,
                                             slow_factor=1.5, hang_at=0.95, hang_for_s=300))


@pytest.fixture(scope="module")
def fleet_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four simulated runs (RUNS and ANOMALOUS) replayed by the batch pipeline as of three times, then
    at their end."""
    directory = tmp_path_factory.mktemp("fleet")
    events = [*simulate(directory, RUNS), simulate_profile(directory, *ANOMALOUS)]
    database = directory / "goodput.duckdb"
    for as_of in ("08:06:00", "08:09:00", "08:12:00"):
        replay(events, database, f"--as_of=2026-11-01T{as_of}Z", "--no_raw_events")
    replay(events, database)
    return database


@pytest.fixture(scope="module")
def report(fleet_database: Path) -> str:
    output = fleet_database.with_name("report.html")
    write_report(fleet_database, output)
    return output.read_text()


def sql(database: Path, query: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(query).fetchall()


def test_every_section_is_present(report: str):
    """The summary and each section are there, each once, and each plotted section has a plot."""
    for key in SECTION_IDS:
        assert report.count(f'id="{key}"') == 1, key
    for key in ("goodput", "badput", "disruptions", "step-deviation", "anomalies", "alerts"):
        assert "<svg" in section(report, key), key
    assert section(report, "goodput").count("<svg") == 2


def test_every_run_is_listed_and_escaped(report: str):
    """Each run id appears in the summary, escaped; the raw id with markup characters never does."""
    summary = section(report, "summary")
    for run_id, _, _ in RUNS:
        assert f'<td class="run">{html.escape(run_id)}</td>' in summary
    assert "run-c<&>" not in report


def test_fleet_goodput_is_the_chip_weighted_figure_of_the_sql(report: str, fleet_database: Path):
    """The fleet goodput printed is productive over elapsed chip-seconds of each run's latest snapshot,
    as SQL on the file (and the saved fleet_goodput_by_day query) computes it."""
    (expected,), = sql(fleet_database, "SELECT 100 * sum(productive_chip_s) / sum(total_chip_s) "
                                        "FROM latest_goodput WHERE window_s = 0 AND total_chip_s > 0")
    printed = re.search(r'id="fleet-goodput">([\d.]+) %<', report)
    assert printed and printed.group(1) == f"{expected:.2f}"
    with duckdb.connect(str(fleet_database), read_only=True) as connection:
        _, rows = run_saved("fleet_goodput_by_day", connection)
    (_, _, _, runs, _, by_day), = rows  # one day, one accelerator type, one group
    assert runs == len(RUNS) + 1 and by_day == pytest.approx(expected, abs=1e-3)
    assert re.search(r'id="run-count">4<', report)


def test_disruptions_are_listed_once_each(report: str, fleet_database: Path):
    """Every disruption of the file is in the table once, with its restart time and recovery."""
    rows = sql(fleet_database, "SELECT DISTINCT run_id, restart_time, recovery_s FROM disruptions")
    assert rows  # each run of RUNS crashes once
    table = section(report, "disruptions").split("<table>")[1]
    for run_id, restart, recovery_s in rows:
        assert table.count(f"<td>{restart:%Y-%m-%d %H:%M:%S}</td>") == 1
        assert f"{recovery_s:.3f}".rstrip("0") in table
        assert html.escape(run_id) in table


def test_anomalies_are_each_anomalys_latest_state(report: str, fleet_database: Path):
    """The anomalies table lists each anomaly of the file once, as the latest_anomalies view has it:
    the simulated slowdown ended, though the replays as of earlier times wrote it open; the hang its
    events end in goes on; a crash is no hang (its disruption explains its silence). The summary
    counts them."""
    latest = sql(fleet_database, "SELECT run_id, kind, started_at, detected_at, ended_at, lost_s "
                                 "FROM latest_anomalies")
    assert sorted((run, kind, ended is None) for run, kind, _, _, ended, _ in latest) == [
        ("run-slow", "hang", True), ("run-slow", "slowdown", False)]
    (open_slowdown_rows,), = sql(fleet_database, "SELECT count(*) FROM run_anomalies "
                                                 "WHERE kind = 'slowdown' AND ended_at IS NULL")
    assert open_slowdown_rows > 0
    table = section(report, "anomalies").split("<tbody>")[1]
    assert table.count("<tr>") == len(latest) and table.count("<td>ongoing</td>") == 1
    for run, kind, started, detected, ended, lost_s in latest:
        row = next(row for row in table.split("<tr>") if f"<td>{started:%Y-%m-%d %H:%M:%S}</td>" in row)
        assert f"<td>{html.escape(run)}</td><td>{kind}</td>" in row
        assert f"<td>{detected:%Y-%m-%d %H:%M:%S}</td>" in row
        assert (f"<td>{ended:%Y-%m-%d %H:%M:%S}</td>" if ended else "<td>ongoing</td>") in row
        if ended:
            assert "<td class=num>" + f"{lost_s:,.3f}".rstrip("0").rstrip(".") + "</td>" in row
        else:  # lost so far, up to the run's latest snapshot: at least what it had lost when found
            so_far = re.search(r'<td class=num data-v="([\d.]+)">≥ [\d,.]+</td>', row)
            assert so_far and float(so_far.group(1)) >= lost_s
    assert re.search(rf'id="anomaly-count">1 / {len(latest)}<', report)


def test_alerts_are_those_the_policies_would_have_fired(report: str, fleet_database: Path):
    """The alerts table lists what pipeline.app.alerts finds in the file (here, disruptions that a later
    snapshot within 10 minutes showed, and each anomaly when it was found)."""
    alerts = evaluate_file(fleet_database)
    assert {alert.policy for alert in alerts} == {"disruption", "anomaly_slowdown", "anomaly_hang"}
    assert re.search(rf'id="alert-count">{len(alerts)}<', report)
    table = section(report, "alerts").split("<table>")[1]
    for alert in alerts:
        assert f"<td>{alert.fired_at:%Y-%m-%d %H:%M:%S}</td>" in table
    assert table.count("<tr>") == len(alerts) + 1


def test_every_saved_query_has_its_table(report: str, fleet_database: Path):
    """Each saved fleet query has an element with its result: as many rows, and its values."""
    queries = section(report, "fleet-queries")
    with duckdb.connect(str(fleet_database), read_only=True) as connection:
        for name in saved_queries("main"):
            columns, rows = run_saved(name, connection)
            block = re.search(rf'<div class="query" id="query-{name}">(.*?)</div>(?=<div class="query"|$)',
                              queries, re.S)
            assert block, name
            assert block.group(1).count("<tr>") == (len(rows) + 1 if rows else 0), name
            for column in columns if rows else ():
                assert f">{html.escape(column)}</th>" in block.group(1)
    _, ranking = run_saved("badput_ranking", duckdb.connect(str(fleet_database), read_only=True))
    assert f"<td>{ranking[0][1]}</td>" in queries


def test_the_simulated_runs_are_compared_as_one_run_group(report: str, fleet_database: Path):
    """The simulated runs share a run group: its table has a column per run, in start order, and
    each metric's last value as model_metrics holds it; its chart has a panel per metric."""
    runs = [run for run, in sql(fleet_database, "SELECT run_id FROM run_metadata GROUP BY run_id "
                                                "ORDER BY min(start_time), run_id")]
    compared = section(report, "run-groups")
    rows = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)
            for row in re.findall(r"<tr>(.*?)</tr>", compared.split("<table>")[1])]
    assert rows[0] == ["", *map(html.escape, runs)]
    last = dict(sql(fleet_database, "SELECT run_id, value FROM model_metrics WHERE name = 'LOSS' "
                                    "QUALIFY row_number() OVER (PARTITION BY run_id "
                                    "ORDER BY step DESC, metric_time DESC) = 1"))
    (loss,) = [row for row in rows if row[0] == "LOSS (last)"]
    assert [float(cell.split(" @ ")[0]) for cell in loss[1:]] == [pytest.approx(last[run], abs=1e-4)
                                                                   for run in runs]
    svg = compared.split("<svg", 1)[1]
    assert all(f">{name}<" in svg for name in ("LOSS", "STEP_TIME"))


def test_the_report_loads_nothing_from_the_network(report: str):
    """No script, stylesheet, image or link points outside the file: its one script is inline."""
    references = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']*)', report)
    assert references and all(reference.startswith("#") for reference in references)
    assert re.findall(r"<script[^>]*>", report) == ["<script>"]
    assert "@import" not in report and "url(http" not in report and "fetch(" not in report


def test_badput_buckets_keep_their_colour_and_none_is_green(report: str, fleet_database: Path,
                                                              tmp_path: Path):
    """Each bucket's swatch is its fixed colour (BUCKET_COLORS) in the fleet's badput legend and on a
    run's page, whatever its rank there; no badput colour is green, the colour of productive time."""
    swatch = r'<span class="swatch" style="background:(#[0-9a-f]{6})"></span>([A-Z_.]+)'
    legend = {name: color for color, name in re.findall(swatch + "</li>", section(report, "badput"))}
    assert {"OTHER", "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", "TPU_INITIALIZATION"} <= set(legend)
    assert legend == {name: bucket_color(name) for name in legend}
    write_run_report(fleet_database, "run-b", tmp_path / "run-b.html")
    run_page = (tmp_path / "run-b.html").read_text()
    run_legend = {name: color for color, name in re.findall(swatch + " ", run_page)}
    assert run_legend and all(legend.get(name, color) == color for name, color in run_legend.items())
    for color in {*BUCKET_COLORS.values(), *legend.values()}:
        hue, _, saturation = colorsys.rgb_to_hls(*(int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)))
        assert not (80 <= hue * 360 <= 170 and saturation > 0.2), color


def test_a_crashed_runs_page_draws_its_attempts_crash_and_recovery(fleet_database: Path, tmp_path: Path):
    """run-a crashed once: two attempt lanes with their init, steps, checkpoints and evals; a crash
    mark at its restart less its recovery, and a recovery span up to the restart the disruptions
    table holds; its goodput over time and its configs and metrics."""
    output = tmp_path / "run-a.html"
    write_run_report(fleet_database, "run-a", output)
    page = output.read_text()
    gantt = page.split('<svg class="gantt"')[1].split("</svg>")[0]
    assert re.findall(r">(attempt \d|disruptions)</text>", gantt) == ["attempt 1", "attempt 2", "disruptions"]
    for kind in ("init", "prep", "data loading", "steps", "checkpoint save", "checkpoint restore", "recovery",
                 "wasted progress"):
        assert f'data-kind="{kind}"' in gantt, kind
    assert gantt.count('class="crash"') == 1
    (restart,), = sql(fleet_database, "SELECT DISTINCT restart_time FROM disruptions WHERE run_id = 'run-a'")
    assert f"recovery to the restart at {restart:%Y-%m-%d %H:%M:%S} UTC" in gantt
    assert '<svg class="goodput-line"' in page and ">LOSS<" not in gantt and "LOSS" in page


def test_a_run_page_of_a_run_the_file_does_not_know_is_an_error(fleet_database: Path, tmp_path: Path):
    """A run id the file has no snapshot or event of raises LookupError, naming runs it has."""
    with pytest.raises(LookupError, match="no run 'nope' in this file; it has run-a"):
        write_run_report(fleet_database, "nope", tmp_path / "nope.html")
    assert not (tmp_path / "nope.html").exists()


def test_tables_sort_in_the_browser(report: str, fleet_database: Path, tmp_path: Path):
    """In chromium a click on a column's heading sorts the table by it (the runs by elapsed time,
    as SQL orders them), and a second click the other way."""
    page_file = tmp_path / "report.html"
    page_file.write_text(report)
    by_elapsed = [run for run, in sql(
        fleet_database, "SELECT run_id FROM goodput_snapshots WHERE window_s = 0 QUALIFY snapshot_time = "
                        "max(snapshot_time) OVER (PARTITION BY run_id) ORDER BY total_time_s DESC")]
    with opened(page_file) as (page, problems):
        runs = page.locator("#top-runs tbody td.run")
        assert runs.all_inner_texts() != by_elapsed
        page.locator("#top-runs thead th", has_text="elapsed").click()
        assert runs.all_inner_texts() == by_elapsed
        page.locator("#top-runs thead th", has_text="elapsed").click()
        assert runs.all_inner_texts() == by_elapsed[::-1]
    assert problems == []


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_report_renders_in_a_headless_browser(report: str, fleet_database: Path, tmp_path: Path):
    """Chromium opens the report from a file: no console or page errors, every section visible
    with its plots drawn, the anomaly figure counting the rows of the anomalies table (and the
    ongoing ones), and a full-page screenshot that is not blank."""
    page_file = tmp_path / "report.html"
    page_file.write_text(report)
    screenshot = tmp_path / "report.png"
    with opened(page_file) as (page, problems):
        for key in SECTION_IDS:
            assert page.locator(f"#{key}").is_visible(), key
        for index in range(page.locator("figure.plot svg").count()):
            box = page.locator("figure.plot svg").nth(index).bounding_box()
            assert box and box["width"] > 600 and box["height"] > 60, (index, box)
        assert page.locator("#fleet-goodput").inner_text().endswith("%")
        assert page.locator("#anomalies figure.plot svg").is_visible()
        assert page.locator("#run-groups figure.plot svg").is_visible()
        ongoing, found = page.locator("#anomaly-count").inner_text().split(" / ")
        cells = page.locator("#anomalies tbody tr td:nth-child(6)").all_inner_texts()
        assert len(cells) == int(found) and cells.count("ongoing") == int(ongoing) > 0
        page.screenshot(path=str(screenshot), full_page=True)
    assert problems == []
    data = screenshot.read_bytes()
    width, height = png_size(data)
    assert width == 1280 and height > 3000
    from PIL import Image

    with Image.open(screenshot) as image:
        colors = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colors is not None and len(colors) > 100


def test_goodput_report_and_replay_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """``goodput replay`` is the batch pipeline and ``goodput report`` writes the report of its file."""
    from pipeline.app.cli import main

    (events,) = simulate(tmp_path, [("run-cli", 60, 3)])
    database, page = tmp_path / "cli.duckdb", tmp_path / "cli.html"
    assert main(["replay", f"--events={events}", f"--duckdb={database}"]) == 0
    assert "run-cli" in capsys.readouterr().out
    assert main(["report", "--duckdb", str(database), "--output", str(page)]) == 0
    assert 'id="fleet-queries"' in page.read_text() and "run-cli" in page.read_text()
    assert main(["report", "--duckdb", str(tmp_path / "missing.duckdb")]) == 2
    assert main(["replay", "--streaming"]) == 2
