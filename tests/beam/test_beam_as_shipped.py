"""The run tracker's tests on Beam as shipped: none of the local runner's patches installed
(``pipeline.beam.direct_runner``, ``GOODPUT_BEAM_AS_SHIPPED=1``), so that what the tracker does
never rests on them."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from pipeline.beam.direct_runner import AS_SHIPPED_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
#: Beam starts and runs about fifteen streaming pipelines: ten seconds on a quiet machine.
TIMEOUT_S = 600


def test_the_run_tracker_tests_pass_on_beam_as_shipped(tmp_path: Path):
    """tests/beam/test_live.py, in a process of its own with no patch installed (its report's
    header says so): every test passes."""
    report = tmp_path / "live.xml"
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider",
         f"--junitxml={report}", "tests/beam/test_live.py"],
        cwd=ROOT, env={**os.environ, AS_SHIPPED_VARIABLE: "1"}, capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False)
    output = completed.stdout + completed.stderr
    assert report.exists(), output
    assert f"as shipped ({AS_SHIPPED_VARIABLE}=1)" in output, output
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcomes = {case.get("name"): "passed" if len(case) == 0 else case[0].tag for case in cases}
    assert len(outcomes) >= 15 and set(outcomes.values()) == {"passed"}, output
