# The fleet goodput pipeline on Google Cloud: Pub/Sub in, Dataflow, BigQuery and Cloud Monitoring
# out. Resources are split by service: pubsub.tf, bigquery.tf, dataflow.tf, iam.tf, monitoring.tf.

provider "google" {
  project = var.project_id
  region  = var.region
}

provider "google-beta" {
  project = var.project_id
  region  = var.region
}

locals {
  # The single source of truth for the event and table schemas, shared with the pipeline.
  schemas       = "${path.module}/../goodput_schemas"
  table_options = jsondecode(file("${local.schemas}/table_options.json")).tables
  labels        = merge({ app = "fleet-goodput" }, var.labels)
  apis = toset([
    "bigquery.googleapis.com",
    "dataflow.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "storage.googleapis.com",
  ])
}

data "google_project" "this" {
  project_id = var.project_id
}

resource "google_project_service" "apis" {
  for_each = var.enable_apis ? local.apis : toset([])

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}
