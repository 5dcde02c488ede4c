# The fleet goodput pipeline on Google Cloud: Pub/Sub in, Dataflow, BigQuery and Cloud Monitoring
# out, and ML Productivity Goodput written on a schedule. Resources are split by service: pubsub.tf,
# bigquery.tf, images.tf, network.tf, dataflow.tf, iam.tf, kms.tf, monitoring.tf, productivity.tf.
#
# No provider blocks: every resource names its project (and region), so the module deploys the
# same as a root module (`terraform apply` here) or called from another configuration, whose
# provider settings it then takes (examples/basic/).

locals {
  repository = "${path.module}/.." # the checkout: the image's sources, the schemas
  # The single source of truth for the event and table schemas, shared with the pipeline.
  schemas       = "${local.repository}/goodput_schemas"
  table_options = jsondecode(file("${local.schemas}/table_options.json")).tables
  labels        = merge({ app = "fleet-goodput" }, var.labels)
  # Every API a resource here calls. On a new project nothing is created before its API is on:
  # each resource depends on google_project_service.apis, directly or through what it refers to
  # (a test checks it). Service Usage itself must be on to enable the others (it is by default).
  apis = toset([
    "artifactregistry.googleapis.com", # the pipeline's image
    "bigquery.googleapis.com",
    "cloudbuild.googleapis.com",           # builds the image (images.tf)
    "cloudresourcemanager.googleapis.com", # project IAM grants, the project's number
    "cloudscheduler.googleapis.com",       # starts the productivity job (productivity.tf)
    "compute.googleapis.com",              # the workers' network and VMs
    "dataflow.googleapis.com",
    "iam.googleapis.com",     # service accounts and the custom role
    "logging.googleapis.com", # the build's and the workers' logs
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com", # the productivity job
    "storage.googleapis.com",
  ])
}

resource "google_project_service" "apis" {
  for_each = var.enable_apis ? local.apis : toset([])

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

# Service agents: Google's own accounts that act for a service in the project. Each is created
# here before it is granted anything (a new project has none until the API is first used).
resource "google_project_service_identity" "pubsub" {
  provider = google-beta

  project = var.project_id
  service = "pubsub.googleapis.com"

  depends_on = [google_project_service.apis]
}
