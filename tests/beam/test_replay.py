"""The batch replay on Beam's DirectRunner."""

from __future__ import annotations


def test_a_replay_on_the_direct_runner_goes_straight_to_the_fn_api_runner():
    """The default runner skips the DirectRunner's attempt at Prism (a download at run time)."""
    from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

    from pipeline.beam.launcher import _batch_runner
    from pipeline.beam.options import GoodputOptions

    assert isinstance(_batch_runner(GoodputOptions([])), FnApiRunner)
    assert isinstance(_batch_runner(GoodputOptions(["--runner=DirectRunner"])), FnApiRunner)
    assert _batch_runner(GoodputOptions(["--runner=DataflowRunner"])) is None
