# ML Productivity Goodput (MPG) in Cloud Monitoring. The stream cannot write it (a run's mean MFU
# is not part of its state, GKE's points come up to an hour late): `goodput productivity` computes
# it from the tables and writes it, and something must run that after the stream has written. Here
# a Cloud Run job on the pipeline's own image runs it, started on var.productivity_schedule by
# Cloud Scheduler. Each runs as an account of its own: the job's may query the tables MPG is
# computed from and write metrics; the trigger's may only start this job. GKE's metrics, MPG's
# scheduling factor, are imported by a job of their own on a schedule of their own
# (gke_metrics.tf): MPG's reads only the table they are imported into, with fewer rights.

locals {
  productivity = local.launch && var.productivity_schedule != null
  # What MPG's saved queries read: the tables and views they name, and the tables named by those
  # views (a query of a view reads the view's tables with the querier's rights). Read from the SQL
  # itself, so that a change of the queries in goodput_schemas/ changes the grants with it; views
  # of views are not followed here, and the cross-check that follows them would fail.
  productivity_queries = ["run_productivity", "fleet_productivity"]
  view_names           = toset([for file in fileset("${local.schemas}/views", "*.sql") : trimsuffix(file, ".sql")])
  named_in = {
    for path in setunion(fileset(local.schemas, "views/*.sql"), [for query in local.productivity_queries : "sql/${query}.sql"]) :
    path => flatten(regexall("[$][{]dataset[}][.](\\w+)", file("${local.schemas}/${path}")))
  }
  productivity_named = toset(flatten([for query in local.productivity_queries : local.named_in["sql/${query}.sql"]]))
  productivity_reads = setunion(local.productivity_named, flatten([for name in local.productivity_named : lookup(local.named_in, "views/${name}.sql", [])]))
}

resource "google_service_account" "productivity" {
  count = local.productivity ? 1 : 0

  project      = var.project_id
  account_id   = "${var.name}-mpg"
  display_name = "Fleet goodput ML Productivity Goodput (Cloud Run job)"

  depends_on = [google_project_service.apis]
}

resource "google_project_iam_member" "productivity" {
  for_each = local.productivity ? toset([
    "roles/bigquery.jobUser",        # the saved queries: query jobs belong to the project
    "roles/monitoring.metricWriter", # MPG's time series, which belong to the project
  ]) : toset([])

  project = var.project_id
  role    = each.value
  member  = google_service_account.productivity[0].member
}

# The rows of what the queries read, with the pipeline's read-only role (iam.tf): no other table.
resource "google_bigquery_table_iam_member" "productivity_reader" {
  for_each = local.productivity ? setsubtract(local.productivity_reads, local.view_names) : toset([])

  project    = var.project_id
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  table_id   = google_bigquery_table.tables[each.key].table_id
  role       = google_project_iam_custom_role.table_reader.name
  member     = google_service_account.productivity[0].member
}

resource "google_bigquery_table_iam_member" "productivity_view_reader" {
  for_each = local.productivity ? setintersection(local.productivity_reads, local.view_names) : toset([])

  project    = var.project_id
  dataset_id = google_bigquery_dataset.goodput.dataset_id
  table_id   = google_bigquery_table.views["${each.key}.sql"].table_id
  role       = google_project_iam_custom_role.table_reader.name
  member     = google_service_account.productivity[0].member
}

resource "google_cloud_run_v2_job" "productivity" {
  count = local.productivity ? 1 : 0

  project             = var.project_id
  location            = var.region
  name                = "${var.name}-productivity"
  labels              = local.labels
  deletion_protection = false # it holds no data: turning the schedule off removes it

  template {
    labels = local.labels

    template {
      service_account = google_service_account.productivity[0].email
      timeout         = "600s" # two queries and a write of a point per run
      max_retries     = 1      # the next scheduled run writes every figure again anyway

      containers {
        image = local.image
        # The image's entry point is Beam's worker boot; goodput is the console script of the
        # package the image installs (pyproject.toml).
        command = ["goodput"]
        args = [
          "productivity",
          "--project=${var.project_id}",
          "--bigquery_dataset=${var.project_id}:${google_bigquery_dataset.goodput.dataset_id}",
          "--location=${var.region}", # where the stream puts runs that name no location (monitoring_location)
        ]
      }
    }
  }

  depends_on = [google_project_service.apis, terraform_data.image] # the image must exist to make the job
}

# Cloud Scheduler calls the Cloud Run Admin API's jobs.run with an OAuth token of this account,
# which may start this job's executions (roles/run.invoker on it) and do nothing else.
resource "google_service_account" "productivity_trigger" {
  count = local.productivity ? 1 : 0

  project      = var.project_id
  account_id   = "${var.name}-mpg-cron"
  display_name = "Fleet goodput MPG schedule (Cloud Scheduler starts the Cloud Run job)"

  depends_on = [google_project_service.apis]
}

resource "google_cloud_run_v2_job_iam_member" "productivity_trigger" {
  count = local.productivity ? 1 : 0

  project  = var.project_id
  location = google_cloud_run_v2_job.productivity[0].location
  name     = google_cloud_run_v2_job.productivity[0].name
  role     = "roles/run.invoker" # run.jobs.run
  member   = google_service_account.productivity_trigger[0].member
}

resource "google_cloud_scheduler_job" "productivity" {
  count = local.productivity ? 1 : 0

  project     = var.project_id
  region      = var.region
  name        = "${var.name}-productivity"
  description = "Starts the Cloud Run job ${google_cloud_run_v2_job.productivity[0].name}: goodput productivity writes ML Productivity Goodput to Cloud Monitoring."
  schedule    = var.productivity_schedule
  time_zone   = "Etc/UTC" # the fleet's figure is per day, UTC

  http_target {
    http_method = "POST"
    uri         = "https://run.googleapis.com/v2/projects/${var.project_id}/locations/${google_cloud_run_v2_job.productivity[0].location}/jobs/${google_cloud_run_v2_job.productivity[0].name}:run"

    oauth_token {
      service_account_email = google_service_account.productivity_trigger[0].email
      scope                 = "https://www.googleapis.com/auth/cloud-platform"
    }
  }

  # The first run starts only once it may, and once the job may do its work.
  depends_on = [
    google_cloud_run_v2_job_iam_member.productivity_trigger,
    google_project_iam_member.productivity,
    google_bigquery_table_iam_member.productivity_reader,
    google_bigquery_table_iam_member.productivity_view_reader,
  ]
}
