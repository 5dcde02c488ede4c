"""The run tracker's tests on Beam as shipped: none of the local runner's patches installed
(``pipeline.beam.direct_runner``, ``GOODPUT_BEAM_AS_SHIPPED=1``), so that what the tracker does
never rests on them."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from pipeline.beam.direct_runner import AS_SHIPPED_VARIABLE, METRICS

ROOT = Path(__file__).resolve().parents[2]
#: The tracker's tests that measure through something only a patch makes right, and the patch:
#: on Beam as shipped they fail. Beam as shipped commits a step's counters for the first bundle
#: on each of its threads only, so the bytes that 200 bundles wrote cannot be counted there.
NEEDS_PATCHES = {"test_state_written_per_message_is_the_message_not_the_history": METRICS}
#: Beam starts and runs about fifteen streaming pipelines: ten seconds on a quiet machine.
TIMEOUT_S = 600


def test_the_run_tracker_tests_pass_on_beam_as_shipped(tmp_path: Path):
    """tests/beam/test_live.py, in a process of its own with no patch installed: every test
    passes but those that name the patch they measure through, which fail (so the patches were
    off, and a test that no longer needs one is taken off the list)."""
    report = tmp_path / "live.xml"
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         f"--junitxml={report}", "tests/beam/test_live.py"],
        cwd=ROOT, env={**os.environ, AS_SHIPPED_VARIABLE: "1"}, capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False)
    output = completed.stdout + completed.stderr
    assert report.exists(), output
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcomes = {case.get("name"): "passed" if len(case) == 0 else case[0].tag for case in cases}
    assert len(outcomes) > len(NEEDS_PATCHES), output
    assert {name for name, outcome in outcomes.items() if outcome != "passed"} == set(NEEDS_PATCHES), output
