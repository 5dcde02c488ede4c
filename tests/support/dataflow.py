"""The streaming graph as Dataflow would receive it, translated offline: Beam's DataflowRunner
with ``--dry_run=True --no_auth`` builds the portable pipeline it would submit (every step's
coders, state cells and timer domains) and stops there, in about a second, with no cloud.

``stateful_steps`` describes each stateful step: the coders of its input's key and value and of
each state cell (as Beam names a coder: its URN, with its components), and each timer's domain.
Run as a module, it prints that of the stream with every sink, the golden file's content::

    python -m support.dataflow > tests/beam/dataflow_state.json   (from tests/)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

#: The stream with every output a Dataflow job has, for a project that exists nowhere.
STREAM = ["--streaming", "--runner=DataflowRunner", "--dry_run=True", "--no_auth", "--project=goodput-test",
          "--region=us-central1", "--temp_location=gs://goodput-test/tmp",
          "--subscription=projects/goodput-test/subscriptions/pipeline",
          "--bigquery_dataset=goodput-test:fleet_goodput", "--monitoring_project=goodput-test"]
#: A coder Beam pickles: a Python object that only the same code can read back.
PICKLED = "beam:coder:pickled_python:v1"
TIME_DOMAINS = {1: "event_time", 2: "processing_time"}


def translated(arguments: Sequence[str] = STREAM) -> Any:
    """The portable pipeline (``beam_runner_api_pb2.Pipeline``) the DataflowRunner would submit
    for the graph of ``arguments``."""
    import apache_beam as beam

    from pipeline.beam.graph import build_pipeline
    from pipeline.beam.options import GoodputOptions

    options = GoodputOptions(list(arguments))
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, options)
    return pipeline.run().job.proto_pipeline


def stateful_steps(proto: Any) -> dict[str, dict[str, Any]]:
    """Each stateful step of ``proto`` by name: its input's key and value coders, its state cells'
    coders and its timers' domains (see the module docstring)."""
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2

    components = proto.components
    steps = {}
    for transform in components.transforms.values():
        if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
        if not (payload.state_specs or payload.timer_family_specs):
            continue
        [input_id] = [pcollection for tag, pcollection in transform.inputs.items()
                      if tag not in payload.side_inputs]
        key, value = components.coders[components.pcollections[input_id].coder_id].component_coder_ids
        steps[transform.unique_name] = {
            "key": _coder(components, key),
            "value": _coder(components, value),
            "state": {name: _coder(components, _state_coder_id(spec))
                      for name, spec in sorted(payload.state_specs.items())},
            "timers": {name: TIME_DOMAINS[spec.time_domain]
                       for name, spec in sorted(payload.timer_family_specs.items())},
        }
    return dict(sorted(steps.items()))


def _state_coder_id(spec: Any) -> str:
    kind = spec.WhichOneof("spec")
    cell = getattr(spec, kind)
    return cell.coder_id if kind == "read_modify_write_spec" else cell.element_coder_id


def _coder(components: Any, coder_id: str) -> Any:
    """A coder as its URN, or [URN, components...] for one with components."""
    coder = components.coders[coder_id]
    parts = [_coder(components, component) for component in coder.component_coder_ids]
    return [coder.spec.urn, *parts] if parts else coder.spec.urn


def pickled(coder: Any) -> bool:
    """Whether a coder (as ``_coder`` writes it) pickles anything."""
    return coder == PICKLED if isinstance(coder, str) else any(map(pickled, coder))


if __name__ == "__main__":
    print(json.dumps(stateful_steps(translated()), indent=2))
