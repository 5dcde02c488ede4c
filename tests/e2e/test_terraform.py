"""The Terraform module, checked offline: formatting; ``terraform validate``, ``plan`` and
``test`` against the real google and google-beta provider schemas (served by the schema-only
stand-in of ``tools/provider_stand_in``); the cross-checks of ``support.terraform`` on the plan
and its dependency graph (Google's API types, a brand-new project, least privilege); checkov.
Each kind of deliberate mistake in ``tests/e2e/terraform_mistakes/`` makes one of them fail."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from goodput_schemas import views
from pipeline.app.alerts import ANOMALY_POLICIES
from support import REPO
from support import terraform as checks

MODULE = REPO / "terraform"
MISTAKES = Path(__file__).resolve().parent / "terraform_mistakes"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
IMAGE = "us-docker.pkg.dev/goodput-test/images/fleet-goodput:1"
KEY = "projects/keys/locations/us-central1/keyRings/goodput/cryptoKeys/goodput"
TRAINERS = "serviceAccount:goodput-test.svc.id.goog[training/trainer]"
GKE_PROJECT = "goodput-gke"
TERRAFORM = shutil.which("terraform")

needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")


#: What the module reads beside it: the schemas, the template and the image's sources.
MODULE_READS = ("goodput_schemas", "dataflow", "emitter", "pipeline", "pyproject.toml", "README.md")


def module_copy(root: Path, *mistakes: str) -> Path:
    """The module in ``root/terraform`` beside what it reads, with the named mistake files added."""
    shutil.copytree(MODULE, root / "terraform", ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    for shared in MODULE_READS:
        (root / shared).symlink_to(REPO / shared)
    for mistake in mistakes:
        shutil.copy(MISTAKES / mistake, root / "terraform" / mistake)
    return root / "terraform"


def terraform(module: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    """terraform with the stand-in providers (and ``PATH``, if given)."""
    from tools.provider_stand_in import terraform_env

    # The stand-in serves every type the module, its example and the mistakes name.
    env = {**os.environ, **terraform_env([MODULE, MISTAKES]), "TF_IN_AUTOMATION": "1",
           "PATH": path or os.environ["PATH"]}
    return subprocess.run([TERRAFORM or "terraform", f"-chdir={module}", *args], env=env, text=True,
                          capture_output=True, timeout=300)


def plan(module: Path, *variables: str) -> checks.Plan:
    """``terraform plan`` of the module with an image (so with the Dataflow job), and any other
    ``-var`` arguments given, as JSON."""
    return plan_with(module, f"-var=container_image={IMAGE}", *variables)


def plan_with(module: Path, *variables: str) -> checks.Plan:
    """``terraform plan`` of the module with the ``-var`` arguments given, as JSON."""
    planned = terraform(module, "plan", "-input=false", "-out=tfplan", "-var=project_id=goodput-test",
                        *variables)
    assert planned.returncode == 0, planned.stderr
    shown = terraform(module, "show", "-json", "tfplan")
    assert shown.returncode == 0, shown.stderr
    plan_json: checks.Plan = json.loads(shown.stdout)
    return plan_json


def graph(module: Path) -> checks.Graph:
    """The module's dependency graph (``terraform graph``)."""
    drawn = terraform(module, "graph")
    assert drawn.returncode == 0, drawn.stderr
    return checks.dependency_graph(drawn.stdout)


def checkov(module: Path) -> list[str]:
    """checkov's failed checks of the module, as "CHECK_ID resource"."""
    if not CHECKOV.exists():
        pytest.skip("checkov is installed by `make test` in .venv-checkov")
    scanned = subprocess.run([str(CHECKOV), "-d", str(module), "--framework", "terraform", "--skip-download",
                              "--quiet", "-o", "json"], text=True, capture_output=True, timeout=300)
    report = json.loads(scanned.stdout)
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    return [f"{c['check_id']} {c['resource']}" for c in report["results"]["failed_checks"]]


# -- The module as it is ------------------------------------------------------------------------

@needs_terraform
def test_the_module_is_formatted():
    formatted = subprocess.run([TERRAFORM or "terraform", "fmt", "-check", "-recursive", "-diff", str(MODULE),
                                str(MISTAKES)], text=True, capture_output=True, timeout=60)
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the module. The stand-in providers are development overrides, which need no
    ``terraform init``."""
    if TERRAFORM is None:
        pytest.skip("terraform is not installed")
    return module_copy(tmp_path_factory.mktemp("module"))


def test_the_module_validates_against_the_provider_schemas(module: Path):
    validated = terraform(module, "validate", "-json")
    assert json.loads(validated.stdout)["valid"] is True, validated.stdout


def test_the_example_validates(module: Path):
    example = module / "examples" / "basic"
    fetched = terraform(example, "get")  # installs the local module; providers need no init
    assert fetched.returncode == 0, fetched.stderr
    validated = terraform(example, "validate", "-json")
    assert json.loads(validated.stdout)["valid"] is True, validated.stdout


def test_terraform_test_passes(module: Path):
    tested = terraform(module, "test")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "0 failed" in tested.stdout


def test_the_plan_passes_every_cross_check(module: Path):
    planned = plan(module)
    assert checks.check_plan(planned, graph(module)) == []
    types = {r["type"] for r in checks.resources(planned)}
    assert {"google_dataflow_flex_template_job", "google_monitoring_dashboard",
            "google_monitoring_alert_policy", "google_pubsub_schema", "google_compute_subnetwork"} <= types


def anomaly_policies(planned: checks.Plan) -> dict[str, dict[str, Any]]:
    """The planned ``anomaly`` alert policies by the name ``pipeline.app.alerts`` replays them as."""
    return {f"anomaly_{policy['index']}": policy["values"]
            for policy in checks.resources(planned, "google_monitoring_alert_policy")
            if policy["name"] == "anomaly"}


def test_each_kind_of_anomaly_alerts_as_the_replay_says(module: Path):
    """By default every kind of anomaly has its policy, each one the replay of pipeline.app.alerts
    evaluates, on that kind's count of open anomalies; anomaly_alert_kinds leaves the others out."""
    planned = anomaly_policies(plan_with(module, "-var=build_image=false"))
    assert set(planned) == set(ANOMALY_POLICIES.values())
    for kind, name in ANOMALY_POLICIES.items():
        (condition,) = planned[name]["conditions"]
        (promql,) = condition["condition_prometheus_query_language"]
        assert f'"kind"="{kind}"' in promql["query"] and "open_anomalies" in promql["query"]
    assert set(anomaly_policies(plan_with(module, "-var=build_image=false",
                                          '-var=anomaly_alert_kinds=["hang"]'))) == {"anomaly_hang"}


def test_by_default_the_image_is_built_from_the_checkout_and_run(module: Path):
    """With no image given, the apply builds one with Cloud Build, tagged by its sources' digest,
    into the module's repository, and the job runs it."""
    planned = plan_with(module)
    assert checks.check_plan(planned, graph(module)) == []
    outputs = {name: output.get("value") for name, output in planned["planned_values"]["outputs"].items()}
    job = next(checks.resources(planned, "google_dataflow_flex_template_job"))["values"]
    assert job["sdk_container_image"] == outputs["image"]
    assert outputs["image"].startswith("us-central1-docker.pkg.dev/goodput-test/fleet-goodput/fleet-goodput:")
    assert f"--substitutions=_IMAGE={outputs['image']}" in outputs["build_command"]
    assert any(r["type"] == "terraform_data" for r in checks.resources(planned))


def test_with_a_customer_key_every_service_agent_may_use_it(module: Path):
    planned = plan(module, f"-var=kms_key_name={KEY}")
    assert checks.check_plan(planned, graph(module)) == []
    grants = [r["values"] for r in checks.resources(planned, "google_kms_crypto_key_iam_member")]
    assert {g["crypto_key_id"] for g in grants} == {KEY}
    assert {r["index"] for r in checks.resources(planned, "google_kms_crypto_key_iam_member")} == {
        "artifact_registry", "bigquery", "compute", "dataflow", "pubsub"}
    identities = {r["values"]["service"]
                  for r in checks.resources(planned, "google_project_service_identity")}
    assert identities == {f"{api}.googleapis.com" for api in ("artifactregistry", "dataflow", "pubsub")}


#: What gke_metrics_project adds: the import's job, its trigger, their accounts and grants.
GKE_METRICS = {
    "google_cloud_run_v2_job.gke_metrics[0]", "google_cloud_scheduler_job.gke_metrics[0]",
    "google_cloud_run_v2_job_iam_member.gke_metrics_trigger[0]", "google_service_account.gke_metrics[0]",
    "google_service_account.gke_metrics_trigger[0]", "google_project_iam_member.gke_metrics_viewer[0]",
    "google_project_iam_member.gke_metrics_queries[0]", "google_bigquery_dataset_iam_member.gke_metrics[0]",
    *(f'google_bigquery_table_iam_member.gke_metrics_{role}["{table}"]'
      for role in ("appender", "reader") for table in checks.GKE_METRICS_TABLES)}


def test_with_a_gke_project_a_scheduled_job_imports_its_metrics_and_may_only_read_them(module: Path):
    """gke_metrics_project schedules goodput import gke-metrics (check_scheduled reads its command
    and arguments) as an account that may read time series in that project and nothing else
    there, and append to and read jobset_metrics and dead_letter alone; the stream takes no part."""
    planned = plan(module, f"-var=gke_metrics_project={GKE_PROJECT}", "-var=gke_metrics_schedule=*/5 * * * *")
    assert checks.check_plan(planned, graph(module)) == []
    assert {r["address"] for r in checks.resources(planned) if "gke_metrics" in r["address"]} == GKE_METRICS
    (scheduler,) = (r["values"] for r in checks.resources(planned, "google_cloud_scheduler_job")
                    if r["name"] == "gke_metrics")
    assert (scheduler["schedule"], scheduler["time_zone"]) == ("*/5 * * * *", "Etc/UTC")
    elsewhere = [(role, target) for grant, role, target in checks.iam_grants(planned)
                 if grant["values"].get("project") == GKE_PROJECT]
    assert elsewhere == [("roles/monitoring.viewer", "var.gke_metrics_project")]
    job = next(checks.resources(planned, "google_dataflow_flex_template_job"))["values"]
    assert not [name for name in job["parameters"] if name.startswith("gke_")]

    default = plan(module)
    assert not [r["address"] for r in checks.resources(default) if "gke_metrics" in r["address"]]


def test_by_default_a_job_on_the_pipelines_image_writes_productivity_hourly(module: Path):
    """Cloud Scheduler starts the productivity job at the top of each hour, as an account that may
    only start it; the job's account reads what MPG's saved queries read (check_productivity reads
    its command and arguments)."""
    planned = plan(module)
    assert checks.check_plan(planned, graph(module)) == []
    (scheduler,) = (r["values"] for r in checks.resources(planned, "google_cloud_scheduler_job"))
    assert (scheduler["schedule"], scheduler["time_zone"]) == ("0 * * * *", "Etc/UTC")
    (job,) = (r["values"] for r in checks.resources(planned, "google_cloud_run_v2_job"))
    assert scheduler["http_target"][0]["uri"].endswith(f"/jobs/{job['name']}:run")
    read = {r["values"]["table_id"] for r in checks.resources(planned, "google_bigquery_table_iam_member")
            if r["name"].startswith("productivity")}
    assert read == checks.PRODUCTIVITY_READS and {"goodput_snapshots", "jobset_metrics"} <= read
    (invoker,) = (r["values"] for r in checks.resources(planned, "google_cloud_run_v2_job_iam_member"))
    assert (invoker["role"], invoker["name"]) == ("roles/run.invoker", job["name"])


def no_schedule(module: Path) -> str:
    """The ``-var-file`` argument that turns the schedule off (``-var`` takes no null), its file
    beside the module rather than in it, where checkov would read it."""
    var_file = module.parent / "no_schedule.tfvars"
    var_file.write_text("productivity_schedule = null\n")
    return f"-var-file={var_file}"


@pytest.mark.parametrize("off", ["no image", "no schedule"])
def test_without_an_image_or_a_schedule_there_is_no_productivity_job(module: Path, off: str):
    variables = (["-var=build_image=false"] if off == "no image"
                 else [f"-var=container_image={IMAGE}", no_schedule(module)])
    planned = plan_with(module, *variables)
    assert checks.check_plan(planned) == []
    assert not [r["address"] for r in checks.resources(planned) if r["name"].startswith("productivity")]


def test_checkov_finds_nothing_and_every_skip_is_justified(module: Path):
    assert checkov(module) == []
    for path in module.glob("*.tf"):
        for line in path.read_text().splitlines():
            if "checkov:skip=" in line:
                assert len(line.split(":", 2)[-1].strip()) > 20, f"{path.name}: a skip needs a reason: {line}"


# -- Deliberate mistakes ------------------------------------------------------------------------

def test_an_unknown_argument_fails_validation(tmp_path: Path):
    if TERRAFORM is None:
        pytest.skip("terraform is not installed")
    copy = module_copy(tmp_path, "unknown_argument.tf")
    validated = terraform(copy, "validate", "-json")
    diagnostics = json.loads(validated.stdout)
    assert diagnostics["valid"] is False
    assert any(d["summary"] == "Unsupported argument" and "message_ordering" in d["detail"]
               for d in diagnostics["diagnostics"]), validated.stdout


#: Each mistake file, and the problem the cross-checks find in the module with it.
MISTAKE_PROBLEMS = {
    "schema_drift_override.tf": "its schema is not goodput_schemas/tables/",
    "unknown_metric_override.tf": "no pipeline writes metric compute.googleapis.com/workload/step_time_v",
    "over_broad_role.tf": "over-broad role roles/editor",
    "throughput_autoscaling_override.tf": "Invalid enum value THROUGHPUT_BASED",
    "alert_comparison_override.tf": "Invalid enum value GREATER_THAN",
    "default_network_override.tf": "private worker IPs with no subnetwork that has Private Google Access",
    "agent_by_name.tf": "before anything makes sure it exists",
    "no_api_wait.tf": "google_service_account.trainer: does not wait for the APIs",
    "missing_api_override.tf": "API iam.googleapis.com is used but not enabled",
    "provider_block.tf": "provider google is configured in the module",
    "unnamed_project_override.tf": "google_pubsub_topic.events: does not name its project",
    "productivity_args_override.tf": "goodput productivity refuses",
    "gke_viewer_here_override.tf": "roles/monitoring.viewer on the whole project is broader than",
    "trigger_publishes.tf": "the productivity trigger may only start the productivity job",
    "gke_import_appends_events.tf": "google_service_account.gke_metrics may append to tables ['dead_letter', "
                                    "'events', 'jobset_metrics']",
}
#: The variables a mistake is planned with, beside an image: those that make what it changes.
MISTAKE_VARIABLES = dict.fromkeys(("gke_viewer_here_override.tf", "gke_import_appends_events.tf"),
                                  (f"-var=gke_metrics_project={GKE_PROJECT}",))


@pytest.fixture(scope="module")
def mistakes_found(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The cross-checks' problems with each mistake file, planned two at a time (each plan is
    mostly one process waiting on another)."""
    if TERRAFORM is None:
        pytest.skip("terraform is not installed")

    def found(mistake: str) -> list[str]:
        copy = module_copy(tmp_path_factory.mktemp("mistake"), mistake)
        return checks.check_plan(plan(copy, *MISTAKE_VARIABLES.get(mistake, ())), graph(copy))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(MISTAKE_PROBLEMS, pool.map(found, MISTAKE_PROBLEMS), strict=True))


@pytest.mark.parametrize("mistake", MISTAKE_PROBLEMS)
def test_a_mistake_fails_a_cross_check(mistakes_found: dict[str, list[str]], mistake: str):
    problems = mistakes_found[mistake]
    assert problems and all(MISTAKE_PROBLEMS[mistake] in p for p in problems), problems


def test_data_roles_broader_than_the_pipeline_needs_fail_the_iam_check(tmp_path: Path):
    """dataEditor on the dataset or on a table, objectAdmin on a bucket, objectViewer on the
    whole template bucket and a custom role with a delete permission are each refused as
    broader than the module needs, though none is primitive or an admin role."""
    if TERRAFORM is None:
        pytest.skip("terraform is not installed")
    problems = checks.check_plan(plan(module_copy(tmp_path, "broad_data_roles.tf")))
    assert all("broader than the module needs" in p for p in problems), problems
    for address in ("google_bigquery_dataset_iam_member.pipeline_data_editor",
                    "google_bigquery_table_iam_member.pipeline_table_editor",
                    "google_storage_bucket_iam_member.pipeline_object_admin",
                    "google_storage_bucket_iam_member.pipeline_bucket_reader",
                    "google_project_iam_custom_role.table_appender_plus"):
        assert any(p.startswith(address + ":") for p in problems), (address, problems)


def test_every_allowed_grant_is_made_and_has_a_reason(module: Path):
    """The IAM allow-list is exact: each (role, resource) in it is granted by the module (with
    training jobs allowed to act as the emitter and GKE's metrics imported), and each has a
    one-line reason."""
    granted = {(role, target) for _, role, target in checks.iam_grants(
        plan_with(module, f'-var=emitter_members=["{TRAINERS}"]', f"-var=kms_key_name={KEY}",
                  f"-var=gke_metrics_project={GKE_PROJECT}"))}
    assert set(checks.IAM_ALLOWED) == granted
    for reason in checks.IAM_ALLOWED.values():
        assert reason and "\n" not in reason


def test_checkov_fails_an_over_broad_role(tmp_path: Path):
    failed = checkov(module_copy(tmp_path, "over_broad_role.tf"))
    assert any(f.startswith("CKV_GCP_117 ") and f.endswith("google_project_iam_member.pipeline_editor")
               for f in failed), failed  # basic roles at project level


# -- The checks themselves ----------------------------------------------------------------------

WORKLOAD = 'resource.type = "compute.googleapis.com/Workload"'


@pytest.mark.parametrize(("query", "group_by", "problem"), [
    ('resource.type = "generic_task" AND metric.type = "custom.googleapis.com/fleet_goodput/goodput_pct"',
     ["resource.label.job"], None),
    (f'{WORKLOAD} AND metric.type = "custom.googleapis.com/fleet_goodput/goodput_pct"', [],
     "is written on generic_task"),
    (f'{WORKLOAD} AND metric.type = "compute.googleapis.com/workload/interval_goodput" AND '
     'metric.label.rolling_window_size = "60"', ["resource.label.workload_id"], None),
    (f'{WORKLOAD} AND metric.type = "compute.googleapis.com/workload/goodput"', [], "no pipeline writes"),
    (f'{WORKLOAD} AND metric.type = "compute.googleapis.com/workload/disruptions"',
     ["metric.label.badput_source"], "has no metric label badput_source"),
    (f'{WORKLOAD} AND metric.type = "compute.googleapis.com/workload/disruptions"',
     ["resource.label.zone"], "has no resource label zone"),
    ('resource.type = "gce_instance" AND metric.type = "compute.googleapis.com/workload/goodput_time"',
     [], "is written on compute.googleapis.com/Workload"),
    ('resource.type = "dataflow_job" AND metric.type = "dataflow.googleapis.com/job/system_lag"', [], None),
    ('resource.type = "generic_task" AND metric.type = "custom.googleapis.com/fleet_goodput/open_anomalies"',
     ["resource.label.job", "metric.label.kind"], None),
    ('resource.type = "generic_task" AND metric.type = "custom.googleapis.com/fleet_goodput/open_anomalies"',
     ["metric.label.host"], "has no metric label host"),
    ('resource.type = "dataflow_job" AND metric.type = "dataflow.googleapis.com/job/elements_produced_count"',
     [], "no pipeline writes"),
])
def test_check_query(query: str, group_by: list[str], problem: str | None):
    problems = checks.check_query(query, group_by)
    assert (problems == []) if problem is None else any(problem in p for p in problems), problems


@pytest.mark.parametrize(("query", "problem"), [
    ('max by (workload_id) (delta({"__name__"="compute.googleapis.com/workload/disruptions", '
     '"window_type"="cumulative"}[10m])) > 0', None),
    ('max by (job) (delta({"__name__"="compute.googleapis.com/workload/disruptions"}[10m])) > 0',
     "PromQL label job"),
    ('rate({"__name__"="compute.googleapis.com/workload/restarts"}[5m]) > 0', "no pipeline writes"),
    ('max by (job) ({"__name__"="custom.googleapis.com/fleet_goodput/open_anomalies", '
     '"monitored_resource"="generic_task", "kind"="hang"}) > 0', None),
    ('max by (workload_id) ({"__name__"="custom.googleapis.com/fleet_goodput/open_anomalies", '
     '"kind"="hang"}) > 0', "PromQL label workload_id"),
])
def test_check_promql(query: str, problem: str | None):
    problems = checks.check_promql(query)
    assert (problems == []) if problem is None else any(problem in p for p in problems), problems


# -- The documented deploy ----------------------------------------------------------------------

GCLOUD = shutil.which("gcloud")
NEW_PROJECT = "goodput-new-project"


def deploy_commands() -> list[str]:
    """The README's commands from a clean checkout to a running job, in order."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("From a clean checkout and a project where only billing is set up"):]
    start = section.index("```sh\n") + len("```sh\n")
    block = section[start:section.index("\n```", start)]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def gcloud(*args: str) -> subprocess.CompletedProcess[str]:
    """gcloud with a configuration of its own: no account, no project, no prompts."""
    if GCLOUD is None:
        pytest.skip("gcloud is not installed")
    with tempfile.TemporaryDirectory() as config:
        env = {**os.environ, "CLOUDSDK_CONFIG": config, "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
        return subprocess.run([GCLOUD, *args], env=env, cwd=REPO, text=True, capture_output=True, timeout=120)


def test_the_readme_deploys_with_one_apply():
    assert deploy_commands() == [
        "gcloud auth login",
        "gcloud auth application-default login",
        "terraform -chdir=terraform init",
        "terraform -chdir=terraform apply -var project_id=PROJECT",
    ]


@pytest.mark.parametrize("command", [c for c in deploy_commands() if c.startswith("gcloud ")])
def test_the_readme_gcloud_commands_exist(command: str):
    shown = gcloud(*command.split()[1:], "--help")
    assert shown.returncode == 0, shown.stderr


def test_the_readme_apply_plans_a_running_job_on_a_new_project(module: Path):
    """The documented apply, run as a plan against the stand-ins up to where a real project is
    needed (``terraform init`` needs the registry: the stand-in's development overrides stand in
    for it): it passes every cross-check and the new-project lint, builds the image and runs the
    job. Its build command is one gcloud takes, from the directory it runs in, up to the login."""
    apply = next(c for c in deploy_commands() if " apply " in c).split()
    variables = [arg.replace("PROJECT", NEW_PROJECT) for arg in apply[apply.index("apply") + 1:]]
    planned = plan_with(module, *(f"-var={v}" for v in variables[1::2]))
    assert checks.check_plan(planned, graph(module)) == []
    types = {r["type"] for r in checks.resources(planned)}
    assert {"google_dataflow_flex_template_job", "terraform_data"} <= types
    build = planned["planned_values"]["outputs"]["build_command"]["value"].split()
    assert build[:4] == ["gcloud", "builds", "submit", "."]
    config = REPO / next(arg.split("=", 1)[1] for arg in build if arg.startswith("--config="))
    assert config.is_file(), config
    submitted = gcloud(*build[1:])
    assert submitted.returncode == 1 and "gcloud auth login" in submitted.stderr, submitted.stderr


def test_the_image_build_config_is_a_cloud_build_that_the_dockerfile_builds():
    """dataflow/cloudbuild.yaml reads as Cloud Build's own ``Build`` message; its docker build names
    a Dockerfile that exists from the repository's root, and each file that Dockerfile copies is
    there too."""
    import yaml
    from google.cloud.devtools import cloudbuild_v1
    from google.protobuf import json_format

    build = yaml.safe_load((REPO / "dataflow" / "cloudbuild.yaml").read_text())
    json_format.ParseDict(build, cloudbuild_v1.Build.pb()())
    args = build["steps"][0]["args"]
    dockerfile = REPO / next(arg.split("=", 1)[1] for arg in args if arg.startswith("--file="))
    assert args[-1] == "." and dockerfile.is_file()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), f"{dockerfile.name} copies {source}, which is not there"


# -- Changing a variable ------------------------------------------------------------------------
#
# The stand-in knows which attributes the real provider replaces a resource for (ForceNew and the
# flex template job's CustomizeDiff): a plan against an applied state shows what a change drains,
# relaunches or makes anew. The runbook's "Changing a variable" says the same.

#: What holds data or run state: never replaced or removed by a change that updates in place.
KEEPERS = ("google_dataflow_flex_template_job.", "google_bigquery_dataset.", "google_bigquery_table.tables",
           "google_pubsub_topic.", "google_pubsub_subscription.", "google_storage_bucket.",
           "google_artifact_registry_repository.")
#: Replaced on purpose by in-place changes: commands that run again, the price and peak loads made anew.
RERUN = {"terraform_data.autoscaling[0]", "terraform_data.image[0]",
         'terraform_data.seed_load["accelerator_prices"]', 'google_bigquery_job.seed["accelerator_prices"]',
         'terraform_data.seed_load["accelerator_peaks"]', 'google_bigquery_job.seed["accelerator_peaks"]'}
#: Every variable's change that updates the deployment in place (all at once: a change that
#: replaces nothing alone replaces nothing with others).
IN_PLACE = {
    "labels": '{team="ml-platform"}', "enable_apis": "false", "emitter_members": f'["{TRAINERS}"]',
    "message_retention_duration": "86400s", "ack_deadline_seconds": "120",
    "partition_expiration_days": "400", "deletion_protection": "false", "container_image": IMAGE,
    "machine_type": "n2-standard-4", "num_workers": "2", "max_workers": "20", "public_worker_ips": "true",
    "subnetwork_cidr": "10.64.0.0/19",  # an expansion: a range that does not hold the old one replaces
    "snapshot_interval_s": "60", "rolling_windows_s": "[60, 600]", "monitoring_min_interval_s": "30",
    "gke_metrics_project": GKE_PROJECT, "gke_metrics_schedule": "*/15 * * * *",  # the import's job added
    "productivity_schedule": "30 */2 * * *",
    "notification_channels": '["projects/goodput-test/notificationChannels/1"]',
    "goodput_threshold_pct": "70",
    "goodput_window_s": "600", "step_deviation_threshold_s": "2", "stall_after_s": "900",
    "anomaly_alert_kinds": '["slowdown", "hang"]',
    "backlog_threshold": "5000", "oldest_unacked_threshold_s": "300", "system_lag_threshold_s": "120",
}
REGIONAL = {"google_artifact_registry_repository.images",
            "google_artifact_registry_repository_iam_member.builder",
            "google_artifact_registry_repository_iam_member.pipeline", "google_compute_subnetwork.workers[0]",
            "google_dataflow_flex_template_job.pipeline[0]", "google_storage_bucket.dataflow",
            "google_storage_bucket.scratch", "terraform_data.autoscaling[0]", "terraform_data.image[0]",
            "google_cloud_run_v2_job.productivity[0]", "google_cloud_scheduler_job.productivity[0]",
            "google_cloud_run_v2_job_iam_member.productivity_trigger[0]"}
#: The views of goodput_schemas/views/, and what the productivity job reads of the tables and views.
VIEWS = frozenset(views("dataset"))
PRODUCTIVITY_READERS = {
    *(f'google_bigquery_table_iam_member.productivity_reader["{table}"]'
      for table in checks.PRODUCTIVITY_READS - VIEWS),
    *(f'google_bigquery_table_iam_member.productivity_view_reader["{view}"]'
      for view in checks.PRODUCTIVITY_READS & VIEWS)}
DATASET = {"google_bigquery_dataset.goodput", 'google_bigquery_job.seed["accelerator_prices"]',
           'google_bigquery_job.seed["accelerator_peaks"]'}
#: What each change that cannot be made in place replaces.
REPLACES = {
    "region=europe-west4": REGIONAL,
    "dataset_location=EU": DATASET | {'terraform_data.seed_load["accelerator_prices"]',
                                      'terraform_data.seed_load["accelerator_peaks"]'},
    "dataset_id=goodput_two": DATASET | {"google_bigquery_dataset_iam_member.pipeline"} | {
        f"{kind}[\"{table}\"]" for table in checks.PIPELINE_TABLES
        for kind in ("google_bigquery_table.tables", "google_bigquery_table_iam_member.pipeline")} | {
        *(f'google_bigquery_table_iam_member.pipeline_reader["{table}"]' for table in checks.READ_TABLES),
        *(f'google_bigquery_table.tables["{table}"]' for table in ("accelerator_prices", "accelerator_peaks",
                                                                    "capacity", "jobset_metrics")),
        *(f'google_bigquery_table.views["{view}.sql"]' for view in VIEWS), *PRODUCTIVITY_READERS},
    # A new repository is empty: the image is built into it again.
    f"kms_key_name={KEY}": {"google_artifact_registry_repository.images", "terraform_data.image[0]",
                            "google_artifact_registry_repository_iam_member.builder",
                            "google_artifact_registry_repository_iam_member.pipeline"},
}


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The module applied with its defaults against the stand-in, and what the apply ran with
    gcloud (a stand-in on PATH records the commands; the real gcloud checks them elsewhere)."""
    if TERRAFORM is None:
        pytest.skip("terraform is not installed")
    root = tmp_path_factory.mktemp("applied")
    copy = module_copy(root)
    (root / "bin").mkdir()
    (root / "bin" / "gcloud").write_text(f'#!/bin/sh\necho "gcloud $*" >> {root / "gcloud.log"}\n')
    (root / "bin" / "gcloud").chmod(0o755)
    applying = terraform(copy, "apply", "-auto-approve", "-input=false", "-var=project_id=goodput-test",
                         path=f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert applying.returncode == 0, applying.stdout + applying.stderr
    return copy, (root / "gcloud.log").read_text().splitlines()


def replacements(module: Path, *variables: str) -> tuple[set[str], set[str], set[str]]:
    """The resources a plan with these ``-var`` changes would (replace, update in place, remove)."""
    planned = terraform(module, "plan", "-refresh=false", "-input=false", "-out=change.tfplan",
                        "-var=project_id=goodput-test", *variables)
    assert planned.returncode == 0, planned.stderr
    changes = json.loads(terraform(module, "show", "-json", "change.tfplan").stdout)["resource_changes"]

    def having(actions: list[str]) -> set[str]:
        return {c["address"] for c in changes if sorted(c["change"]["actions"]) == actions}
    return having(["create", "delete"]), having(["update"]), having(["delete"])


def test_apply_builds_the_image_and_sets_the_autoscaling_bounds(applied: tuple[Path, list[str]]):
    _, ran = applied
    assert [command.split()[:4] for command in ran] == [
        ["gcloud", "builds", "submit", "."], ["gcloud", "dataflow", "jobs", "update-options"]]
    for command in ran:  # what gcloud takes, up to the login
        checked = gcloud(*command.split()[1:])
        assert checked.returncode == 1 and "gcloud auth login" in checked.stderr, checked.stderr


def test_a_second_apply_changes_nothing(applied: tuple[Path, list[str]]):
    assert replacements(applied[0]) == (set(), set(), set())


def test_every_other_variable_changes_the_deployment_in_place(applied: tuple[Path, list[str]]):
    declared = set(re.findall(r'^variable "(\w+)"', (MODULE / "variables.tf").read_text(), re.M))
    covered = set(IN_PLACE) | {change.split("=")[0] for change in REPLACES}
    # project_id and name make another deployment; build_image without an image removes the job.
    assert declared - covered == {"project_id", "name", "build_image", "subnetwork"}
    replaced, updated, removed = replacements(applied[0], *(f"-var={k}={v}" for k, v in IN_PLACE.items()))
    assert replaced <= RERUN, replaced - RERUN
    assert "google_dataflow_flex_template_job.pipeline[0]" in updated
    assert not [address for address in removed if address.startswith(KEEPERS)], removed


def test_your_own_subnetwork_updates_the_job_in_place_and_retires_the_module_network(applied):
    mine = "-var=subnetwork=regions/us-central1/subnetworks/mine"
    replaced, updated, removed = replacements(applied[0], mine)
    assert replaced == set() and "google_dataflow_flex_template_job.pipeline[0]" in updated
    assert removed == {"google_compute_network.workers[0]", "google_compute_subnetwork.workers[0]",
                       "google_compute_firewall.workers[0]"}


def test_turning_the_schedule_off_removes_the_productivity_job_its_trigger_and_their_rights(applied):
    replaced, updated, removed = replacements(applied[0], no_schedule(applied[0]))
    assert replaced == set() and updated == set()
    assert removed == PRODUCTIVITY_READERS | {
        "google_cloud_run_v2_job.productivity[0]", "google_cloud_scheduler_job.productivity[0]",
        "google_cloud_run_v2_job_iam_member.productivity_trigger[0]",
        "google_service_account.productivity[0]", "google_service_account.productivity_trigger[0]",
        'google_project_iam_member.productivity["roles/bigquery.jobUser"]',
        'google_project_iam_member.productivity["roles/monitoring.metricWriter"]'}


@pytest.mark.parametrize("change", REPLACES)
def test_what_a_change_that_cannot_be_made_in_place_replaces(applied: tuple[Path, list[str]], change: str):
    replaced, _, _ = replacements(applied[0], f"-var={change}")
    assert replaced == REPLACES[change]
