# Identity: one service account for the training jobs' emitters (publish to the events topic and
# nothing else) and one for the pipeline (read its subscription, write the dataset's tables, write
# metrics, run as a Dataflow worker). No primitive roles, no keys.

resource "google_service_account" "emitter" {
  account_id   = "${var.name}-emitter"
  display_name = "Fleet goodput emitter (training jobs publish events)"
}

resource "google_pubsub_topic_iam_member" "emitter" {
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
  account_id   = "${var.name}-pipeline"
  display_name = "Fleet goodput pipeline (Dataflow)"
}

resource "google_project_iam_member" "pipeline" {
  for_each = toset([
    "roles/dataflow.worker",
    "roles/monitoring.metricWriter",
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

  subscription = google_pubsub_subscription.pipeline.name
  role         = each.value
  member       = google_service_account.pipeline.member
}

resource "google_bigquery_dataset_iam_member" "pipeline" {
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  role       = "roles/bigquery.dataEditor"
  member     = google_service_account.pipeline.member
}

resource "google_storage_bucket_iam_member" "pipeline" {
  bucket = google_storage_bucket.dataflow.name
  role   = "roles/storage.objectAdmin" # the template spec, staging and temporary files
  member = google_service_account.pipeline.member
}

# Pub/Sub's service agent moves undeliverable messages: it publishes to the dead-letter topic and
# acknowledges them on the pipeline's subscription.
locals {
  pubsub_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  topic  = google_pubsub_topic.dead_letter.name
  role   = "roles/pubsub.publisher"
  member = local.pubsub_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  subscription = google_pubsub_subscription.pipeline.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
}
