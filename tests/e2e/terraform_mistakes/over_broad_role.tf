# A deliberate mistake: a primitive role for the pipeline, on the whole project.
resource "google_project_iam_member" "pipeline_editor" {
  project = var.project_id
  role    = "roles/editor"
  member  = google_service_account.pipeline.member
}
