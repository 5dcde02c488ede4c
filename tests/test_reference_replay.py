"""Every call of the reference recorder, replayed through ours, gives the same facts as events.

The reference (ml-goodput-measurement 0.2.3) is driven through its own recorder classes with its
test hook, ``cloud_logger``, capturing the Cloud Logging payloads it would write. The same calls
go through our recorder to a file. Each reference payload must have exactly one event of ours
with the same kind, time and values; the events must be schema-valid, in order, none lost, and
one attempt per recorder instance.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ml_goodput_measurement.src import goodput_elastic

from conftest import at
from emitter import ElasticGoodputRecorder
from pipeline.beam.graph import read_lines
from pipeline.core.events import parse_message

# The reference's payload time key for each of our kinds.
TIME_KEY = {
    "job_start": "job_start_time", "job_end": "job_end_time", "step_start": "step_start_time",
    "tpu_init_start": "tpu_init_start_time", "tpu_init_end": "tpu_init_end_time",
    "training_prep_start": "training_prep_start_time", "training_prep_end": "training_prep_end_time",
    "data_loading_start": "data_loading_start_time", "data_loading_end": "data_loading_end_time",
    "custom_badput_start": "custom_badput_event_start_time",
    "custom_badput_end": "custom_badput_event_end_time",
    "elastic_slice_counts": "elastic_slice_counts_timestamp",
    "elastic_wait_start": "elastic_wait_start_time", "elastic_wait_end": "elastic_wait_end_time",
    "elastic_reinit_start": "elastic_reinit_start_time", "elastic_reinit_end": "elastic_reinit_end_time",
}
# Our body field -> the reference's payload field, where they carry the same value.
FIELD = {"step": "step_count", "badput_type": "custom_badput_event_type",
         "event_type": "elastic_wait_event_type", "active_slices": "active_slices",
         "total_slices": "total_slices", "available_slices": "available_slices"}


class CapturingCloudLogger:
    """Stands in for the reference's Cloud Logging writer and keeps its payloads."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    def flush(self) -> None:
        """Writes are synchronous here."""


def reference_trace(seed: int) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """Calls of two attempts (a crash and a restart), every reference method, explicit times."""
    rng = random.Random(seed)
    clock = 0.0

    def now() -> datetime.datetime:
        return at(clock)

    for attempt, (first, last) in enumerate([(0, 140), (100, 220)]):
        calls: list[tuple[str, tuple[Any, ...]]] = [("record_job_start_time", (now(),))]
        for name in ("tpu_init", "training_preparation", "data_loading"):
            calls.append((f"record_{name}_start_time", (now(),)))
            clock += rng.uniform(1, 30)
            calls.append((f"record_{name}_end_time", (now(),)))
        calls.append(("record_elastic_slice_counts", (4, 4, 4, now())))
        for step in range(first, last):
            calls.append(("record_step_start_time", (step, now())))
            clock += rng.uniform(0.2, 3.0)
            if step % 50 == 49:
                calls.append(("record_custom_badput_event_start_time", (now(), "EVAL_STEP")))
                clock += rng.uniform(1, 5)
                calls.append(("record_custom_badput_event_end_time", (now(), "EVAL_STEP")))
                calls.append(("record_checkpoint_progress", (step, now())))
                calls.append(("record_data_loading_start_time", (now(),)))
                clock += rng.uniform(0.1, 1)
                calls.append(("record_data_loading_end_time", (now(),)))
            if step == first + 70:
                calls.append(("record_elastic_wait_start_time", ("slice_down", now())))
                clock += 12.5
                calls.append(("record_elastic_wait_end_time", ("slice_down", now())))
                calls.append(("record_elastic_reinit_start_time", (now(),)))
                clock += 4.25
                calls.append(("record_elastic_reinit_end_time", (now(),)))
                calls.append(("record_elastic_slice_counts", (3, 4, 3, now())))
        if attempt == 1:
            calls.append(("record_job_end_time", (now(),)))
        clock += 300.0  # the outage between attempts
        yield calls


@pytest.mark.parametrize("seed", [1, 2])
def test_reference_calls_replay_to_matching_events(seed: int, tmp_path: Path, make_settings):
    """Each reference payload has one valid event of ours with the same kind, time and values."""
    events_file = tmp_path / "events.jsonl"
    reference_entries: list[list[dict[str, Any]]] = []
    attempt_ids = []
    for calls in reference_trace(seed):
        sink = CapturingCloudLogger()
        theirs = goodput_elastic.ElasticGoodputRecorder(
            "run-7", "goodput_run-7", logging_enabled=True, cloud_logger=sink)
        ours = ElasticGoodputRecorder("run-7", "goodput_run-7", logging_enabled=True,
                                      destination=f"file:{events_file}", settings=make_settings())
        for method, args in calls:
            getattr(theirs, method)(*args)
            getattr(ours, method)(*args)
        assert ours.close()
        assert ours.stats.dropped == 0
        reference_entries.append(sink.entries)
        attempt_ids.append(ours.attempt_id)

    events = []
    for source, line in read_lines(str(events_file)):
        parsed, dead = parse_message(line, source)
        assert not dead, dead
        events.extend(parsed)

    assert len(set(attempt_ids)) == 2
    assert [e.attempt_id for e in events] == sorted(
        (e.attempt_id for e in events), key=attempt_ids.index)  # attempts do not interleave
    for attempt_id, entries in zip(attempt_ids, reference_entries, strict=True):
        ours = [e for e in events if e.attempt_id == attempt_id]
        assert [e.seq for e in ours] == list(range(len(ours)))  # in order, none lost
        assert len(ours) == len(entries)  # record_checkpoint_progress writes nothing in either
        for event, entry in zip(ours, entries, strict=True):
            assert entry["job_name"] == event.run_id
            assert entry[TIME_KEY[event.kind]] == pytest.approx(event.time_us / 1e6, abs=1e-6)
            for ours_name, theirs_name in FIELD.items():
                if ours_name in event.body:
                    assert entry[theirs_name] == event.body[ours_name]
