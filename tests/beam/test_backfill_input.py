"""A backfill (``--from_duckdb``) given an emitter file is refused in one line that names
``--events``, before anything is read or written."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pipeline.beam.launcher import run


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``run(argv)`` answers with, once it has exited with code 2."""
    assert run(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize("name", ["events.jsonl", "events.json", "events.jsonl.gz", "marked.jsonl"])
def test_an_emitter_file_given_as_a_backfill_names_the_events_option(name: str, clean_lines: list[bytes],
                                                                       tmp_path: Path, capsys):
    """An emitter file (plain, .json, gzip or with a byte order mark) as --from_duckdb says to use
    --events=FILE, not DuckDB's "Catalog Error"."""
    data = b"".join(line + b"\n" for line in clean_lines[:5])
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz")
                     else b"\xef\xbb\xbf" + data if name.startswith("marked") else data)
    output = tmp_path / "out.duckdb"
    said = refused([f"--from_duckdb={path}", f"--duckdb={output}"], capsys)
    assert said == (f"python -m pipeline: --from_duckdb={path} is not a DuckDB file but looks like an "
                    f"emitter file (JSON lines): replay it with --events={path}")
    assert not output.exists()


def test_another_file_given_as_a_backfill_says_what_is_read(tmp_path: Path, capsys):
    """A file that is neither a DuckDB file nor an emitter file names both options."""
    path = tmp_path / "notes.csv"
    path.write_text("a,b\n1,2\n")
    said = refused([f"--from_duckdb={path}", f"--duckdb={tmp_path / 'out.duckdb'}"], capsys)
    assert "is not a DuckDB file" in said and "--events=FILE" in said and "Catalog" not in said
