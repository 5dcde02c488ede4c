"""``goodput import capacity``: the accelerator capacity paid for, from a CSV file, as rows of the
``capacity`` table, so that fleet SQL can set the runs' chip-seconds against it.

A reservation (or a node pool's allocatable chips) is paid for whether or not a job runs on it:
it can be nearly all allocated while its chips are seldom busy, and no per-run figure shows what
no run used. The ``capacity_goodput`` saved query divides, per day and
accelerator type, the runs' productive chip-seconds by the chip-seconds paid for, and says what
share of them no run used. The CSV, one span per line (a header line first; times in ISO 8601,
UTC unless they say otherwise; location may be empty)::

    accelerator_type,location,start_time,end_time,chips
    v5p,us-east5-a,2026-11-01T00:00:00Z,2026-12-01T00:00:00Z,512

    goodput import capacity --csv capacity.csv --duckdb goodput.duckdb
    goodput import capacity --csv capacity.csv --bigquery_dataset P:goodput
    goodput query capacity_goodput --duckdb goodput.duckdb

The file is checked whole before anything is written: a line that cannot be read, a span that
ends before it starts, or two spans of one accelerator type and location that overlap (they would
count the same chips twice) refuse the import, each line with its reason. Importing a file again
appends its spans again; the saved query counts each span (accelerator type, location, start and
end) once, as last imported, so a corrected chip count replaces the old one. A span that overlaps
one already in the table (of the DuckDB file, of the BigQuery dataset) without being the same span
would count the same chips twice as well, and refuses the import the same way: to correct a span's
chips, import it again with the same start and end; to extend it, import the time after its end.
Accelerator types and locations are stored lower-cased and compared so, here and in the saved
query (``V5P`` is ``v5p``).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import datetime
import io
import itertools
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from goodput_schemas.limits import MAX_CHIP_COUNT, shown, text_problem
from pipeline.app.checks import OneLineParser, UsageError
from pipeline.app.outputs import add_output_options, check_outputs, parse_time, write_rows
from pipeline.core.rows import Row

#: The table the spans go to.
CAPACITY = "capacity"
#: The CSV's columns; ``location`` may be left empty.
COLUMNS = ("accelerator_type", "location", "start_time", "end_time", "chips")
#: Problems listed when a file is refused; the rest are counted.
MAX_PROBLEMS_SHOWN = 20
#: What makes a span the same span: an import of it again replaces it.
SPAN_KEY = ("accelerator_type", "location", "start_time", "end_time")
#: The spans already in the table, each once (a BigQuery query, or DuckDB's).
_IMPORTED_SQL = "SELECT DISTINCT accelerator_type, location, start_time, end_time FROM capacity"


def read_spans(text: str, imported_at: datetime.datetime,
               imported: Iterable[tuple[str, Row]] = ()) -> tuple[list[Row], list[str]]:
    """The ``capacity`` rows of a CSV file's text, and what is wrong with it, one line each
    (nothing is to be imported unless that list is empty). ``imported`` holds the spans already in
    the table, each with where it is (a file or dataset): a span of the file may be one of them
    again, but may not overlap one."""
    reader = csv.DictReader(io.StringIO(text))
    try:
        header = reader.fieldnames or ()
    except csv.Error as error:
        return [], [f"line 1: {error}"]
    missing = [column for column in COLUMNS if column not in header]
    if missing:
        return [], [f"line 1: the header lacks {', '.join(missing)} (it is {','.join(COLUMNS)})"]
    rows: list[Row] = []
    problems: list[str] = []
    lines: list[int] = []
    while True:
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error as error:  # e.g. a cell past the csv module's field size limit
            problems.append(f"line {reader.reader.line_num}: {error}")
            continue
        line = reader.line_num
        row, problem = _span(record, imported_at)
        if problem is not None:
            problems.append(f"line {line}: {problem}")
        elif row is not None:
            rows.append(row)
            lines.append(line)
    problems += _overlaps(rows, lines) + _overlaps_imported(rows, lines, imported)
    return rows, problems


def _span(record: dict[str, str | None], imported_at: datetime.datetime) -> tuple[Row | None, str | None]:
    """One CSV record as a row, or why it is not one (a record of empty cells is neither)."""
    cells = {column: (record.get(column) or "").strip() for column in COLUMNS}
    if None in record:
        return None, "more cells than the header has columns"
    if not any(cells.values()):
        return None, None
    if not cells["accelerator_type"]:
        return None, "accelerator_type is empty"
    for column in ("accelerator_type", "location"):
        problem = text_problem(column, cells[column])
        if problem is not None:
            return None, problem
    try:
        start, end = parse_time(cells["start_time"]), parse_time(cells["end_time"])
    except ValueError as error:
        return None, str(error)
    if end <= start:
        return None, f"end_time {cells['end_time']} is not after start_time {cells['start_time']}"
    digits = cells["chips"].lstrip("0") or "0"  # so that no count is too long to convert
    if not (digits.isascii() and digits.isdigit()) or len(digits) > len(str(MAX_CHIP_COUNT)) \
            or int(digits) > MAX_CHIP_COUNT:
        return None, f"chips must be a whole number from 0 to {MAX_CHIP_COUNT}, got {shown(cells['chips'])}"
    return {"accelerator_type": cells["accelerator_type"].lower(),
            "location": cells["location"].lower() or None, "start_time": start, "end_time": end,
            "chips": int(digits), "imported_at": imported_at}, None


def span_key(row: Row) -> tuple[str, str]:
    """What a span's chips count under: its accelerator type and location, lower-cased (as SQL's
    LOWER does), so that ``V5P`` and ``v5p`` are one type; an import stores them so, and a span
    an older version stored otherwise is keyed so when it is read back."""
    return row["accelerator_type"].lower(), (row["location"] or "").lower()


def _overlaps(rows: Sequence[Row], lines: Sequence[int]) -> list[str]:
    """Each span that overlaps the one before it of its accelerator type and location."""
    problems = []
    order = sorted(range(len(rows)), key=lambda i: (span_key(rows[i]), rows[i]["start_time"]))
    for before, after in itertools.pairwise(order):
        first, second = rows[before], rows[after]
        if span_key(first) == span_key(second) and second["start_time"] < first["end_time"]:
            problems.append(f"line {lines[after]}: its span overlaps the one of line {lines[before]} "
                            f"({first['accelerator_type']} in {first['location'] or 'no location'}): "
                            "the same chips would count twice")
    return problems


def _overlaps_imported(rows: Sequence[Row], lines: Sequence[int],
                       imported: Iterable[tuple[str, Row]]) -> list[str]:
    """Each span of the file that overlaps one already imported of its accelerator type and location,
    other than itself (an import of the same span again replaces it).

    The spans imported of each type and location are sorted by start, each with the latest end
    among those up to it: a span of the file is set only against those that start before it ends,
    from the last back while one of them may still end after it starts. The table's spans do not
    overlap (imports refuse that), so that is about one per span of the file, not every one
    imported: re-importing a file costs time in proportion to its lines and the table's."""
    spans: dict[tuple[str, str], list[tuple[str, Row]]] = {}
    for where, span in imported:
        spans.setdefault(span_key(span), []).append((where, span))
    starts: dict[tuple[str, str], list[datetime.datetime]] = {}
    reaches: dict[tuple[str, str], list[datetime.datetime]] = {}
    for key, found in spans.items():
        found.sort(key=lambda item: item[1]["start_time"])
        starts[key] = [span["start_time"] for _, span in found]
        reaches[key] = list(itertools.accumulate((span["end_time"] for _, span in found), max))
    problems = []
    for row, line in zip(rows, lines, strict=True):
        key = span_key(row)
        if key not in spans:
            continue
        index = bisect.bisect_left(starts[key], row["end_time"])
        while index > 0 and reaches[key][index - 1] > row["start_time"]:
            index -= 1
            where, span = spans[key][index]
            same = row["start_time"] == span["start_time"] and row["end_time"] == span["end_time"]
            if not same and span["end_time"] > row["start_time"]:
                problems.append(
                    f"line {line}: its span overlaps the one imported to {where} before, from "
                    f"{_time(span['start_time'])} to {_time(span['end_time'])} ({row['accelerator_type']} "
                    f"in {row['location'] or 'no location'}): the same chips would count twice; to "
                    "correct that span, import it with the same start and end")
    return problems


def _time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def imported_spans(args: argparse.Namespace) -> list[tuple[str, Row]]:
    """The spans already in the ``capacity`` table of each output, each with where it is: none
    where the file, the dataset or the table does not exist yet. Reading BigQuery may raise
    ``google.api_core.exceptions.GoogleAPIError``."""
    spans = []
    if args.duckdb:
        spans += [(args.duckdb, span) for span in _duckdb_spans(args.duckdb)]
    if args.bigquery_dataset:
        spans += [(args.bigquery_dataset, span)
                  for span in _bigquery_spans(args.bigquery_dataset, args.bigquery_endpoint)]
    return spans


def _duckdb_spans(path: str) -> list[Row]:
    import os

    import duckdb

    from pipeline.app.checks import read_only

    if not os.path.lexists(path):
        return []
    with read_only(path) as connection:
        try:
            found = connection.execute(_IMPORTED_SQL).fetchall()
        except duckdb.CatalogException:  # a file an older version wrote, or none of ours yet
            return []
    return [_span_row(row) for row in found]


def _bigquery_spans(dataset: str, endpoint: str | None) -> list[Row]:
    from google.api_core.exceptions import NotFound
    from google.cloud import bigquery

    from goodput_schemas import parse_dataset
    from pipeline.sinks.bigquery import make_client

    project, name = parse_dataset(dataset)
    client = make_client(project, endpoint)
    try:
        found = client.query_and_wait(
            _IMPORTED_SQL, job_config=bigquery.QueryJobConfig(default_dataset=f"{project}.{name}"))
        return [_span_row(tuple(row)) for row in found]
    except NotFound:  # no dataset or table yet: --bigquery_create_tables makes them
        return []


def _span_row(values: Sequence[Any]) -> Row:
    """A span read from a table, its times aware (DuckDB's are naive, in UTC; BigQuery's aware)."""
    row: Row = dict(zip(SPAN_KEY, values, strict=True))
    for column in ("start_time", "end_time"):
        if row[column].tzinfo is None:
            row[column] = row[column].replace(tzinfo=datetime.timezone.utc)
    return row


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The arguments of ``goodput import capacity``, on ``parser`` if given."""
    parser = parser or OneLineParser(prog="goodput import capacity")
    parser.description = (
        "Imports the accelerator capacity paid for (reserved or allocatable chips) from a CSV file\n"
        "into the capacity table, one row per span, for the capacity_goodput query.")
    parser.epilog = (
        "the CSV (a header line, then one span per line; times ISO 8601, UTC unless given):\n"
        f"  {','.join(COLUMNS)}\n"
        "  v5p,us-east5-a,2026-11-01T00:00:00Z,2026-12-01T00:00:00Z,512\n\n"
        "example:\n"
        "  goodput import capacity --csv capacity.csv --duckdb goodput.duckdb\n"
        "  goodput query capacity_goodput --duckdb goodput.duckdb\n\n"
        "The file is checked whole first: a line that cannot be read, or spans of one accelerator\n"
        "type and location that overlap, in the file or with one imported before, refuse it, each\n"
        "with its line (types and locations are lower-cased: V5P is v5p). Importing a span again\n"
        "(same type, location, start and end) replaces it in the query: correct a span's chips so;\n"
        "extend a span by importing the time after its end.\n"
        "Exit status: 0 if the spans were imported, 1 if the file was refused or a read or write\n"
        "failed, 2 for a usage error.")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--csv", required=True, metavar="FILE",
                        help="the capacity spans ('-': standard input)")
    add_output_options(parser)
    return parser


def _check(args: argparse.Namespace) -> None:
    """``UsageError`` unless the arguments hold together; the DuckDB file is looked at read-only."""
    from pipeline.app.checks import check_readable_file

    check_outputs(args)
    if args.csv != "-":
        check_readable_file(args.csv, "--csv")


def run(args: argparse.Namespace, out: TextIO | None = None, stdin: TextIO | None = None) -> int:
    """Runs an import for parsed arguments; see ``--help``."""
    out = out or sys.stdout
    try:
        _check(args)
        text = (stdin or sys.stdin).read() if args.csv == "-" else _read_text(args.csv)
    except UsageError as error:
        print(f"goodput import capacity: {error}", file=sys.stderr)
        return 2
    from google.api_core import exceptions

    from pipeline.app.outputs import first_line

    try:
        imported = imported_spans(args)
    except UsageError as error:
        print(f"goodput import capacity: {error}", file=sys.stderr)
        return 2
    except exceptions.GoogleAPIError as error:
        print(f"goodput import capacity: reading the spans imported to {args.bigquery_dataset} failed: "
              f"{first_line(error)}; nothing was imported", file=sys.stderr)
        return 1
    rows, problems = read_spans(text, datetime.datetime.now(datetime.timezone.utc), imported)
    if problems:
        for problem in problems[:MAX_PROBLEMS_SHOWN]:
            print(f"goodput import capacity: {args.csv}: {problem}", file=sys.stderr)
        more = len(problems) - MAX_PROBLEMS_SHOWN
        print(f"goodput import capacity: {f'{more} more problems; ' if more > 0 else ''}nothing was "
              "imported: fix the file and import it again", file=sys.stderr)
        return 1
    if not rows:
        print(f"goodput import capacity: {args.csv} holds no span: nothing was imported", file=sys.stderr)
        return 1
    chip_s = sum(row["chips"] * (row["end_time"] - row["start_time"]).total_seconds() for row in rows)
    what = f"{len(rows)} spans ({chip_s / 3600:,.1f} chip-hours)"
    return write_rows(args, CAPACITY, rows, what, "goodput import capacity", out)


def _read_text(path: str) -> str:
    """A CSV file's text (a byte order mark, as spreadsheets write, is dropped)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            return handle.read()
    except UnicodeDecodeError as error:
        raise UsageError(f"--csv={path} is not UTF-8 text ({error.reason} at byte {error.start}): save it "
                         "as UTF-8 CSV") from None
    except OSError as error:
        raise UsageError(f"cannot read --csv={path}: {error.strerror}") from None


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``goodput import capacity``: see ``--help``."""
    return run(build_parser().parse_args(argv), out)


if __name__ == "__main__":
    sys.exit(main())
