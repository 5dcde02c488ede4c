"""A run's state in two parts: the hot part every message reads, and the archive of its older
step and observation columns, read only when the engine asks for a sealed value
(``pipeline.core.columns``, ``pipeline.core.state_coder``)."""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import state_coder
from pipeline.core.columns import ArchiveMissing, Column
from pipeline.core.engine import RunState
from pipeline.core.events import Event
from support.steps import S, attempt_events, step_times

WINDOWS = (60, 300)


@dataclasses.dataclass
class CountingArchive:
    """A state's archive, its entries, and how many times they were read."""

    entries: list[bytes] = dataclasses.field(default_factory=list)
    reads: int = 0

    def archive(self) -> state_coder.Archive:
        return state_coder.Archive(self.read)

    def read(self) -> Iterable[bytes]:
        self.reads += 1
        return list(self.entries)

    def store(self, chunks: list[bytes], anew: bool) -> None:
        if anew:
            self.entries.clear()
        self.entries.extend(chunks)


def sealed_and_decoded(state: RunState, archive: CountingArchive, keep: int = 64,
                       chunk: int = 32) -> RunState:
    """``state`` as a stream stores it and another worker reads it back: sealed (small chunks, so
    that a short run has an archive), its hot part encoded, and decoded with ``archive``."""
    archive.store(*state_coder.seal(state, keep=keep, chunk=chunk))
    return state_coder.decode_state(state_coder.encode_state(state), archive.archive())


operations = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(-2**63, 2**63 - 1)),
    st.tuples(st.just("extend"), st.lists(st.integers(-2**40, 2**40), max_size=40)),
    st.tuples(st.just("insert"), st.integers(0, 200), st.integers(-9, 9)),
    st.tuples(st.just("delete"), st.integers(-200, 200)),
    st.tuples(st.just("seal"), st.integers(0, 30), st.integers(1, 16)),
    st.tuples(st.just("replace"), st.lists(st.integers(-9, 9), max_size=50)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(operations, st.lists(st.integers(-5, 60), max_size=8))
def test_a_column_answers_as_the_array_it_replaces_whatever_is_sealed(ops, probes):
    """Appends, inserts, deletions, replacements and seals in any order: the column equals a
    plain array at every step, by index (negative too), slice, bisection and iteration; its
    sealed values come back from the loader, once."""
    column, model, sealed = Column(), array("q"), array("q")
    loads = []

    def load() -> array[int]:
        loads.append(len(sealed))
        return array("q", sealed)

    for op, *args in ops:
        if op == "append":
            column.append(args[0])
            model.append(args[0])
        elif op == "extend":
            column.extend(args[0])
            model.extend(args[0])
        elif op == "insert":
            at = min(args[0], len(model))
            column.insert(at, args[1])
            model.insert(at, args[1])
        elif op == "delete" and model and -len(model) <= args[0] < len(model):
            del column[args[0]]
            del model[args[0]]
        elif op == "replace":
            column[:] = array("q", args[0])
            model[:] = array("q", args[0])
        elif op == "seal":
            if column.moved:  # taken back whole: as a stored state, sealed anew from nothing
                sealed, column = array("q"), Column(model)
            sealed.extend(column.seal(args[0], args[1]))
            column = Column(column.tail)
            column.restore(len(sealed), _edges(sealed), load)
        assert len(column) == len(model)
        for probe in probes:
            if -len(model) <= probe < len(model):
                assert column[probe] == model[probe]
            assert column[probe:] == model[probe:] and column[:probe] == model[:probe]
            ordered = sorted(model)
            sorted_column = Column(ordered)
            assert sorted_column.bisect_right(probe) == sum(value <= probe for value in ordered)
            assert sorted_column.bisect_left(probe) == sum(value < probe for value in ordered)
        assert list(column) == list(model)
    assert len(loads) <= sum(op == "seal" for op, *_ in ops)


def _edges(values: array[int]) -> list[int]:
    return [values[i] for i in sorted({0, 1, len(values) - 1}) if 0 <= i < len(values)]


def test_reading_the_ends_of_a_sealed_column_and_searching_past_them_loads_nothing():
    """The first two and the last sealed values are kept beside the tail; a search for a value
    at or past the last sealed one looks in the tail alone."""
    column = Column(range(0, 1000, 10))
    sealed = column.seal(keep=10, chunk=8)
    restored = Column(column.tail)
    restored.restore(len(sealed), _edges(sealed), load=None)
    assert (restored[0], restored[1], restored[len(sealed) - 1], restored[-1]) == (0, 10, sealed[-1], 990)
    assert restored.bisect_right(985) == 99 and restored.bisect_left(986) == 99
    assert restored.bisect_right(sealed[-1]) == len(sealed)
    with pytest.raises(ArchiveMissing):
        _ = restored[5]  # a sealed value: only the archive has it


def fleet_events(steps: int, attempt_id: str = "a", first_step: int = 0, start_us: int | None = None,
                 seed: int = 0) -> list[Event]:
    """An attempt's job start, step starts and a model-metrics event per step."""
    times = step_times(steps, 1.0, seed=seed, compile_s=5.0,
                       **({} if start_us is None else {"start_us": start_us}))
    events = attempt_events(attempt_id, times, first_step=first_step)
    metrics = [Event("run", attempt_id, len(events) + k, t + S // 2, "model_metrics", {"loss": 1.0 / (k + 1)})
               for k, t in enumerate(times)]
    return events + metrics


def state_of(events: Iterable[Event]) -> RunState:
    state = RunState("run")
    state.add_all(events)
    return state


def test_a_decoded_state_gives_every_snapshot_of_the_state_it_was_and_keeps_its_archive_apart():
    """Sealed, encoded and decoded, then given the next steps: snapshots equal those of the
    state that was never stored, and the archive is never read: the step statistics and the
    detector go on from where they were encoded."""
    events = fleet_events(2_000)
    stored, archive = state_of(events[:500]), CountingArchive()
    stored.snapshot(events[499].time_us, WINDOWS)
    stored.add_all(events[500:1_500])
    stored.snapshot(events[1_499].time_us, WINDOWS)  # the timeline advanced: no step scanned again
    decoded = sealed_and_decoded(stored, archive)
    assert decoded.attempts["a"].steps.archived > 0
    whole = state_of(events)
    for event in events[1_500:]:
        decoded.add(event)
    as_of = max(event.time_us for event in events)
    assert decoded.snapshot(as_of, WINDOWS) == whole.snapshot(as_of, WINDOWS)
    assert archive.reads == 0


def test_a_late_step_inside_the_sealed_stretch_takes_the_column_back_and_the_archive_is_written_anew():
    """A step that arrives late, before the sealed values: the archive is read, the numbers are
    those of the whole run, and the next seal replaces the archive rather than adding to it."""
    events = fleet_events(600)
    late = next(e for e in events if e.kind == "step_start" and e.body["step"] == 10)
    rest = [e for e in events if e is not late]
    archive = CountingArchive()
    decoded = sealed_and_decoded(state_of(rest), archive)
    decoded.add(late)
    as_of = max(event.time_us for event in events)
    assert decoded.snapshot(as_of, WINDOWS) == state_of(events).snapshot(as_of, WINDOWS)
    assert archive.reads == 1
    chunks, anew = state_coder.seal(decoded, keep=64, chunk=32)
    assert anew and chunks
    archive.store(chunks, anew)
    again = state_coder.decode_state(state_coder.encode_state(decoded), archive.archive())
    assert again.snapshot(as_of, WINDOWS) == state_of(events).snapshot(as_of, WINDOWS)


def test_a_restart_that_reruns_sealed_steps_has_the_numbers_of_the_whole_run():
    """A second attempt resumes from a step the first ran long ago (sealed): its wasted progress
    reads the archive, and the snapshot is the whole run's."""
    first = fleet_events(800)
    restart_us = max(e.time_us for e in first) + 60 * S
    second = fleet_events(300, attempt_id="b", first_step=100, start_us=restart_us + 20 * S, seed=1)
    second[0] = dataclasses.replace(second[0], time_us=restart_us)
    archive = CountingArchive()
    decoded = sealed_and_decoded(state_of(first), archive)
    for event in second:
        decoded.add(event)
    as_of = max(e.time_us for e in second)
    expected = state_of(first + second).snapshot(as_of, WINDOWS)
    assert decoded.snapshot(as_of, WINDOWS) == expected
    assert expected is not None and expected.disruptions and expected.disruptions[0].wasted_progress_s > 0


def test_chunks_that_do_not_follow_each_other_are_refused():
    state = state_of(fleet_events(300))
    chunks, _ = state_coder.seal(state, keep=64, chunk=32)
    missing_first = state_coder.Archive(lambda: chunks[1:])
    decoded = state_coder.decode_state(state_coder.encode_state(state), missing_first)
    with pytest.raises(ValueError, match="do not follow each other"):
        decoded.snapshot(10**18, WINDOWS)


def test_a_state_without_an_archive_round_trips_and_one_of_the_version_before_is_refused():
    """Nothing sealed: the hot part holds everything, and encodes again to the same bytes; a
    state the version before the archive encoded (GPS1) is refused with what to do."""
    state = state_of(fleet_events(200))
    data = state_coder.encode_state(state)
    decoded = state_coder.decode_state(data)
    assert state_coder.encode_state(decoded) == data
    assert decoded.snapshot(10**18, WINDOWS) == state.snapshot(10**18, WINDOWS)
    with pytest.raises(ValueError, match="drain the job and launch it again"):
        state_coder.decode_state(b"GPS1" + data[4:])


def test_observations_older_than_the_tail_are_forgotten_and_a_copy_of_one_is_a_redelivery():
    """Of a heartbeat or model-metrics event older than the tail, a sealed state keeps only its
    seq: a conflicting copy of one is taken for a redelivery (a state that keeps it calls it a
    conflict), and the run's numbers are the same."""
    events = fleet_events(600)
    old = next(e for e in events if e.kind == "model_metrics")
    copy = dataclasses.replace(old, body={"loss": 99.0})
    whole, conflicts = state_of(events), []
    assert not whole.add(copy, conflicts) and len(conflicts) == 1
    decoded, conflicts = sealed_and_decoded(state_of(events), CountingArchive()), []
    assert len(decoded.attempts["a"].obs_seqs) < 600
    assert not decoded.add(copy, conflicts) and conflicts == []
    as_of = max(event.time_us for event in events)
    assert decoded.snapshot(as_of, WINDOWS) == whole.snapshot(as_of, WINDOWS)


def test_a_week_long_window_of_a_sealed_state_is_exact_and_reads_no_archive():
    """Windows are figures of the classified timeline, which a sealed state keeps whole: a
    7-day window of a run of 30,000 steps (with checkpoints) decoded from its hot part equals the
    whole state's, without the archive."""
    events = fleet_events(30_000)
    ends = [e for e in events if e.kind == "step_start" and e.body["step"] % 1000 == 999]
    saves = [Event("run", "a", 10**6 + k, e.time_us + S // 4, "checkpoint_save",
                   {"step": e.body["step"], "blocking_s": 2.0}) for k, e in enumerate(ends)]
    week = (7 * 86_400,)
    whole, stored, archive = state_of(events + saves), state_of(events + saves), CountingArchive()
    as_of = max(event.time_us for event in events) + 10 * S
    for state in (whole, stored):  # the stream snapshots a run before it compacts it
        state.snapshot(as_of - 20 * S, week)
    decoded = sealed_and_decoded(stored, archive, keep=256, chunk=1024)
    expected = whole.snapshot(as_of, week)
    assert expected is not None and expected.windows[0] is not None
    assert decoded.snapshot(as_of, week) == expected
    assert archive.reads == 0
