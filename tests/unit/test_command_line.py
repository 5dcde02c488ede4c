"""What the command lines accept without Beam: emitter files as users have them, DuckDB files that
are or are not this pipeline's, and the ``goodput`` subcommands' answers to mistakes (one line on
stderr, exit code 2, no file touched)."""

from __future__ import annotations

import datetime
import gzip
import hashlib
from pathlib import Path

import duckdb
import pytest

from pipeline.app.cli import main
from pipeline.core.events import read_lines
from pipeline.sinks.duckdb import DuckDBSink, not_ours, opened

LINES = [b'{"schema_version": 1, "run_id": "a"}', b"", b'{"schema_version": 1, "run_id": "b"}']


def plain_file(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(LINES) + b"\n")
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ours(path: Path) -> Path:
    """A DuckDB file as the pipeline leaves it: every table and view, no rows but the prices and peaks."""
    DuckDBSink(path).close()
    return path


def foreign(path: Path, *statements: str) -> Path:
    with duckdb.connect(str(path)) as connection:
        for statement in statements:
            connection.execute(statement)
    return path


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_a_gzip_compressed_emitter_file_is_read_as_the_plain_one(tmp_path: Path):
    """A gzip-compressed emitter file gives the plain file's messages, line numbers and all."""
    plain = plain_file(tmp_path)
    compressed = tmp_path / "events.jsonl.gz"
    compressed.write_bytes(gzip.compress(plain.read_bytes()))
    assert [line for _, line in read_lines(str(compressed))] == [line for _, line in read_lines(str(plain))]
    assert [source.rsplit(":", 1)[1] for source, _ in read_lines(str(compressed))] == ["1", "3"]


def test_a_byte_order_mark_at_the_start_of_an_emitter_file_is_skipped(tmp_path: Path):
    """A UTF-8 byte order mark before the first line, compressed or not, is not part of its message."""
    plain = plain_file(tmp_path)
    marked, both = tmp_path / "marked.jsonl", tmp_path / "marked.jsonl.gz"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    both.write_bytes(gzip.compress(marked.read_bytes()))
    expected = [line for _, line in read_lines(str(plain))]
    assert [line for _, line in read_lines(str(marked))] == expected
    assert [line for _, line in read_lines(str(both))] == expected


def test_an_empty_database_and_one_this_pipeline_wrote_are_ours(tmp_path: Path):
    """A DuckDB file with nothing in it, or with the pipeline's tables and views, may be written."""
    with duckdb.connect(str(tmp_path / "empty.duckdb")) as connection:
        assert not_ours(connection) is None
    with duckdb.connect(str(ours(tmp_path / "ours.duckdb"))) as connection:
        assert not_ours(connection) is None


def test_a_file_an_older_version_wrote_is_ours_and_gets_the_newer_columns(tmp_path: Path):
    """A file without the columns and tables added since (an older version's) is accepted, and
    the sink adds what it lacks."""
    path = foreign(ours(tmp_path / "old.duckdb"), "DROP VIEW latest_goodput",
                   "ALTER TABLE goodput_snapshots DROP COLUMN missing_events",
                   "ALTER TABLE goodput_snapshots DROP COLUMN location", "DROP TABLE step_stats")
    with duckdb.connect(str(path)) as connection:
        assert not_ours(connection) is None
    sink = DuckDBSink(path)
    columns = {name for name, in sink.query("SELECT column_name FROM duckdb_columns() "
                                            "WHERE table_name = 'goodput_snapshots'")}
    assert {"missing_events", "location"} <= columns
    assert sink.query("SELECT count(*) FROM step_stats") == [(0,)]
    sink.close()


@pytest.mark.parametrize(("statements", "named"), [
    (["CREATE TABLE customers (id INTEGER)"], "the table 'customers'"),
    (["CREATE TABLE events (run_id VARCHAR, note VARCHAR)"], "a column 'note'"),
    (["CREATE TABLE events (run_id INTEGER)"], "'run_id' of its table 'events' is INTEGER, not VARCHAR"),
    (["CREATE VIEW recent AS SELECT 1 AS x"], "the view 'recent'"),
    (["CREATE SCHEMA sales", "CREATE TABLE sales.events (run_id VARCHAR)"], "the schema 'sales'"),
    (["CREATE SEQUENCE ids"], "the sequence 'ids'"),
    (["CREATE MACRO twice(x) AS 2 * x"], "the macro 'twice'"),
    (["CREATE TABLE events (run_id VARCHAR, seq BIGINT DEFAULT 0)"],
     "the default or expression of the column 'events.seq'"),
    (["CREATE TABLE events (run_id VARCHAR, kind VARCHAR GENERATED ALWAYS AS (upper(run_id)))"],
     "the default or expression of the column 'events.kind'"),
    (["CREATE TABLE events (run_id VARCHAR CHECK (run_id <> ''))"],
     "the CHECK constraint of the table 'events'"),
    (["CREATE TABLE events (run_id VARCHAR PRIMARY KEY)"],
     "the PRIMARY KEY constraint of the table 'events'"),
    (["CREATE TABLE events (run_id VARCHAR)", "CREATE INDEX by_run ON events (upper(run_id))"],
     "the index 'by_run'"),
])
def test_a_database_holding_anything_of_someone_else_is_not_ours(tmp_path: Path, statements: list[str],
                                                                 named: str):
    """Anything in a DuckDB file that the pipeline does not make makes it someone else's, named:
    what a query or an insert would run (macros, defaults, computed columns, constraints, indexes)
    too."""
    path = foreign(tmp_path / "theirs.duckdb", *statements)
    with duckdb.connect(str(path), read_only=True) as connection:
        problem = not_ours(connection)
    assert problem is not None and named in problem


def test_the_sink_refuses_someone_elses_database_before_writing_to_it(tmp_path: Path):
    """The sink itself refuses a DuckDB file that is not the pipeline's, and leaves it as it was."""
    path = foreign(tmp_path / "theirs.duckdb", "CREATE TABLE events (run_id VARCHAR, note VARCHAR)",
                   "INSERT INTO events VALUES ('x', 'kept')")
    before = digest(path)
    with pytest.raises(ValueError, match="not a DuckDB file this pipeline wrote"):
        DuckDBSink(path)
    assert digest(path) == before
    with duckdb.connect(str(path), read_only=True) as connection:
        assert connection.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("events",)]


def test_a_write_opens_the_file_only_for_itself_and_stores_times_in_utc(tmp_path: Path):
    """``opened`` (the streaming writes) attaches the file to the process's one in-memory
    connection: a reader on a connection of its own (as another process's) opens it between
    writes, a foreign file is refused unchanged without upsetting the next write, and a time
    with a zone is stored as its UTC time."""
    path, theirs = tmp_path / "out.duckdb", foreign(tmp_path / "theirs.duckdb", "CREATE TABLE x (a INTEGER)")
    at = datetime.datetime(2026, 1, 2, 12, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    for seq in range(2):
        with opened(path) as sink:
            sink.write("events", [{"run_id": "r", "attempt_id": "a", "seq": seq, "event_time": at,
                                   "kind": "job_start"}])
        with duckdb.connect(str(path), read_only=True) as reader:  # free once written
            assert reader.execute("SELECT count(*), min(event_time) FROM events").fetchone() == (
                seq + 1, datetime.datetime(2026, 1, 2, 10, 30))
        before = digest(theirs)
        with pytest.raises(ValueError, match="not a DuckDB file this pipeline wrote"), opened(theirs):
            pass
        assert digest(theirs) == before


@pytest.mark.parametrize("command", [["query", "badput_ranking"], ["report"]])
def test_report_and_query_refuse_a_directory_or_a_file_that_is_not_duckdb(tmp_path: Path, command, capsys):
    """goodput query and report name a directory, an empty file and a non-DuckDB file for what
    they are, in one line, exit code 2."""
    empty, text = tmp_path / "empty.duckdb", tmp_path / "notes.duckdb"
    empty.touch()
    text.write_text("hello\n")
    output = ["--output", str(tmp_path / "report.html")] if command == ["report"] else []
    for path, said in ((tmp_path, "is a directory"), (empty, "is an empty file"),
                       (text, "is not a DuckDB file"), (tmp_path / "nope.duckdb", "no such file")):
        assert main([*command, "--duckdb", str(path), *output]) == 2
        assert said in one_line_error(capsys)
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("command", [["query", "badput_ranking"], ["report"]])
def test_report_and_query_refuse_someone_elses_database(tmp_path: Path, command, capsys):
    """goodput query and report refuse a DuckDB file the pipeline did not write, saying what it holds."""
    path = foreign(tmp_path / "theirs.duckdb", "CREATE TABLE customers (id INTEGER)")
    output = ["--output", str(tmp_path / "report.html")] if command == ["report"] else []
    assert main([*command, "--duckdb", str(path), *output]) == 2
    assert "the table 'customers'" in one_line_error(capsys)


def hostile_configs(path: Path) -> Path:
    """A run group of two runs whose differing configs hold text a spreadsheet would run, or a
    terminal obey, and a metric whose last value is negative."""
    sink = DuckDBSink(path)
    at = datetime.datetime(2026, 11, 2, 8, tzinfo=datetime.timezone.utc)
    sink.write("run_metadata", [{"run_id": run, "attempt_id": "a", "run_group": "g", "run_name": run,
                                 "start_time": at + datetime.timedelta(hours=n)}
                                for n, run in enumerate(("r1", "r2"))])
    values = {"r1": ['=HYPERLINK("http://example.com/x","y")', "-1+2", "\tTAB",
                     "\x1b]0;title\x07\x1b[31mred"],
              "r2": ["+1+1", "@SUM(A1)", "\rCR", "line\nbreak\u202eevil"]}
    sink.write("run_configs", [{"run_id": run, "attempt_id": "a", "recorded_at": at, "source": "user",
                                "key": f"k{i}", "value": value}
                               for run, texts in values.items() for i, value in enumerate(texts)])
    sink.write("model_metrics", [{"run_id": "r1", "attempt_id": "a", "metric_time": at, "step": 1,
                                  "name": "LOSS", "value": -2.5}])
    sink.close()
    return path


def test_query_csv_cells_a_spreadsheet_would_run_are_text_and_numbers_stay_numbers(tmp_path: Path, capsys):
    """goodput query --format csv prefixes text beginning with =, +, -, @, a tab or a carriage
    return with a single quote (OWASP's advice), and leaves a negative number as it is."""
    import csv
    import io

    path = hostile_configs(tmp_path / "goodput.duckdb")
    assert main(["query", "run_group_comparison", "--duckdb", str(path), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out, newline="")))
    configs = {row["value"] for row in rows if row["item"] == "config"}
    assert {"'=HYPERLINK(\"http://example.com/x\",\"y\")", "'+1+1", "'-1+2", "'@SUM(A1)", "'\tTAB",
            "'\rCR"} <= configs
    assert [row["last_value"] for row in rows if row["name"] == "LOSS" and row["run_id"] == "r1"] == ["-2.5"]


def test_query_table_shows_control_characters_as_escapes(tmp_path: Path, capsys):
    """goodput query's table shows an escape sequence, a line break or a bidi override in a value
    as its escape, one row a line."""
    path = hostile_configs(tmp_path / "goodput.duckdb")
    assert main(["query", "run_group_comparison", "--duckdb", str(path)]) == 0
    out = capsys.readouterr().out
    assert all(line.isprintable() for line in out.splitlines())
    assert "\\x1b]0;title\\x07\\x1b[31mred" in out and "line\\nbreak\\u202eevil" in out
    assert len(out.splitlines()) == int(out.splitlines()[-1].strip("()").split()[0]) + 3


def test_the_report_overwrites_no_file_but_an_earlier_report(tmp_path: Path, capsys):
    """goodput report refuses an --output that exists and is not a report, or that is its input."""
    database = ours(tmp_path / "goodput.duckdb")
    notes = tmp_path / "notes.html"
    notes.write_text("<p>mine</p>\n")
    for output, said in ((notes, "is not a report"), (database, "is the --duckdb file"),
                         (tmp_path, "is a directory")):
        before = digest(database)
        assert main(["report", "--duckdb", str(database), "--output", str(output)]) == 2
        assert said in one_line_error(capsys)
        assert digest(database) == before
    assert notes.read_text() == "<p>mine</p>\n"
    report = tmp_path / "report.html"
    assert main(["report", "--duckdb", str(database), "--output", str(report)]) == 0
    assert main(["report", "--duckdb", str(database), "--output", str(report)]) == 0  # again


@pytest.mark.parametrize(("argv", "said"), [
    ([], "required: command"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["query", "--format", "xml"], "invalid choice: 'xml'"),
    (["query", "badput_ranking", "--sql", "--dataset", "goodput`; DROP TABLE x"], "invalid dataset"),
    (["emulator", "pubsub", "--port", "70000"], "port"),
    (["emulator", "pubsub", "--port", "http"], "invalid"),
    (["report"], "--duckdb"),
])
def test_a_mistake_in_a_goodput_command_is_one_line(argv: list[str], said: str, capsys):
    """goodput answers a mistake in its arguments with one line naming it, exit code 2, no usage."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    line = one_line_error(capsys)
    assert line.startswith("goodput") and said in line


def test_goodput_demo_answers_a_mistake_in_one_line(capsys):
    """goodput demo's range checks are one line, exit code 2, like every other command's."""
    from pipeline.demo import demo

    for argv, said in ((["--runs", "0"], "--runs must be between 1 and 100"),
                       (["--duration-s", "nan"], "--duration-s must be between 10 and 3600")):
        with pytest.raises(SystemExit) as exited:
            demo.main(argv)
        assert exited.value.code == 2
        assert said in one_line_error(capsys)


def test_goodput_import_refuses_missing_inputs_and_outputs_it_did_not_write(tmp_path: Path, capsys):
    """goodput import names a missing or directory input, and an --output or --rejected that is
    an input or a file it did not write, in one line, exit code 2, touching nothing."""
    export = tmp_path / "export.json"
    export.write_text("[]\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    for argv, said in (([str(tmp_path / "nope.json")], "no such file"),
                       ([str(tmp_path)], "is a directory"),
                       ([str(export), "--output", str(export)], "is also an input"),
                       ([str(export), "--output", str(notes)], "is not a file this command wrote"),
                       ([str(export), "--output", str(tmp_path / "o.jsonl"), "--rejected", str(notes)],
                        "is not a file this command wrote")):
        output = [] if "--output" in argv else ["--output", str(tmp_path / "o.jsonl")]
        assert main(["import", *argv, *output]) == 2
        assert said in one_line_error(capsys)
    assert export.read_text() == "[]\n" and notes.read_text() == "mine\n"
    assert not (tmp_path / "o.jsonl").exists()


def test_goodput_emulator_on_a_port_in_use_is_one_line(capsys):
    """An emulator asked for a port another process listens on says so in one line, exit code 2."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["emulator", "bigquery", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in one_line_error(capsys)
