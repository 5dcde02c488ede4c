"""The raw ``events`` table read back as messages: what a backfill replays and what a restarted
stream restores its runs from.

Every event the pipeline accepted is a row of ``events`` (``pipeline.core.rows.event_rows``), kept
whole: ids within the table's limits, the body as JSON. Read back, one attempt's rows in
sequence order become messages again in the emitter's encoding, which the parser reads as it read
the originals, so a replay of the table gives every number the stream gave. A redelivered message
leaves its rows in the table twice; the repeats are dropped here (and would be by the engine).

    goodput replay --from_duckdb=live.duckdb --duckdb=backfill.duckdb
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.events import Event, encode_events

#: Events per message read back: the emitter's default batch.
EVENTS_PER_MESSAGE = 1000
#: The columns a message is made of, in this order.
COLUMNS = "run_id, attempt_id, seq, epoch_us(event_time), kind, step, body"
_FETCH_ROWS = 10_000


def messages(rows: Iterable[Sequence[Any]], source: str) -> Iterator[tuple[str, bytes]]:
    """(source, message) for rows of ``COLUMNS``, ordered by run, attempt and seq."""
    own: list[Event] = []
    last: tuple[str, str, int] | None = None
    for run_id, attempt_id, seq, time_us, kind, step, body in rows:
        if (run_id, attempt_id, seq) == last:
            continue  # a redelivered message's row
        last = run_id, attempt_id, seq
        if own and ((own[-1].run_id, own[-1].attempt_id) != (run_id, attempt_id)
                    or len(own) == EVENTS_PER_MESSAGE):
            yield _message(own, source)
            own = []
        values = {"step": step} if kind == "step_start" else json.loads(body)
        own.append(Event(run_id, attempt_id, seq, time_us, kind, values))
    if own:
        yield _message(own, source)


def _message(events: list[Event], source: str) -> tuple[str, bytes]:
    first = events[0]
    return f"{source}#{first.run_id}/{first.attempt_id}/{first.seq}", encode_events(events)


def backfill_messages(path: str) -> Iterator[tuple[str, bytes]]:
    """The messages of every run in the ``events`` table of a DuckDB file that no process is
    writing, read in chunks."""
    import duckdb

    with duckdb.connect(path, read_only=True) as connection:
        cursor = connection.execute(f"SELECT {COLUMNS} FROM events ORDER BY run_id, attempt_id, seq")
        yield from messages(_chunks(cursor), f"duckdb:{path}")


def run_history(path: str, run_id: str) -> tuple[list[tuple[str, bytes]], int | None]:
    """One run's messages in the ``events`` table of a DuckDB file that this process may be
    writing too, and the time of its latest snapshot there (microseconds), if it has one: read
    whole, under the lock its writers take (``pipeline.sinks.duckdb``)."""
    from pipeline.sinks.duckdb import opened

    with opened(path) as sink:
        rows = sink.query(f"SELECT {COLUMNS} FROM events WHERE run_id = ? ORDER BY attempt_id, seq",
                          [run_id])
        [(reported,)] = sink.query("SELECT epoch_us(max(snapshot_time)) FROM goodput_snapshots "
                                   "WHERE run_id = ?", [run_id])
    return list(messages(rows, f"duckdb:{path}")), reported if isinstance(reported, int) else None


def run_ids(path: str) -> frozenset[str]:
    """Every run with a row in the ``events`` table of a DuckDB file (none without a file)."""
    from pipeline.sinks.duckdb import opened

    if not Path(path).is_file():
        return frozenset()
    with opened(path) as sink:
        return frozenset(str(run_id) for run_id, in sink.query("SELECT DISTINCT run_id FROM events"))


def _chunks(cursor: Any) -> Iterator[Sequence[Any]]:
    while rows := cursor.fetchmany(_FETCH_ROWS):
        yield from rows
