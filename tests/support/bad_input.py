"""Bad input, one case each: the messages and events the pipeline must dead-letter with their
reasons, beside valid neighbours it must keep."""

from __future__ import annotations

import json
from typing import Any

from goodput_schemas.limits import (
    MAX_EVENTS_PER_MESSAGE,
    MAX_ID_LENGTH,
    MAX_JSON_DEPTH,
    MAX_LABELS,
    MAX_MESSAGE_BYTES,
    MAX_TEXT_LENGTH,
)
from goodput_schemas.wire import encode_batch
from support.runs import (
    T0,
    S,
    micros,
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
