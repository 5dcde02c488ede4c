# A deliberate mistake: the GKE metrics' viewer role granted on the deployment's own project,
# where the pipeline reads no time series.
resource "google_project_iam_member" "pipeline_gke_metrics" {
  count = 1

  project = var.project_id
}
