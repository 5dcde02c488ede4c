"""Delivery faults through the batch replay: a file with every line twice and shuffled, and a
backfill of a raw events table holding every event twice, give the tables of the clean file."""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path

import duckdb
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
def test_a_redelivered_file_holds_each_raw_row_once(name, clean_replay, redelivered_replay):
    """The raw tables take a row once however often its message comes (by its key): redelivered,
    they hold the clean rows, each once."""
    clean_rows = table(clean_replay, name)
    assert len(set(clean_rows)) == len(clean_rows)
    assert table(redelivered_replay, name) == clean_rows


def test_a_backfill_from_a_raw_events_table_holding_each_event_twice_gives_the_clean_snapshot_tables(
        clean_replay, tmp_path: Path):
    """Replaying a raw events table that holds every event twice (goodput replay --from_duckdb of
    a file an earlier version wrote from a redelivered file) reproduces every snapshot table."""
    redelivered = tmp_path / "redelivered.duckdb"
    shutil.copy(clean_replay, redelivered)
    with duckdb.connect(str(redelivered)) as connection:
        connection.execute("INSERT INTO events SELECT * FROM events")
    assert Counter(table(redelivered, "events")) == Counter(table(clean_replay, "events") * 2)
    backfilled = tmp_path / "backfill.duckdb"
    run_batch(f"--from_duckdb={redelivered}", f"--duckdb={backfilled}")
    for name in SNAPSHOT_TABLES:
        assert table(backfilled, name) == table(clean_replay, name), name
