# A deliberate mistake: the pipeline's data roles as they were, broader than it needs. dataEditor on
# the dataset may create and delete its tables (on one table, delete it and change its schema);
# objectAdmin on the bucket may overwrite the template spec.
resource "google_bigquery_dataset_iam_member" "pipeline_data_editor" {
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  role       = "roles/bigquery.dataEditor"
  member     = google_service_account.pipeline.member
}

resource "google_bigquery_table_iam_member" "pipeline_table_editor" {
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  table_id   = google_bigquery_table.tables["events"].table_id
  role       = "roles/bigquery.dataEditor"
  member     = google_service_account.pipeline.member
}

resource "google_storage_bucket_iam_member" "pipeline_object_admin" {
  bucket = google_storage_bucket.dataflow.name
  role   = "roles/storage.objectAdmin"
  member = google_service_account.pipeline.member
}

resource "google_project_iam_custom_role" "table_appender_plus" {
  project     = var.project_id
  role_id     = "table_appender_plus"
  title       = "An appender that may also delete"
  permissions = ["bigquery.tables.updateData", "bigquery.tables.delete"]
}

resource "google_storage_bucket_iam_member" "pipeline_bucket_reader" {
  bucket = google_storage_bucket.dataflow.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.pipeline.member
}
