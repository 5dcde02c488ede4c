# A deliberate mistake: the GKE metrics import's viewer role granted on the deployment's own
# project, where it reads no time series (planned with gke_metrics_project set).
resource "google_project_iam_member" "gke_metrics_viewer" {
  project = var.project_id
}
