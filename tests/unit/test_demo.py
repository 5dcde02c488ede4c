"""The demo's command line, its output directory, and how it compares the live numbers with the
batch replay's."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.demo import demo


def test_compare_names_each_difference():
    """A run missing on one side and a differing figure are each reported; equal figures are not."""
    live = {"a": (90.0, 100.0, 1, 10, True), "b": (50.0, 10.0, 0, 5, False)}
    batch = {"a": (90.0, 100.0, 1, 10, True), "c": (1.0, 1.0, 0, 0, True)}
    assert demo.compare(live, live) == []
    assert demo.compare(live, batch) == ["b: only in the live tables", "c: only in the batch replay"]
    assert demo.compare(live, {**batch, "b": (50.0, 10.0, 0, 6, False)}) == [
        "c: only in the batch replay", "b: max productive step live 5 != batch 6"]


def test_help_names_the_options(capsys):
    """``--help`` explains the options and exits 0."""
    with pytest.raises(SystemExit) as exited:
        demo.main(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for option in ("--output-dir", "--runs", "--duration-s", "--no-jax", "--quiet"):
        assert option in shown


def _contents(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def test_a_directory_it_did_not_make_is_left_untouched(tmp_path: Path, capsys, nothing_starts):
    """goodput demo --output-dir on a user's directory holding files named like demo outputs
    exits 2 with one line, and every file there is as it was."""
    from pipeline.app.cli import main

    mine = {"report.html": b"<html>my own report</html>\n", "events.jsonl": b'{"mine": 1}\n',
            "goodput.duckdb": b"not the demo's", "spool/notes.txt": b"keep\n"}
    for name, data in mine.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    assert main(["demo", "--output-dir", str(tmp_path), "--no-jax"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err.startswith("goodput demo: --output-dir=")
    assert "not a directory the demo made" in captured.err
    assert _contents(tmp_path) == mine


def test_a_file_as_the_output_directory_is_one_line(tmp_path: Path, capsys, nothing_starts):
    """An --output-dir that is a file exits 2 with one line, and the file is as it was."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    assert demo.main(["--output-dir", str(notes)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "is not a directory" in lines[0]
    assert notes.read_text() == "mine\n"


def test_a_new_or_empty_directory_is_made_the_demos(tmp_path: Path):
    """A directory that does not exist is made, and it and an empty one are marked as the demo's."""
    new, empty = tmp_path / "a" / "b", tmp_path / "empty"
    empty.mkdir()
    for directory in (new, empty):
        assert demo.prepare_output_dir(directory) == directory.resolve()
        assert [path.name for path in directory.iterdir()] == [demo.MARKER]


def test_the_demos_directory_has_only_the_demos_outputs_replaced(tmp_path: Path):
    """In a directory the demo made, its earlier outputs and spool go; a user's other files stay."""
    directory = tmp_path / "demo-output"
    demo.prepare_output_dir(directory)
    for name in demo.OUTPUTS:
        (directory / name).write_text("earlier run\n")
    (directory / "spool").mkdir()
    (directory / "spool" / "batch-1.jsonl").write_text("{}\n")
    (directory / "notes.txt").write_text("mine\n")
    demo.prepare_output_dir(directory)
    assert sorted(path.name for path in directory.iterdir()) == sorted([demo.MARKER, "notes.txt"])


def test_a_marker_the_demo_did_not_write_is_not_trusted(tmp_path: Path, nothing_starts):
    """A .goodput-demo file with other content does not make a directory the demo's."""
    (tmp_path / demo.MARKER).write_text("something else\n")
    (tmp_path / "report.html").write_text("mine\n")
    assert demo.main(["--output-dir", str(tmp_path)]) == 2
    assert (tmp_path / "report.html").read_text() == "mine\n"
