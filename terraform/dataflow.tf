# The streaming pipeline: a Dataflow flex template (spec written here from dataflow/metadata.json,
# image from images.tf) launched as one streaming job with Streaming Engine, its workers on the
# network of network.tf. GKE's JobSet metrics are imported apart from it (gke_metrics.tf).

locals {
  launch = var.container_image != null || var.build_image
  template_spec = {
    image    = local.image
    sdkInfo  = { language = "PYTHON" }
    metadata = jsondecode(file("${local.repository}/dataflow/metadata.json"))
  }
}

resource "google_storage_bucket" "dataflow" {
  # checkov:skip=CKV_GCP_62: holds only the template spec and the price seed; no user data to audit
  project = var.project_id

  name                        = "${var.project_id}-${var.name}-dataflow"
  location                    = var.region
  labels                      = local.labels
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      age            = 7
      matches_prefix = ["build/", "temp/", "staging/"] # the build's sources; Dataflow's files of earlier versions
    }
    action {
      type = "Delete"
    }
  }

  # Versions: the template spec keeps its last three; anything else replaced or deleted (the
  # build's uploaded sources, files of earlier versions) goes a day later.
  lifecycle_rule {
    condition {
      num_newer_versions = 3
      with_state         = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 1
      with_state                 = "ARCHIVED"
      matches_prefix             = ["build/", "seed/", "temp/", "staging/"]
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.apis]
}

# Dataflow's staging and temporary files, apart from the template spec: the pipeline may write
# and delete objects here and only here.
resource "google_storage_bucket" "scratch" {
  # checkov:skip=CKV_GCP_62: only Dataflow's own staging and temporary files; no user data to audit
  # checkov:skip=CKV_GCP_78: scratch files that Dataflow rewrites and deletes; older versions would only be kept to be deleted
  project = var.project_id

  name                        = "${var.project_id}-${var.name}-scratch"
  location                    = var.region
  labels                      = local.labels
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true

  lifecycle_rule {
    condition {
      age = 7
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.apis]
}

resource "google_storage_bucket_object" "template" {
  count = local.launch ? 1 : 0

  bucket       = google_storage_bucket.dataflow.name
  name         = "templates/${var.name}.json"
  content      = jsonencode(local.template_spec)
  content_type = "application/json"
}

resource "google_dataflow_flex_template_job" "pipeline" {
  provider = google-beta
  count    = local.launch ? 1 : 0
  project  = var.project_id

  name                    = var.name
  region                  = var.region
  container_spec_gcs_path = "gs://${google_storage_bucket.dataflow.name}/${google_storage_bucket_object.template[0].name}"
  sdk_container_image     = local.image
  service_account_email   = google_service_account.pipeline.email
  temp_location           = "gs://${google_storage_bucket.scratch.name}/temp"
  staging_location        = "gs://${google_storage_bucket.scratch.name}/staging"
  subnetwork              = local.subnetwork
  ip_configuration        = var.public_worker_ips ? "WORKER_IP_PUBLIC" : "WORKER_IP_PRIVATE"
  kms_key_name            = var.kms_key_name
  labels                  = local.labels

  enable_streaming_engine = true
  autoscaling_algorithm   = "AUTOSCALING_ALGORITHM_BASIC" # throughput-based
  num_workers             = var.num_workers
  max_workers             = var.max_workers
  machine_type            = var.machine_type

  parameters = {
    subscription              = google_pubsub_subscription.pipeline.id
    bigquery_dataset          = "${var.project_id}:${google_bigquery_dataset.goodput.dataset_id}"
    monitoring_project        = var.project_id
    monitoring_location       = var.region
    monitoring_min_interval_s = tostring(var.monitoring_min_interval_s)
    snapshot_interval_s       = tostring(var.snapshot_interval_s)
    windows                   = join(",", [for w in var.rolling_windows_s : tostring(w)])
  }

  on_delete = "drain" # terraform destroy drains: every message read is written first

  lifecycle {
    # The provider replaces a job whose worker counts change (drain and relaunch: the new job
    # restores each run from BigQuery with two queries); a running Streaming Engine job takes
    # new bounds in place instead (terraform_data.autoscaling).
    ignore_changes = [num_workers, max_workers]
  }

  depends_on = [
    google_project_iam_member.pipeline,
    google_pubsub_subscription_iam_member.pipeline,
    google_bigquery_dataset_iam_member.pipeline,
    google_bigquery_table_iam_member.pipeline,
    google_bigquery_table_iam_member.pipeline_reader,
    google_storage_bucket_iam_member.pipeline_scratch,
    google_storage_bucket_iam_member.pipeline_templates,
    google_artifact_registry_repository_iam_member.pipeline,
    google_bigquery_table.tables,
    google_compute_firewall.workers,
    google_kms_crypto_key_iam_member.agents,
    terraform_data.image,
  ]
}

# The running job's autoscaling bounds, set in place whenever they change (and once at launch):
# num_workers becomes the fewest workers autoscaling keeps, max_workers the most.
resource "terraform_data" "autoscaling" {
  count = local.launch ? 1 : 0

  triggers_replace = [google_dataflow_flex_template_job.pipeline[0].job_id, var.num_workers, var.max_workers]

  provisioner "local-exec" {
    command = join(" ", [
      "gcloud dataflow jobs update-options ${google_dataflow_flex_template_job.pipeline[0].job_id} --quiet",
      "--project=${var.project_id} --region=${var.region}",
      "--min-num-workers=${var.num_workers} --max-num-workers=${var.max_workers}",
    ])
  }

  lifecycle {
    precondition {
      condition     = var.num_workers <= var.max_workers
      error_message = "num_workers must not be more than max_workers."
    }
  }
}
