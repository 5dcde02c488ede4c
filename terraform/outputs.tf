output "topic" {
  description = "The events topic: the emitter's destination (GoodputRecorder(destination=...))."
  value       = google_pubsub_topic.events.id
}

output "subscription" {
  description = "The pipeline's subscription."
  value       = google_pubsub_subscription.pipeline.id
}

output "dataset" {
  description = "The BigQuery dataset, as PROJECT:DATASET (the pipeline's --bigquery_dataset)."
  value       = "${var.project_id}:${google_bigquery_dataset.goodput.dataset_id}"
}

output "emitter_service_account" {
  description = "The service account training jobs publish as."
  value       = google_service_account.emitter.email
}

output "pipeline_service_account" {
  description = "The service account the Dataflow job runs as."
  value       = google_service_account.pipeline.email
}

output "bucket" {
  description = "The bucket of the template spec and the price seed."
  value       = google_storage_bucket.dataflow.name
}

output "scratch_bucket" {
  description = "The bucket of Dataflow's staging and temporary files."
  value       = google_storage_bucket.scratch.name
}

output "job_id" {
  description = "The Dataflow job's id (null until container_image is set)."
  value       = one(google_dataflow_flex_template_job.pipeline[*].job_id)
}

output "productivity_job" {
  description = "The Cloud Run job that writes ML Productivity Goodput on productivity_schedule (null when that is null, or with no image); gcloud run jobs execute runs it at once."
  value       = one(google_cloud_run_v2_job.productivity[*].name)
}

output "gke_metrics_job" {
  description = "The Cloud Run job that imports GKE's JobSet metrics on gke_metrics_schedule (null without gke_metrics_project, or with no image); gcloud run jobs execute runs it at once."
  value       = one(google_cloud_run_v2_job.gke_metrics[*].name)
}

output "dashboard" {
  description = "The Cloud Monitoring dashboard's id."
  value       = google_monitoring_dashboard.fleet.id
}

output "image" {
  description = "The image the Dataflow job runs: var.container_image, or the one built from this checkout."
  value       = local.image
}

output "build_command" {
  description = "The Cloud Build command that builds and pushes the image from this checkout (run from the repository's root); terraform apply runs it when build_image is on."
  value       = local.build_command
}
