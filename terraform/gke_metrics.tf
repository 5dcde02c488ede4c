# GKE's JobSet metrics (var.gke_metrics_project), ML Productivity Goodput's scheduling factor, in the
# jobset_metrics table. They are read from Cloud Monitoring up to an hour after GKE samples them, so
# no stream step reads them: a processing-time timer that re-arms itself would hold a Dataflow job's
# watermark, and its drain would never end. `goodput import gke-metrics` runs instead, as
# `goodput productivity` does (productivity.tf): a Cloud Run job on the pipeline's image, started
# on var.gke_metrics_schedule by Cloud Scheduler. Each run reads the last 2 hours and appends only
# the points the table lacks. Each runs as an account of its own: the job's may list time series
# in the GKE project, and query and append to jobset_metrics and dead_letter (where a refused
# point goes); the trigger's may only start this job.

locals {
  gke_metrics = local.launch && var.gke_metrics_project != null
  # What the import reads (the latest point of each series, the refused points kept) and appends to.
  gke_metrics_tables = toset(["jobset_metrics", "dead_letter"])
}

resource "google_service_account" "gke_metrics" {
  count = local.gke_metrics ? 1 : 0

  project      = var.project_id
  account_id   = "${var.name}-gke"
  display_name = "Fleet goodput GKE JobSet metrics import (Cloud Run job)"

  depends_on = [google_project_service.apis]
}

# monitoring.timeSeries.list comes in no predefined role narrower than roles/monitoring.viewer
# (read-only: no writes, no alerting changes), and a custom role would have to be made in the
# clusters' project, often another team's.
resource "google_project_iam_member" "gke_metrics_viewer" {
  count = local.gke_metrics ? 1 : 0

  project = var.gke_metrics_project
  role    = "roles/monitoring.viewer"
  member  = google_service_account.gke_metrics[0].member
}

resource "google_project_iam_member" "gke_metrics_queries" {
  count = local.gke_metrics ? 1 : 0

  project = var.project_id
  role    = "roles/bigquery.jobUser" # what the tables hold of the range: query jobs belong to the project
  member  = google_service_account.gke_metrics[0].member
}

# The pipeline's own roles (iam.tf), on the two tables alone: streaming inserts, and rows read in
# queries; and the dataset's metadata, which insertAll checks.
resource "google_bigquery_table_iam_member" "gke_metrics_appender" {
  for_each = local.gke_metrics ? local.gke_metrics_tables : toset([])

  project    = var.project_id
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  table_id   = google_bigquery_table.tables[each.key].table_id
  role       = google_project_iam_custom_role.table_appender.name
  member     = google_service_account.gke_metrics[0].member
}

resource "google_bigquery_table_iam_member" "gke_metrics_reader" {
  for_each = local.gke_metrics ? local.gke_metrics_tables : toset([])

  project    = var.project_id
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  table_id   = google_bigquery_table.tables[each.key].table_id
  role       = google_project_iam_custom_role.table_reader.name
  member     = google_service_account.gke_metrics[0].member
}

resource "google_bigquery_dataset_iam_member" "gke_metrics" {
  count = local.gke_metrics ? 1 : 0

  project    = var.project_id
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  role       = "roles/bigquery.metadataViewer" # bigquery.datasets.get, which insertAll checks
  member     = google_service_account.gke_metrics[0].member
}

resource "google_cloud_run_v2_job" "gke_metrics" {
  count = local.gke_metrics ? 1 : 0

  project             = var.project_id
  location            = var.region
  name                = "${var.name}-gke-metrics"
  labels              = local.labels
  deletion_protection = false # it holds no data: turning the import off removes it

  template {
    labels = local.labels

    template {
      service_account = google_service_account.gke_metrics[0].email
      timeout         = "600s" # five metrics' series of 2 hours, two queries, one insert
      max_retries     = 0      # the next scheduled run reads the same 2 hours again

      containers {
        image = local.image
        # The image's entry point is Beam's worker boot; goodput is the console script of the
        # package the image installs (pyproject.toml).
        command = ["goodput"]
        args = [
          "import",
          "gke-metrics",
          "--project=${var.gke_metrics_project}",
          "--bigquery_dataset=${var.project_id}:${google_bigquery_dataset.goodput.dataset_id}",
        ]
      }
    }
  }

  depends_on = [google_project_service.apis, terraform_data.image] # the image must exist to make the job
}

# Cloud Scheduler calls the Cloud Run Admin API's jobs.run with an OAuth token of this account,
# which may start this job's executions (roles/run.invoker on it) and do nothing else.
resource "google_service_account" "gke_metrics_trigger" {
  count = local.gke_metrics ? 1 : 0

  project      = var.project_id
  account_id   = "${var.name}-gke-cron"
  display_name = "Fleet goodput GKE metrics schedule (Cloud Scheduler starts the Cloud Run job)"

  depends_on = [google_project_service.apis]
}

resource "google_cloud_run_v2_job_iam_member" "gke_metrics_trigger" {
  count = local.gke_metrics ? 1 : 0

  project  = var.project_id
  location = google_cloud_run_v2_job.gke_metrics[0].location
  name     = google_cloud_run_v2_job.gke_metrics[0].name
  role     = "roles/run.invoker" # run.jobs.run
  member   = google_service_account.gke_metrics_trigger[0].member
}

resource "google_cloud_scheduler_job" "gke_metrics" {
  count = local.gke_metrics ? 1 : 0

  project     = var.project_id
  region      = var.region
  name        = "${var.name}-gke-metrics"
  description = "Starts the Cloud Run job ${google_cloud_run_v2_job.gke_metrics[0].name}: goodput import gke-metrics appends GKE's new JobSet points to the jobset_metrics table."
  schedule    = var.gke_metrics_schedule
  time_zone   = "Etc/UTC"

  http_target {
    http_method = "POST"
    uri         = "https://run.googleapis.com/v2/projects/${var.project_id}/locations/${google_cloud_run_v2_job.gke_metrics[0].location}/jobs/${google_cloud_run_v2_job.gke_metrics[0].name}:run"

    oauth_token {
      service_account_email = google_service_account.gke_metrics_trigger[0].email
      scope                 = "https://www.googleapis.com/auth/cloud-platform"
    }
  }

  # The first run starts only once it may, and once the job may do its work.
  depends_on = [
    google_cloud_run_v2_job_iam_member.gke_metrics_trigger,
    google_project_iam_member.gke_metrics_viewer,
    google_project_iam_member.gke_metrics_queries,
    google_bigquery_table_iam_member.gke_metrics_appender,
    google_bigquery_table_iam_member.gke_metrics_reader,
    google_bigquery_dataset_iam_member.gke_metrics,
  ]
}
