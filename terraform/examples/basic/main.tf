# The fleet goodput pipeline deployed from another configuration, with alerts sent by e-mail.
# terraform init && terraform apply -var project_id=PROJECT -var alert_email=you@example.com

variable "project_id" {
  description = "The project to deploy into."
  type        = string
}

variable "container_image" {
  description = "The pipeline image built from dataflow/Dockerfile (null: no Dataflow job yet)."
  type        = string
  default     = null
}

variable "alert_email" {
  description = "Where alerts are sent."
  type        = string
}

resource "google_monitoring_notification_channel" "email" {
  project      = var.project_id
  display_name = "Fleet goodput alerts"
  type         = "email"
  labels = {
    email_address = var.alert_email
  }
}

module "fleet_goodput" {
  source = "../.."

  project_id            = var.project_id
  region                = "us-central1"
  container_image       = var.container_image
  max_workers           = 5
  goodput_threshold_pct = 85
  notification_channels = [google_monitoring_notification_channel.email.id]
  labels = {
    team = "ml-platform"
  }
}

output "topic" {
  description = "Where training jobs publish their events."
  value       = module.fleet_goodput.topic
}
