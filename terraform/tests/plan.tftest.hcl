# terraform test: the module's behaviour with mocked providers (no cloud needed).

mock_provider "google" {
  mock_data "google_project" {
    defaults = {
      number = "123456789012"
    }
  }
}

mock_provider "google-beta" {
  mock_resource "google_project_service_identity" {
    defaults = {
      member = "serviceAccount:service-123456789012@gcp-sa-pubsub.iam.gserviceaccount.com"
    }
  }
}

variables {
  project_id = "goodput-test"
}

run "by_default_the_image_is_built_and_run" {
  command = plan

  assert {
    condition     = google_dataflow_flex_template_job.pipeline[0].sdk_container_image == terraform_data.image[0].triggers_replace[0]
    error_message = "The job runs the image the apply builds."
  }

  assert {
    condition     = google_artifact_registry_repository.images.format == "DOCKER"
    error_message = "The module makes the image's repository."
  }
}

run "without_an_image_everything_but_the_job_is_deployed" {
  command = plan

  variables {
    build_image = false
  }

  assert {
    condition     = length(google_dataflow_flex_template_job.pipeline) == 0
    error_message = "No container_image: no Dataflow job."
  }

  assert {
    condition     = length(google_bigquery_table.tables) == length(fileset("${path.module}/../goodput_schemas/tables", "*.json"))
    error_message = "Every table of goodput_schemas/tables/ is deployed."
  }
}

run "the_pipeline_streams_with_its_state_kept_on_update" {
  command = plan # an apply would run gcloud (the job's autoscaling bounds)

  variables {
    container_image = "us-docker.pkg.dev/goodput-test/images/fleet-goodput:1"
  }

  assert {
    condition     = google_dataflow_flex_template_job.pipeline[0].enable_streaming_engine && google_dataflow_flex_template_job.pipeline[0].on_delete == "drain"
    error_message = "The job runs on Streaming Engine and is drained, not cancelled, on destroy."
  }

  assert {
    condition     = google_dataflow_flex_template_job.pipeline[0].autoscaling_algorithm == "AUTOSCALING_ALGORITHM_BASIC" && google_dataflow_flex_template_job.pipeline[0].ip_configuration == "WORKER_IP_PRIVATE"
    error_message = "Throughput-based autoscaling, as the API names it; workers without public IPs."
  }

  assert {
    condition     = jsondecode(google_storage_bucket_object.template[0].content).image == var.container_image
    error_message = "The template spec names the image."
  }
}

run "the_dataflow_subscription_sets_nothing_dataflow_ignores" {
  variables {
    build_image = false
  }

  assert {
    condition     = google_pubsub_subscription.pipeline.enable_message_ordering != true && length(google_pubsub_subscription.pipeline.dead_letter_policy) == 0 && length(google_pubsub_subscription.pipeline.retry_policy) == 0
    error_message = "Dataflow honours neither ordering nor Pub/Sub's dead-letter and retry policies: none is set (and paid for)."
  }

  assert {
    condition     = google_pubsub_subscription.pipeline.expiration_policy[0].ttl == "" && google_pubsub_subscription.pipeline.message_retention_duration == var.message_retention_duration
    error_message = "The subscription never expires and keeps a stopped pipeline's backlog for the retention."
  }

  assert {
    condition     = google_pubsub_topic.events.schema_settings[0].encoding == "JSON"
    error_message = "The events topic checks JSON messages against the event schema."
  }
}

run "points_more_often_than_every_5_s_are_refused" {
  command = plan

  variables {
    monitoring_min_interval_s = 2
  }

  expect_failures = [var.monitoring_min_interval_s]
}

run "each_kind_of_anomaly_has_its_alert" {
  command = plan

  variables {
    build_image = false
  }

  assert {
    condition     = toset(keys(google_monitoring_alert_policy.anomaly)) == toset(["slowdown", "hang", "straggler"])
    error_message = "By default every kind of anomaly alerts, each on a policy of its own."
  }
}

run "only_kinds_the_pipeline_finds_can_alert" {
  command = plan

  variables {
    anomaly_alert_kinds = ["stall"]
  }

  expect_failures = [var.anomaly_alert_kinds]
}

run "the_pipeline_appends_rows_and_keeps_its_files_apart" {
  command = plan

  variables {
    container_image = "us-docker.pkg.dev/goodput-test/images/fleet-goodput:1"
  }

  assert {
    condition     = toset(google_project_iam_custom_role.table_appender.permissions) == toset(["bigquery.tables.get", "bigquery.tables.updateData"])
    error_message = "The pipeline's table role appends rows: no reads, no deletes, no schema changes."
  }

  assert {
    condition     = length(setintersection(keys(google_bigquery_table_iam_member.pipeline), ["accelerator_prices", "accelerator_peaks", "capacity"])) == 0
    error_message = "The pipeline may not write the price and peak tables, which Terraform loads, nor capacity, which a person imports."
  }

  assert {
    condition     = toset(google_project_iam_custom_role.table_reader.permissions) == toset(["bigquery.tables.getData"]) && toset(keys(google_bigquery_table_iam_member.pipeline_reader)) == toset(["events", "goodput_snapshots"])
    error_message = "The pipeline reads the rows of the two tables a restore queries, and no others."
  }

  assert {
    condition     = startswith(google_dataflow_flex_template_job.pipeline[0].temp_location, "gs://${google_storage_bucket.scratch.name}/") && startswith(google_dataflow_flex_template_job.pipeline[0].staging_location, "gs://${google_storage_bucket.scratch.name}/")
    error_message = "Dataflow's staging and temporary files go to the scratch bucket, apart from the template spec."
  }
}

run "gke_metrics_are_imported_on_a_schedule_only_from_a_project_given" {
  command = plan

  variables {
    container_image     = "us-docker.pkg.dev/goodput-test/images/fleet-goodput:1"
    gke_metrics_project = "goodput-gke"
  }

  assert {
    condition     = join(" ", google_cloud_run_v2_job.gke_metrics[0].template[0].template[0].containers[0].args) == "import gke-metrics --project=goodput-gke --bigquery_dataset=goodput-test:fleet_goodput" && google_cloud_run_v2_job.gke_metrics[0].template[0].template[0].containers[0].image == var.container_image
    error_message = "A job on the pipeline's image runs goodput import gke-metrics for the project given, into the module's dataset."
  }

  assert {
    condition     = google_cloud_scheduler_job.gke_metrics[0].schedule == "*/10 * * * *" && google_cloud_scheduler_job.gke_metrics[0].http_target[0].uri == "https://run.googleapis.com/v2/projects/goodput-test/locations/us-central1/jobs/fleet-goodput-gke-metrics:run"
    error_message = "Cloud Scheduler starts the import every 10 minutes by default."
  }

  assert {
    condition     = google_project_iam_member.gke_metrics_viewer[0].project == "goodput-gke" && google_project_iam_member.gke_metrics_viewer[0].role == "roles/monitoring.viewer"
    error_message = "The import's own account may read time series in the GKE project, and nothing more there."
  }

  assert {
    condition     = toset(keys(google_bigquery_table_iam_member.gke_metrics_appender)) == toset(["jobset_metrics", "dead_letter"]) && toset(keys(google_bigquery_table_iam_member.gke_metrics_reader)) == toset(["jobset_metrics", "dead_letter"])
    error_message = "The import appends to and reads jobset_metrics and dead_letter alone."
  }

  assert {
    condition     = length([for name in keys(google_dataflow_flex_template_job.pipeline[0].parameters) : name if startswith(name, "gke_")]) == 0 && !contains(keys(google_bigquery_table_iam_member.pipeline), "jobset_metrics")
    error_message = "The stream takes no part in the import."
  }
}

run "by_default_no_gke_metrics_are_imported" {
  command = plan

  variables {
    container_image = "us-docker.pkg.dev/goodput-test/images/fleet-goodput:1"
  }

  assert {
    condition     = length(google_cloud_run_v2_job.gke_metrics) == 0 && length(google_service_account.gke_metrics) == 0 && length(google_project_iam_member.gke_metrics_viewer) == 0
    error_message = "No gke_metrics_project: no import, no account, no grant."
  }
}

run "gke_metrics_need_a_project_id_and_a_unix_cron_schedule" {
  command = plan

  variables {
    gke_metrics_project  = "Not a project"
    gke_metrics_schedule = "every 10 minutes"
  }

  expect_failures = [var.gke_metrics_project, var.gke_metrics_schedule]
}

run "productivity_is_written_hourly_by_a_job_on_the_pipelines_image" {
  command = plan

  variables {
    container_image = "us-docker.pkg.dev/goodput-test/images/fleet-goodput:1"
  }

  assert {
    condition     = google_cloud_run_v2_job.productivity[0].template[0].template[0].containers[0].image == var.container_image && join(" ", google_cloud_run_v2_job.productivity[0].template[0].template[0].containers[0].args) == "productivity --project=goodput-test --bigquery_dataset=goodput-test:fleet_goodput --location=us-central1"
    error_message = "The job runs goodput productivity in the pipeline's image, on the module's dataset."
  }

  assert {
    condition     = google_cloud_scheduler_job.productivity[0].schedule == "0 * * * *" && google_cloud_scheduler_job.productivity[0].http_target[0].uri == "https://run.googleapis.com/v2/projects/goodput-test/locations/us-central1/jobs/fleet-goodput-productivity:run"
    error_message = "Cloud Scheduler starts the job at the top of each hour."
  }

  assert {
    condition     = google_cloud_run_v2_job_iam_member.productivity_trigger[0].role == "roles/run.invoker" && google_cloud_run_v2_job_iam_member.productivity_trigger[0].name == google_cloud_run_v2_job.productivity[0].name
    error_message = "The scheduler's account may start this job, on the job alone."
  }

  assert {
    condition     = contains(keys(google_bigquery_table_iam_member.productivity_reader), "jobset_metrics") && !contains(keys(google_bigquery_table_iam_member.productivity_reader), "events")
    error_message = "The job reads what MPG is computed from (GKE's metrics among them), not the raw events."
  }
}

run "a_null_schedule_writes_no_productivity" {
  command = plan

  variables {
    container_image       = "us-docker.pkg.dev/goodput-test/images/fleet-goodput:1"
    productivity_schedule = null
  }

  assert {
    condition     = length(google_cloud_run_v2_job.productivity) == 0 && length(google_cloud_scheduler_job.productivity) == 0 && length(google_service_account.productivity) == 0 && length(google_bigquery_table_iam_member.productivity_reader) == 0
    error_message = "No schedule: no job, no trigger, no account, no grants."
  }
}

run "a_schedule_is_unix_cron" {
  command = plan

  variables {
    productivity_schedule = "every 1 hours"
  }

  expect_failures = [var.productivity_schedule]
}
