# Identity: one service account for the training jobs' emitters (publish to the events topic and
# nothing else) and one for the pipeline (read its subscription, append rows to the tables it
# writes, write metrics, run as a Dataflow worker, keep Dataflow's files in its scratch bucket,
# pull its image); the image builder's account is in images.tf, the productivity job's and its
# trigger's in productivity.tf, the GKE metrics import's and its trigger's in gke_metrics.tf.
# No primitive roles, no admin roles, no keys. Each binding and why it is needed is listed in the
# cross-check that fails on any other (tests/support/terraform.py, IAM_ALLOWED).

resource "google_service_account" "emitter" {
  project = var.project_id

  account_id   = "${var.name}-emitter"
  display_name = "Fleet goodput emitter (training jobs publish events)"

  depends_on = [google_project_service.apis]
}

resource "google_pubsub_topic_iam_member" "emitter" {
  project = var.project_id

  topic  = google_pubsub_topic.events.name
  role   = "roles/pubsub.publisher"
  member = google_service_account.emitter.member
}

resource "google_service_account_iam_member" "emitter_users" {
  for_each = toset(var.emitter_members)

  service_account_id = google_service_account.emitter.name
  role               = "roles/iam.workloadIdentityUser"
  member             = each.value
}

resource "google_service_account" "pipeline" {
  project = var.project_id

  account_id   = "${var.name}-pipeline"
  display_name = "Fleet goodput pipeline (Dataflow)"

  depends_on = [google_project_service.apis]
}

resource "google_project_iam_member" "pipeline" {
  for_each = toset([
    "roles/dataflow.worker",
    "roles/monitoring.metricWriter",
    "roles/bigquery.jobUser", # run queries (restores, below): granted on projects only
  ])

  project = var.project_id
  role    = each.value
  member  = google_service_account.pipeline.member
}

resource "google_pubsub_subscription_iam_member" "pipeline" {
  for_each = toset([
    "roles/pubsub.subscriber",
    "roles/pubsub.viewer", # the Pub/Sub source reads the subscription's settings
  ])

  project      = var.project_id
  subscription = google_pubsub_subscription.pipeline.name
  role         = each.value
  member       = google_service_account.pipeline.member
}

# BigQuery: the pipeline appends rows with streaming inserts (tabledata.insertAll), reads two
# tables in queries to restore runs, and does nothing else: no tables made, nothing deleted.
# insertAll needs bigquery.tables.updateData and
# bigquery.tables.get on the table and bigquery.datasets.get on the dataset. No predefined role
# appends without more: roles/bigquery.dataEditor, even on one table, may also delete the table
# and change its schema. Hence a custom role on each table the pipeline writes (not
# accelerator_prices and accelerator_peaks, which load jobs fill as the deployer, nor capacity,
# which goodput import capacity fills as its user, nor jobset_metrics, which goodput import
# gke-metrics fills as its own account), and the dataset's metadata.
locals {
  pipeline_tables = setsubtract(keys(local.table_options), concat(keys(local.seeded_tables), ["capacity", "jobset_metrics"]))
}

resource "google_project_iam_custom_role" "table_appender" {
  project     = var.project_id
  role_id     = "${replace(var.name, "-", "_")}_table_appender"
  title       = "Fleet goodput table appender"
  description = "Streaming inserts into a table: its metadata and new rows; no reads, no deletes, no schema changes."
  permissions = ["bigquery.tables.get", "bigquery.tables.updateData"]

  depends_on = [google_project_service.apis]
}

resource "google_bigquery_table_iam_member" "pipeline" {
  for_each = local.pipeline_tables

  project    = var.project_id
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  table_id   = google_bigquery_table.tables[each.key].table_id
  role       = google_project_iam_custom_role.table_appender.name
  member     = google_service_account.pipeline.member
}

# A stream launched anew (a job drained and launched again) restores each run it does not hold
# from two queries of that run's rows in events and goodput_snapshots (pipeline/beam/restore.py):
# a query job in the project (roles/bigquery.jobUser, above) that reads those two tables' rows.
# The productivity job reads what its queries read with the same role (productivity.tf), and the
# GKE metrics import what it imported already (gke_metrics.tf).
resource "google_project_iam_custom_role" "table_reader" {
  project     = var.project_id
  role_id     = "${replace(var.name, "-", "_")}_table_reader"
  title       = "Fleet goodput run history reader"
  description = "Reads a table's rows in queries: a run's history, when a stream restores the run; what ML Productivity Goodput is computed from; the GKE points and refusals an import holds already."
  permissions = ["bigquery.tables.getData"]

  depends_on = [google_project_service.apis]
}

resource "google_bigquery_table_iam_member" "pipeline_reader" {
  for_each = toset(["events", "goodput_snapshots"])

  project    = var.project_id
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  table_id   = google_bigquery_table.tables[each.key].table_id
  role       = google_project_iam_custom_role.table_reader.name
  member     = google_service_account.pipeline.member
}

resource "google_bigquery_dataset_iam_member" "pipeline" {
  project = var.project_id

  dataset_id = google_bigquery_dataset.goodput.dataset_id
  role       = "roles/bigquery.metadataViewer" # bigquery.datasets.get, which insertAll checks
  member     = google_service_account.pipeline.member
}

# Cloud Storage: Dataflow's staging and temporary files are created, read, listed and cleaned up
# in a bucket of their own; the template spec (and the price seed) stay in the deployer's bucket,
# where the pipeline may only read the template spec.
resource "google_storage_bucket_iam_member" "pipeline_scratch" {
  bucket = google_storage_bucket.scratch.name
  role   = "roles/storage.objectUser"
  member = google_service_account.pipeline.member
}

resource "google_storage_bucket_iam_member" "pipeline_templates" {
  bucket = google_storage_bucket.dataflow.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.pipeline.member

  condition {
    title       = "template-specs-only"
    description = "The flex template launcher reads the template spec; nothing else in the bucket."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.dataflow.name}/objects/templates/\")"
  }
}

# Artifact Registry: the flex template launcher and the workers pull the pipeline's image.
resource "google_artifact_registry_repository_iam_member" "pipeline" {
  project    = var.project_id
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.reader"
  member     = google_service_account.pipeline.member
}
