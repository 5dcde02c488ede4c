"""The launcher's answers to mistakes (``python -m pipeline``, ``goodput replay``): one line on
stderr saying what is wrong and what to do, exit code 2, before anything is read or written; and
emitter files as users have them (gzip, a byte order mark) replayed like the plain ones."""

from __future__ import annotations

import gzip
import hashlib
import os
import time
from pathlib import Path

import duckdb
import pytest

from pipeline.beam.launcher import _respelled, run
from pipeline.beam.options import UsageError, parse_command_line
from pipeline.core.detect import DetectionSettings
from support.beam import SNAPSHOT_TABLES, table

STREAM = ["--streaming", "--subscription=projects/p/subscriptions/s"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``run(argv)`` answers with, once it has exited with code 2."""
    assert run(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("python -m pipeline: ")
    return lines[0]


@pytest.fixture
def events(tmp_path: Path, clean_lines: list[bytes]) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in clean_lines))
    return path


@pytest.mark.parametrize(("more", "said"), [
    (["--windows=1e20"], "--windows"),
    (["--windows=100000000000000000000"], "windows must be from 1 to"),
    (["--windows=60,60"], "given twice"),
    (["--windows=0"], "windows must be from 1 to"),
    (["--as_of=yesterday"], "not an ISO 8601 time"),
    (["--as_of=1970-01-01T00:00:00Z"], "outside the years events may have"),
    (["--exclude=2026-11-01T09:00:00Z"], "an exclusion is START/END"),
    (["--exclude=2026-11-01T09:30:00Z/2026-11-01T09:00:00Z"], "must end after it starts"),
    (["--monitoring_project=p", "--monitoring_max_lag_s=-1"], "above 0"),
    (["--monitoring_project=p", "--monitoring_max_lag_s=inf"], "above 0"),
    (["--monitoring_project=p", "--monitoring_min_interval_s=nan"], "above 0"),
    (["--monitoring_project=p", "--monitoring_min_interval_s=1"], "every 5 s"),
    (["--log_level=loud"], "--log_level"),
    (["--duckbd=out.duckdb"], "unknown option --duckbd: did you mean --duckdb?"),
    (["stray.jsonl"], "unexpected argument 'stray.jsonl'"),
    (["--runner=NoSuchRunner"], "--runner=NoSuchRunner is not a runner"),
    (["--subscription=projects/p/subscriptions/s"], "add --streaming"),
    (["--silence_s=60"], "--silence_s has no effect in a batch replay"),
    (["--bigquery_create_tables"], "--bigquery_create_tables needs --bigquery_dataset"),
    (["--monitoring_latest_now"], "--monitoring_latest_now needs --monitoring_project"),
    (["--bigquery_dataset=just-a-project"], "is not PROJECT:DATASET"),
    (["--bigquery_dataset=goodput-local:d", "--bigquery_endpoint=127.0.0.1:9050"], "is not a URL"),
    (["--monitoring_project=p", "--monitoring_endpoint=http://x"], "is not HOST:PORT"),
])
def test_a_mistaken_option_of_a_replay_is_one_line_and_exit_2(events: Path, tmp_path: Path, more: list[str],
                                                               said: str, capsys):
    """Each mistaken option or combination is named in one line, exit code 2; no file is made."""
    output = tmp_path / "out.duckdb"
    assert said in refused([f"--events={events}", f"--duckdb={output}", *more], capsys)
    assert not output.exists()


@pytest.mark.parametrize(("more", "said"), [
    (["--snapshot_interval_s=0"], "--snapshot_interval_s: must be a number of seconds above 0"),
    (["--snapshot_interval_s=nan"], "--snapshot_interval_s: must be a number of seconds above 0"),
    (["--silence_s=-5"], "--silence_s: must be a number of seconds above 0"),
    (["--gc_after_s=1e300"], "--gc_after_s: must be a number of seconds above 0"),
    (["--as_of=2026-11-01T00:00:00Z"], "--as_of has no effect in the stream"),
    (["--exclude=2026-11-01T00:00:00Z/2026-11-01T01:00:00Z"], "--exclude has no effect in the stream"),
])
def test_a_mistaken_option_of_the_stream_is_one_line_and_exit_2(tmp_path: Path, more: list[str], said: str,
                                                                 capsys):
    """The stream's options are checked the same way, before it starts."""
    output = tmp_path / "out.duckdb"
    assert said in refused([*STREAM, f"--duckdb={output}", *more], capsys)
    assert not output.exists()


@pytest.mark.parametrize(("argv", "said"), [
    (["--streaming", "--duckdb=x.duckdb"], "--streaming needs --subscription"),
    ([*STREAM[:1], "--subscription=projects/p/topics/t", "--duckdb=x.duckdb"], "is a topic"),
    ([*STREAM[:1], "--subscription=goodput", "--duckdb=x.duckdb"], "is not projects/P/subscriptions/S"),
    ([*STREAM, "--events=e.jsonl", "--duckdb=x.duckdb"], "--events has no effect in the stream"),
    (["--duckdb=x.duckdb"], "--events=FILE or --from_duckdb=FILE is required"),
])
def test_a_stream_without_a_subscription_or_with_files_is_refused(argv: list[str], said: str, capsys):
    """What the stream reads is a subscription, named in full; a replay reads files."""
    assert said in refused(argv, capsys)


def test_no_output_at_all_is_refused_with_the_options_that_give_one(events: Path, capsys):
    """A replay or a stream with no sink would compute and write nothing: refused, naming the sinks."""
    for argv in ([f"--events={events}"], STREAM):
        line = refused(argv, capsys)
        assert all(option in line for option in ("--duckdb", "--bigquery_dataset", "--monitoring_project"))


def test_someone_elses_duckdb_file_is_refused_before_anything_is_written(events: Path, tmp_path: Path,
                                                                         capsys):
    """An existing DuckDB file that is not the pipeline's is refused, naming what it holds, and is
    left byte for byte as it was, with no write-ahead log beside it."""
    theirs = tmp_path / "theirs.duckdb"
    with duckdb.connect(str(theirs)) as connection:
        connection.execute("CREATE TABLE events (run_id VARCHAR, amount DOUBLE)")
        connection.execute("INSERT INTO events VALUES ('order-1', 9.5)")
    before = digest(theirs)
    for argv in ([f"--events={events}", f"--duckdb={theirs}"], [*STREAM, f"--duckdb={theirs}"]):
        line = refused(argv, capsys)
        assert "not a DuckDB file this pipeline wrote" in line and "'amount'" in line
        assert digest(theirs) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "theirs.duckdb"]


def test_a_directory_or_a_corrupt_file_as_duckdb_is_refused_at_once(events: Path, tmp_path: Path, capsys):
    """A directory, an empty file or a file that is not DuckDB is named for what it is within a
    second, not after the sink's retries."""
    empty, corrupt = tmp_path / "empty.duckdb", tmp_path / "corrupt.duckdb"
    empty.touch()
    corrupt.write_bytes(b"not a database\n" * 100)
    for path, said in ((tmp_path, "is a directory"), (empty, "is an empty file"),
                       (corrupt, "is not a DuckDB file")):
        started = time.monotonic()
        assert said in refused([f"--events={events}", f"--duckdb={path}"], capsys)
        assert time.monotonic() - started < 1.0
    assert corrupt.read_bytes() == b"not a database\n" * 100 and empty.read_bytes() == b""


def test_a_backfill_of_a_file_the_pipeline_did_not_write_is_refused(tmp_path: Path, capsys):
    """--from_duckdb of someone else's DuckDB file, of a text file or of a file without raw
    events is one line, exit code 2."""
    theirs, text, bare = tmp_path / "theirs.duckdb", tmp_path / "notes.txt", tmp_path / "bare.duckdb"
    with duckdb.connect(str(theirs)) as connection:
        connection.execute("CREATE TABLE orders (id INTEGER)")
    duckdb.connect(str(bare)).close()
    text.write_text("hello\n")
    output = tmp_path / "out.duckdb"
    for path, said in ((theirs, "the table 'orders'"), (text, "is not a DuckDB file"),
                       (bare, "has no raw events table")):
        assert said in refused([f"--from_duckdb={path}", f"--duckdb={output}"], capsys)
    assert not output.exists()


def test_an_events_path_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path: Path, capsys):
    """A FIFO, a directory or an unreadable file given as --events is called so, not "no such file"."""
    fifo, unreadable = tmp_path / "events.fifo", tmp_path / "secret.jsonl"
    os.mkfifo(fifo)
    unreadable.write_text("{}\n")
    unreadable.chmod(0)
    output = [f"--duckdb={tmp_path / 'out.duckdb'}"]
    assert "is a FIFO (a named pipe), not a file" in refused([f"--events={fifo}", *output], capsys)
    assert "is a directory, not a file" in refused([f"--events={tmp_path}", *output], capsys)
    if not os.access(unreadable, os.R_OK):  # root reads it anyway
        assert "permission denied" in refused([f"--events={unreadable}", *output], capsys)
    assert "no such file" in refused([f"--events={tmp_path / 'nope.jsonl'}", *output], capsys)


def test_events_files_in_formats_the_replay_does_not_read_are_named(events: Path, tmp_path: Path, capsys):
    """Another compression, UTF-16 text, a DuckDB file or a gzip file cut short is named in one line."""
    import bz2

    text = events.read_bytes()
    cases = {"events.jsonl.bz2": (bz2.compress(text), "is bzip2-compressed"),
             "events16.jsonl": (text.decode().encode("utf-16"), "is UTF-16 text"),
             "cut.jsonl.gz": (gzip.compress(text)[:-64], "is a gzip file cut short")}
    output = [f"--duckdb={tmp_path / 'out.duckdb'}"]
    for name, (data, said) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert said in refused([f"--events={tmp_path / name}", *output], capsys)
    database = tmp_path / "db.duckdb"
    duckdb.connect(str(database)).close()
    assert f"--from_duckdb={database}" in refused([f"--events={database}", *output], capsys)


def test_gzip_and_byte_order_marked_files_replay_like_the_plain_one(events: Path, clean_replay: Path,
                                                                    tmp_path: Path):
    """A gzip-compressed emitter file with a UTF-8 byte order mark gives the plain file's tables."""
    marked = tmp_path / "events.jsonl.gz"
    marked.write_bytes(gzip.compress(b"\xef\xbb\xbf" + events.read_bytes()))
    output = tmp_path / "out.duckdb"
    assert run([f"--events={marked}", f"--duckdb={output}"]) == 0
    for name in (*SNAPSHOT_TABLES, "events", "run_metadata"):
        assert table(output, name) == table(clean_replay, name), name
    assert table(output, "dead_letter") == []


def test_a_file_an_older_version_wrote_is_written_again(events: Path, tmp_path: Path):
    """A DuckDB file without the columns and tables added since it was written is accepted, and
    gets them."""
    from pipeline.sinks.duckdb import DuckDBSink

    old = tmp_path / "old.duckdb"
    DuckDBSink(old).close()
    with duckdb.connect(str(old)) as connection:
        connection.execute("DROP VIEW latest_goodput")
        connection.execute("ALTER TABLE goodput_snapshots DROP COLUMN missing_events")
        connection.execute("DROP TABLE step_stats")
    assert run([f"--events={events}", f"--duckdb={old}"]) == 0
    assert table(old, "goodput_snapshots", "missing_events IS NOT NULL")
    assert table(old, "step_stats")


def test_help_names_the_command_it_was_run_as(capsys):
    """--help lists the pipeline's options under the name it was run as."""
    assert run(["--help"], prog="goodput replay") == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: goodput replay") and "--snapshot_interval_s" in out and "gzip" in out


def test_the_pipeline_options_take_detection_settings_and_refuse_nonsense():
    events = ["--events=e.jsonl", "--duckdb=g.duckdb"]
    options = parse_command_line([*events, "--min_slowdown=0.2", "--hang_min_s=120", "--hang_factor=5",
                                  "--straggler_min_s=600", "--host_bucket_s=120", "--host_settle_s=0"])
    assert (options.min_slowdown, options.hang_min_s, options.hang_factor) == (0.2, 120.0, 5.0)
    assert (options.straggler_min_s, options.host_bucket_s, options.host_settle_s) == (600, 120, 0)
    assert parse_command_line(events).straggler_min_s == DetectionSettings().straggler_min_s
    for bad in ("--min_slowdown=0", "--min_slowdown=nan", "--hang_factor=-1", "--hang_min_s=0",
                "--straggler_min_s=0", "--host_bucket_s=1.5", "--host_settle_s=-1", "--host_bucket_s=86401"):
        with pytest.raises(UsageError, match=bad.split("=")[0]):
            parse_command_line([*events, bad])


def test_the_pipeline_takes_its_options_and_beams_with_hyphens():
    """python -m pipeline respells --from-duckdb and Beam's --temp-location as declared."""
    given = ["--from-duckdb=a.duckdb", "--temp-location", "gs://b/t", "--snapshot-interval-s=5"]
    assert _respelled(given) == ["--from_duckdb=a.duckdb", "--temp_location", "gs://b/t",
                                 "--snapshot_interval_s=5"]
