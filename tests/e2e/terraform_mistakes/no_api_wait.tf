# A deliberate mistake: a service account made without waiting for the IAM API to be enabled.
resource "google_service_account" "trainer" {
  project    = var.project_id
  account_id = "${var.name}-trainer"
}
