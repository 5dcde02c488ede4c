"""Cross-checks of a Terraform plan (``terraform show -json``) against the rest of the project and
against Google's APIs: the tables and views are the ones in ``goodput_schemas/``, the topic schema is
the event schema, every metric a dashboard or alert uses is one the pipeline writes (with labels it
sets), the Dataflow job's parameters are pipeline options of its template, the productivity job
and the GKE metrics import run commands the image has with arguments they take, IAM is least
privilege, the planned values are valid messages of the services' own API types (enum values
included), and the module deploys into a brand-new project (every resource waits for its API,
names its project, grants service agents only once they exist, and private workers have a
subnetwork).

Each check returns the problems it found, as sentences; none means it passed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import tomllib
from google.cloud import bigquery, dataflow_v1beta3, monitoring_dashboard_v1, monitoring_v3
from google.protobuf import descriptor, json_format, message
from google.pubsub_v1 import types as pubsub_types

from goodput_schemas import EVENT_PROTO, saved_queries, table_names, table_options, table_schema, views
from pipeline.app import gke, productivity
from pipeline.app.checks import UsageError
from pipeline.app.outputs import check_dataset
from pipeline.beam.options import GoodputOptions
from pipeline.core import rows
from pipeline.sinks.monitoring import METRICS, OPTIONAL_LABEL, resource_of
from support import REPO

TEMPLATE_METADATA = REPO / "dataflow" / "metadata.json"
#: The tables the pipeline appends rows to (not ``accelerator_prices`` and ``accelerator_peaks``,
#: which Terraform loads, nor ``capacity``, which ``goodput import capacity`` fills, nor
#: ``jobset_metrics``, which ``goodput import gke-metrics`` fills).
PIPELINE_TABLES = (rows.GOODPUT, rows.BADPUT, rows.STEP_STATS, rows.DISRUPTIONS, rows.RUN_ANOMALIES,
                   rows.DEAD_LETTER, rows.EVENTS, rows.RUN_METADATA, rows.RUN_CONFIGS, rows.MODEL_METRICS)
#: The tables ``goodput import gke-metrics`` appends to and reads (what it imported already).
GKE_METRICS_TABLES = frozenset({gke.JOBSET_METRICS, rows.DEAD_LETTER})

#: Google Cloud's own metrics the pipeline's self-monitoring may use, with their resource type.
CLOUD_METRICS = {
    "pubsub.googleapis.com/subscription/num_undelivered_messages": "pubsub_subscription",
    "pubsub.googleapis.com/subscription/oldest_unacked_message_age": "pubsub_subscription",
    "dataflow.googleapis.com/job/system_lag": "dataflow_job",
    "dataflow.googleapis.com/job/is_failed": "dataflow_job",
}
PRIMITIVE_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
TABLE_APPENDER = "google_project_iam_custom_role.table_appender"
TABLE_READER = "google_project_iam_custom_role.table_reader"
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
        "the pipeline pulls and acknowledges",
    ("roles/pubsub.viewer", "google_pubsub_subscription.pipeline"):
        "the pipeline's Pub/Sub source reads the subscription's settings",
    ("roles/dataflow.worker", "project"):
        "the job's workers run as the pipeline's account (granted on projects only)",
    ("roles/monitoring.metricWriter", "project"):
        "the pipeline and goodput productivity write time series, which belong to the project",
    ("roles/bigquery.jobUser", "project"):
        "a stream launched anew restores runs, goodput productivity reads MPG, goodput import "
        "gke-metrics what it imported, with query jobs, which belong to the project",
    (TABLE_READER, "google_bigquery_table.tables"):
        "a restore reads a run's rows of events and goodput_snapshots, goodput productivity the "
        "tables MPG's queries read, goodput import gke-metrics jobset_metrics and dead_letter; no "
        "other table (see CUSTOM_ROLES and READERS)",
    (TABLE_READER, "google_bigquery_table.views"):
        "goodput productivity queries a view, and a query of a view needs its rows too (see READERS)",
    ("roles/monitoring.viewer", "var.gke_metrics_project"):
        "goodput import gke-metrics lists GKE's JobSet time series in the clusters' project; no "
        "narrower predefined role has monitoring.timeSeries.list",
    ("roles/run.invoker", "google_cloud_run_v2_job.productivity"):
        "Cloud Scheduler's account starts the productivity job's executions (run.jobs.run), no other",
    ("roles/run.invoker", "google_cloud_run_v2_job.gke_metrics"):
        "Cloud Scheduler's account starts the GKE metrics import's executions, no other",
    (TABLE_APPENDER, "google_bigquery_table.tables"):
        "streaming inserts into each table the pipeline or the GKE metrics import writes, and no more "
        "(see CUSTOM_ROLES and APPENDERS)",
    ("roles/bigquery.metadataViewer", "google_bigquery_dataset.goodput"):
        "insertAll checks bigquery.datasets.get on the dataset; this role reads metadata, no rows",
    ("roles/storage.objectUser", "google_storage_bucket.scratch"):
        "Dataflow creates, reads, lists and deletes its staging and temporary files",
    ("roles/storage.objectViewer", "google_storage_bucket.dataflow"):
        "the flex template launcher reads the template spec, Cloud Build the uploaded sources "
        "(each grant limited by a condition to its own folder)",
    ("roles/artifactregistry.reader", "google_artifact_registry_repository.images"):
        "the flex template launcher and the workers pull the pipeline's image",
    ("roles/artifactregistry.writer", "google_artifact_registry_repository.images"):
        "Cloud Build pushes the image it builds",
    ("roles/logging.logWriter", "project"):
        "Cloud Build writes the build's log (log entries belong to the project)",
    ("roles/cloudkms.cryptoKeyEncrypterDecrypter", "var.kms_key_name"):
        "service agents encrypt with the customer's key: Pub/Sub, BigQuery, Dataflow, Compute "
        "Engine, Artifact Registry",
}
#: The permissions of each custom role, the least that its grants need.
CUSTOM_ROLES: dict[str, frozenset[str]] = {
    # tabledata.insertAll needs updateData and get on the table (and datasets.get, above)
    TABLE_APPENDER: frozenset({"bigquery.tables.get", "bigquery.tables.updateData"}),
    # a query reads the rows of the tables it names
    TABLE_READER: frozenset({"bigquery.tables.getData"}),
}
#: The tables the pipeline may read: a restore's (pipeline.sinks.raw_events.BigQueryEvents).
READ_TABLES = frozenset({"events", "goodput_snapshots"})
_DATASET_MARK = "`DATASET`"
_NAMED = re.compile(re.escape(_DATASET_MARK) + r"\.(\w+)")


def query_reads(queries: Iterable[str]) -> frozenset[str]:
    """The tables and views the saved ``queries`` read, and those the views read, all the way
    down: a query of a view reads the view's tables with the querier's rights."""
    saved, view_sql = saved_queries(_DATASET_MARK), views(_DATASET_MARK)
    todo = [name for query in queries for name in _NAMED.findall(saved[query])]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += _NAMED.findall(view_sql.get(name, ""))
    return frozenset(seen)


#: What the productivity job may read: what goodput productivity's saved queries read.
PRODUCTIVITY_READS = query_reads((productivity.RUN_QUERY, productivity.FLEET_QUERY))
PIPELINE_ACCOUNT = "google_service_account.pipeline"
PRODUCTIVITY_ACCOUNT = "google_service_account.productivity"
GKE_METRICS_ACCOUNT = "google_service_account.gke_metrics"
#: The tables (and views) each account may read rows of, with what reads them.
READERS = {PIPELINE_ACCOUNT: (READ_TABLES, "a restore reads"),
           PRODUCTIVITY_ACCOUNT: (PRODUCTIVITY_READS, "MPG's saved queries read"),
           GKE_METRICS_ACCOUNT: (GKE_METRICS_TABLES, "the import reads what it imported")}
#: The tables each account may append to, with what writes them.
APPENDERS = {PIPELINE_ACCOUNT: (frozenset(PIPELINE_TABLES), "the pipeline writes"),
             GKE_METRICS_ACCOUNT: (GKE_METRICS_TABLES, "the import writes points and refusals to")}
#: The job each account runs, by the address of that job's Cloud Run job: an account that reads
#: or appends is expected only where its job is planned (the pipeline's always is).
ACCOUNT_JOBS = {PRODUCTIVITY_ACCOUNT: "google_cloud_run_v2_job.productivity",
                GKE_METRICS_ACCOUNT: "google_cloud_run_v2_job.gke_metrics"}
#: Variables naming a project other than the deployment's, which a resource may be in.
OTHER_PROJECTS = {"var.gke_metrics_project": "the GKE metrics import reads them in the clusters' project"}
#: The argument of each kind of IAM grant that names what it is granted on.
_IAM_SCOPE = {
    "google_pubsub_topic_iam_member": "topic",
    "google_pubsub_subscription_iam_member": "subscription",
    "google_bigquery_table_iam_member": "table_id",
    "google_bigquery_dataset_iam_member": "dataset_id",
    "google_storage_bucket_iam_member": "bucket",
    "google_service_account_iam_member": "service_account_id",
    "google_artifact_registry_repository_iam_member": "repository",
    "google_kms_crypto_key_iam_member": "crypto_key_id",
    "google_cloud_run_v2_job_iam_member": "name",
}
#: Accounts that may be granted one role on one resource and nothing else: (the grant's type, the
#: role, the resource, the problem otherwise).
SOLE_GRANTS = {
    "google_service_account.emitter": ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
                                       "google_pubsub_topic.events",
                                       "the emitter may only publish to the events topic"),
    "google_service_account.productivity_trigger": (
        "google_cloud_run_v2_job_iam_member", "roles/run.invoker", "google_cloud_run_v2_job.productivity",
        "the productivity trigger may only start the productivity job"),
    "google_service_account.gke_metrics_trigger": (
        "google_cloud_run_v2_job_iam_member", "roles/run.invoker", "google_cloud_run_v2_job.gke_metrics",
        "the GKE metrics trigger may only start the GKE metrics import"),
}
#: Grants allowed only with an IAM condition: the grant's address and a text its condition's
#: expression must hold (the one folder of the bucket it may read).
IAM_CONDITIONS = {
    ("roles/storage.objectViewer", "google_storage_bucket.dataflow"): {
        "google_storage_bucket_iam_member.pipeline_templates": "/objects/templates/",
        "google_storage_bucket_iam_member.builder": "/objects/build/",
    },
}
_RESOURCE_ADDRESS = re.compile(r"^((?:data\.)?google[a-z0-9_]*\.[A-Za-z0-9_-]+|var\.[a-z0-9_]+)")

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


# -- Scheduled commands: ML Productivity Goodput, GKE's metrics ---------------------------------

#: The console scripts the image installs (dataflow/Dockerfile installs the project's package).
SCRIPTS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
#: Each Cloud Run job of the module: the goodput command it runs, and that command's parser.
SCHEDULED = {"google_cloud_run_v2_job.productivity": (("productivity",), productivity.build_parser),
             "google_cloud_run_v2_job.gke_metrics": (("import", "gke-metrics"), gke.build_parser)}


def check_scheduled(plan: Plan) -> list[str]:
    """The productivity job runs ``goodput productivity`` and the GKE metrics job ``goodput import
    gke-metrics`` (a console script of the image) with arguments the command takes, for the
    module's dataset (and project, or GKE's), in the Dataflow job's image; Cloud Scheduler starts
    each job through the Cloud Run Admin API with an OAuth token (Google's APIs take access
    tokens, not the ID tokens a Cloud Run service's own URL takes)."""
    problems = []
    project = plan["variables"]["project_id"]["value"]
    dataset = f"{project}:{plan['variables']['dataset_id']['value']}"
    read_from = {"google_cloud_run_v2_job.productivity": project,
                 "google_cloud_run_v2_job.gke_metrics": plan["variables"]["gke_metrics_project"]["value"]}
    images = {job["values"]["sdk_container_image"]
              for job in resources(plan, "google_dataflow_flex_template_job")}
    runs = set()
    for job in resources(plan, "google_cloud_run_v2_job"):
        values, address = job["values"], job["address"]
        runs.add(f"https://run.googleapis.com/v2/projects/{project}/locations/{values['location']}"
                 f"/jobs/{values['name']}:run")
        (container,) = values["template"][0]["template"][0]["containers"]
        command, args = container.get("command") or [], container.get("args") or []
        if len(command) != 1 or SCRIPTS.get(command[0]) != "pipeline.app.cli:main":
            problems.append(f"{address}: runs {command}, not the goodput command the image installs")
        if _address(job) not in SCHEDULED:
            problems.append(f"{address}: runs goodput {args}, no command the module schedules")
            continue
        words, parser = SCHEDULED[_address(job)]
        name = " ".join(("goodput", *words))
        if tuple(args[:len(words)]) != words:
            problems.append(f"{address}: runs goodput {args[:len(words)]}, not {name}")
        try:
            parsed = parser().parse_args(args[len(words):])
            check_dataset(parsed)
        except (SystemExit, UsageError):
            problems.append(f"{address}: {name} refuses {args[len(words):]}")
            continue
        expected = (read_from[_address(job)], dataset, None)
        if (parsed.project, parsed.bigquery_dataset, getattr(parsed, "duckdb", None)) != expected:
            problems.append(f"{address}: {name} runs for {parsed.project} on {parsed.bigquery_dataset}, "
                            f"not for {expected[0]} on {dataset} alone")
        if images and container["image"] not in images:
            problems.append(f"{address}: runs {container['image']}, not the pipeline's {sorted(images)}")
    for scheduler in resources(plan, "google_cloud_scheduler_job"):
        (target,) = scheduler["values"].get("http_target") or [{}]
        uri = target.get("uri", "")
        if uri not in runs:
            problems.append(f"{scheduler['address']}: calls {uri!r}, not the jobs.run of a job of the module")
        if not target.get("oauth_token") or target.get("oidc_token"):
            problems.append(f"{scheduler['address']}: calls the Cloud Run Admin API without an OAuth token")
    return problems


# -- IAM ----------------------------------------------------------------------------------------

def _referenced_resource(expression: dict[str, Any]) -> str | None:
    """The first resource or data source (``type.name``, ``data.type.name``) or variable
    (``var.name``) an expression of the configuration refers to."""
    for reference in expression.get("references", []):
        if match := _RESOURCE_ADDRESS.match(reference):
            return match.group(1)
    return None


def _referenced_by(plan: Plan, argument: str) -> dict[str, str | None]:
    """What each configured resource's ``argument`` refers to (``_referenced_resource``), by address."""
    return {resource["address"]: _referenced_resource(resource.get("expressions", {}).get(argument, {}))
            for resource in configured(plan)}


def iam_grants(plan: Plan) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(planned resource, role, what it is granted on) of every IAM grant. A role known only at
    apply (a custom role's name) is named by the resource it refers to; a grant on a project other
    than the deployment's, by the variable naming that project."""
    configuration = {resource["address"]: resource.get("expressions", {}) for resource in configured(plan)}
    for resource in resources(plan):
        type_ = resource["type"]
        if "_iam_" not in type_ or type_.endswith("_iam_custom_role"):
            continue
        expressions = configuration.get(re.sub(r"\[.*\]$", "", resource["address"]), {})
        role = resource["values"].get("role") or _referenced_resource(expressions.get("role", {})) or "?"
        if type_.startswith("google_project_iam"):
            project = _referenced_resource(expressions.get("project", {}))
            target = project if project in OTHER_PROJECTS else "project"
        else:
            target = _referenced_resource(expressions.get(_IAM_SCOPE.get(type_, ""), {})) or type_
        yield resource, role, target


def check_iam(plan: Plan) -> list[str]:
    """Every grant is one of ``IAM_ALLOWED``, so none is broader than the module needs (and none
    is a primitive role or a service's admin role); every custom role has at most its
    ``CUSTOM_ROLES`` permissions; each account may append to the tables it writes (``APPENDERS``)
    and read the rows its queries read (``READERS``), no others; no keys; the emitter may only
    publish to the events topic, each trigger only start its job."""
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
    grantees = _referenced_by(plan, "member")
    appended: dict[str | None, set[str]] = {}
    read: dict[str | None, set[str]] = {}
    for resource, role, target in iam_grants(plan):
        address = resource["address"]
        granted = {TABLE_APPENDER: appended, TABLE_READER: read}.get(role)
        if granted is not None:
            table = resource["values"].get("table_id", "")
            granted.setdefault(grantees.get(_address(resource)), set()).add(table)
        if role in PRIMITIVE_ROLES or role.endswith(".admin"):
            problems.append(f"{address}: over-broad role {role}")
        elif (role, target) not in IAM_ALLOWED:
            where = "the whole project" if target == "project" else target
            problems.append(f"{address}: {role} on {where} is broader than the module needs "
                            "(not in IAM_ALLOWED)")
        elif (role, target) in IAM_CONDITIONS:
            folder = IAM_CONDITIONS[role, target].get(resource["address"])
            if folder is None or not any(folder in condition.get("expression", "")
                                         for condition in resource["values"].get("condition") or []):
                problems.append(f"{address}: {role} on {target} is broader than the module needs "
                                f"without a condition on {folder or 'one folder'!r}")
    jobs = {_address(job) for job in resources(plan, "google_cloud_run_v2_job")}
    for granted, expected_of, verb in ((appended, APPENDERS, "append to"), (read, READERS, "read")):
        expected = {account: tables for account, tables in expected_of.items()
                    if ACCOUNT_JOBS.get(account, "the pipeline") in jobs | {"the pipeline"}}
        for account in sorted(set(granted) | set(expected), key=str):
            tables, what = expected.get(account, (frozenset(), f"nothing it runs needs to {verb} any"))
            if granted.get(account, set()) != tables:
                problems.append(f"{account} may {verb} tables {sorted(granted.get(account, ()))}; {what}"
                                + (f" {sorted(tables)}" if tables else ""))
    for resource in configured(plan):
        expressions = resource.get("expressions", {})
        members = expressions.get("member", {}).get("references", [])
        for account, (type_, role, target, what) in SOLE_GRANTS.items():
            if account not in members:
                continue
            granted_on = expressions.get(_IAM_SCOPE.get(resource["type"], ""), {}).get("references", [])
            if ((resource["type"], expressions.get("role", {}).get("constant_value")) != (type_, role)
                    or target not in granted_on):
                problems.append(f"{resource['address']}: {what}")
    return problems


# -- Google's API types -------------------------------------------------------------------------
#
# The stand-in provider checks names and types, not values: the real provider passes most values
# to the API as they are, and the API refuses an enum value it does not know (Dataflow answers 400
# to autoscaling_algorithm = "THROUGHPUT_BASED"). So the planned values of each resource the API
# checks are read into that API's own message type, which refuses what the API refuses.

#: Planned attributes named otherwise in the API message, by resource type.
_API_NAMES = {"google_dataflow_flex_template_job": {"labels": "additional_user_labels"}}


def _message_dict(values: dict[str, Any], fields: descriptor.Descriptor,
                  renames: dict[str, str]) -> dict[str, Any]:
    """Planned values as the JSON of a message: the attributes that are fields of the message
    (renamed as the API names them), single blocks unwrapped from their list, empty and unknown
    values left out (the provider sends none)."""
    known = fields.fields_by_name
    out: dict[str, Any] = {}
    for name, value in values.items():
        field = known.get(renames.get(name, name))
        if field is None or value in (None, "", [], {}):
            continue
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            nested = field.message_type
            if nested.full_name.startswith("google.protobuf."):
                out[field.name] = value  # a Duration ("600s"), a wrapper: JSON as the API takes it
                continue
            blocks = value if isinstance(value, list) else [value]
            converted = [_message_dict(block, nested, {}) for block in blocks]
            out[field.name] = converted if field.is_repeated else converted[0]
        else:
            out[field.name] = value
    return out


def api_problems(values: dict[str, Any], message_type: type[message.Message],
                 renames: dict[str, str] | None = None) -> list[str]:
    """What the API's message type refuses in a resource's planned values (none if it reads them)."""
    try:
        json_format.ParseDict(_message_dict(values, message_type.DESCRIPTOR, renames or {}), message_type())
    except json_format.ParseError as error:
        return [str(error)]
    return []


def check_api_types(plan: Plan) -> list[str]:
    """The Dataflow job's launch request, the alert policies, the topics and subscriptions are
    valid API messages; the tables' partitioning and clustering are what BigQuery takes."""
    problems = []
    for resource in resources(plan):
        values, address = resource["values"], resource["address"]
        match resource["type"]:
            case "google_dataflow_flex_template_job":
                launch = {"job_name": values["name"],
                          "container_spec_gcs_path": values["container_spec_gcs_path"],
                          "parameters": values.get("parameters") or {},
                          "environment": _message_dict(
                              values, dataflow_v1beta3.FlexTemplateRuntimeEnvironment.pb().DESCRIPTOR,
                              _API_NAMES[resource["type"]])}
                found = api_problems(launch, dataflow_v1beta3.LaunchFlexTemplateParameter.pb())
            case "google_monitoring_alert_policy":
                found = api_problems(values, monitoring_v3.AlertPolicy.pb())
            case "google_pubsub_topic":
                found = api_problems(values, pubsub_types.Topic.pb())
            case "google_pubsub_subscription":
                found = api_problems(values, pubsub_types.Subscription.pb())
            case "google_bigquery_table" if not values.get("view"):
                found = _bigquery_table_problems(values)
            case _:
                continue
        problems += [f"{address}: {problem}" for problem in found]
    return problems


_CLUSTERING_TYPES = {"STRING", "INT64", "INTEGER", "DATE", "TIMESTAMP", "BOOL", "BOOLEAN", "DATETIME",
                     "NUMERIC", "BIGNUMERIC", "GEOGRAPHY"}


def _bigquery_table_problems(values: dict[str, Any]) -> list[str]:
    """BigQuery's rules for a table's partitioning and clustering (the API is not protobuf)."""
    problems = []
    columns = {field["name"]: field["type"] for field in json.loads(values["schema"])}
    for partitioning in values.get("time_partitioning") or []:
        if partitioning["type"] not in vars(bigquery.TimePartitioningType).values():
            problems.append(f"time partitioning type {partitioning['type']!r} is not one of BigQuery's")
        if columns.get(partitioning.get("field")) not in ("TIMESTAMP", "DATE", "DATETIME"):
            problems.append(f"partitioned on {partitioning.get('field')!r}, not a time column")
    clustering = values.get("clustering") or []
    if len(clustering) > 4:
        problems.append(f"clustered on {len(clustering)} columns; BigQuery takes at most 4")
    problems += [f"clustered on {name!r}, which is not a column that can cluster"
                 for name in clustering if columns.get(name) not in _CLUSTERING_TYPES]
    return problems


# -- A brand-new project ------------------------------------------------------------------------

#: The API each kind of resource calls, by type prefix (the longest prefix that matches).
RESOURCE_APIS = {
    "google_artifact_registry_": "artifactregistry.googleapis.com",
    "google_bigquery_": "bigquery.googleapis.com",
    "google_cloud_run_": "run.googleapis.com",
    "google_cloud_scheduler_": "cloudscheduler.googleapis.com",
    "google_compute_": "compute.googleapis.com",
    "google_dataflow_": "dataflow.googleapis.com",
    "google_monitoring_": "monitoring.googleapis.com",
    "google_project_iam_custom_role": "iam.googleapis.com",
    "google_project_iam_": "cloudresourcemanager.googleapis.com",
    "google_project": "cloudresourcemanager.googleapis.com",
    "google_pubsub_": "pubsub.googleapis.com",
    "google_service_account": "iam.googleapis.com",
    "google_storage_": "storage.googleapis.com",
}
#: Calls made on the deployer's machine that need an API too.
BUILD_API = "cloudbuild.googleapis.com"
API_ENABLEMENT = "google_project_service.apis"
#: Service agents by e-mail domain (accounts Google makes for a service, not there before), and
#: what makes each exist before it is granted anything: a service identity, BigQuery's encryption
#: account read (which makes it), or for Compute Engine's agent, the API enabled.
SERVICE_AGENTS = {
    "gcp-sa-": "google_project_service_identity.",
    "dataflow-service-producer-prod": "google_project_service_identity.",
    "bigquery-encryption": "data.google_bigquery_default_service_account.",
    "compute-system": API_ENABLEMENT,
}
_SERVICE_AGENT = re.compile(r"@([a-z-]+)\.iam\.gserviceaccount\.com$")

Graph = dict[str, set[str]]


def dependency_graph(dot: str) -> Graph:
    """``terraform graph``'s output as each resource's direct dependencies."""
    graph: Graph = {}
    for node, dependency in re.findall(r'^\s*"([^"]+)" -> "([^"]+)"', dot, re.M):
        graph.setdefault(node, set()).add(dependency)
    return graph


def _waits_for(graph: Graph, node: str) -> set[str]:
    seen: set[str] = set()
    todo = [node]
    while todo:
        for dependency in graph.get(todo.pop(), ()):
            if dependency not in seen:
                seen.add(dependency)
                todo.append(dependency)
    return seen


def _api_of(type_: str) -> str | None:
    prefixes = [prefix for prefix in RESOURCE_APIS if type_.startswith(prefix)]
    return RESOURCE_APIS[max(prefixes, key=len)] if prefixes else None


def _address(resource: dict[str, Any]) -> str:
    """A resource's address in the graph: without its index, data sources with ``data.``."""
    return re.sub(r"\[.*\]$", "", resource["address"])


def check_new_project(plan: Plan, graph: Graph) -> list[str]:
    """What a project where only billing is set up needs: the APIs are enabled by the module and
    every resource waits for the enablement (a race or a 403 otherwise); every resource names its
    project (the module has no provider blocks of its own), the deployment's unless it is one of
    ``OTHER_PROJECTS``; service agents are granted only after something makes sure they exist;
    private workers have a subnetwork."""
    problems = []
    project = plan["variables"]["project_id"]["value"]
    planned = list(_all_resources(plan))
    projects = _referenced_by(plan, "project")
    enabled = {r["values"]["service"] for r in planned if r["type"] == "google_project_service"}
    builds = any(r["type"] == "terraform_data" and r["name"] == "image" for r in planned)
    enabled_needed = {BUILD_API} if builds else set()
    for resource in planned:
        type_, values = resource["type"], resource["values"]
        api = _api_of(type_)
        if api is None or type_ == "google_project_service":
            continue
        enabled_needed.add(api)
        if API_ENABLEMENT not in _waits_for(graph, _address(resource)):
            problems.append(f"{resource['address']}: does not wait for the APIs to be enabled "
                            f"({API_ENABLEMENT})")
        unknown = _unknown_after(plan, resource["address"])
        named = values.get("project") == project or projects.get(_address(resource)) in OTHER_PROJECTS
        if ("project" in values or "project" in unknown) and not named:
            problems.append(f"{resource['address']}: does not name its project (a module's provider "
                            "settings are its caller's)")
        agent = _SERVICE_AGENT.search(values.get("member") or "") if "_iam_" in type_ else None
        maker = next((made for domain, made in SERVICE_AGENTS.items()
                      if agent and agent.group(1).startswith(domain)), None)
        if maker and not _member_made_by(plan, graph, resource, maker):
            problems.append(f"{resource['address']}: grants service agent {values['member']} "
                            f"before anything makes sure it exists ({maker.rstrip('.')})")
        private = (type_ == "google_dataflow_flex_template_job"
                   and values.get("ip_configuration") == "WORKER_IP_PRIVATE")
        if private and plan["variables"].get("subnetwork", {}).get("value") is None \
                and not any(subnetwork["values"].get("private_ip_google_access") for subnetwork in planned
                            if subnetwork["type"] == "google_compute_subnetwork"
                            and _address(subnetwork) in _waits_for(graph, _address(resource))):
            problems.append(f"{resource['address']}: private worker IPs with no subnetwork that has "
                            "Private Google Access: the workers cannot reach Google's APIs")
    problems += [f"API {api} is used but not enabled by the module"
                 for api in sorted(enabled_needed - enabled)]
    problems += [f"provider {name} is configured in the module: a module takes its caller's providers"
                 for name, provider in plan["configuration"].get("provider_config", {}).items()
                 if provider.get("expressions")]
    return problems


def _member_made_by(plan: Plan, graph: Graph, grant: dict[str, Any], maker: str) -> bool:
    """Whether a grant's member is read from ``maker`` (a service identity, a data source), or for
    an agent made with its API, whether the grant waits for the API's enablement."""
    if maker == API_ENABLEMENT:
        return API_ENABLEMENT in _waits_for(graph, _address(grant))
    configured_as = {r["address"]: r for r in configured(plan)}.get(_address(grant), {})
    references = list(configured_as.get("expressions", {}).get("member", {}).get("references", []))
    if "each.value" in references:
        references += configured_as.get("for_each_expression", {}).get("references", [])
    return any(reference.startswith(maker) for reference in references)


def _all_resources(plan: Plan) -> Iterator[dict[str, Any]]:
    """Planned resources and the data sources read at plan, and those left to apply."""
    yield from resources(plan)
    for change in plan.get("resource_changes", []):
        if change["mode"] == "data" and not any(r["address"] == change["address"] for r in resources(plan)):
            yield {**change, "values": change["change"].get("after") or {}}


def _unknown_after(plan: Plan, address: str) -> dict[str, Any]:
    """The attributes of a resource known only at apply."""
    for change in plan.get("resource_changes", []):
        if change["address"] == address:
            unknown: dict[str, Any] = change["change"].get("after_unknown") or {}
            return unknown
    return {}


CHECKS = (check_tables, check_topic_schema, check_monitoring, check_dataflow, check_scheduled, check_iam,
          check_api_types)


def check_plan(plan: Plan, graph: Graph | None = None) -> list[str]:
    """Every cross-check's problems; with the module's dependency graph, the new-project ones too."""
    problems = [problem for check in CHECKS for problem in check(plan)]
    return problems if graph is None else problems + check_new_project(plan, graph)
