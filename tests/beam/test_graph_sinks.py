"""How the graph's sinks treat what they cannot write, by runner: fail the work item where the
runner retries it (Dataflow), never on the local DirectRunner family, where a failed bundle stops
the pipeline (``pipeline.beam.transforms.WriteToBigQuery``, ``WriteToMonitoring``)."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

from pipeline.beam.graph import build_pipeline
from pipeline.beam.options import GoodputOptions
from pipeline.beam.transforms import WriteToBigQuery, WriteToMonitoring

STREAM = ["--streaming", "--subscription=projects/goodput-test/subscriptions/pipeline", "--no_restore",
          "--bigquery_dataset=goodput-test:fleet_goodput", "--monitoring_project=goodput-test"]


@pytest.mark.parametrize(("runner", "fails"), [
    (None, False), ("DirectRunner", False), ("BundleBasedDirectRunner", False), ("DataflowRunner", True)])
def test_the_sinks_fail_work_items_only_where_the_runner_retries_them(runner, fails):
    """The stream's three sinks (rows, points, the points' dead letters) fail a bundle on Dataflow
    and never on a local runner."""
    options = GoodputOptions([*STREAM, *([f"--runner={runner}"] if runner else [])])
    pipeline = beam.Pipeline(runner=FnApiRunner(), options=options)  # built, never run
    build_pipeline(pipeline, options)
    sinks: list[bool] = []

    class Sinks(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node: Any) -> None:
            if isinstance(node.transform, (WriteToBigQuery, WriteToMonitoring)):
                sinks.append(node.transform.fail_work_items)

    pipeline.visit(Sinks())
    assert sinks == [fails] * 3
