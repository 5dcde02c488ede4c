# A customer-managed key (var.kms_key_name) is used by Google's service agents, not by the
# pipeline: each service that encrypts with it may use it once its agent exists. Nothing here
# without a key.

# The agents of the services that use the key besides Pub/Sub (whose agent main.tf makes).
resource "google_project_service_identity" "key_users" {
  provider = google-beta
  for_each = var.kms_key_name == null ? toset([]) : toset(["artifactregistry", "dataflow"])

  project = var.project_id
  service = "${each.key}.googleapis.com"

  depends_on = [google_project_service.apis]
}

# BigQuery's encryption account, made on first read; Compute Engine's agent is made with its API.
data "google_bigquery_default_service_account" "this" {
  count = var.kms_key_name == null ? 0 : 1

  project = var.project_id

  depends_on = [google_project_service.apis]
}

data "google_project" "this" {
  count = var.kms_key_name == null ? 0 : 1

  project_id = var.project_id

  depends_on = [google_project_service.apis]
}

locals {
  crypto_key_users = var.kms_key_name == null ? {} : {
    artifact_registry = google_project_service_identity.key_users["artifactregistry"].member                                  # the image repository
    bigquery          = data.google_bigquery_default_service_account.this[0].member                                           # the dataset's tables
    dataflow          = google_project_service_identity.key_users["dataflow"].member                                          # the job's state
    compute           = "serviceAccount:service-${data.google_project.this[0].number}@compute-system.iam.gserviceaccount.com" # the workers' disks
    pubsub            = google_project_service_identity.pubsub.member                                                         # the topics' messages
  }
}

resource "google_kms_crypto_key_iam_member" "agents" {
  for_each = local.crypto_key_users

  crypto_key_id = var.kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = each.value
}
