"""Rows BigQuery holds twice: the README's replay with a BigQuery sink run twice, minutes apart,
through the real ``google-cloud-bigquery`` client into the local stand-in. BigQuery drops a row
sent again under the same insert id only within its de-duplication window, so the second replay
writes every row again; every view and saved query reads what it read after the first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from goodput_schemas import saved_queries, table_names, views
from pipeline.app.cli import main
from pipeline.emulators.bigquery import DEDUP_S, BigQueryEmulator, BigQueryStore
from pipeline.sinks.bigquery import make_client
from support.clock import ManualClock
from support.runs import FLEET, as_run, messages, recorded, with_configs_and_metrics
from support.text import canonical

PROJECT, DATASET = "goodput-local", "goodput"


@pytest.fixture
def clock() -> ManualClock:
    """The stand-in's clock, moved on by the test."""
    return ManualClock()


@pytest.fixture
def emulator(clock: ManualClock) -> Iterator[BigQueryEmulator]:
    with BigQueryEmulator(store=BigQueryStore(clock=clock)) as started:
        yield started


def readings(client: Any) -> dict[str, list[str]]:
    """Each view's rows and each saved query's result, read through the BigQuery client, as text
    (``support.text.canonical``)."""
    dataset = f"`{PROJECT}.{DATASET}`"
    read = {}
    for name, sql in {**{f"view {name}": f"SELECT * FROM {dataset}.{name}" for name in views(dataset)},
                      **{f"query {name}": sql for name, sql in saved_queries(dataset).items()}}.items():
        read[name] = sorted(canonical(tuple(row.values())) for row in client.query_and_wait(sql))
    return read


def test_a_replay_written_twice_into_bigquery_counts_once_in_every_view_and_saved_query(
        emulator, clock, tmp_path: Path):
    """The second replay, past the de-duplication window, doubles every table the replay writes;
    each view and saved query reads the same rows as after the first."""
    events = [event for number, (run_id, name) in enumerate(sorted(FLEET.items()))
              for event in with_configs_and_metrics(as_run(recorded(name)[0], run_id),
                                                    {"optimizer.lr": f"0.{number + 1}"})]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in messages(events, 100)))
    replay = ["replay", f"--events={path}", f"--bigquery_dataset={PROJECT}:{DATASET}",
              f"--bigquery_endpoint={emulator.endpoint}"]
    assert main([*replay, "--bigquery_create_tables"]) == 0
    client = make_client(PROJECT, emulator.endpoint)
    once = readings(client)
    counts = {name: len(emulator.store.rows(PROJECT, DATASET, name)) for name in table_names()}
    assert once["query badput_ranking"] and once["query checkpoint_interval"]
    assert once["query disruption_rates"] and once["view latest_badput"]

    clock.now += DEDUP_S + 1  # a retried work item, or the same replay, minutes later
    assert main(replay) == 0
    for name, count in counts.items():  # the seeded tables are seeded once, while empty
        doubled = count if name in ("accelerator_prices", "accelerator_peaks") else 2 * count
        assert len(emulator.store.rows(PROJECT, DATASET, name)) == doubled, name
    twice = readings(client)
    for name in once:
        assert twice[name] == once[name], name
