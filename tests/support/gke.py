"""GKE's JobSet metrics as Google writes them, for the Cloud Monitoring stand-in to serve: series on
the ``k8s_entity`` resource, made with the real client's types and preloaded into a ``MetricStore``
(``MetricStore.preload``), since no user can write them."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from google.api import distribution_pb2, metric_pb2
from google.cloud import monitoring_v3

from pipeline.app.gke import METRICS, RESOURCE_TYPE

PROJECT = "gke-project"
GAUGE = metric_pb2.MetricDescriptor.GAUGE
DOUBLE, DISTRIBUTION = metric_pb2.MetricDescriptor.DOUBLE, metric_pb2.MetricDescriptor.DISTRIBUTION
#: Each metric's value type and unit, as GKE's system metrics list gives them.
KINDS = {"scheduling_goodput": (DOUBLE, "1"), "proxy_runtime_goodput": (DOUBLE, "1"),
         "times_between_interruptions": (DISTRIBUTION, "s"), "times_to_recover": (DISTRIBUTION, "s"),
         "uptime": (DOUBLE, "s")}


def stamp(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def jobset_series(metric: str, jobset: str, points: Iterable[tuple[float, Any]], cluster: str = "c1",
                  namespace: str = "training", uid: str = "uid-1", location: str = "us-central1",
                  project: str = PROJECT) -> Any:
    """A ``TimeSeries`` of one of GKE's JobSet metrics (a short name): (end time in seconds since
    the epoch, value) per point, a value being a float or, for a distribution, (count, mean)."""
    value_type, unit = KINDS[metric]
    series = monitoring_v3.TimeSeries(metric_kind=GAUGE, value_type=value_type, unit=unit)
    series.metric.type = METRICS[metric]
    series.resource.type = RESOURCE_TYPE
    series.resource.labels.update({"project_id": project, "location": location, "cluster_name": cluster,
                                   "entity_type": "jobset", "entity_namespace": namespace,
                                   "entity_name": jobset, "entity_uid": uid})
    series.points = [monitoring_v3.Point(interval=monitoring_v3.TimeInterval(end_time=stamp(end)),
                                         value=_typed(value)) for end, value in points]
    return series


def _typed(value: Any) -> Any:
    if isinstance(value, tuple):
        count, mean = value
        distribution = distribution_pb2.Distribution(count=count, mean=mean)
        return monitoring_v3.TypedValue(distribution_value=distribution)
    return monitoring_v3.TypedValue(double_value=value)
