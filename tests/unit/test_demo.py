"""The demo's command line, and how it compares the live numbers with the batch replay's."""

from __future__ import annotations

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


