# A deliberate mistake: the GKE metrics import's account may append to the events table, which the
# pipeline writes (so appending to it is allowed, but not for this account).
resource "google_bigquery_table_iam_member" "gke_metrics_events" {
  project    = var.project_id
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  table_id   = google_bigquery_table.tables["events"].table_id
  role       = google_project_iam_custom_role.table_appender.name
  member     = google_service_account.gke_metrics[0].member
}
