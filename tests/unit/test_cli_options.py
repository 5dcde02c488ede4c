"""One option style with the other accepted, no abbreviations, and errors that name the option to
use: in every ``goodput`` command and in ``python -m pipeline``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipeline.app.checks import OneLineParser
from pipeline.app.cli import main
from pipeline.app.spelling import respell


def test_respell_spells_each_long_option_as_declared():
    """Hyphens and underscores are one; values, short options and what follows -- are untouched."""
    declared = ["--bigquery_dataset", "--output-dir", "-o"]
    given = ["--bigquery-dataset=a-b_c", "--output_dir", "x_y-z", "-o", "--", "--output_dir"]
    assert respell(given, declared) == ["--bigquery_dataset=a-b_c", "--output-dir", "x_y-z", "-o", "--",
                                        "--output_dir"]
    assert respell(["--unknown-option", "--bigquery"], declared) == ["--unknown-option", "--bigquery"]


def parser() -> argparse.ArgumentParser:
    made = OneLineParser(prog="goodput test")
    made.add_argument("--bigquery_dataset", metavar="PROJECT:DATASET", required=True)
    made.add_argument("--output-dir", metavar="DIR")
    return made


def test_a_command_takes_either_spelling_of_each_option():
    """--bigquery-dataset and --output_dir are the options declared the other way."""
    args = parser().parse_args(["--bigquery-dataset", "p:d", "--output_dir=out"])
    assert (args.bigquery_dataset, args.output_dir) == ("p:d", "out")


def test_an_abbreviation_is_refused_naming_the_option_meant(capsys):
    """--output (for --output-dir) is an unknown option, with the whole name suggested."""
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["--bigquery_dataset", "p:d", "--output", "out"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == ("goodput test: unknown option --output: did you mean --output-dir? "
                                       "(see goodput test --help)\n")


def test_a_missing_option_is_named_with_its_value(capsys):
    """A required option missing is named as it is written: --bigquery_dataset PROJECT:DATASET."""
    with pytest.raises(SystemExit):
        parser().parse_args([])
    assert capsys.readouterr().err == ("goodput test: --bigquery_dataset PROJECT:DATASET is required "
                                       "(see goodput test --help)\n")


@pytest.mark.parametrize(("argv", "error"), [
    (["report"], "goodput report: --duckdb FILE is required (see goodput report --help)"),
    (["report", "--duck", "x.duckdb"],
     "goodput report: --duckdb FILE is required (see goodput report --help)"),
    (["query", "badput_ranking"], "goodput query: --duckdb FILE is required to run a query (or --sql "
                                  "--dataset PROJECT.DATASET to print it)"),
    (["query", "badput_ranking", "--duck", "x"], "goodput query: unknown option --duck: did you mean "
                                                 "--duckdb? (see goodput query --help)"),
    (["sql", "SELECT 1"], "goodput sql: --duckdb FILE is required: the DuckDB file to query"),
    (["sql"], "goodput sql: the following arguments are required: query (see goodput sql --help)"),
    (["import", "capacity", "--csv", "c.csv", "--duckdb", "x.duckdb", "--bigquery-datase", "p:d"],
     "goodput import capacity: unknown option --bigquery-datase: did you mean --bigquery_dataset? "
     "(see goodput import capacity --help)"),
    (["productivity", "--project", "my-project"],
     "goodput productivity: --duckdb FILE or --bigquery_dataset PROJECT:DATASET is required "
     "(see goodput productivity --help)"),
    (["replay"], "goodput replay: --events=FILE or --from_duckdb=FILE is required (see --help)"),
    (["replay", "--events=e.jsonl", "--duck=x.duckdb"],
     "goodput replay: unknown option --duck: did you mean --duckdb?"),
])
def test_a_mistake_is_one_line_naming_the_option_to_use(capsys, argv, error):
    """No argument, a wrong or abbreviated one: one line on stderr naming the option, exit code 2."""
    try:
        code = main(argv)
    except SystemExit as exited:
        code = exited.code
    assert code == 2
    assert capsys.readouterr().err == error + "\n"


@pytest.mark.parametrize("command", [["report"], ["query", "badput_ranking"], ["sql", "SELECT 1"]])
def test_a_file_that_is_not_a_duckdb_file_is_named(tmp_path: Path, capsys, command):
    """--duckdb naming a text file is one line naming --duckdb and the file."""
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    assert main([*command, "--duckdb", str(text)]) == 2
    assert capsys.readouterr().err == (f"goodput {command[0]}: --duckdb={text} is not a DuckDB file: "
                                       "name a DuckDB file this pipeline wrote\n")


def test_replay_of_a_duckdb_file_as_events_names_the_option_to_use(tmp_path: Path, capsys):
    """--events naming a DuckDB file points to --from_duckdb, whichever spelling was used."""
    import duckdb

    database = tmp_path / "goodput.duckdb"
    duckdb.connect(str(database)).close()
    assert main(["replay", f"--events={database}", f"--duckdb={tmp_path / 'out.duckdb'}"]) == 2
    assert capsys.readouterr().err == (f"goodput replay: --events={database} is a DuckDB file: replay its "
                                       f"raw events table with --from_duckdb={database}\n")


def test_the_demo_takes_its_hyphenated_options_with_underscores(capsys):
    """goodput demo --duration_s is its --duration-s: the value is checked as that option's."""
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--duration_s", "0"])
    assert exited.value.code == 2
    assert "--duration-s must be" in capsys.readouterr().err
