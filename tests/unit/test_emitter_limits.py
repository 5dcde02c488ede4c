"""The emitter holds a job to the pipeline's limits (``goodput_schemas.limits``) at the call, so
that nothing a job records is dead-lettered later, where nobody looks: what the parser would
refuse is recorded nothing of (counted in ``stats.invalid_calls``, logged once; a strict recorder
raises ``ValueError``), and the largest values it accepts the parser accepts too.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

import pytest

from emitter import EmitterSettings, GoodputRecorder
from emitter.testing import capture_events
from goodput_schemas.limits import (
    MAX_CHIP_COUNT,
    MAX_COUNT,
    MAX_EVENTS_PER_MESSAGE,
    MAX_ID_LENGTH,
    MAX_LABELS,
    MAX_MESSAGE_BYTES,
    MAX_SLICE_COUNT,
    MAX_TEXT_LENGTH,
)
from goodput_schemas.wire import encode_batches
from pipeline.core.events import parse_batch
from support.runs import at

UTC = datetime.timezone.utc
LONG = "x" * (MAX_TEXT_LENGTH + 1)

Call = Callable[[GoodputRecorder], None]
CALLS: list[tuple[str, Call, str]] = [
    ("a badput type over MAX_TEXT_LENGTH",
     lambda r: r.record_custom_badput_event_start_time(at(0), LONG), "MAX_TEXT_LENGTH"),
    ("a badput type with a control character",
     lambda r: r.record_custom_badput_event_end_time(at(0), "eval\x1b[2J"), "printable"),
    ("an elastic wait type with a newline",
     lambda r: r.record_elastic_wait_start_time("slice\ndown", at(0)), "printable"),
    ("a time before 2000", lambda r: r.record_step_start_time(1, datetime.datetime(1999, 12, 31, tzinfo=UTC)),
     "2000-01-01..2200-01-01"),
    ("a time after 2200", lambda r: r.record_job_end_time(datetime.datetime(2200, 1, 1, tzinfo=UTC)),
     "2000-01-01..2200-01-01"),
    ("a step past MAX_COUNT", lambda r: r.record_step_start_time(MAX_COUNT + 1, at(0)),
     "MAX_COUNT"),
    ("a checkpoint step past MAX_COUNT",
     lambda r: r.record_checkpoint_save(MAX_COUNT + 1, at(0), at(1)), "MAX_COUNT"),
    ("a slice count past MAX_SLICE_COUNT",
     lambda r: r.record_elastic_slice_counts(MAX_SLICE_COUNT + 1, 1, 1, at(0)), "MAX_SLICE_COUNT"),
    ("more active slices than slices",
     lambda r: r.record_elastic_slice_counts(3, 2, 2, at(0)), "at most total_slices"),
]


@pytest.mark.parametrize(("call", "message"), [case[1:] for case in CALLS], ids=[case[0] for case in CALLS])
def test_what_the_pipeline_would_dead_letter_is_refused_at_the_call(make_recorder, call, message):
    """A value the parser would dead-letter records nothing and is counted; on a strict recorder
    it raises ValueError at the call, naming the limit."""
    recorder = make_recorder()
    call(recorder)
    assert (recorder.stats.recorded, recorder.stats.invalid_calls) == (0, 1)
    strict = make_recorder(strict=True)
    with pytest.raises(ValueError, match=message):
        call(strict)
    assert strict.stats.recorded == 0


METADATA: list[tuple[str, dict[str, Any], str]] = [
    ("a run id over MAX_ID_LENGTH", {"job_name": "r" * (MAX_ID_LENGTH + 1)}, "printable characters"),
    ("a run id over MAX_ID_BYTES", {"job_name": "é" * 257 + "€" * 171}, "MAX_ID_BYTES"),
    ("a run id with a control character", {"job_name": "run\x00"}, "printable characters"),
    ("a run id with a bidi override", {"job_name": "run\u202e"}, "printable characters"),
    ("an empty run id", {"job_name": ""}, "missing or empty"),
    ("more than MAX_LABELS labels", {"labels": {f"k{i}": "v" for i in range(MAX_LABELS + 1)}}, "MAX_LABELS"),
    ("a label key with a tab", {"labels": {"team\t": "a"}}, "printable"),
    ("a label value over MAX_TEXT_LENGTH", {"labels": {"team": LONG}}, "MAX_TEXT_LENGTH"),
    ("a label value with a lone surrogate", {"labels": {"team": "\ud800"}}, "lone surrogate"),
    ("a run group over MAX_TEXT_LENGTH", {"run_group": LONG}, "MAX_TEXT_LENGTH"),
    ("an accelerator type with a newline", {"accelerator_type": "v5p\n"}, "printable"),
    ("a location with an escape", {"location": "us-central1\x1b"}, "printable"),
    ("a chip count past MAX_CHIP_COUNT", {"chip_count": MAX_CHIP_COUNT + 1}, "MAX_CHIP_COUNT"),
    ("an ideal step time of millennia", {"configured_ideal_step_time": 1e12}, "at most"),
]


@pytest.mark.parametrize(("metadata", "message"), [case[1:] for case in METADATA],
                         ids=[case[0] for case in METADATA])
def test_run_metadata_the_pipeline_would_dead_letter_is_refused_at_construction(make_settings, metadata,
                                                                               message):
    """Run metadata the parser would dead-letter raises ValueError when a strict recorder is
    built (a lenient one leaves it out, logged)."""
    arguments = {"job_name": "run", **metadata}
    with pytest.raises(ValueError, match=message):
        GoodputRecorder(arguments.pop("job_name"), logging_enabled=True, destination="file:/dev/null",
                        settings=make_settings(), strict=True, **arguments)


def test_a_batch_larger_than_the_pipeline_reads_is_refused_in_the_settings():
    """max_batch_events above MAX_EVENTS_PER_MESSAGE is refused when the settings are built."""
    EmitterSettings(max_batch_events=MAX_EVENTS_PER_MESSAGE)
    with pytest.raises(ValueError, match="MAX_EVENTS_PER_MESSAGE"):
        EmitterSettings(max_batch_events=MAX_EVENTS_PER_MESSAGE + 1)


def parsed(data: bytes) -> int:
    """How many events the parser keeps of a message; it must dead-letter none."""
    batch, dead = parse_batch(data)
    assert not dead, [letter.reason for letter in dead]
    assert batch is not None
    return len(batch)


def test_the_largest_values_the_emitter_takes_the_pipeline_takes(make_settings):
    """Ids, names and labels at their limits, the extreme times (the earliest, and now) and the
    largest counts all pass the parser without a dead letter."""
    name = "é" * MAX_TEXT_LENGTH
    labels = {f"{i:03d}" + "k" * (MAX_TEXT_LENGTH - 3): "line one\nline two\u2028" + "ü" * 200
              for i in range(MAX_LABELS)}
    with capture_events() as captured:
        recorder = GoodputRecorder("r" * MAX_ID_LENGTH, logging_enabled=True, settings=make_settings(),
                                   run_group=name, accelerator_type=name, location=name, labels=labels,
                                   chip_count=MAX_CHIP_COUNT, configured_ideal_step_time=1e-6)
        recorder.record_job_start_time(datetime.datetime(2000, 1, 1, tzinfo=UTC))
        recorder.record_step_start_time(MAX_COUNT, datetime.datetime.now(UTC))
        recorder.record_custom_badput_event_start_time(at(0), name)
        recorder.record_elastic_slice_counts(MAX_SLICE_COUNT, MAX_SLICE_COUNT, MAX_SLICE_COUNT, at(1))
        recorder.record_model_metrics(7, loss=float("nan"), mfu=float("inf"), time_=at(2))
        recorder.close()
    assert sum(parsed(message.data) for message in captured.messages) == 5


def test_a_batch_over_the_message_limit_is_sent_as_several_messages_the_pipeline_reads(make_settings):
    """A batch whose JSON passes MAX_MESSAGE_BYTES goes as several messages, each within the
    limit and read whole by the parser; together they carry every event once."""
    events = MAX_EVENTS_PER_MESSAGE
    with capture_events() as captured:
        recorder = GoodputRecorder("run", logging_enabled=True,
                                   settings=make_settings(max_batch_events=events, max_queue_events=events,
                                                          max_latency_s=30))
        for step in range(events):  # 100,000 model metrics with every field: about 20 MB of JSON
            recorder.record_model_metrics(step, loss=1.0 / (step + 1), step_time_s=1.2345678901234,
                                          tokens_per_s=123456.789012, samples_per_s=98765.4321098,
                                          mfu=0.412345678901, tflops_per_device=432.109876543, time_=at(step))
        assert recorder.close(timeout=60)
    sizes = [len(message.data) for message in captured.messages]
    assert len(sizes) > 1 and max(sizes) <= MAX_MESSAGE_BYTES
    assert sum(parsed(message.data) for message in captured.messages) == events
    seqs = [event["seq"] for message in captured.messages for event in json.loads(message.data)["events"]]
    assert seqs == list(range(events))
    assert recorder.stats.sent == events and recorder.stats.messages_sent == len(sizes)


def test_messages_are_split_in_order_at_any_limit():
    """encode_batches keeps seq order and every message within the limit, or of one event when
    one event is over it."""
    records = [(seq, 1_800_000_000_000_000 + seq, "heartbeat", {}) for seq in range(1000)]
    for limit in (MAX_MESSAGE_BYTES, 5000, 700, 1):
        messages = encode_batches("run", "a", records, max_bytes=limit)
        # Within the limit, or a single event (one heartbeat's message is about 130 bytes).
        assert all(len(m.data) <= limit or m.first_seq == m.last_seq for m in messages)
        assert [e["seq"] for m in messages for e in json.loads(m.data)["events"]] == list(range(1000))
    assert len(encode_batches("run", "a", records)) == 1
