"""Every call of the reference recorder, replayed through ours, gives the same facts as events.

The reference (ml-goodput-measurement 0.2.3, in its own venv through ``support.reference``) is
driven through its own recorder classes with its test hook, ``cloud_logger``, capturing the Cloud
Logging payloads it would write. The same calls
go through our recorder to a file. Each reference payload must have exactly one event of ours
with the same kind, time and values; the events must be schema-valid, in order, none lost, and
one attempt per recorder instance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emitter import ElasticGoodputRecorder
from pipeline.core.events import parse_message, read_lines
from support.reference import FIELD, TIME_KEY, reference_payloads, reference_trace


@pytest.mark.parametrize("seed", [1, 2])
def test_reference_calls_replay_to_matching_events(seed: int, tmp_path: Path, make_settings):
    """Each reference payload has one valid event of ours with the same kind, time and values."""
    events_file = tmp_path / "events.jsonl"
    reference_entries: list[list[dict[str, Any]]] = []
    attempt_ids = []
    for calls in reference_trace(seed):
        ours = ElasticGoodputRecorder("run-7", "goodput_run-7", logging_enabled=True,
                                      destination=f"file:{events_file}", settings=make_settings())
        for method, args in calls:
            getattr(ours, method)(*args)
        assert ours.close()
        assert ours.stats.dropped == 0
        reference_entries.append(reference_payloads([calls], job_name="run-7"))  # a recorder of its own
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
