"""The streaming graph as Dataflow would receive it, translated offline (``support.dataflow``):
what an update (``--update``) can carry, and which timers hold a drain.

On Dataflow every processing-time timer holds the watermark, so a drain waits for it: none may
be upstream of the run tracker or beside it, and the tracker's one (its interval snapshot, set
only by a message: ``test_live``) fires within an interval. An update carries a stateful step's
state only if its coders are the same: none may pickle (a class's code changed since could not
read it back), and a change of any of them is a change of ``dataflow_state.json``, made on
purpose: a job that ran the old graph is drained and launched again, not updated (README,
"Deploy")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.beam.options import UsageError, parse_command_line
from support.dataflow import STREAM, pickled, stateful_steps, translated

GOLDEN = Path(__file__).with_name("dataflow_state.json")
TRACKER = "TrackRuns/TrackRun/ParDo(TrackRunDoFn)"


@pytest.fixture(scope="module")
def proto():
    return translated()


def test_the_stateful_steps_coders_and_timers_are_the_golden_files(proto):
    steps = stateful_steps(proto)
    assert steps == json.loads(GOLDEN.read_text()), (
        "a stateful step's coders or timers changed: a running job cannot be updated to this graph. "
        "If that is meant, write the new file (python -m support.dataflow, from tests/) and say in the "
        f"change that jobs are drained and launched again. Now:\n{json.dumps(steps, indent=2)}")


def test_no_stateful_step_pickles_its_key_or_its_state(proto):
    steps = stateful_steps(proto)
    assert set(steps) == {TRACKER, "WriteToMonitoring/Gate"}
    for name, step in steps.items():
        assert not pickled(step["key"]), name
        assert not [cell for cell, coder in step["state"].items() if pickled(coder)], name


def test_no_processing_time_timer_is_upstream_of_the_tracker_or_beside_it_and_one_is_in_it(proto):
    steps = stateful_steps(proto)
    assert [timer for timer, domain in steps[TRACKER]["timers"].items() if domain == "processing_time"] == [
        "ts-snapshot"]
    after = downstream(proto, TRACKER)
    held = {name for name, step in steps.items()
            if name != TRACKER and "processing_time" in step["timers"].values()}
    assert held <= after and "WriteToMonitoring/Gate" in held


@pytest.mark.parametrize("more", [["--no_restore"], ["--no_raw_events"]])
def test_a_stream_that_restores_nothing_has_the_same_stateful_steps(more):
    assert stateful_steps(translated([*STREAM, *more])) == json.loads(GOLDEN.read_text())


def test_the_gke_import_is_not_part_of_the_stream():
    """It was a processing-time timer re-armed for ever, so a drain never ended: the options are
    refused, and the import is a scheduled command (``goodput import gke-metrics``)."""
    with pytest.raises(UsageError, match="goodput import gke-metrics"):
        parse_command_line([*STREAM, "--gke_metrics_project=gke-project"])


def downstream(proto, name: str) -> set[str]:
    """The leaf steps that consume, directly or not, what step ``name`` outputs."""
    transforms = proto.components.transforms
    leaves = {t.unique_name: t for t in transforms.values() if not t.subtransforms}
    consumers: dict[str, list[str]] = {}
    for leaf in leaves.values():
        for pcollection in leaf.inputs.values():
            consumers.setdefault(pcollection, []).append(leaf.unique_name)
    found, pending = set(), [name]
    while pending:
        for pcollection in leaves[pending.pop()].outputs.values():
            for consumer in consumers.get(pcollection, []):
                if consumer not in found:
                    found.add(consumer)
                    pending.append(consumer)
    return found
