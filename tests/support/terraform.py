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
from pipeline.core import rows
from pipeline.sinks.monitoring import METRICS, OPTIONAL_LABEL, resource_of
from support import REPO

TEMPLATE_METADATA = REPO / "dataflow" / "metadata.json"
#: The tables the pipeline appends rows to (not ``accelerator_prices``, which Terraform loads).
PIPELINE_TABLES = (rows.GOODPUT, rows.BADPUT, rows.STEP_STATS, rows.DISRUPTIONS, rows.DEAD_LETTER,
                   rows.EVENTS, rows.RUN_METADATA)

#: Google Cloud's own metrics the pipeline's self-monitoring may use, with their resource type.
CLOUD_METRICS = {
    "pubsub.googleapis.com/subscription/num_undelivered_messages": "pubsub_subscription",
    "pubsub.googleapis.com/subscription/oldest_unacked_message_age": "pubsub_subscription",
    "dataflow.googleapis.com/job/system_lag": "dataflow_job",
    "dataflow.googleapis.com/job/is_failed": "dataflow_job",
}
PRIMITIVE_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
TABLE_APPENDER = "google_project_iam_custom_role.table_appender"
#: Every IAM grant the module may make, as (role, what it is granted on), with why it is needed.
#: What it is granted on is the resource the grant's scope names (its topic, subscription, table,
#: dataset, bucket or service account) or ``project``; a custom role is named by its resource. Any
#: other grant is broader than the module needs and fails ``check_iam``.
IAM_ALLOWED: dict[tuple[str, str], str] = {
    ("roles/pubsub.publisher", "google_pubsub_topic.events"):
        "the emitter publishes the training jobs' events",
    ("roles/iam.workloadIdentityUser", "google_service_account.emitter"):
        "training jobs' Kubernetes service accounts (var.emitter_members) act as the emitter",
    ("roles/pubsub.subscriber", "google_pubsub_subscription.pipeline"):
        "the pipeline pulls and acknowledges; Pub/Sub's agent acknowledges what it dead-letters",
    ("roles/pubsub.viewer", "google_pubsub_subscription.pipeline"):
        "the pipeline's Pub/Sub source reads the subscription's settings",
    ("roles/pubsub.publisher", "google_pubsub_topic.dead_letter"):
        "Pub/Sub's service agent moves undeliverable messages to the dead-letter topic",
    ("roles/dataflow.worker", "project"):
        "the job's workers run as the pipeline's account (granted on projects only)",
    ("roles/monitoring.metricWriter", "project"):
        "the pipeline writes time series, which belong to the project",
    (TABLE_APPENDER, "google_bigquery_table.tables"):
        "streaming inserts into each table the pipeline writes, and no more (see CUSTOM_ROLES)",
    ("roles/bigquery.metadataViewer", "google_bigquery_dataset.goodput"):
        "insertAll checks bigquery.datasets.get on the dataset; this role reads metadata, no rows",
    ("roles/storage.objectUser", "google_storage_bucket.scratch"):
        "Dataflow creates, reads, lists and deletes its staging and temporary files",
    ("roles/storage.objectViewer", "google_storage_bucket.dataflow"):
        "the flex template launcher reads the template spec (a condition limits it to templates/)",
}
#: The permissions of each custom role, the least that its grants need.
CUSTOM_ROLES: dict[str, frozenset[str]] = {
    # tabledata.insertAll needs updateData and get on the table (and datasets.get, above)
    TABLE_APPENDER: frozenset({"bigquery.tables.get", "bigquery.tables.updateData"}),
}
#: The argument of each kind of IAM grant that names what it is granted on.
_IAM_SCOPE = {
    "google_pubsub_topic_iam_member": "topic",
    "google_pubsub_subscription_iam_member": "subscription",
    "google_bigquery_table_iam_member": "table_id",
    "google_bigquery_dataset_iam_member": "dataset_id",
    "google_storage_bucket_iam_member": "bucket",
    "google_service_account_iam_member": "service_account_id",
}
#: Grants allowed only with an IAM condition, and a text the condition's expression must hold.
IAM_CONDITIONS = {("roles/storage.objectViewer", "google_storage_bucket.dataflow"): "/objects/templates/"}
_RESOURCE_ADDRESS = re.compile(r"^(google[a-z0-9_]*\.[A-Za-z0-9_-]+)")

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

def _referenced_resource(expression: dict[str, Any]) -> str | None:
    """The first resource (``type.name``) an expression of the configuration refers to."""
    for reference in expression.get("references", []):
        if match := _RESOURCE_ADDRESS.match(reference):
            return match.group(1)
    return None


def iam_grants(plan: Plan) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(planned resource, role, what it is granted on) of every IAM grant. A role known only at
    apply (a custom role's name) is named by the resource it refers to."""
    configuration = {resource["address"]: resource.get("expressions", {}) for resource in configured(plan)}
    for resource in resources(plan):
        type_ = resource["type"]
        if "_iam_" not in type_ or type_.endswith("_iam_custom_role"):
            continue
        expressions = configuration.get(re.sub(r"\[.*\]$", "", resource["address"]), {})
        role = resource["values"].get("role") or _referenced_resource(expressions.get("role", {})) or "?"
        if type_.startswith("google_project_iam"):
            target = "project"
        else:
            target = _referenced_resource(expressions.get(_IAM_SCOPE.get(type_, ""), {})) or type_
        yield resource, role, target


def check_iam(plan: Plan) -> list[str]:
    """Every grant is one of ``IAM_ALLOWED``, so none is broader than the module needs (and none
    is a primitive role or a service's admin role); every custom role has at most its
    ``CUSTOM_ROLES`` permissions; the pipeline may append to every table it writes; no keys; the
    emitter may only publish to the events topic."""
    problems = []
    for resource in resources(plan):
        if resource["type"] == "google_service_account_key":
            problems.append(f"{resource['address']}: no service account keys")
        if resource["type"] == "google_project_iam_custom_role":
            extra = set(resource["values"].get("permissions") or []) - CUSTOM_ROLES.get(
                resource["address"], frozenset())
            if extra:
                problems.append(f"{resource['address']}: permissions {sorted(extra)} are broader than "
                                f"the module needs (CUSTOM_ROLES)")
    appended: set[str] = set()
    for resource, role, target in iam_grants(plan):
        address = resource["address"]
        if role == TABLE_APPENDER:
            appended.add(resource["values"].get("table_id", ""))
        if role in PRIMITIVE_ROLES or role.endswith(".admin"):
            problems.append(f"{address}: over-broad role {role}")
        elif (role, target) not in IAM_ALLOWED:
            where = "the whole project" if target == "project" else target
            problems.append(f"{address}: {role} on {where} is broader than the module needs "
                            "(not in IAM_ALLOWED)")
        elif (role, target) in IAM_CONDITIONS and not any(
                IAM_CONDITIONS[role, target] in condition.get("expression", "")
                for condition in resource["values"].get("condition") or []):
            problems.append(f"{address}: {role} on {target} is broader than the module needs "
                            f"without a condition on {IAM_CONDITIONS[role, target]!r}")
    problems += [f"the pipeline writes table {table} but may not append to it"
                 for table in sorted(set(PIPELINE_TABLES) - appended)]
    problems += [f"the pipeline may append to table {table}, which it never writes"
                 for table in sorted(appended - set(PIPELINE_TABLES))]
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
