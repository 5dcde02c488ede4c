"""The HTML report (pipeline.app.report) of hand-made tables: empty, missing, with nulls, many runs,
a long history, anomalies."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import duckdb
import pytest

from pipeline.app.report import (
    MAX_GROUP_RUNS,
    MAX_GROUPS,
    MAX_TABLE_ROWS,
    MAX_TIMELINE_ROWS,
    _anomaly_end,
    _Fleet,
    fleet_trend,
    write_report,
)
from pipeline.app.run_page import MAX_ATTEMPT_LANES, write_run_report
from support.history import SECTION_IDS, anomaly_row, at, goodput_row, section, write_rows


def test_an_empty_file_gives_every_section_with_a_note(tmp_path: Path):
    """A file with the tables but no rows, or with no tables at all, still gives the whole page."""
    empty = write_rows(tmp_path / "empty.duckdb", {})
    bare = tmp_path / "bare.duckdb"
    duckdb.connect(str(bare)).close()
    for database in (empty, bare):
        output = tmp_path / f"{database.stem}.html"
        write_report(database, output)
        page = output.read_text()
        for key in SECTION_IDS:
            assert f'id="{key}"' in page, key
        assert "No goodput snapshots in this file." in page
        assert "No alert would have fired" in page
        assert re.search(r'id="run-count">0<', page)
    assert "Could not run on this file" in (tmp_path / "bare.html").read_text()
    assert "No anomalies found." in (tmp_path / "empty.html").read_text()
    assert "No anomaly data in this file" in (tmp_path / "bare.html").read_text()
    assert "No configs or metrics in this file" in (tmp_path / "bare.html").read_text()
    assert "No run group has several runs." in (tmp_path / "empty.html").read_text()


def test_a_missing_file_is_an_error(tmp_path: Path):
    """A path with no file raises rather than writing an empty report."""
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "missing.duckdb", tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()


def test_nulls_unknown_chips_and_no_rolling_windows(tmp_path: Path):
    """A run with only cumulative rows, NULL goodput and deviation, and no chip count: the fleet
    figure is time-weighted and the page says what is missing."""
    rows = [goodput_row("lonely", 60 * i, goodput_pct=50.0, chip_count=0, step_time_deviation_s=None,
                        last_step=None, ideal_step_time_s=None, run_group=None, accelerator_type=None)
            for i in range(1, 4)]
    rows.append(goodput_row("lonely-too", 120, goodput_pct=None, total_time_s=0.0, chip_count=0,
                            step_time_deviation_s=None))
    database = write_rows(tmp_path / "nulls.duckdb", {"goodput_snapshots": rows})
    output = tmp_path / "nulls.html"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_report(database, output)
    page = output.read_text()
    assert re.search(r'id="fleet-goodput">50.00 %<', page) and "time-weighted (no chip counts)" in page
    assert "no rolling windows" in page
    assert "No step-time deviation in this file" in page
    assert "No disruptions recorded." in page


def test_many_runs_keep_legends_and_panels_bounded(tmp_path: Path):
    """Forty runs: ten named in each legend, the rest grouped; twelve panels; every run in the summary."""
    rows = [goodput_row(f"run-{n:02d}", t, window_s=window, goodput_pct=40.0 + n, chip_count=n + 1,
                        step_time_deviation_s=0.01 * n)
            for n in range(40) for t in (600, 1200, 1800) for window in (0, 60, 300)]
    badput = [{"run_id": f"run-{n:02d}", "snapshot_time": at(1800), "window_s": 0, "badput_source": source,
               "seconds": 100.0 + n, "pct": 5.0} for n in range(40) for source in ("TRAINING_PREP", "OTHER")]
    database = write_rows(tmp_path / "many.duckdb", {"goodput_snapshots": rows, "badput_snapshots": badput})
    output = tmp_path / "many.html"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_report(database, output)
    page = output.read_text()
    assert section(page, "goodput").count("30 other runs") == 1
    assert section(page, "step-deviation").count("30 other runs") == 1
    assert "Panels for the 12 runs losing the most chip-hours, and 28 more runs losing" in page
    assert "Bars for the 30 runs losing the most chip-hours, and 10 more runs losing" in page
    assert all(f'<td class="run">run-{n:02d}</td>' in page for n in range(40))
    assert output.stat().st_size < 3_000_000


def test_a_long_history_is_thinned(tmp_path: Path):
    """Days of snapshots every 30 s draw at most MAX_POINTS points a series: the page stays light."""
    rows = [goodput_row("long", 30 * i, window_s=window, goodput_pct=50.0 + i % 40)
            for i in range(1, 8001) for window in (0, 60)]
    database = write_rows(tmp_path / "long.duckdb", {"goodput_snapshots": rows})
    output = tmp_path / "long.html"
    write_report(database, output)
    assert output.stat().st_size < 1_000_000
    assert "2026-11-04 02:40:00" in section(output.read_text(), "summary")  # the last snapshot


def test_a_file_from_before_anomalies_were_detected_gives_the_report(tmp_path: Path):
    """A file with snapshots but no run_anomalies table (nor its view): the section says there is no
    anomaly data, the summary figure is a dash, and the rest of the report is drawn."""
    database = write_rows(tmp_path / "old.duckdb", {"goodput_snapshots": [goodput_row("old", 600)]})
    with duckdb.connect(str(database)) as connection:
        connection.execute("DROP VIEW latest_anomalies")
        connection.execute("DROP TABLE run_anomalies")
    output = tmp_path / "old.html"
    write_report(database, output)
    page = output.read_text()
    assert "No anomaly data in this file" in section(page, "anomalies")
    assert re.search(r'id="anomaly-count">—<', page)
    assert "<svg" in section(page, "goodput") and "<td class=\"run\">old</td>" in page


#: Two runs' anomalies as the pipeline appends them: a row when each is found, another when it ends.
ANOMALIES = [
    anomaly_row("run-a", "slowdown", 100, 160),
    anomaly_row("run-a", "slowdown", 100, 160, ended=400, changed=430, observed_step_s=1.4, lost_s=120.0),
    anomaly_row("run-a", "hang", 540, 600, lost_s=59.0),
    anomaly_row("run-b", "straggler", 200, 260, host="host-7"),
    anomaly_row("run-b", "straggler", 200, 260, ended=500, host="host-7", lost_s=75.0),
    anomaly_row("run-b", "straggler", 650, 700, host="host-<3>", lost_s=25.0),
]


@pytest.fixture(scope="module")
def anomalies_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The report of two runs with the anomalies of ANOMALIES, snapshots up to T0 + 900 s."""
    rows = [goodput_row(run, seconds) for run in ("run-a", "run-b") for seconds in (300, 600, 900)]
    database = write_rows(tmp_path_factory.mktemp("anomalies") / "anomalies.duckdb",
                          {"goodput_snapshots": rows, "run_anomalies": ANOMALIES})
    output = database.with_suffix(".html")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_report(database, output)
    return output.read_text()


def test_the_anomaly_figure_counts_ongoing_over_all(anomalies_page: str):
    """The summary figure is the anomalies still going on over all of them, each counted once."""
    assert re.search(r'id="anomaly-count">2 / 4<', anomalies_page)


def test_the_anomaly_table_lists_each_anomalys_latest_state_ongoing_first(anomalies_page: str):
    """One row per anomaly, in its latest state: the ongoing ones first, then by time lost."""
    table = section(anomalies_page, "anomalies").split("<tbody>")[1]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]
    assert [[*cells[:3], cells[5]] for cells in rows] == [
        ["run-a", "hang", "—", "ongoing"],
        ["run-b", "straggler", "host-&lt;3&gt;", "ongoing"],
        ["run-a", "slowdown", "—", f"{at(400):%Y-%m-%d %H:%M:%S}"],
        ["run-b", "straggler", "host-7", f"{at(500):%Y-%m-%d %H:%M:%S}"],
    ]
    assert rows[2][6:] == ["1", "1.4", "120"]  # baseline and observed step time, lost time


def test_the_anomaly_timeline_has_each_kind_the_detections_and_the_stragglers_hosts(anomalies_page: str):
    """The timeline's legend names each kind found, the detection mark and the ongoing mark; each
    straggler is labelled with its host, escaped."""
    svg = section(anomalies_page, "anomalies").split("<svg", 1)[1].split("</svg>")[0]
    for text in ("slowdown", "hang", "straggler", "detected", "ongoing (to the run's latest snapshot)",
                 "host-7", "host-&lt;3&gt;", "run-a", "run-b"):
        assert f">{text}<" in svg, text


def test_an_anomaly_span_ends_at_its_end_or_at_its_runs_latest_snapshot():
    """An ended anomaly spans to its end; an ongoing one to its run's latest snapshot, or to when it
    was found if its run has no later snapshot."""
    ended = anomaly_row("r", "slowdown", 10, 20, ended=50, changed=60)
    ongoing = anomaly_row("r", "hang", 70, 130)
    latest = {"r": goodput_row("r", 300)}
    assert _anomaly_end(ended, latest) == at(50)
    assert _anomaly_end(ongoing, latest) == at(300)
    assert _anomaly_end(ongoing, {"r": goodput_row("r", 100)}) == at(130)
    assert _anomaly_end(ongoing, {}) == at(130)


def test_many_anomalies_keep_the_timeline_and_table_bounded(tmp_path: Path):
    """Fifty runs with five anomalies each: MAX_TIMELINE_ROWS timeline rows and MAX_TABLE_ROWS table
    rows, the rest counted."""
    anomalies = [anomaly_row(f"run-{n:02d}", "slowdown", 100 * i, 100 * i + 30, ended=100 * i + 60)
                 for n in range(50) for i in range(5)]
    database = write_rows(tmp_path / "many.duckdb", {"run_anomalies": anomalies})
    output = tmp_path / "many.html"
    write_report(database, output)
    anomalies_section = section(output.read_text(), "anomalies")
    assert (f"Rows for the {MAX_TIMELINE_ROWS} runs with anomalies losing the most chip-hours, and "
            f"{50 - MAX_TIMELINE_ROWS} more runs losing") in anomalies_section
    assert f"{250 - MAX_TABLE_ROWS} more rows not shown, of " in anomalies_section
    svg = anomalies_section.split("</svg>")[0]
    assert sum(f">run-{n:02d}<" in svg for n in range(50)) == MAX_TIMELINE_ROWS
    assert anomalies_section.count("<tr>") == MAX_TABLE_ROWS + 1


def metadata_row(run_id: str, started: float, group: str | None = "llama") -> dict[str, object]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-a", "start_time": at(started), "run_group": group}


def config_row(run_id: str, key: str, value: str, source: str = "user") -> dict[str, object]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-a", "recorded_at": at(0), "source": source, "key": key,
            "value": value}


def metric_row(run_id: str, step: int | None, name: str, value: float,
               seconds: float = 0) -> dict[str, object]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-a", "metric_time": at(seconds or step or 0),
            "step": step, "name": name, "value": value}


@pytest.fixture(scope="module")
def groups_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Group "llama": run-1 and run-2 (learning rates 0.01 and 0.02, one seed), LOSS over 300 steps
    (run-2's last one NaN), a LATENCY by time; group "solo": one run."""
    runs = {"run-1": 0.01, "run-2": 0.02}
    database = write_rows(tmp_path_factory.mktemp("groups") / "groups.duckdb", {
        "goodput_snapshots": [goodput_row(run, 600, goodput_pct=pct) for run, pct in
                              (("run-1", 80.0), ("run-2", 90.0), ("alone", 50.0))],
        "run_metadata": [metadata_row("run-1", 0), metadata_row("run-2", 60),
                         metadata_row("alone", 0, "solo")],
        "run_configs": [config_row(run, key, value) for run, lr in runs.items()
                        for key, value in (("lr", str(lr)), ("seed", "1"))]
                       + [config_row("run-1", "jax", "0.4", "software"), config_row("alone", "lr", "9")],
        "model_metrics": [metric_row(run, step, "LOSS", math.nan if (run, step) == ("run-2", 299)
                                     else 3 / (1 + step)) for run in runs for step in range(300)]
                         + [metric_row("run-1", None, "LATENCY", 0.25, seconds=500)],
    })
    output = database.with_suffix(".html")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_report(database, output)
    return output.read_text()


def test_a_run_group_of_several_runs_is_compared_side_by_side(groups_page: str):
    """The group's runs are columns: goodput, the config that differs (not the one that does not,
    nor a software one), and each metric's last value with its step; a group of one run is not shown."""
    compared = section(groups_page, "run-groups")
    assert 'id="group-llama"' in compared and 'id="group-solo"' not in compared
    table = compared.split("<table>")[1].split("</table>")[0]
    rows = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]
    assert rows == [["", "run-1", "run-2"], ["goodput % (cumulative)", "80", "90"],
                    ["config lr", "0.01", "0.02"], ["LATENCY (last)", "0.25", "—"],
                    ["LOSS (last)", "0.01 @ step 299", "NaN @ step 299"]]


def test_each_metric_of_a_group_is_drawn_over_steps(groups_page: str):
    """One chart for the group: a panel for LOSS (recorded by step; LATENCY is not), a line per run,
    thinned to MAX_POINTS points at most."""
    svg = section(groups_page, "run-groups").split("<svg", 1)[1].split("</svg>")[0]
    for text in ("LOSS", "run-1", "run-2", "step"):
        assert f">{text}<" in svg, text
    assert ">LATENCY<" not in svg


def test_a_file_from_before_configs_and_metrics_gives_the_report(tmp_path: Path):
    """A file without run_configs and model_metrics tables: the section says there is no such data,
    and the rest of the report is drawn."""
    database = write_rows(tmp_path / "old.duckdb", {"goodput_snapshots": [goodput_row("old", 600)],
                                                    "run_metadata": [metadata_row("old", 0)]})
    with duckdb.connect(str(database)) as connection:
        connection.execute("DROP TABLE run_configs")
        connection.execute("DROP TABLE model_metrics")
    output = tmp_path / "old.html"
    write_report(database, output)
    page = output.read_text()
    assert "No configs or metrics in this file" in section(page, "run-groups")
    assert "<svg" in section(page, "goodput") and "<td class=\"run\">old</td>" in page


def test_a_large_group_shows_its_latest_runs(tmp_path: Path):
    """A group of twelve runs shows its latest MAX_GROUP_RUNS, in start order, and counts the others."""
    runs = [f"run-{n:02d}" for n in range(12)]
    database = write_rows(tmp_path / "large.duckdb", {
        "run_metadata": [metadata_row(run, 60 * n) for n, run in enumerate(runs)],
        "model_metrics": [metric_row(run, step, "LOSS", 1.0) for run in runs for step in range(3)]})
    output = tmp_path / "large.html"
    write_report(database, output)
    compared = section(output.read_text(), "run-groups")
    header = re.findall(r"<th[^>]*>(.*?)</th>", re.findall(r"<tr>(.*?)</tr>", compared)[0])
    assert header == ["", *runs[-MAX_GROUP_RUNS:]]
    assert f"{12 - MAX_GROUP_RUNS} earlier runs are not shown" in compared


def test_a_file_from_before_productivity_and_capacity_gives_the_report(tmp_path: Path):
    """A file without the tables MPG and capacity are computed from: the productivity section says
    so, and the rest of the report is drawn."""
    database = write_rows(tmp_path / "old.duckdb", {"goodput_snapshots": [goodput_row("old", 600)]})
    with duckdb.connect(str(database)) as connection:
        for table in ("accelerator_peaks", "jobset_metrics", "capacity"):
            connection.execute(f"DROP TABLE {table}")
    output = tmp_path / "old.html"
    write_report(database, output)
    page = output.read_text()
    assert "No productivity data in this file" in section(page, "productivity")
    assert "<svg" in section(page, "goodput") and "<td class=\"run\">old</td>" in page


def test_a_file_without_capacity_gives_the_runs_productivity_and_says_how_to_import_it(tmp_path: Path):
    """With no capacity imported, the runs' MPG is shown (its runtime factor at least) and the
    capacity part says how to import one; with no capacity table, that there is none."""
    database = write_rows(tmp_path / "runs.duckdb", {"goodput_snapshots": [goodput_row("alone", 600)]})
    output = tmp_path / "runs.html"
    write_report(database, output)
    productivity = section(output.read_text(), "productivity")
    assert re.search(r"<td>alone</td>.*?<td class=num>90\.00 %</td></tr>", productivity)
    assert "No capacity imported: goodput import capacity --csv FILE" in productivity
    with duckdb.connect(str(database)) as connection:
        connection.execute("DROP TABLE capacity")
    write_report(database, output)
    assert "No capacity table in this file" in section(output.read_text(), "productivity")


def test_the_fleet_trend_is_chip_weighted_by_group_and_accelerator():
    """At each snapshot time, the fleet's goodput is the productive over elapsed chip-seconds of each
    run's latest cumulative row by then, and so is each run group's and accelerator type's: a
    100-chip run at 50 % outweighs a 1-chip run at 10 %."""
    rows = [goodput_row("big", 600, goodput_pct=50.0, chip_count=100, run_group="g1"),
            goodput_row("small", 900, goodput_pct=10.0, chip_count=1, run_group="g2",
                        accelerator_type="h100"),
            goodput_row("big", 1200, goodput_pct=90.0, chip_count=100, run_group="g1")]
    fleet = _Fleet(goodput=rows, badput=[], disruptions=[], anomalies=None, queries=[], alerts=[])
    times, series, chip_weighted = fleet_trend(fleet)
    assert chip_weighted and times == [at(600), at(900), at(1200)]
    assert series[""] == pytest.approx([50.0, 100 * 30_090 / 60_900, 100 * 108_090 / 120_900])
    assert series["group:g1"] == pytest.approx([50.0, 50.0, 90.0])
    assert series["group:g2"][0] is None and series["group:g2"][1:] == pytest.approx([10.0, 10.0])
    assert series["accelerator:v5p"] == series["group:g1"]
    assert series["accelerator:h100"] == series["group:g2"]


def test_run_groups_beyond_the_limit_are_the_cheapest_and_counted(tmp_path: Path):
    """Of MAX_GROUPS + 2 run groups of two runs each, the comparison shows those whose runs lose
    the most chip-hours, and says what the other two groups' runs lose."""
    groups = [f"group-{n:02d}" for n in range(MAX_GROUPS + 2)]
    runs = {group: [f"{group}-a", f"{group}-b"] for group in groups}
    database = write_rows(tmp_path / "groups.duckdb", {
        "goodput_snapshots": [goodput_row(run, 600, goodput_pct=50.0, chip_count=n + 1, run_group=group)
                              for n, group in enumerate(groups) for run in runs[group]],
        "run_metadata": [metadata_row(run, 0, group) for group in groups for run in runs[group]],
        "model_metrics": [metric_row(run, 1, "LOSS", 1.0) for group in groups for run in runs[group]]})
    output = tmp_path / "groups.html"
    write_report(database, output)
    compared = section(output.read_text(), "run-groups")
    shown = re.findall(r'<div class="group" id="group-(group-\d+)">', compared)
    assert shown == groups[::-1][:MAX_GROUPS]
    lost = 2 * 300 * (1 + 2) / 3600  # the two cheapest groups' four runs: 300 s lost on 1 or 2 chips each
    assert f"the others' 4 runs, losing {lost:.1f} chip-hours" in compared


def event_row(run_id: str, attempt: str, seq: int, seconds: float, kind: str, step: int | None = None,
              body: str | None = None) -> dict[str, object]:
    return {"run_id": run_id, "attempt_id": attempt, "seq": seq, "event_time": at(seconds), "kind": kind,
            "step": step, "body": body}


def test_a_run_of_many_restarts_draws_its_latest_attempts(tmp_path: Path):
    """A run of MAX_ATTEMPT_LANES + 5 attempts: its page has a lane for each of the latest
    MAX_ATTEMPT_LANES, numbered as they are, and one saying how many earlier ones are not drawn."""
    attempts = MAX_ATTEMPT_LANES + 5
    events = [row for n in range(attempts) for row in (
        event_row("restarts", f"a{n:03d}", 0, 100 * n, "job_start", body='{"chip_count": 8}'),
        *(event_row("restarts", f"a{n:03d}", 1 + step, 100 * n + 10 + step, "step_start", step=step)
          for step in range(20)))]
    database = write_rows(tmp_path / "restarts.duckdb", {
        "goodput_snapshots": [goodput_row("restarts", 100 * attempts)], "events": events})
    output = tmp_path / "restarts.html"
    write_run_report(database, "restarts", output)
    gantt = output.read_text().split('<svg class="gantt"')[1].split("</svg>")[0]
    lanes = re.findall(r'<g class="lane">.*?>([^<]+)</text></g>', gantt)
    assert lanes == ["5 earlier attempts", *(f"attempt {n}" for n in range(6, attempts + 1))]
    assert gantt.count('data-kind="steps"') == MAX_ATTEMPT_LANES


def test_a_run_page_without_raw_events_says_so(tmp_path: Path):
    """A run whose file keeps no raw events (a replay with --no_raw_events) still has its page: its
    figures and goodput over time, and a note where the timeline would be."""
    database = write_rows(tmp_path / "bare.duckdb", {"goodput_snapshots": [goodput_row("bare", 600)]})
    output = tmp_path / "bare.html"
    write_run_report(database, "bare", output)
    page = output.read_text()
    assert "No raw events of this run" in page and '<svg class="goodput-line"' in page
    assert "<dt>lost</dt><dd>0.1 chip-hours ($1)</dd>" in page  # 60 s of 600 on 8 v5p chips at $4.20
