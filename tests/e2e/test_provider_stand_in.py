"""The stand-in google providers (tools/provider_stand_in): terraform validate and test work offline
against the real provider schemas, and catch unknown arguments, wrong types and unknown types.

The first run downloads two wheels from PyPI into .cache/terraform (about 140 MB, 40 s with the
schema rebuild); later runs reuse them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.provider_stand_in import referenced_types, terraform_env, values

TERRAFORM = shutil.which("terraform")
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not on PATH")

MODULE = """
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
