"""Delivery faults through the batch replay: a file with every line twice and shuffled, and a
backfill of its raw events table, give the snapshot tables of the clean file."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from support.beam import SNAPSHOT_TABLES, replay, run_batch, table
from support.runs import (
    FLEET,
)


@pytest.fixture(scope="module")
def redelivered_replay(clean_lines: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The batch replay of the clean file with every line twice, the lines shuffled."""
    lines = clean_lines * 2
    random.Random(7).shuffle(lines)
    return replay(lines, tmp_path_factory.mktemp("redelivered"))


@pytest.mark.parametrize("name", SNAPSHOT_TABLES)
def test_a_file_with_every_line_twice_and_shuffled_gives_the_clean_snapshot_tables(
        name, clean_replay, redelivered_replay):
    """Every row of every snapshot table of the redelivered file equals the clean file's."""
    clean_rows = table(clean_replay, name)
    assert {row[0] for row in clean_rows} == set(FLEET)
    assert table(redelivered_replay, name) == clean_rows


@pytest.mark.parametrize("name", ["events", "run_metadata"])
def test_a_redelivered_file_repeats_raw_rows_but_holds_no_other(name, clean_replay, redelivered_replay):
    """The raw tables append per message: redelivered, each clean row is there twice, and nothing else."""
    clean_rows = table(clean_replay, name)
    assert len(set(clean_rows)) == len(clean_rows)
    assert Counter(table(redelivered_replay, name)) == Counter(clean_rows * 2)


def test_a_backfill_from_the_redelivered_raw_events_table_gives_the_clean_snapshot_tables(
        clean_replay, redelivered_replay, tmp_path: Path):
    """Replaying the raw events table, duplicates included (goodput replay --from_duckdb),
    reproduces every snapshot table."""
    backfilled = tmp_path / "backfill.duckdb"
    run_batch(f"--from_duckdb={redelivered_replay}", f"--duckdb={backfilled}")
    for name in SNAPSHOT_TABLES:
        assert table(backfilled, name) == table(clean_replay, name), name
