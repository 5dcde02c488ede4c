"""The HTML report (pipeline.app.report) of hand-made tables: empty, missing, with nulls, many runs,
a long history."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import duckdb
import pytest

from pipeline.app.report import write_report
from support.history import SECTION_IDS, at, goodput_row, section, write_rows


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
    assert "Panels for the 12 runs with the most chip-hours; 28 more runs" in page
    assert "Bars for the 30 runs with the most chip-hours; 10 more runs" in page
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


