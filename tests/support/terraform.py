"""Cross-checks of a Terraform plan (``terraform show -json``) against the rest of the project:
the tables and views are the ones in ``goodput_schemas/``, the topic schema is the event schema, every
metric a dashboard or alert uses is one the pipeline writes (with labels it sets), the Dataflow
job's parameters are pipeline options of its template, and IAM is least privilege.

Each check returns the problems it found, as sentences; none means it passed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from google.cloud import monitoring_dashboard_v1
from google.protobuf import json_format

from goodput_schemas import EVENT_PROTO, table_names, table_options, table_schema, views
from pipeline.beam.options import GoodputOptions
from pipeline.sinks.monitoring import METRICS, OPTIONAL_LABEL, resource_of
from support import REPO

TEMPLATE_METADATA = REPO / "dataflow" / "metadata.json"

#: Google Cloud's own metrics the pipeline's self-monitoring may use, with their resource type.
CLOUD_METRICS = {
    "pubsub.googleapis.com/subscription/num_undelivered_messages": "pubsub_subscription",
    "pubsub.googleapis.com/subscription/oldest_unacked_message_age": "pubsub_subscription",
    "dataflow.googleapis.com/job/system_lag": "dataflow_job",
    "dataflow.googleapis.com/job/is_failed": "dataflow_job",
}
#: The roles the pipeline may hold on the whole project; everything else is granted on a resource.
PROJECT_ROLES = {"roles/dataflow.worker", "roles/monitoring.metricWriter"}
PRIMITIVE_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}

Plan = dict[str, Any]


def resources(plan: Plan, type_: str | None = None) -> Iterator[dict[str, Any]]:
    """The planned resources of the root module (of one type, if given)."""
    for resource in plan["planned_values"]["root_module"].get("resources", []):
        if type_ is None or resource["type"] == type_:
            yield resource


def resource_changes(plan: Plan, type_: str) -> Iterator[dict[str, Any]]:
    """The planned changes (``after`` and ``after_unknown``) of the resources of one type."""
    for change in plan.get("resource_changes", []):
        if change["type"] == type_ and change["mode"] == "managed":
            yield change["change"]


def configured(plan: Plan) -> Iterator[dict[str, Any]]:
    """The resources as configured (expressions and references) in the root module."""
    yield from plan["configuration"]["root_module"].get("resources", [])


# -- BigQuery and Pub/Sub schemas -----------------------------------------------------------------

def check_tables(plan: Plan) -> list[str]:
    """Every table of ``goodput_schemas/tables/`` with its JSON schema, partitioning and clustering; every
    view of ``goodput_schemas/views/``; nothing else."""
    problems: list[str] = []
    project = plan["variables"]["project_id"]["value"]
    dataset = plan["variables"]["dataset_id"]["value"]
    expected_views = views(f"`{project}.{dataset}`")
    tables, seen_views = set(), set()
    for resource in resources(plan, "google_bigquery_table"):
        values, name = resource["values"], resource["values"]["table_id"]
        if values.get("view"):
            seen_views.add(name)
            if values["view"][0]["query"] != expected_views.get(name):
                problems.append(f"view {name}: its query is not goodput_schemas/views/{name}.sql")
            continue
        tables.add(name)
        if name not in table_names():
            problems.append(f"table {name} has no schema in goodput_schemas/tables/")
            continue
        if json.loads(values["schema"]) != table_schema(name):
            problems.append(f"table {name}: its schema is not goodput_schemas/tables/{name}.json")
        options = table_options(name)
        if (values.get("clustering") or []) != options["cluster"]:
            problems.append(f"table {name}: clustered on {values.get('clustering')}, "
                            f"not {options['cluster']}")
        partitioned = [p.get("field") for p in values.get("time_partitioning") or []]
        if partitioned != ([options["partition_field"]] if options["partition_field"] else []):
            problems.append(f"table {name}: partitioned on {partitioned}, not {options['partition_field']}")
    problems += [f"table {name} of goodput_schemas/tables/ is missing"
                 for name in set(table_names()) - tables]
    problems += [f"view {name} of goodput_schemas/views/ is missing"
                 for name in set(expected_views) - seen_views]
    return problems


def check_topic_schema(plan: Plan) -> list[str]:
    """The events topic enforces ``goodput_schemas/goodput_event.proto`` on JSON messages."""
    schemas = list(resources(plan, "google_pubsub_schema"))
    if len(schemas) != 1:
        return [f"expected one Pub/Sub schema, found {len(schemas)}"]
    values = schemas[0]["values"]
    problems = []
    if (values["type"], values["definition"]) != ("PROTOCOL_BUFFER", EVENT_PROTO.read_text()):
        problems.append("the Pub/Sub schema is not goodput_schemas/goodput_event.proto")
    topics = [t["values"] for t in resources(plan, "google_pubsub_topic")
              if t["values"].get("schema_settings")]
    if [t["schema_settings"][0]["encoding"] for t in topics] != ["JSON"]:
        problems.append("exactly one topic, the events topic, must enforce the schema on JSON messages")
    return problems


# -- Metrics ------------------------------------------------------------------------------------

_METRIC = re.compile(r'metric\.type\s*=\s*"([^"]+)"')
_RESOURCE_TYPE = re.compile(r'resource\.type\s*=\s*"([^"]+)"')
_LABEL = re.compile(r"\b(metric|resource)\.labels?\.(\w+)")
_PROMQL_NAME = re.compile(r'"__name__"\s*=\s*"([^"]+)"')
_PROMQL_MATCHER = re.compile(r'"?(\w+)"?\s*(?:=~|!~|!=|=)\s*"')
_PROMQL_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def check_query(query: str, group_by: list[str] | tuple[str, ...] = ()) -> list[str]:
    """One monitoring filter (with the fields it groups by): its metrics are written by the
    pipeline or are Google Cloud's, on their resource, with labels they have."""
    problems = []
    text = " ".join([query, *group_by])
    metrics = _METRIC.findall(query)
    resource_types = set(_RESOURCE_TYPE.findall(query))
    if not metrics:
        return [f"no metric.type in filter {query!r}"]
    for metric in metrics:
        if metric in CLOUD_METRICS:
            if resource_types != {CLOUD_METRICS[metric]}:
                problems.append(f"{metric} is a metric of resource {CLOUD_METRICS[metric]}: {query!r}")
            continue
        if metric not in METRICS:
            problems.append(f"no pipeline writes metric {metric}")
            continue
        resource, resource_labels = resource_of(metric)
        if resource_types - {resource}:
            problems.append(f"{metric} is written on {resource}, not {sorted(resource_types)}")
        for kind, label in _LABEL.findall(text):
            known = resource_labels if kind == "resource" else METRICS[metric] | {OPTIONAL_LABEL}
            if label not in known:
                problems.append(f"{metric} has no {kind} label {label}")
    return problems


def check_promql(query: str) -> list[str]:
    """A PromQL alert: its metrics are the pipeline's, with their labels or the resource's."""
    names = _PROMQL_NAME.findall(query)
    if not names:
        return [f"no \"__name__\" matcher in PromQL {query!r}"]
    problems = [f"no pipeline writes metric {name}" for name in names if name not in METRICS]
    known = {OPTIONAL_LABEL, "__name__", "monitored_resource"}
    for name in names:
        known |= METRICS.get(name, frozenset()) | resource_of(name)[1]
    used = set(_PROMQL_MATCHER.findall(query))
    for group in _PROMQL_BY.findall(query):
        used |= {label.strip() for label in group.split(",") if label.strip()}
    problems += [f"PromQL label {label} is not set on {names}" for label in sorted(used - known)]
    return problems


def dashboard_queries(dashboard: Any) -> Iterator[list[str]]:
    """The problems of every filter (with the fields it groups by) and PromQL query of a
    dashboard's JSON."""
    if isinstance(dashboard, dict):
        if isinstance(dashboard.get("filter"), str):
            yield check_query(dashboard["filter"], dashboard.get("aggregation", {}).get("groupByFields", []))
        if isinstance(dashboard.get("prometheusQuery"), str):
            yield check_promql(dashboard["prometheusQuery"])
        for value in dashboard.values():
            yield from dashboard_queries(value)
    elif isinstance(dashboard, list):
        for value in dashboard:
            yield from dashboard_queries(value)


def check_monitoring(plan: Plan) -> list[str]:
    """The dashboards parse as Cloud Monitoring ``Dashboard``s, and every metric they and the
    alert policies use is checked by ``check_query`` or ``check_promql``."""
    problems = []
    dashboards = list(resources(plan, "google_monitoring_dashboard"))
    if not dashboards:
        problems.append("no dashboard")
    for resource in dashboards:
        text = resource["values"]["dashboard_json"]
        try:
            monitoring_dashboard_v1.Dashboard.from_json(text)
        except (json_format.ParseError, ValueError) as error:
            problems.append(f"dashboard {resource['name']} is not a Dashboard: {error}")
            continue
        for found in dashboard_queries(json.loads(text)):
            problems += [f"dashboard {resource['name']}: {p}" for p in found]
    for resource in resources(plan, "google_monitoring_alert_policy"):
        for condition in resource["values"]["conditions"]:
            for threshold in condition.get("condition_threshold") or []:
                group_by = [field for aggregation in threshold.get("aggregations") or []
                            for field in aggregation.get("group_by_fields") or []]
                problems += [f"alert {resource['name']}: {p}"
                             for p in check_query(threshold["filter"], group_by)]
            for promql in condition.get("condition_prometheus_query_language") or []:
                problems += [f"alert {resource['name']}: {p}" for p in check_promql(promql["query"])]
    return problems


# -- Dataflow -----------------------------------------------------------------------------------

def check_dataflow(plan: Plan) -> list[str]:
    """The job's parameters are its template's (``dataflow/metadata.json``), every one of them a
    pipeline option, with values the pipeline accepts; the template spec is that metadata."""
    metadata = json.loads(TEMPLATE_METADATA.read_text())
    declared = {p["name"] for p in metadata["parameters"]}
    required = {p["name"] for p in metadata["parameters"] if not p.get("isOptional")}
    problems = [f"template parameter {name} is not a pipeline option"
                for name in sorted(declared - set(GoodputOptions([]).get_all_options()))]
    for job in resource_changes(plan, "google_dataflow_flex_template_job"):
        # A parameter whose value is known only at apply (a resource's id) is in after_unknown.
        parameters = job["after"]["parameters"]
        names = set(parameters) | set(job["after_unknown"].get("parameters") or {})
        problems += [f"job parameter {name} is not in dataflow/metadata.json"
                     for name in sorted(names - declared)]
        problems += [f"required template parameter {name} is not set"
                     for name in sorted(required - names)]
        try:
            GoodputOptions([f"--{name}={value}" for name, value in parameters.items()]).get_all_options()
        except SystemExit:
            problems.append(f"the pipeline refuses the job's parameters {parameters}")
        if not job["after"].get("enable_streaming_engine"):
            problems.append("the job runs without Streaming Engine")
    for spec in resources(plan, "google_storage_bucket_object"):
        content = spec["values"].get("content")
        if content and json.loads(content).get("metadata") not in (None, metadata):
            problems.append("the template spec's metadata is not dataflow/metadata.json")
    return problems


# -- IAM ----------------------------------------------------------------------------------------

def check_iam(plan: Plan) -> list[str]:
    """No primitive role and no service's admin role (``roles/<service>.admin``), no keys; on
    the project only the pipeline's worker and metric writer roles; the emitter may only publish
    to the events topic."""
    problems = []
    for resource in resources(plan):
        type_, values = resource["type"], resource["values"]
        if type_ == "google_service_account_key":
            problems.append(f"{resource['address']}: no service account keys")
        if "_iam_" not in type_:
            continue
        role = values.get("role", "")
        if role in PRIMITIVE_ROLES or role.endswith(".admin"):
            problems.append(f"{resource['address']}: over-broad role {role}")
        elif type_.startswith("google_project_iam") and role not in PROJECT_ROLES:
            problems.append(f"{resource['address']}: {role} on the whole project")
    for resource in configured(plan):
        expressions = resource.get("expressions", {})
        members = expressions.get("member", {}).get("references", [])
        if "google_service_account.emitter" in members:
            target = expressions.get("topic", {}).get("references", [])
            role = expressions.get("role", {}).get("constant_value")
            if (resource["type"], role) != ("google_pubsub_topic_iam_member", "roles/pubsub.publisher") \
                    or "google_pubsub_topic.events" not in target:
                problems.append(f"{resource['address']}: the emitter may only publish to the events topic")
    return problems


CHECKS = (check_tables, check_topic_schema, check_monitoring, check_dataflow, check_iam)


def check_plan(plan: Plan) -> list[str]:
    """Every cross-check's problems."""
    return [problem for check in CHECKS for problem in check(plan)]
