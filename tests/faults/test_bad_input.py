"""Bad input: every malformed, out-of-range, oversized or hostile message or event lands in the
dead letters with a specific reason; the pipeline keeps going, and nothing else changes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reference_harness import T0, micros

from goodput_schemas.limits import (
    MAX_EVENTS_PER_MESSAGE,
    MAX_ID_LENGTH,
    MAX_JSON_DEPTH,
    MAX_LABELS,
    MAX_MESSAGE_BYTES,
    MAX_TEXT_LENGTH,
)
from goodput_schemas.wire import encode_batch
from pipeline.core import engine
from pipeline.core import events as events_module
from pipeline.core.events import (
    EVENT_KINDS,
    OVERSIZED_PAYLOAD_BYTES,
    Batch,
    DeadLetter,
    parse_batch,
)
from pipeline.core.snapshot import DATA_LOADING_ASYNC, WASTED_PROGRESS

from .support import (
    FLEET,
    ODD_T0,
    SNAPSHOT_TABLES,
    S,
    batch_of,
    encode_events,
    final,
    fleet_events,
    messages,
    odd_messages,
    odd_runs,
    query,
    recorded,
    replay,
    state_of,
    table,
)

T = micros(T0) + 100 * S  # inside the replayed fleet's time span, so no bad line moves its as_of
STEP = {"seq": 0, "time_us": T, "step_start": {"step": 1}}  # the valid neighbour of a bad event


def message(*events: Any, ascii: bool = True, **header: Any) -> bytes:
    """A message of ``events`` (a bad one's attempt named by the case), header fields overridden."""
    document = {"schema_version": 1, "run_id": "run-bad", "attempt_id": "bad", "events": list(events)}
    document.update(header)
    for name, value in header.items():
        if value is ...:  # leave the field out
            del document[name]
    return json.dumps(document, ensure_ascii=ascii).encode()


def job_start(**body: Any) -> dict[str, Any]:
    return {"seq": 1, "time_us": T, "job_start": body}


def labels(count: int, key: str = "k", value: str = "v") -> dict[str, str]:
    return {f"{key}{i}": value for i in range(count)}


def oversized() -> bytes:
    """A message valid in every way but its size (JSON whitespace pads it past the limit)."""
    valid = message(STEP, attempt_id="oversized")
    padding = b" " * (MAX_MESSAGE_BYTES + 1 - len(valid))
    return valid[:-1] + padding + valid[-1:]


def beside(attempt_id: str, kind: str, body: Any = None, **fields: Any) -> bytes:
    """A message of one valid step and one event of ``kind`` (``fields`` override seq and time)."""
    event = {"seq": 1, "time_us": T, kind: {} if body is None else body, **fields}
    return message(STEP, {k: v for k, v in event.items() if v is not ...}, attempt_id=attempt_id)


def starting(attempt_id: str, **body: Any) -> bytes:
    """A message of one valid step and a job start with ``body``."""
    return beside(attempt_id, "job_start", body)


def replaced(old: bytes, new: bytes, attempt_id: str) -> bytes:
    """The valid step's message with ``old`` replaced by ``new`` in its text."""
    return message(STEP, attempt_id=attempt_id).replace(old, new)


LONG = MAX_TEXT_LENGTH + 1
PRINTABLE_ID = f"run_id must be 1..{MAX_ID_LENGTH} printable characters"
# (case, line, a reason it must give, how many of its events are kept)
CASES: list[tuple[str, bytes, str | None, int]] = [
    # Unreadable messages.
    ("truncated JSON", encode_batch("run-a", "x", [(0, T, "job_end", {})]).data[:-9], "not valid JSON", 0),
    ("invalid JSON", b"{'schema_version': 1, 'run_id': 'run-a'}", "not valid JSON", 0),
    ("a bare NaN token", replaced(b'"step": 1', b'"step": NaN', "bare"),
     "message is not valid JSON: NaN is not a JSON value", 0),
    ("not UTF-8", b'{"schema_version":1,"run_id":"run-\xff"}', "message is not UTF-8", 0),
    ("not an object", b"[1, 2]", "must be a JSON object (an EventBatch), got an array", 0),
    # Versions.
    ("schema_version 0", message(STEP, schema_version=0),
     "unsupported schema_version 0: not a version of this contract", 0),
    ("a future schema_version", message(STEP, schema_version=2),
     "unsupported schema_version 2: newer than this pipeline", 0),
    ("no schema_version", message(STEP, schema_version=...),
     "unsupported schema_version None: the message has none", 0),
    ("schema_version as text", message(STEP, schema_version="1"), "unsupported schema_version '1'", 0),
    ("schema_version true", message(STEP, schema_version=True), "unsupported schema_version True", 0),
    ("schema_version a list", message(STEP, schema_version=[1]), "unsupported schema_version an array", 0),
    # Missing and unknown fields.
    ("an unknown header field", message(STEP, colour="red"), "message does not match the schema", 0),
    ("run_id null", message(STEP, run_id=None), "run_id is missing or empty", 0),
    ("no attempt_id", message(STEP, attempt_id=...), "attempt_id is missing or empty", 0),
    ("no events", message(events=...), "message has no events", 0),
    ("empty events", message(), "message has no events", 0),
    ("an unknown event kind", beside("kind", "warp_drive"), "unknown event kind or field 'warp_drive'", 1),
    ("an event without time_us", beside("time", "job_end", time_us=...), "time_us is missing", 1),
    ("an event without a kind", message(STEP, {"seq": 1, "time_us": T}, attempt_id="nokind"),
     "event has no kind", 1),
    ("an event that is no object", message(STEP, "step 2", attempt_id="str"),
     "event must be a JSON object, got a string", 1),
    ("an event of two kinds", beside("two", "job_end", heartbeat={}), "event does not match the schema", 1),
    # Values out of range.
    ("a NaN duration", beside("nan", "checkpoint_save", {"blocking_s": "NaN"}),
     "checkpoint_save.blocking_s must be finite, got nan", 1),
    ("an infinite duration", beside("inf", "checkpoint_restore", {"blocking_s": "Infinity"}),
     "checkpoint_restore.blocking_s must be finite, got inf", 1),
    ("a negative duration", beside("neg", "checkpoint_save", {"blocking_s": -2}),
     "checkpoint_save.blocking_s must be >= 0, got -2.0", 1),
    ("a duration of centuries", beside("huge", "checkpoint_save", {"blocking_s": 1e300}),
     "checkpoint_save.blocking_s must be at most MAX_DURATION_S", 1),
    ("a negative step", beside("step", "step_start", {"step": -4}),
     "step_start.step must be >= 0, got -4", 1),
    ("a negative seq", beside("seq", "job_end", seq=-1), "seq must be >= 0, got -1", 1),
    ("a negative chip count", starting("chips", chip_count=-8),
     "job_start.chip_count must be >= 0, got -8", 1),
    ("a step beyond int64", beside("int64", "step_start", {"step": 2**64}),
     "event does not match the schema", 1),
    ("a time in 1970", beside("1970", "job_end", time_us=5),
     "time_us 5 is outside 2000-01-01..2200-01-01 UTC", 1),
    ("a zero ideal step time", starting("ideal", configured_ideal_step_time_s=0),
     "job_start.configured_ideal_step_time_s must be > 0", 1),
    ("a diverged loss (kept)",
     beside("loss", "model_metrics", {"step": 1, "loss": "NaN", "mfu": "-Infinity"}), None, 2),
    # Sizes.
    ("an oversized message", oversized(), f"more than MAX_MESSAGE_BYTES ({MAX_MESSAGE_BYTES})", 0),
    ("too many events", message(*[{}] * (MAX_EVENTS_PER_MESSAGE + 1), attempt_id="many"),
     f"more than MAX_EVENTS_PER_MESSAGE ({MAX_EVENTS_PER_MESSAGE})", 0),
    ("too many labels", starting("labels", labels={f"k{i}": "v" for i in range(MAX_LABELS + 1)}),
     f"job_start.labels has {MAX_LABELS + 1} labels, more than MAX_LABELS", 1),
    ("a long label key", starting("key", labels={"k" * LONG: "v"}),
     f"is {LONG} characters, more than MAX_TEXT_LENGTH", 1),
    ("a long label value", starting("value", labels={"k": "v" * LONG}),
     f"job_start.labels['k'] is {LONG} characters, more than MAX_TEXT_LENGTH", 1),
    ("a long run group", starting("group", run_group="g" * LONG),
     f"job_start.run_group is {LONG} characters, more than MAX_TEXT_LENGTH", 1),
    ("nesting past the limit", starting("nested", labels=json.loads("[" * 40 + "]" * 40)),
     f"nests deeper than MAX_JSON_DEPTH ({MAX_JSON_DEPTH})", 0),
    ("nesting past Python's recursion limit",
     replaced(b'"step": 1', b'"step": ' + b"[" * 10**5 + b"]" * 10**5, "deep"),
     "nests deeper than MAX_JSON_DEPTH", 0),
    # Characters.
    ("a label value of invalid Unicode", starting("surrogate", labels={"k": "\ud800"}),
     "job_start.labels['k'] is not valid Unicode", 1),
    ("a label value of several lines (kept)", starting("lines", labels={"note": "a\tb\nc"}), None, 2),
    ("a control character in a label key", starting("control", labels={"k\x1b[2J": "v"}),
     "must be printable characters", 1),
    ("a terminal escape in a badput type",
     beside("ansi", "custom_badput_start", {"badput_type": "\x1b[31mEVAL"}),
     "custom_badput_start.badput_type must be printable characters", 1),
    ("a NUL in a run id", message(STEP, run_id="run\x00x"), PRINTABLE_ID, 0),
    ("a newline in a run id", message(STEP, run_id="run\nx"), PRINTABLE_ID, 0),
    ("a terminal escape in a run id", message(STEP, run_id="run\x1b[2J"), PRINTABLE_ID, 0),
    ("a right-to-left override in a run id", message(STEP, run_id="run\u202ex", ascii=False),
     PRINTABLE_ID + ", got 'run\\u202ex'", 0),
    ("a zero-width space in a run id", message(STEP, run_id="run\u200bx", ascii=False), PRINTABLE_ID, 0),
    ("a lone surrogate in a run id", message(STEP, run_id="\ud800"), PRINTABLE_ID, 0),
    ("a run id too long", message(STEP, run_id="r" * (MAX_ID_LENGTH + 1)), PRINTABLE_ID + ", got 'rrrr", 0),
    ("a DEL in an attempt id", message(STEP, attempt_id="a\x7f"), "attempt_id must be 1..512 printable", 0),
    ("a run id in other scripts (kept)", message(STEP, run_id="rün-日本-😀", ascii=False), None, 1),
]


@pytest.mark.parametrize(("line", "reason", "kept"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_dead_lettered_with_its_reason(line: bytes, reason: str | None, kept: int):
    """A bad message is one dead letter, a bad event one dead letter beside its kept neighbours,
    each with a reason that names what is wrong."""
    batch, dead = parse_batch(line, "file:1")
    assert (len(batch) if batch is not None else 0) == kept
    if reason is None:
        assert dead == []
    else:
        (letter,) = dead
        assert reason in letter.reason
        assert len(letter.reason) < 400  # a reason for a person, not an echo of the input
        assert letter.payload


_HEADER = '"schema_version":1,"run_id":"r","attempt_id":"a"'
_NESTED_AT = {  # where a deep value (DEEP) hides in a message beside a valid step (STEP)
    "schema_version": '{"schema_version":DEEP,"run_id":"r","attempt_id":"a","events":[STEP]}',
    "an unknown header field": '{' + _HEADER + ',"x":DEEP,"events":[STEP]}',
    "run_id": '{"schema_version":1,"run_id":DEEP,"attempt_id":"a","events":[STEP]}',
    "an event": '{' + _HEADER + ',"events":[DEEP,STEP]}',
    "a body": '{' + _HEADER + ',"events":[{"seq":1,"time_us":TIME,"job_end":DEEP},STEP]}',
    "labels": '{' + _HEADER + ',"events":[{"seq":1,"time_us":TIME,"job_start":{"labels":DEEP}},STEP]}',
}


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 990, 5000])
@pytest.mark.parametrize("where", list(_NESTED_AT))
def test_deep_nesting_anywhere_is_a_dead_letter_even_deep_in_a_call_stack(where: str, depth: int):
    """A value nested past the limit, wherever it is and however deep (below or past Python's
    recursion limit), is a dead letter, also when the parser is called from a deep stack (a worker's)."""
    data = (_NESTED_AT[where].replace("DEEP", "[" * depth + "]" * depth).replace("STEP", json.dumps(STEP))
            .replace("TIME", str(T)).encode())

    def called_from(frames: int) -> tuple[Batch | None, list[DeadLetter]]:
        return parse_batch(data) if frames == 0 else called_from(frames - 1)

    batch, dead = called_from(300)
    assert batch is None and len(dead) == 1


def test_an_oversized_message_keeps_its_head_and_names_its_run():
    """The dead letter of an oversized message holds its first bytes, not all of them, and its run."""
    _, (letter,) = parse_batch(oversized())
    assert len(letter.payload) == OVERSIZED_PAYLOAD_BYTES
    assert letter.run_id == "run-bad"


def test_an_oversized_message_is_judged_alike_as_bytes_and_as_text():
    """A message just over the limit in bytes (though not in characters) is rejected as text too."""
    valid = message(STEP, attempt_id="été", ascii=False).decode()  # two characters of two bytes
    text = valid[:-1] + " " * (MAX_MESSAGE_BYTES + 1 - len(valid.encode())) + valid[-1:]
    assert len(text) <= MAX_MESSAGE_BYTES < len(text.encode())
    assert parse_batch(text) == parse_batch(text.encode())
    assert "MAX_MESSAGE_BYTES" in parse_batch(text)[1][0].reason


def test_steps_going_backwards_without_a_restart_are_a_rollback_not_a_dead_letter():
    """Step numbers falling inside one attempt are an in-process rollback: a disruption, no dead letter."""
    events = [{"seq": 0, "time_us": T, "job_start": {"chip_count": 8}}]
    steps = [*range(0, 21), *range(10, 16)]
    events += [{"seq": i + 1, "time_us": T + (i + 1) * S, "step_start": {"step": step}}
               for i, step in enumerate(steps)]
    batch, dead = parse_batch(message(*events, run_id="run-rollback", attempt_id="only"))
    assert dead == [] and batch is not None
    state = engine.RunState("run-rollback")
    state.add_batch(batch)
    snapshot = state.snapshot(T + 40 * S)
    assert snapshot is not None
    (rollback,) = snapshot.disruptions
    assert rollback.in_process and (rollback.last_step_before, rollback.resume_step) == (20, 10)
    assert snapshot.cumulative.badput_s[WASTED_PROGRESS] > 0


def _without_job_start(shape: int) -> tuple[list[bytes], list[bytes], int]:
    """The messages of a run less its job starts, the job starts one per message, and its as_of."""
    events, as_of = recorded(shape)
    starts = [encode_events([e]) for e in events if e.kind == "job_start"]
    return messages([e for e in events if e.kind != "job_start"], 50), starts, as_of


def test_a_run_without_a_job_start_starts_at_its_first_step():
    """Steps of a run whose job_start never came are counted from the first step, on no chips."""
    rest, _, as_of = _without_job_start(0)
    snapshot = final(rest, as_of)
    first_step = min(t for data in rest for t in batch_of(data).step_times)
    assert snapshot.started_us == first_step
    assert snapshot.chip_count == 0 and snapshot.cumulative.productive_s > 0


def test_a_run_with_neither_a_start_nor_a_step_has_no_snapshot():
    """A run that recorded only heartbeats has no figures to report (its events stay in the raw table)."""
    events, as_of = recorded(0)
    beats = [e for e in events if e.kind == "heartbeat"]
    assert beats
    state = engine.RunState("run")
    state.add_all(beats)
    assert state.snapshot(as_of) is None


def test_a_job_start_arriving_last_gives_the_complete_runs_numbers():
    """A job_start that arrives after every other event (and after snapshots) gives the clean figures."""
    rest, starts, as_of = _without_job_start(1)
    state = engine.RunState("run")
    for data in rest:
        state.add_batch(batch_of(data))
        state.snapshot(as_of)
    for data in starts:
        state.add_batch(batch_of(data))
        state.snapshot(as_of)  # with the first start only, the restart's steps join its segment
    assert state.snapshot(as_of) == final(messages(recorded(1)[0], 1000), as_of)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=odd_runs, as_of_s=st.integers(-5, 80))
def test_odd_runs_never_raise_and_keep_the_accounting_whole(run, as_of_s):
    """Valid but odd runs give a snapshot (or none before they start) with no negative figure and
    goodput plus badput equal to the elapsed time."""
    snapshot = state_of(batch_of(data) for data in odd_messages(run)).snapshot(ODD_T0 + as_of_s * S)
    if snapshot is None:
        return
    for figures in (snapshot.cumulative, *(w for w in snapshot.windows if w is not None)):
        accounted = figures.productive_s + sum(seconds for bucket, seconds in figures.badput_s.items()
                                               if bucket != DATA_LOADING_ASYNC)
        assert accounted == pytest.approx(figures.total_s, abs=1e-6)
        assert figures.productive_s >= 0 and min(figures.badput_s.values()) >= 0
    assert all(d.recovery_s >= 0 and d.wasted_progress_s >= 0 for d in snapshot.disruptions)


# -- fuzzing the parser ------------------------------------------------------------------------

_KEYS = st.sampled_from(["schema_version", "run_id", "attempt_id", "events", "seq", "time_us", "step",
                         "labels", "blocking_s", "loss", *EVENT_KINDS]) | st.text(max_size=6)
_scalars = (st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats()
            | st.sampled_from([0, 1, T, -1, "NaN", "Infinity", "1"]) | st.text(max_size=6))
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=25,
)
_kind_body = st.dictionaries(_KEYS, _json, max_size=3)
_events = st.one_of(
    _json,
    st.builds(lambda seq, time_us, kind, body: {"seq": seq, "time_us": time_us, kind: body},
              st.integers(-2, 2**63) | _scalars, st.integers(T - 10, T + 10) | _scalars,
              st.sampled_from(EVENT_KINDS), _kind_body),
)
_ids = st.sampled_from(["run", "a", ""]) | st.text(max_size=4) | _scalars
_batches = st.fixed_dictionaries(
    {"schema_version": st.sampled_from([1, 1, 1, 2, 0, "1", True, None]), "run_id": _ids, "attempt_id": _ids,
     "events": st.lists(_events, max_size=6) | _json})


def _check(data: bytes | str) -> tuple[Batch | None, list[DeadLetter]]:
    """Parses ``data``: it never raises, and each event is kept or dead-lettered, or the whole message is."""
    batch, dead = parse_batch(data, "m")
    whole = [d for d in dead if d.source == "m"]
    assert batch is not None or dead, "a message vanished"
    assert all(d.reason and isinstance(d.payload, str) for d in dead)
    if whole:
        assert len(dead) == 1 and batch is None
        return batch, dead
    document = json.loads(data)  # readable, since something in it was kept or judged alone
    assert (len(batch) if batch is not None else 0) + len(dead) == len(document["events"])
    assert batch is None or (batch.run_id, batch.attempt_id) == (document["run_id"], document["attempt_id"])
    return batch, dead


@settings(max_examples=300, deadline=None)
@example(b"")
@example(b"\xff" * 3)
@example(b"[" * 5000)
@example(b'{"schema_version":1,"run_id":"r","attempt_id":"a","events":[{}]}')
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_and_never_vanish(data: bytes):
    """Any bytes at all give events or dead letters, never an exception and never nothing."""
    _check(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=_json | _batches, ascii=st.booleans())
def test_arbitrary_json_never_raises_and_accounts_for_every_event(document: Any, ascii: bool):
    """Any JSON document, message-shaped or not, gives each event kept or dead-lettered once, or
    one dead letter for the message."""
    text = json.dumps(document, ensure_ascii=ascii)
    try:
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate, written raw: not UTF-8
        data = text.encode("utf-8", errors="surrogatepass")
    _check(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=_batches, compact=st.booleans())
def test_bytes_and_text_give_the_same_result(document: Any, compact: bool):
    """A message read as bytes (in columns where it can be) and as text gives the same events and
    the same dead letters."""
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":") if compact else None)
    try:
        data = text.encode()
    except UnicodeEncodeError:
        return  # not UTF-8: has no text form
    assert parse_batch(data, "m") == parse_batch(text, "m")


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(1, 8), others=st.integers(0, 3), cap=st.integers(1, 10))
def test_the_event_limit_holds_alike_in_columns_and_in_general(steps: int, others: int, cap: int):
    """A message of the emitter's shape over the event limit is rejected in columns as in the general path."""
    records = [(i, T + i, "step_start", {"step": i}) for i in range(steps)]
    records += [(steps + i, T + steps + i, "heartbeat", {}) for i in range(others)]
    data = encode_batch("run", "a", records).data
    with mock.patch.object(events_module, "MAX_EVENTS_PER_MESSAGE", cap):
        columns, general = parse_batch(data), parse_batch(data.decode())
    assert columns == general
    assert (columns[0] is None) == (steps + others > cap)


# -- the same through the Beam batch pipeline ---------------------------------------------------

_EXTRA = {  # valid lines of other runs with something odd about them (see the tests above)
    "rollback": message(*[{"seq": i, "time_us": T + i * S, "step_start": {"step": step}}
                          for i, step in enumerate([0, 1, 2, 3, 4, 2, 3])], run_id="run-rollback"),
    "unstarted": message(*[{"seq": i, "time_us": T + i * S, "step_start": {"step": i}} for i in range(5)],
                         run_id="run-unstarted"),
    "heartbeats only": message({"seq": 0, "time_us": T, "heartbeat": {}}, run_id="run-heartbeats"),
    # A run starting at the replay's snapshot time, which is the fleet's latest event's.
    "starting": message({"seq": 0, "time_us": max(e.time_us for e in fleet_events()), "job_start": {}},
                        run_id="run-starting"),
}


@pytest.fixture(scope="module")
def mixed_replay(clean_lines: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The batch replay of the clean file with every bad line and the odd runs' lines among its lines."""
    bad = [line for _, line, _, _ in CASES] + list(_EXTRA.values())
    lines = list(clean_lines)
    for index, line in enumerate(bad):
        lines.insert(index * len(lines) // len(bad), line)
    directory = tmp_path_factory.mktemp("mixed")
    return replay(lines, directory), directory / "events.jsonl"


def _line_numbers(events_file: Path) -> dict[bytes, int]:
    return {line: number for number, line in enumerate(events_file.read_bytes().split(b"\n"), start=1)}


def test_each_bad_line_of_a_replay_is_in_the_dead_letter_table_with_its_reason(mixed_replay):
    """Every bad line's dead letter is in the table, from its line, with its reason."""
    database, events_file = mixed_replay
    numbers = _line_numbers(events_file)
    rows = query(database, "SELECT source, reason, payload, run_id FROM dead_letter")
    for case, line, reason, _ in CASES:
        source = f"{events_file}:{numbers[line]}"
        found = [r for r in rows if r[0] == source or r[0].startswith(source + "#")]
        if reason is None:
            assert found == [], case
        else:
            assert [r[1] for r in found if reason in r[1]], (case, found)
    assert len(rows) == sum(1 for case in CASES if case[2] is not None)


def test_the_good_runs_of_a_replay_with_bad_lines_are_the_clean_ones(mixed_replay, clean_replay):
    """Bad lines among the good runs' lines change no row of the good runs."""
    database, _ = mixed_replay
    where = "run_id IN (" + ", ".join(f"'{run_id}'" for run_id in FLEET) + ")"
    for name in (*SNAPSHOT_TABLES, "events", "run_metadata"):
        assert table(database, name, where) == table(clean_replay, name), name


def test_the_valid_events_of_bad_lines_are_kept(mixed_replay):
    """The valid neighbours of bad events are in the raw events table, and the odd runs have their
    figures: a rollback is a disruption; a run without a start starts at its first step; a run of
    heartbeats alone has none; a run that starts at the snapshot time has no elapsed time yet."""
    database, _ = mixed_replay
    kept = sum(case[3] for case in CASES if case[0] != "a run id in other scripts (kept)")
    (rows,) = query(database, "SELECT count(*) FROM events WHERE run_id = 'run-bad'")[0]
    assert rows == kept
    assert query(database, "SELECT in_process, last_step_before, resume_step FROM disruptions "
                           "WHERE run_id = 'run-rollback'") == [(True, 4, 2)]
    (started,) = query(database, "SELECT epoch_us(window_start) FROM goodput_snapshots "
                                 "WHERE run_id = 'run-unstarted' AND window_s = 0")[0]
    assert started == T
    assert query(database, "SELECT count(*) FROM goodput_snapshots WHERE run_id = 'run-heartbeats'") == [(0,)]
    assert query(database, "SELECT total_time_s, goodput_pct FROM goodput_snapshots "
                           "WHERE run_id = 'run-starting' AND window_s = 0") == [(0.0, None)]
    assert query(database, "SELECT count(*) FROM events WHERE run_id = 'run-heartbeats'") == [(1,)]


def test_values_that_are_observations_may_be_non_finite():
    """A NaN loss and a -Infinity MFU are kept as they are, not dead-lettered."""
    line = next(line for case, line, _, _ in CASES if case == "a diverged loss (kept)")
    batch, _ = parse_batch(line)
    assert batch is not None
    (metrics,) = [e for e in batch.others if e.kind == "model_metrics"]
    assert math.isnan(metrics.body["loss"]) and metrics.body["mfu"] == -math.inf
