"""One message reaches no further than its own run: values that pass the schema but would break a
sum, a write or another run's numbers are dead letters (the parser), and what the engine derives
from a run's events stays inside its columns and does not depend on their order."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest

from goodput_schemas.limits import MAX_CHIP_COUNT, MAX_CLOCK_AHEAD_S, MAX_COUNT, MAX_SLICE_COUNT
from goodput_schemas.wire import encode_batch
from pipeline.core import engine, state_coder
from pipeline.core.events import DeadLetter, Event, encode_events, parse_batch
from pipeline.core.rows import snapshot_rows
from support.runs import ODD_T0, S

NOW = ODD_T0 + 3600 * S  # the pipeline's clock in these tests
INT64 = 2**63 - 1


def message(*records: tuple[int, int, str, dict[str, object]], attempt: str = "a") -> bytes:
    return encode_batch("run", attempt, list(records)).data


def reasons(data: bytes) -> list[str]:
    """The dead letters' reasons of a message read as bytes, which must be those read as text."""
    as_bytes, as_text = parse_batch(data, "m", NOW), parse_batch(data.decode(), "m", NOW)
    assert as_bytes[0] == as_text[0]
    assert [d.reason for d in as_bytes[1]] == [d.reason for d in as_text[1]]
    return [d.reason for d in as_bytes[1]]


BOUNDED = [
    ("a seq past MAX_COUNT", (MAX_COUNT + 1, ODD_T0, "step_start", {"step": 1}), "seq must be at most"),
    ("a seq of 2**63-1", (INT64, ODD_T0, "heartbeat", {}), "seq must be at most"),
    ("a step past MAX_COUNT", (0, ODD_T0, "step_start", {"step": MAX_COUNT + 1}), "step_start.step"),
    ("a checkpoint step of 2**63-1", (0, ODD_T0, "checkpoint_save", {"step": INT64, "blocking_s": 1.0}),
     "checkpoint_save.step"),
    ("a chip count past MAX_CHIP_COUNT", (0, ODD_T0, "job_start", {"chip_count": MAX_CHIP_COUNT + 1}),
     "MAX_CHIP_COUNT"),
    ("a slice count past MAX_SLICE_COUNT",
     (0, ODD_T0, "elastic_slice_counts",
      {"active_slices": 1, "total_slices": MAX_SLICE_COUNT + 1, "available_slices": 1}), "MAX_SLICE_COUNT"),
    ("more active slices than slices",
     (0, ODD_T0, "elastic_slice_counts", {"active_slices": 3, "total_slices": 2, "available_slices": 2}),
     "active_slices \\(3\\) must be at most total_slices \\(2\\)"),
    ("more available slices than slices",
     (0, ODD_T0, "elastic_slice_counts", {"active_slices": 1, "total_slices": 2, "available_slices": 5}),
     "available_slices \\(5\\) must be at most total_slices"),
]


@pytest.mark.parametrize(("record", "reason"), [case[1:] for case in BOUNDED],
                         ids=[case[0] for case in BOUNDED])
def test_integers_past_their_limits_are_dead_letters(record, reason):
    """An integer past its limit (or slice counts that contradict each other) is a dead letter
    naming it, and its valid neighbours are kept."""
    good = (1 if record[0] == 0 else 0, ODD_T0, "step_start", {"step": 0})
    (found,) = reasons(message(good, record))
    assert re.search(reason, found), found
    batch, _ = parse_batch(message(good, record), "m", NOW)
    assert batch is not None and len(batch) == 1


def test_the_largest_counts_are_accepted():
    """Counts at their limits are valid events."""
    records = [(MAX_COUNT, ODD_T0, "step_start", {"step": MAX_COUNT}),
               (0, ODD_T0, "job_start", {"chip_count": MAX_CHIP_COUNT}),
               (1, ODD_T0, "elastic_slice_counts", {"active_slices": MAX_SLICE_COUNT,
                                                    "total_slices": MAX_SLICE_COUNT,
                                                    "available_slices": MAX_SLICE_COUNT})]
    assert reasons(message(*records)) == []


@pytest.mark.parametrize("kind", ["step_start", "heartbeat", "job_end"])
def test_an_event_dated_past_the_clock_tolerance_is_a_dead_letter(kind):
    """An event dated more than MAX_CLOCK_AHEAD_S after the pipeline's clock is a dead letter;
    one at the limit is kept."""
    body = {"step": 3} if kind == "step_start" else {}
    limit = NOW + MAX_CLOCK_AHEAD_S * S
    assert reasons(message((0, limit, kind, body))) == []
    (reason,) = reasons(message((0, limit + 1, kind, body)))
    assert "MAX_CLOCK_AHEAD_S" in reason
    (reason,) = reasons(message((0, ODD_T0, "step_start", {"step": 1}),
                                (1, 7_226_582_400 * S, kind, body)))  # 2199
    assert "ahead of the pipeline's clock" in reason


def test_the_clock_is_the_wall_clock_unless_given():
    """Without a clock, the parser takes the wall clock: an event dated 2199 is a dead letter."""
    _, (letter,) = parse_batch(message((0, 7_226_582_400 * S, "heartbeat", {})))
    assert "MAX_CLOCK_AHEAD_S" in letter.reason


def test_missing_events_over_many_attempts_stay_inside_int64():
    """Events missing below seq MAX_COUNT in several attempts are counted up to MAX_COUNT, so the
    snapshot's INT64 column can always hold them."""
    state = engine.RunState("run")
    for attempt in ("a", "b", "c"):
        state.add(Event("run", attempt, 0, ODD_T0, "job_start", {}))
        state.add(Event("run", attempt, MAX_COUNT, ODD_T0 + S, "heartbeat", {}))
    snapshot = state.snapshot(ODD_T0 + 2 * S)
    assert snapshot is not None and snapshot.missing_events == MAX_COUNT
    (row,) = [row for table, row in snapshot_rows(snapshot) if table == "goodput_snapshots"
              and row["window_s"] == 0]
    assert row["missing_events"] <= INT64


# -- conflicting duplicates -------------------------------------------------------------------

def normal(event: Event) -> Event:
    """The event as the parser reads it (its body's defaults filled in)."""
    batch, _ = parse_batch(encode_events([event]), "m", NOW)
    assert batch is not None
    return batch.events()[0]


BASE = [Event("run", "a", 0, ODD_T0, "job_start", {"chip_count": 8}),
        *(Event("run", "a", seq, ODD_T0 + (seq + 1) * S, "step_start", {"step": seq})
          for seq in range(1, 20)),
        Event("run", "a", 20, ODD_T0 + 21 * S, "checkpoint_save", {"step": 19, "blocking_s": 0.5}),
        Event("run", "a", 21, ODD_T0 + 22 * S, "heartbeat", {}),
        Event("run", "a", 22, ODD_T0 + 23 * S, "custom_badput_start", {"badput_type": "eval"}),
        Event("run", "a", 23, ODD_T0 + 25 * S, "custom_badput_end", {"badput_type": "eval"}),
        Event("run", "b", 0, ODD_T0 + 40 * S, "job_start", {"chip_count": 16}),
        *(Event("run", "b", seq, ODD_T0 + (40 + seq) * S, "step_start", {"step": 10 + seq})
          for seq in range(1, 10))]
BASE = [normal(e) for e in BASE]
AS_OF = ODD_T0 + 60 * S


def copy_of(seq: int, attempt: str, time_us: int, kind: str, body: dict[str, object]) -> Event:
    return normal(Event("run", attempt, seq, time_us, kind, body))


CONFLICTS = [
    ("two step numbers", copy_of(5, "a", ODD_T0 + 6 * S, "step_start", {"step": 9})),
    ("a step moved in time", copy_of(5, "a", ODD_T0 + 6 * S + 300_000, "step_start", {"step": 5})),
    ("a step and a job end", copy_of(7, "a", ODD_T0 + 8 * S, "job_end", {"failed": True})),
    ("two job starts", copy_of(0, "b", ODD_T0 + 30 * S, "job_start", {"chip_count": 1024})),
    ("a checkpoint and a heartbeat", copy_of(20, "a", ODD_T0 + 21 * S, "heartbeat", {})),
    ("two heartbeats", copy_of(21, "a", ODD_T0 + 50 * S, "heartbeat", {})),
    ("two metrics", copy_of(21, "a", ODD_T0 + 22 * S, "model_metrics", {"step": 3, "loss": float("nan")})),
    ("a span's end moved", copy_of(23, "a", ODD_T0 + 24 * S, "custom_badput_end", {"badput_type": "eval"})),
    ("a step and a heartbeat", copy_of(3, "b", ODD_T0 + 80 * S, "heartbeat", {})),
]


def deliveries(events: list[Event], rng: random.Random) -> list[list[Event]]:
    """The events as one message each, or as a message per attempt, in a random order."""
    if rng.random() < 0.5:
        out = [[e] for e in events]
    else:
        out = [[e for e in events if e.attempt_id == a] for a in sorted({e.attempt_id for e in events})]
    rng.shuffle(out)
    return out


def fed(messages: list[list[Event]], rng: random.Random) -> tuple[engine.RunState, list[DeadLetter]]:
    """A state fed the messages as the pipeline feeds it: snapshots along the way, and its state
    encoded and decoded between messages at random (the stream's Beam state)."""
    state, letters = engine.RunState("run"), []
    for events in messages:
        batch = parse_batch(encode_events(events), "m", NOW)[0]
        assert batch is not None
        state.add_batch(batch, letters)
        if rng.random() < 0.5:
            state.snapshot(max(e.time_us for e in events))
        if rng.random() < 0.5:
            state = state_coder.decode_state(state_coder.encode_state(state))
    return state, letters


def order_key(event: Event) -> tuple[int, int]:
    return event.time_us, engine.fingerprint(event.kind, event.body)


@pytest.mark.parametrize("conflict", [case[1] for case in CONFLICTS], ids=[case[0] for case in CONFLICTS])
def test_conflicting_duplicates_give_the_same_numbers_in_any_order(conflict):
    """Of two different events under one (attempt, seq), the same one is kept whatever the order,
    delivery and snapshots, and the other is a dead letter; the numbers are those of the kept one
    alone."""
    (original,) = [e for e in BASE if (e.attempt_id, e.seq) == (conflict.attempt_id, conflict.seq)]
    kept, other = sorted([original, conflict], key=order_key)
    alone = engine.RunState("run")
    alone.add_all([kept if e is original else e for e in BASE])
    expected = alone.snapshot(AS_OF)
    rng = random.Random(7)
    for trial in range(12):
        events = [*BASE, conflict, *(rng.sample(BASE, 3) if trial % 2 else [])]  # with redeliveries
        state, letters = fed(deliveries(events, rng), rng)
        assert state.snapshot(AS_OF) == expected
        (letter,) = letters
        assert "conflicting duplicate of (attempt" in letter.reason and letter.run_id == "run"
        payload = json.loads(letter.payload)
        assert (payload["seq"], payload["time_us"]) == (other.seq, other.time_us) and other.kind in payload


def test_identical_duplicates_are_no_dead_letters():
    """Redeliveries of the same events, in any order, are deduplicated silently."""
    rng = random.Random(3)
    for _ in range(5):
        state, letters = fed(deliveries([*BASE, *BASE, *rng.sample(BASE, 5)], rng), rng)
        assert letters == [] and state.events == len(BASE)


def test_three_conflicting_copies_keep_the_first_in_order_and_dead_letter_the_others():
    """Of three different copies, the first by (time, fingerprint) is kept, in every order, and
    the two others are the dead letters."""
    copies = [copy_of(5, "a", ODD_T0 + 6 * S, "step_start", {"step": n}) for n in (5, 40, 41)]
    copies[0] = next(e for e in BASE if (e.attempt_id, e.seq) == ("a", 5))
    expected_letters: set[tuple[int, str]] | None = None
    snapshots = set()
    for order in itertools.permutations(copies):
        state, letters = fed([[e] for e in [*BASE[:5], *order, *BASE[6:]]], random.Random(0))
        snapshots.add(repr(state.snapshot(AS_OF)))
        found = {(json.loads(d.payload)["time_us"], d.payload) for d in letters}
        assert len(found) == 2
        expected_letters = expected_letters or found
        assert found == expected_letters
    assert len(snapshots) == 1


def test_a_run_id_longer_than_a_pubsub_attribute_takes_is_a_dead_letter():
    """A run id of 512 printable characters but over 1,024 bytes (a Pub/Sub attribute value's
    limit) is refused, as the emitter refuses it: no run may depend on the transport's limit."""
    long_id = "é" * 257 + "€" * 171
    data = encode_batch(long_id, "a", [(0, ODD_T0, "heartbeat", {})]).data
    batch, dead = parse_batch(data, "m", NOW)
    assert batch is None
    assert ["MAX_ID_BYTES" in letter.reason for letter in dead] == [True]
