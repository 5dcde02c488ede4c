"""The Dataflow flex template (``dataflow/``): its entry point, its image and its parameters, and
the streaming graph's step names, which a job update (``--update``) matches state by."""

from __future__ import annotations

import importlib.util
import json
import re
from typing import Any

import apache_beam as beam
import pytest
import tomllib

from pipeline.beam.graph import build_pipeline
from pipeline.beam.options import GoodputOptions
from support import REPO

TEMPLATE = REPO / "dataflow"

# The running job's steps. Renaming one (above all the stateful TrackRuns/TrackRun and
# WriteToMonitoring/Gate) makes an in-place update lose its state: keep them, or give the update a
# transform name mapping (README "Deploy", runbook).
STEP_NAMES = [
    "ReadPubSub", "WithSource", "ParseEvents", "ParseEvents/Validate", "Unreported",
    "Unreported/Start", "Unreported/UnreportedRuns", "WithUnreported", "TrackRuns", "TrackRuns/TrackRun",
    "SnapshotRows", "SnapshotRows/Rows", "InputRows", "DeadLetters", "DeadLetterRows", "DeadLetterRows/Rows",
    "AllRows", "WriteToBigQuery", "WriteToBigQuery/InsertPerBundle", "WriteToMonitoring",
    "WriteToMonitoring/ByRun", "WriteToMonitoring/Gate", "WriteToMonitoring/Write",
    "MonitoringDeadLetterRows", "MonitoringDeadLetterRows/Rows", "MonitoringDeadLettersToBigQuery",
    "MonitoringDeadLettersToBigQuery/InsertPerBundle",
]


def load_entry_point():
    spec = importlib.util.spec_from_file_location("template_main", TEMPLATE / "main.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_template_always_streams_on_dataflow():
    entry = load_entry_point()
    assert entry.template_args(["--subscription=projects/p/subscriptions/s"]) == [
        "--subscription=projects/p/subscriptions/s", "--runner=DataflowRunner", "--streaming"]
    given = ["--runner=DirectRunner", "--streaming"]
    assert entry.template_args(given) == given


def streaming_graph_labels() -> list[str]:
    """Every transform's full label, at every depth, of a streaming graph built anew."""
    options = GoodputOptions(["--streaming", "--subscription=projects/goodput-test/subscriptions/pipeline",
                              "--bigquery_dataset=goodput-test:fleet_goodput",
                              "--monitoring_project=goodput-test"])
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, options)
    labels: list[str] = []

    class Labels(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node: Any) -> None:
            labels.append(node.full_label)

        def visit_transform(self, node: Any) -> None:
            labels.append(node.full_label)

    pipeline.visit(Labels())
    return [label for label in labels if label]  # the root has none


def test_the_step_names_of_the_streaming_job_stay_the_same():
    """Built twice, the graph has the same transforms by the same names, none derived from where
    the code is (a lambda's line, an object's address), so an update (``--update``) finds every
    step of the running job; the named steps are the ones listed above."""
    labels = streaming_graph_labels()
    assert labels == streaming_graph_labels()
    assert not [label for label in labels if re.search(r"<lambda|at 0x|\.py:\d", label)]
    assert [label for label in labels if label.count("/") <= 1 and not label.startswith("ReadPubSub/")
            ] == STEP_NAMES


def test_the_image_has_the_beam_and_python_the_project_pins():
    dockerfile = (TEMPLATE / "Dockerfile").read_text()
    python, beam_version = re.search(r"FROM apache/beam_python(3\.\d+)_sdk:(\S+)", dockerfile).groups()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pin = next(d for d in project["dependencies"] if d.startswith("apache-beam"))
    low, high = re.search(r">=([\d.]+),<([\d.]+)", pin).groups()
    version = tuple(map(int, beam_version.split(".")))
    assert tuple(map(int, low.split("."))) <= version < tuple(map(int, high.split(".")))
    assert python == "3.11" and "python311-template-launcher-base" in dockerfile  # one Python


def test_the_image_installs_the_three_distributions():
    """The pipeline, the emitter and the contract are each copied into the image and installed."""
    dockerfile = (TEMPLATE / "Dockerfile").read_text()
    for folder in ("goodput_schemas", "emitter", "pipeline"):
        assert f"COPY {folder}/ {folder}/" in dockerfile
    assert "RUN pip install --no-cache-dir ./goodput_schemas ./emitter .\n" in dockerfile


@pytest.mark.parametrize("parameter", json.loads((TEMPLATE / "metadata.json").read_text())["parameters"])
def test_every_template_parameter_is_a_pipeline_option(parameter):
    assert parameter["name"] in GoodputOptions([]).get_all_options()
    assert parameter["helpText"] and parameter["label"]
