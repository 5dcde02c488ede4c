"""Bad input: every malformed, out-of-range, oversized or hostile message or event lands in the
dead letters with a specific reason; the pipeline keeps going, and nothing else changes."""

from __future__ import annotations

import json
import math
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from goodput_schemas.limits import (
    MAX_JSON_DEPTH,
    MAX_MESSAGE_BYTES,
)
from goodput_schemas.wire import encode_batch
from pipeline.core import engine
from pipeline.core import events as events_module
from pipeline.core.events import (
    EVENT_KINDS,
    OVERSIZED_PAYLOAD_BYTES,
    Batch,
    DeadLetter,
    encode_events,
    parse_batch,
)
from pipeline.core.snapshot import DATA_LOADING_ASYNC, WASTED_PROGRESS
from support.bad_input import CASES, STEP, T, message, oversized
from support.runs import (
    ODD_T0,
    S,
    batch_of,
    final,
    messages,
    odd_messages,
    odd_runs,
    recorded,
    state_of,
)


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


def _without_job_start(shape: str) -> tuple[list[bytes], list[bytes], int]:
    """The messages of a run less its job starts, the job starts one per message, and its as_of."""
    events, as_of = recorded(shape)
    starts = [encode_events([e]) for e in events if e.kind == "job_start"]
    return messages([e for e in events if e.kind != "job_start"], 50), starts, as_of


def test_a_run_without_a_job_start_starts_at_its_first_step():
    """Steps of a run whose job_start never came are counted from the first step, on no chips."""
    rest, _, as_of = _without_job_start("ended")
    snapshot = final(rest, as_of)
    first_step = min(t for data in rest for t in batch_of(data).step_times)
    assert snapshot.started_us == first_step
    assert snapshot.chip_count == 0 and snapshot.cumulative.productive_s > 0


def test_a_run_with_neither_a_start_nor_a_step_has_no_snapshot():
    """A run that recorded only heartbeats has no figures to report (its events stay in the raw table)."""
    events, as_of = recorded("ended")
    beats = [e for e in events if e.kind == "heartbeat"]
    assert beats
    state = engine.RunState("run")
    state.add_all(beats)
    assert state.snapshot(as_of) is None


def test_a_job_start_arriving_last_gives_the_complete_runs_numbers():
    """A job_start that arrives after every other event (and after snapshots) gives the clean figures."""
    rest, starts, as_of = _without_job_start("restarted")
    state = engine.RunState("run")
    for data in rest:
        state.add_batch(batch_of(data))
        state.snapshot(as_of)
    for data in starts:
        state.add_batch(batch_of(data))
        state.snapshot(as_of)  # with the first start only, the restart's steps join its segment
    assert state.snapshot(as_of) == final(messages(recorded("restarted")[0], 1000), as_of)


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
    # By repr, which is exact for floats and equal for two NaNs (a diverged run's loss).
    assert repr(parse_batch(data, "m")) == repr(parse_batch(text, "m"))


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


def test_values_that_are_observations_may_be_non_finite():
    """A NaN loss and a -Infinity MFU are kept as they are, not dead-lettered."""
    line = next(line for case, line, _, _ in CASES if case == "a diverged loss (kept)")
    batch, _ = parse_batch(line)
    assert batch is not None
    (metrics,) = [e for e in batch.others if e.kind == "model_metrics"]
    assert math.isnan(metrics.body["loss"]) and metrics.body["mfu"] == -math.inf
