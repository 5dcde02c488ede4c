"""``goodput import capacity``: a CSV of capacity spans read whole and checked before anything is
written, against itself and the spans imported before, into the ``capacity`` table of a DuckDB file."""

from __future__ import annotations

import datetime
import io
import itertools
from pathlib import Path

import duckdb
import pytest

from pipeline.app.capacity import read_spans
from pipeline.app.cli import main

UTC = datetime.timezone.utc
NOV_1, NOV_2 = datetime.datetime(2026, 11, 1, tzinfo=UTC), datetime.datetime(2026, 11, 2, tzinfo=UTC)
IMPORTED = datetime.datetime(2026, 11, 3, tzinfo=UTC)
HEADER = "accelerator_type,location,start_time,end_time,chips\n"


def problems(text: str) -> list[str]:
    return read_spans(HEADER + text, IMPORTED)[1]


def test_a_span_is_a_row_with_utc_times_and_an_empty_location_as_null():
    """Times with a Z, an offset or none are UTC instants; blank lines are skipped."""
    rows, found = read_spans(HEADER + "v5p,us-east5-a,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,512\n\n"
                             " h100 ,,2026-11-01T02:00:00+02:00,2026-11-01 06:00,8\n", IMPORTED)
    assert found == []
    assert rows == [
        {"accelerator_type": "v5p", "location": "us-east5-a", "start_time": NOV_1, "end_time": NOV_2,
         "chips": 512, "imported_at": IMPORTED},
        {"accelerator_type": "h100", "location": None, "start_time": NOV_1,
         "end_time": NOV_1 + datetime.timedelta(hours=6), "chips": 8, "imported_at": IMPORTED}]


@pytest.mark.parametrize(("line", "problem"), [
    (",us,2026-11-01,2026-11-02,8", "line 2: accelerator_type is empty"),
    ("v5p,us,yesterday,2026-11-02,8", "line 2: not an ISO 8601 time: 'yesterday'"),
    ("v5p,us,2026-11-02,2026-11-01,8", "line 2: end_time 2026-11-01 is not after start_time 2026-11-02"),
    ("v5p,us,2026-11-01,2026-11-01,8", "line 2: end_time 2026-11-01 is not after start_time"),
    ("v5p,us,1999-12-31,2026-11-01,8", "line 2: '1999-12-31' is outside the years 2000 to 2200"),
    ("v5p,us,2026-11-01,2026-11-02,8.5", "line 2: chips must be a whole number from 0 to 16777216, got '8.5"),
    ("v5p,us,2026-11-01,2026-11-02,-8", "line 2: chips must be a whole number"),
    ("v5p,us,2026-11-01,2026-11-02,²", "line 2: chips must be a whole number"),
    ("v5p,us,2026-11-01,2026-11-02,8,extra", "line 2: more cells than the header has columns"),
    ("v5p\x07,us,2026-11-01,2026-11-02,8", "line 2: accelerator_type must be printable characters"),
    ("v5p,us,2026-11-01,2026-11-02," + "9" * 5000, "line 2: chips must be a whole number"),
    ('v5p,"' + "u" * 200_000 + '",2026-11-01,2026-11-02,8', "line 2: field larger than field limit"),
])
def test_a_line_that_cannot_be_read_says_why(line: str, problem: str):
    """Each unreadable line is named by its number with its reason."""
    (found,) = problems(line + "\n")
    assert found.startswith(problem)


def test_overlapping_spans_of_one_type_and_location_are_refused():
    """Two spans of one accelerator type and location that overlap would count chips twice; spans
    that only touch, or of another location, do not."""
    found = problems("v5p,us-a,2026-11-01T00:00Z,2026-11-01T12:00Z,8\n"
                     "v5p,us-a,2026-11-01T12:00Z,2026-11-02T00:00Z,8\n"
                     "v5p,us-b,2026-11-01T06:00Z,2026-11-01T18:00Z,8\n"
                     "v5p,us-a,2026-11-01T23:00Z,2026-11-02T01:00Z,8\n")
    assert found == ["line 5: its span overlaps the one of line 3 (v5p in us-a): the same chips would count "
                     "twice"]


def imported(type_: str, location: str | None, start: datetime.datetime,
             end: datetime.datetime) -> tuple[str, dict[str, object]]:
    return "f.duckdb", {"accelerator_type": type_, "location": location, "start_time": start, "end_time": end}


def test_a_span_overlapping_one_imported_before_is_refused_unless_it_is_that_span():
    """A span imported before may be imported again (its chips corrected), and others may touch it
    or be of another type or location; one that overlaps it is named with it."""
    before = [imported("v5p", "us-a", NOV_1, NOV_2), imported("h100", None, NOV_1, NOV_2)]
    found = read_spans(HEADER + "v5p,us-a,2026-11-01,2026-11-02,16\n"
                                "v5p,us-a,2026-11-02,2026-11-03,8\n"
                                "v5p,us-b,2026-11-01T12:00Z,2026-11-02,8\n"
                                "v5e,us-a,2026-11-01T12:00Z,2026-11-02,8\n"
                                "h100,,2026-11-01T23:00Z,2026-11-02T01:00Z,4\n", IMPORTED, before)[1]
    assert found == ["line 6: its span overlaps the one imported to f.duckdb before, from "
                     "2026-11-01T00:00:00Z to 2026-11-02T00:00:00Z (h100 in no location): the same chips "
                     "would count twice; to correct that span, import it with the same start and end"]


def test_spans_that_differ_only_in_case_are_one_span():
    """Accelerator types and locations are lower-cased: the same span in other letters overlaps
    itself, and an import stores the lower-cased names."""
    rows, found = read_spans(HEADER + "v5p,us-east5-a,2026-11-01,2026-11-02,8\n"
                                      "V5P,US-East5-A,2026-11-01,2026-11-02,8\n", IMPORTED)
    assert found == ["line 3: its span overlaps the one of line 2 (v5p in us-east5-a): the same chips "
                     "would count twice"]
    assert {(row["accelerator_type"], row["location"]) for row in rows} == {("v5p", "us-east5-a")}


def test_a_span_imported_before_in_other_letters_is_the_same_span():
    """A span an older version stored as V5P in US-A is the span v5p in us-a: importing that again
    replaces it, and one overlapping it is refused."""
    before = [imported("V5P", "US-A", NOV_1, NOV_2)]
    assert read_spans(HEADER + "v5p,us-a,2026-11-01,2026-11-02,16\n", IMPORTED, before)[1] == []
    (found,) = read_spans(HEADER + "v5p,us-a,2026-11-01T12:00Z,2026-11-03,8\n", IMPORTED, before)[1]
    assert found.startswith("line 2: its span overlaps the one imported to f.duckdb before")


class CountedTime(datetime.datetime):
    """A time that counts the comparisons made with it."""

    comparisons = 0

    def _counted(self, other: object, compare: str) -> bool:
        CountedTime.comparisons += 1
        return bool(getattr(datetime.datetime, compare)(self, other))

    def __lt__(self, other: object) -> bool:
        return self._counted(other, "__lt__")

    def __le__(self, other: object) -> bool:
        return self._counted(other, "__le__")

    def __gt__(self, other: object) -> bool:
        return self._counted(other, "__gt__")

    def __ge__(self, other: object) -> bool:
        return self._counted(other, "__ge__")

    def __eq__(self, other: object) -> bool:
        return self._counted(other, "__eq__")

    __hash__ = datetime.datetime.__hash__


def test_importing_a_file_again_compares_each_span_with_a_few_imported():
    """A file of 2,000 spans imported again is checked against the 2,000 in the table with a few
    dozen comparisons of times per line (the table's spans sorted once), not one per span imported."""
    lines = 2000
    starts = [NOV_1.timestamp() + 3600 * hour for hour in range(lines)]
    before = [imported("v5p", "us-a", CountedTime.fromtimestamp(start, UTC),
                       CountedTime.fromtimestamp(start + 3600, UTC)) for start in starts]
    at = [datetime.datetime.fromtimestamp(start, UTC).isoformat() for start in [*starts, starts[-1] + 3600]]
    text = "".join(f"v5p,us-a,{start},{end},8\n" for start, end in itertools.pairwise(at))
    CountedTime.comparisons = 0
    rows, found = read_spans(HEADER + text, IMPORTED, before)
    assert len(rows) == lines and found == []
    assert CountedTime.comparisons < 50 * lines, CountedTime.comparisons


def test_a_header_without_the_columns_is_refused():
    """The header must name every column."""
    assert read_spans("type,start,end,chips\nv5p,2026-11-01,2026-11-02,8\n", IMPORTED)[1] == [
        "line 1: the header lacks accelerator_type, location, start_time, end_time (it is "
        "accelerator_type,location,start_time,end_time,chips)"]


def capacity_rows(path: Path) -> list[tuple[object, ...]]:
    with duckdb.connect(str(path), read_only=True) as connection:
        return connection.execute("SELECT accelerator_type, location, chips FROM capacity "
                                  "ORDER BY ALL").fetchall()


def test_the_command_appends_every_span_of_a_good_file(tmp_path: Path):
    """A file saved by a spreadsheet (a byte order mark first) is imported whole."""
    csv = tmp_path / "capacity.csv"
    csv.write_text("\ufeff" + HEADER + "v5p,us-a,2026-11-01,2026-11-02,8\nh100,,2026-11-01,2026-11-02,4\n",
                   encoding="utf-8")
    out = io.StringIO()
    assert main(["import", "capacity", "--csv", str(csv), "--duckdb", str(tmp_path / "f.duckdb")], out) == 0
    assert out.getvalue() == f"2 spans (288.0 chip-hours) appended to {tmp_path / 'f.duckdb'}\n"
    assert capacity_rows(tmp_path / "f.duckdb") == [("h100", None, 4), ("v5p", "us-a", 8)]


def test_a_file_with_a_bad_line_imports_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """One bad line refuses the whole file, so a partial import never skews the paid chip-hours."""
    csv = tmp_path / "capacity.csv"
    csv.write_text(HEADER + "v5p,us-a,2026-11-01,2026-11-02,8\nv5p,us-a,2026-11-03,2026-11-02,8\n")
    database = tmp_path / "f.duckdb"
    assert main(["import", "capacity", "--csv", str(csv), "--duckdb", str(database)]) == 1
    assert "line 3: end_time 2026-11-02 is not after start_time 2026-11-03" in capsys.readouterr().err
    assert not database.exists()


def test_an_import_overlapping_a_span_imported_before_writes_nothing(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]):
    """A second file whose span overlaps one the first imported (the same chips counted twice) is
    refused whole: the table keeps only the first file's spans."""
    database = tmp_path / "f.duckdb"
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    first.write_text(HEADER + "v5p,us-a,2026-11-01,2026-11-03,8\n")
    second.write_text(HEADER + "h100,us-a,2026-11-01,2026-11-02,4\nv5p,us-a,2026-11-02,2026-11-04,8\n")
    assert main(["import", "capacity", "--csv", str(first), "--duckdb", str(database)]) == 0
    capsys.readouterr()
    assert main(["import", "capacity", "--csv", str(second), "--duckdb", str(database)]) == 1
    err = capsys.readouterr().err
    assert (f"line 3: its span overlaps the one imported to {database} before, from 2026-11-01T00:00:00Z to "
            "2026-11-03T00:00:00Z (v5p in us-a): the same chips would count twice") in err
    assert err.endswith("nothing was imported: fix the file and import it again\n")
    assert capacity_rows(database) == [("v5p", "us-a", 8)]


def test_a_span_imported_again_or_extended_after_its_end_is_imported(tmp_path: Path):
    """The same span again (its chips corrected) and the time after its end are not overlaps."""
    database = tmp_path / "f.duckdb"
    csv = tmp_path / "capacity.csv"
    for text in ("v5p,us-a,2026-11-01,2026-11-03,8\n", "v5p,us-a,2026-11-01,2026-11-03,16\n",
                 "v5p,us-a,2026-11-03,2026-11-05,16\n"):
        csv.write_text(HEADER + text)
        assert main(["import", "capacity", "--csv", str(csv), "--duckdb", str(database)], io.StringIO()) == 0
    assert capacity_rows(database) == [("v5p", "us-a", 8), ("v5p", "us-a", 16), ("v5p", "us-a", 16)]


def test_capacity_imported_again_in_other_letters_counts_once(tmp_path: Path):
    """A span imported as v5p, then again as V5P with its chips corrected, is one span of capacity_goodput,
    with the corrected chips."""
    from pipeline.app.fleet_sql import run_saved

    database = tmp_path / "f.duckdb"
    csv = tmp_path / "capacity.csv"
    for text in ("v5p,us-a,2026-11-01,2026-11-02,8\n", "V5P,US-A,2026-11-01,2026-11-02,16\n"):
        csv.write_text(HEADER + text)
        assert main(["import", "capacity", "--csv", str(csv), "--duckdb", str(database)], io.StringIO()) == 0
    with duckdb.connect(str(database), read_only=True) as connection:
        columns, found = run_saved("capacity_goodput", connection)
    (row,) = (dict(zip(columns, values, strict=True)) for values in found)
    assert (row["accelerator_type"], row["paid_chip_hours"]) == ("v5p", 16 * 24.0)


def test_runs_that_spell_their_type_in_capitals_use_the_capacity(tmp_path: Path):
    """capacity_goodput lower-cases the runs' accelerator types as the import does the spans': a
    run of V5P uses the chips of v5p."""
    from pipeline.app.fleet_sql import run_saved
    from pipeline.sinks.duckdb import DuckDBSink

    database = tmp_path / "f.duckdb"
    sink = DuckDBSink(database)
    sink.write("goodput_snapshots", [{
        "run_id": "r", "snapshot_time": NOV_2, "window_s": 0, "window_start": NOV_1, "window_end": NOV_2,
        "goodput_pct": 50.0, "productive_time_s": 43200.0, "total_time_s": 86400.0, "disruptions": 0,
        "max_productive_step": 0, "chip_count": 4, "productive_chip_s": 0.0, "total_chip_s": 0.0,
        "accelerator_type": "V5P", "ended": False}])
    sink.close()
    csv = tmp_path / "capacity.csv"
    csv.write_text(HEADER + "v5p,us-a,2026-11-01,2026-11-02,8\n")
    assert main(["import", "capacity", "--csv", str(csv), "--duckdb", str(database)], io.StringIO()) == 0
    with duckdb.connect(str(database), read_only=True) as connection:
        columns, found = run_saved("capacity_goodput", connection)
    (row,) = (dict(zip(columns, values, strict=True)) for values in found)
    assert (row["accelerator_type"], row["paid_chip_hours"], row["used_chip_hours"]) == ("v5p", 192.0, 96.0)


@pytest.mark.parametrize(("arguments", "problem"), [
    (["--csv", "{csv}"], "no output: give --duckdb=FILE or --bigquery_dataset=PROJECT:DATASET"),
    (["--csv", "{missing}", "--duckdb", "{db}"], "no such file: --csv="),
    (["--csv", "{csv}", "--duckdb", "{db}", "--bigquery_endpoint", "http://x"],
     "--bigquery_endpoint needs --bigquery_dataset"),
    (["--csv", "{csv}", "--bigquery_dataset", "nodataset"], "--bigquery_dataset: 'nodataset' is not"),
    (["--csv", "{csv}", "--duckdb", "{csv}"], "--duckdb="),
])
def test_a_usage_mistake_is_one_line_and_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                arguments: list[str], problem: str):
    """A command line that does not hold together is refused before anything is read or written."""
    csv = tmp_path / "capacity.csv"
    csv.write_text(HEADER + "v5p,us-a,2026-11-01,2026-11-02,8\n")
    paths = {"csv": csv, "missing": tmp_path / "missing.csv", "db": tmp_path / "f.duckdb"}
    assert main(["import", "capacity", *(argument.format(**paths) for argument in arguments)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("goodput import capacity: ") and problem in line
    assert not (tmp_path / "f.duckdb").exists()
