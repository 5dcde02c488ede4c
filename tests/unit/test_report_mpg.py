"""The report's ML Productivity Goodput table when runs lack factors, and the lost time of an
anomaly that goes on, in the fleet report and on the run's page."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from pipeline.app.report import write_report
from pipeline.app.run_page import write_run_report
from support.history import anomaly_row, at, goodput_row, section, table_rows, write_rows


def mfu(run_id: str, value: float) -> dict[str, object]:
    return {"run_id": run_id, "attempt_id": f"{run_id}-a", "metric_time": at(300), "step": 300, "name": "MFU",
            "value": value}


@pytest.fixture(scope="module")
def mpg_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three accelerator runs with an MFU and a one-chip CPU run without one, at the highest runtime
    goodput; no run has a scheduling goodput (no GKE metrics)."""
    database = write_rows(tmp_path_factory.mktemp("mpg") / "mpg.duckdb", {
        "goodput_snapshots": [goodput_row("big", 600, goodput_pct=80.0, chip_count=256),
                              goodput_row("mid", 600, goodput_pct=70.0, chip_count=64),
                              goodput_row("small", 600, goodput_pct=90.0, chip_count=8),
                              goodput_row("cpu", 600, goodput_pct=95.0, chip_count=1,
                                          accelerator_type="cpu")],
        "model_metrics": [mfu("big", 0.5), mfu("mid", 0.4), mfu("small", 0.3)]})
    output = database.with_suffix(".html")
    write_report(database, output)
    return section(output.read_text(), "productivity")


def test_a_run_missing_a_factor_others_have_is_ranked_apart_with_its_mpg_a_bound(mpg_page: str):
    """The CPU run, without the program goodput the others have, is not among the comparable runs:
    it is in a table of its own, its program factor "missing" and its MPG "≤" its runtime goodput."""
    assert [row[0] for row in table_rows(mpg_page, "productivity-runs")] == ["big", "mid", "small"]
    assert table_rows(mpg_page, "productivity-missing") == [
        ["cpu", "cpu", "1", "n/a", "95.00 %", "missing", "—", "≤ 95.00 %"]]
    assert "Runs missing a factor" in mpg_page and "an upper bound" in mpg_page


def test_a_factor_no_run_has_is_named_and_left_out_for_all(mpg_page: str):
    """No run has a scheduling goodput: every run shows it as n/a, the note says how to get it, and
    the comparable runs' MPG is runtime × program."""
    assert [row[3] for row in table_rows(mpg_page, "productivity-runs")] == ["n/a"] * 3
    assert [row[7] for row in table_rows(mpg_page, "productivity-runs")] == ["40.00 %", "28.00 %", "27.00 %"]
    assert "No run in this file has a scheduling goodput" in mpg_page
    assert "goodput import gke-metrics" in mpg_page and "MPG here is runtime × program" in mpg_page


def test_missing_cells_sort_last_either_way(mpg_page: str):
    """A missing or n/a factor is a cell the page's sort puts last whichever way (its data-v is none)."""
    assert re.search(r'<td class=num data-v="none">missing</td>', mpg_page)
    assert re.search(r'<td class=num data-v="none">n/a</td>', mpg_page)


@pytest.fixture(scope="module")
def hang_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run "hung": a hang from T0+1000 s found at T0+1060 s (its row: 60 s with no step, lost_s 59)
    that goes on; its latest snapshot is at T0+19000 s. Run "slow": a slowdown that ended, lost 300 s."""
    return write_rows(tmp_path_factory.mktemp("hang") / "hang.duckdb", {
        "goodput_snapshots": [goodput_row("hung", 1060), goodput_row("hung", 19000),
                              goodput_row("slow", 5000)],
        "run_anomalies": [anomaly_row("hung", "hang", 1000, 1060, baseline_step_s=1.0, observed_step_s=60.0,
                                      lost_s=59.0),
                          anomaly_row("slow", "slowdown", 100, 200, ended=900, lost_s=300.0)]})


def test_an_ongoing_hang_has_lost_at_least_the_time_to_the_latest_snapshot(hang_file: Path):
    """The anomalies table shows the ongoing hang's lost time up to its run's latest snapshot as a
    lower bound (≥ 17,999 s), not the 59 s it had lost when found; an ended slowdown's is exact."""
    output = hang_file.with_suffix(".html")
    write_report(hang_file, output)
    anomalies = section(output.read_text(), "anomalies")
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", anomalies)]
    lost = {row[0]: html.unescape(row[-1]) for row in cells if row}
    assert lost == {"hung": "≥ 17,999", "slow": "300"}
    assert 'data-v="17999.000000"' in anomalies


def test_the_run_page_shows_an_ongoing_hangs_lost_time_so_far(hang_file: Path):
    """The run's page says the hang has lost ≥ 5.0 h so far, in its timeline and its table."""
    output = hang_file.with_name("hung.html")
    write_run_report(hang_file, "hung", output)
    page = html.unescape(output.read_text())
    assert "ongoing, lost ≥ 5.0 h so far" in page
    assert re.search(r"<td[^>]*>≥ 17,999</td>", page)
    assert "lost ≥ 59 s" not in page
