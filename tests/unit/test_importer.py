"""Importing the reference's Cloud Logging history (``pipeline.app.importer``): each payload of
every recorder method becomes the matching event, and bad entries are counted with their reasons."""

from __future__ import annotations

import datetime
import json

import pytest

from pipeline.app import importer
from pipeline.core.events import Event
from support.reference import (
    FIELD,
    LOG_NAME,
    TIME_KEY,
    log_entries,
    reference_payloads,
    reference_trace,
)
from support.runs import events_of, shape


def imported_events(result: importer.ImportResult) -> list[Event]:
    return events_of(result.messages)


@pytest.mark.parametrize("seed", [1, 2])
def test_every_reference_payload_becomes_the_matching_event(seed: int):
    """Each payload of every recorder method becomes one valid event of the same kind, time and values."""
    attempts = list(reference_trace(seed))
    payloads = reference_payloads(attempts, job_name="run-7")
    result = importer.import_entries(
        (f"line{n}", entry) for n, entry in enumerate(log_entries(payloads)))
    events = imported_events(result)
    assert not result.rejected and len(events) == len(payloads)
    assert result.attempts == {"run-7": 2}
    for event, payload in zip(events, payloads, strict=True):
        assert event.run_id == payload["job_name"]
        assert payload[TIME_KEY[event.kind]] == pytest.approx(event.time_us / 1e6, abs=1e-6)
        for ours, theirs in FIELD.items():
            if ours in event.body:
                assert payload[theirs] == event.body[ours]


def test_attempts_start_at_each_job_start_with_seqs_in_order():
    """A new attempt at each job_start entry; entries before the first form their own; seqs 0, 1, 2..."""
    t = datetime.datetime(2026, 11, 1, 8, tzinfo=datetime.timezone.utc).timestamp()
    payloads = [{"job_name": "run", "step_count": 7, "step_start_time": t},
                {"job_name": "run", "job_start_time": t + 10},
                {"job_name": "run", "step_count": 0, "step_start_time": t + 20},
                {"job_name": "run", "step_count": 1, "step_start_time": t + 22},
                {"job_name": "run", "job_start_time": t + 60},
                {"job_name": "run", "step_count": 1, "step_start_time": t + 70}]
    events = imported_events(importer.import_entries(("x", p) for p in payloads))
    attempts = list(dict.fromkeys(e.attempt_id for e in events))
    assert len(attempts) == 3
    assert [(attempts.index(e.attempt_id), e.seq, e.kind) for e in events] == [
        (0, 0, "step_start"), (1, 0, "job_start"), (1, 1, "step_start"), (1, 2, "step_start"),
        (2, 0, "job_start"), (2, 1, "step_start")]


def test_json_lines_of_entries_and_of_bare_payloads_give_the_same_events():
    """LogEntry lines and bare jsonPayload lines import to the same kinds, times and values."""
    payloads = reference_payloads(shape("long_clean", 21).attempts)
    entries = "\n".join(json.dumps(e) for e in log_entries(payloads))
    bare = "\n".join(json.dumps(p) for p in payloads)
    from_entries = imported_events(importer.import_entries(importer.read_entries(entries, "e.jsonl")))
    from_bare = imported_events(importer.import_entries(importer.read_entries(bare, "p.jsonl")))
    assert [(e.seq, e.time_us, e.kind, e.body) for e in from_entries] == [
        (e.seq, e.time_us, e.kind, e.body) for e in from_bare]


def test_bad_entries_are_counted_with_their_reasons():
    """Nothing is dropped unseen: each bad entry is rejected with a reason, duplicates and other
    jobs are counted, and the good entries are still imported."""
    t = 1_793_520_000.0
    good = {"job_name": "run", "job_start_time": t}
    lines = [
        json.dumps({"logName": LOG_NAME, "insertId": "a", "timestamp": "2026-11-01T08:00:00Z",
                    "jsonPayload": good}),
        json.dumps({"logName": LOG_NAME, "insertId": "a", "timestamp": "2026-11-01T08:00:00Z",
                    "jsonPayload": good}),  # the same entry again
        json.dumps({"logName": LOG_NAME, "insertId": "b", "timestamp": "2026-11-01T08:00:01Z",
                    "textPayload": "hello"}),
        "{not json",
        "42",
        json.dumps({"step_count": 1.0, "step_start_time": t + 1}),
        json.dumps({"job_name": "run", "something_else": 1}),
        json.dumps({"job_name": "run", "step_count": 1.5, "step_start_time": t + 2}),
        json.dumps({"job_name": "run", "step_count": 2.0, "step_start_time": "yesterday"}),
        json.dumps({"job_name": "run", "event_type": "save", "step": 2.0, "directory": "gs://b",
                    "wait_for_prev_start_time": t + 3}),
        json.dumps({"job_name": "other", "job_start_time": t}),
        json.dumps({"job_name": "run", "step_count": 0.0, "step_start_time": t + 4}),
    ]
    result = importer.import_entries(importer.read_entries("\n".join(lines), "h.jsonl"), job_name="run")
    assert result.entries == len(lines)
    assert (result.events, result.duplicates, result.other_jobs) == (2, 1, 1)
    assert result.reasons == {"no jsonPayload": 1, "invalid JSON": 1, "not a JSON object": 1,
                              "no job_name": 1, "unknown payload": 1, "bad field": 1, "bad time": 1,
                              "incomplete checkpoint entry": 1}
    assert {r.source for r in result.rejected} == {f"h.jsonl:{n}" for n in (3, 4, 5, 6, 7, 8, 9, 10)}
    assert result.entries == (result.events + result.duplicates + result.other_jobs + len(result.rejected))
    assert "rejected 1: bad time" in result.summary()
    assert next(r for r in result.rejected if r.reason == "invalid JSON").payload == "{not json"


def test_a_bad_log_entry_timestamp_is_rejected():
    """A LogEntry whose timestamp is not RFC 3339 is rejected, not guessed."""
    entry = {"logName": LOG_NAME, "insertId": "a", "timestamp": "Sunday",
             "jsonPayload": {"job_name": "run", "job_start_time": 1_793_520_000.0}}
    result = importer.import_entries([("h.json#0", entry)])
    assert result.reasons == {"bad timestamp": 1} and result.events == 0


def test_help_names_the_inputs_and_outputs(capsys: pytest.CaptureFixture[str]):
    """--help explains the export, the input formats and both outputs."""
    from pipeline.app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["import", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for words in ("gcloud logging read", "--output", "--destination", "--job-name", "jsonPayload"):
        assert words in text




def test_values_past_the_contract_limits_are_rejected_not_dead_lettered():
    """Entries at the contract's limits import to events the parser takes; past them, each is
    rejected with its reason and the field it broke."""
    from goodput_schemas.limits import MAX_CLOCK_AHEAD_S, MAX_COUNT, MAX_SLICE_COUNT, MAX_TEXT_LENGTH
    from pipeline.core.events import parse_message

    t = 1_793_520_000.0
    now_us = round(t * 1_000_000)
    ahead_s = MAX_CLOCK_AHEAD_S + 1

    def slices(active: int, total: int, available: int) -> dict[str, object]:
        return {"job_name": "run", "elastic_slice_counts_timestamp": t + 3, "active_slices": active,
                "total_slices": total, "available_slices": available}

    at_limits = [
        {"job_name": "run", "job_start_time": t},
        {"job_name": "run", "step_count": float(MAX_COUNT), "step_start_time": t + 1},
        {"job_name": "run", "custom_badput_event_start_time": t + 2,
         "custom_badput_event_type": "e" * MAX_TEXT_LENGTH},
        slices(MAX_SLICE_COUNT, MAX_SLICE_COUNT, MAX_SLICE_COUNT),
        {"job_name": "run", "step_count": 1.0, "step_start_time": t + MAX_CLOCK_AHEAD_S},
    ]
    past_limits = {
        "step_count must be a whole number in 0..MAX_COUNT": {
            "job_name": "run", "step_count": float(2**60), "step_start_time": t + 4},
        "step must be a whole number in 0..MAX_COUNT": {
            "job_name": "run", "event_type": "save", "step": float(MAX_COUNT + 1), "directory": "gs://b",
            "wait_for_prev_start_time": t + 5, "checkpoint_manager_blocking_duration_secs": 1.0},
        "total_slices must be a whole number in 0..MAX_SLICE_COUNT": slices(1, MAX_SLICE_COUNT + 1, 1),
        "active_slices (3) must be at most total_slices (2)": slices(3, 2, 2),
        "available_slices (5) must be at most total_slices (4)": slices(4, 4, 5),
        f"custom_badput_event_type is {MAX_TEXT_LENGTH + 1} characters": {
            "job_name": "run", "custom_badput_event_start_time": t + 6,
            "custom_badput_event_type": "e" * (MAX_TEXT_LENGTH + 1)},
        "custom_badput_event_type must be printable": {
            "job_name": "run", "custom_badput_event_start_time": t + 6, "custom_badput_event_type": "a\nb"},
        "jsonPayload.job_name (the run id) must be 1..512 printable characters": {
            "job_name": "r" * 513, "job_start_time": t},
        "checkpoint_manager_blocking_duration_secs must be seconds in 0..MAX_DURATION_S": {
            "job_name": "run", "event_type": "save", "step": 1.0, "wait_for_prev_start_time": t + 7,
            "checkpoint_manager_blocking_duration_secs": 1e12},
        f"is {ahead_s} s ahead of the pipeline's clock": {
            "job_name": "run", "step_count": 2.0, "step_start_time": t + ahead_s},
    }
    payloads = at_limits + list(past_limits.values())
    result = importer.import_entries([(f"h.jsonl:{n}", p) for n, p in enumerate(payloads, 1)], now_us=now_us)

    events = []
    for message in result.messages:
        parsed, dead = parse_message(message.data, now_us=now_us)
        assert not dead, dead
        events.extend(parsed)
    assert [e.kind for e in events] == ["job_start", "step_start", "custom_badput_start",
                                        "elastic_slice_counts", "step_start"]
    assert result.events == len(at_limits) and len(result.rejected) == len(past_limits)
    assert {r.source for r in result.rejected} == {
        f"h.jsonl:{n}" for n in range(len(at_limits) + 1, len(payloads) + 1)}
    by_payload = {r.payload: r for r in result.rejected}
    for phrase, payload in past_limits.items():
        rejected = by_payload[json.dumps(payload, sort_keys=True)]
        assert phrase in rejected.detail, rejected
    assert result.reasons == {"bad field": 8, "incomplete checkpoint entry": 1, "bad time": 1}


def test_an_entry_past_a_limit_goes_to_the_rejected_file(tmp_path, capsys: pytest.CaptureFixture[str]):
    """goodput import writes an entry past a contract limit to --rejected with its reason, and
    imports the others."""
    from pipeline.app.cli import main

    t = 1_793_520_000.0
    export = tmp_path / "history.jsonl"
    export.write_text("\n".join(json.dumps(p) for p in (
        {"job_name": "run", "job_start_time": t},
        {"job_name": "run", "step_count": float(2**53), "step_start_time": t + 1})) + "\n")
    rejected = tmp_path / "rejected.jsonl"
    code = main(["import", str(export), "--output", str(tmp_path / "events.jsonl"),
                 "--rejected", str(rejected)])
    assert code == 0
    lines = [json.loads(line) for line in rejected.read_text().splitlines()]
    assert [(r["source"], r["reason"]) for r in lines] == [(f"{export}:2", "bad field")]
    assert "MAX_COUNT (2**53-1)" in lines[0]["detail"]
    assert "rejected 1: bad field" in capsys.readouterr().out


DEEP = "[" * 100_000 + "]" * 100_000  # far past the parser's recursion limit


def history(*payloads: object) -> list[dict[str, object]]:
    """LogEntries of ``payloads``, a second apart, as gcloud exports them."""
    return [{"logName": LOG_NAME, "insertId": f"i{n}", "timestamp": f"2026-11-01T08:00:{n:02d}Z",
             "jsonPayload": payload} for n, payload in enumerate(payloads)]


GOOD = ({"job_name": "run", "job_start_time": 1_793_520_000.0},
        {"job_name": "run", "step_count": 1.0, "step_start_time": 1_793_520_001.0})


@pytest.mark.parametrize("layout", ["array", "lines"])
def test_a_deeply_nested_entry_is_rejected_alone(layout: str):
    """An entry nested past the parser's recursion limit is rejected as too deep, saying how deep,
    and the entries around it are imported."""
    deep = f'{{"jsonPayload": {{"job_name": "run", "step_start_time": {DEEP}}}}}'
    first, last = (json.dumps(entry) for entry in history(*GOOD))
    text = f"[{first}, {deep}, {last}]" if layout == "array" else f"{first}\n{deep}\n{last}\n"
    result = importer.import_entries(importer.read_entries(text, "h.json"))
    assert (result.entries, result.events, result.reasons) == (3, 2, {"too deep": 1})
    (rejected,) = result.rejected
    assert rejected.source == ("h.json#1" if layout == "array" else "h.json:2")
    assert "nests 100002 levels deep, more than MAX_JSON_DEPTH (32)" in rejected.detail


def test_an_entry_nested_past_the_events_limit_is_rejected():
    """An entry that parses but nests deeper than MAX_JSON_DEPTH, as no event may, is rejected."""
    from goodput_schemas.limits import MAX_JSON_DEPTH

    nested = {"job_name": "run", "job_start_time": 1_793_520_000.0, "extra": []}
    inner = nested["extra"]
    for _ in range(MAX_JSON_DEPTH):
        inner.append([])
        inner = inner[0]
    text = json.dumps(history(nested, GOOD[1]))
    result = importer.import_entries(importer.read_entries(text, "h.json"))
    assert (result.events, result.reasons) == (1, {"too deep": 1})


def test_an_array_element_that_does_not_parse_is_rejected_alone():
    """In gcloud's JSON array, an element that is not JSON (a bare word, a number past Python's
    4300 digits, a stray bracket) is rejected with the parser's reason; the others are imported."""
    first, last = (json.dumps(entry) for entry in history(*GOOD))
    text = f"[{first}, tru, {'9' * 5000}, }}, {last}]"
    result = importer.import_entries(importer.read_entries(text, "h.json"))
    assert (result.entries, result.events, result.reasons) == (5, 2, {"invalid JSON": 3})
    assert [r.source for r in result.rejected] == ["h.json#1", "h.json#2", "h.json#3"]


def test_a_cut_short_array_keeps_its_whole_elements():
    """An export cut off mid-element imports the elements before the cut and says it is cut short."""
    text = json.dumps(history(*GOOD), indent=2)[:-40]
    result = importer.import_entries(importer.read_entries(text, "h.json"))
    assert (result.events, result.reasons) == (1, {"invalid JSON": 2})
    assert "the export is cut short" in result.rejected[-1].detail


def test_a_byte_that_is_not_utf8_rejects_only_its_entry(tmp_path):
    """A line holding a byte that is not UTF-8 is rejected by the check of its field; the other
    lines are imported."""
    export = tmp_path / "h.jsonl"
    lines = [json.dumps(payload).encode() for payload in (GOOD[0], {"job_name": "run-X"}, GOOD[1])]
    export.write_bytes(b"\n".join(lines).replace(b"run-X", b"run-\xff"))
    result = importer.import_files([export])
    assert (result.events, result.reasons) == (2, {"bad field": 1})
    assert result.rejected[0].source == f"{export}:2"


def test_the_command_lists_a_deep_entry_in_the_rejected_file(tmp_path, capsys: pytest.CaptureFixture[str]):
    """goodput import of an export with a deeply nested entry exits 0, writes the other entries'
    events and the deep one to --rejected with its reason."""
    from pipeline.app.cli import main

    first, last = (json.dumps(entry) for entry in history(*GOOD))
    export = tmp_path / "history.json"
    export.write_text(f'[{first}, {{"jsonPayload": {DEEP}}}, {last}]')
    rejected, events = tmp_path / "rejected.jsonl", tmp_path / "events.jsonl"
    assert main(["import", str(export), "--output", str(events), "--rejected", str(rejected)]) == 0
    assert [(r["source"], r["reason"]) for r in map(json.loads, rejected.read_text().splitlines())] == [
        (f"{export}#1", "too deep")]
    assert "2 events" in capsys.readouterr().out


def test_a_number_past_a_floats_range_is_rejected_alone():
    """A time, count or duration too large for a float (an integer of 400 digits, or 1e308 seconds,
    which is no microsecond count) is rejected as a bad time or field; the others are imported."""
    big = 10**400
    save = {"job_name": "run", "event_type": "save", "step": 1.0, "wait_for_prev_start_time": 1_793_520_002.0,
            "checkpoint_manager_blocking_duration_secs": 1.0}
    payloads = [GOOD[0],
                {"job_name": "run", "step_count": 1.0, "step_start_time": 1e308},
                {"job_name": "run", "step_count": 1.0, "step_start_time": -1e308},
                {"job_name": "run", "step_count": 1.0, "step_start_time": big},
                {"job_name": "run", "step_count": big, "step_start_time": 1_793_520_001.0},
                {**save, "wait_for_prev_start_time": 1e308},
                {**save, "checkpoint_manager_blocking_duration_secs": big},
                GOOD[1]]
    text = "\n".join(json.dumps(payload) for payload in payloads)
    result = importer.import_entries(importer.read_entries(text, "h.jsonl"))
    assert result.events == 2
    assert result.reasons == {"bad time": 4, "bad field": 1, "incomplete checkpoint entry": 1}
