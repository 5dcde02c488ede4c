# -- Project ------------------------------------------------------------------------------------

variable "project_id" {
  description = "The project to deploy into."
  type        = string
}

variable "region" {
  description = "Region of the Dataflow job, its buckets, network and image repository. Changing it replaces them all (the job drained and relaunched): see the runbook."
  type        = string
  default     = "us-central1"
}

variable "name" {
  description = "Prefix of every resource name (topic, subscriptions, service accounts, job). Changing it makes another deployment: see the runbook."
  type        = string
  default     = "fleet-goodput"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,20}$", var.name))
    error_message = "name must be 3 to 21 characters: lower-case letters, digits and hyphens, starting with a letter."
  }
}

variable "labels" {
  description = "Labels added to every resource that takes labels."
  type        = map(string)
  default     = {}
}

variable "enable_apis" {
  description = "Enable the Google APIs the system uses (never disabled on destroy)."
  type        = bool
  default     = true
}

variable "kms_key_name" {
  description = "Cloud KMS key for the topics, the dataset, the image repository and the Dataflow job (null: Google-managed keys). Changing it makes the image repository anew (the image is built again); the rest is updated in place."
  type        = string
  default     = null
}

# -- Pub/Sub ------------------------------------------------------------------------------------

variable "message_retention_duration" {
  description = "How long the topic and the pipeline's subscription keep messages, e.g. \"604800s\" (7 days): the window in which a stopped pipeline can catch up."
  type        = string
  default     = "604800s"
}

variable "ack_deadline_seconds" {
  description = "Ack deadline of the pipeline's subscription."
  type        = number
  default     = 60

  validation {
    condition     = var.ack_deadline_seconds >= 10 && var.ack_deadline_seconds <= 600
    error_message = "ack_deadline_seconds must be between 10 and 600."
  }
}

variable "emitter_members" {
  description = "Principals allowed to act as the emitter service account, e.g. GKE workload identities \"serviceAccount:PROJECT.svc.id.goog[NAMESPACE/KSA]\"."
  type        = list(string)
  default     = []
}

# -- BigQuery -----------------------------------------------------------------------------------

variable "dataset_id" {
  description = "BigQuery dataset of the output tables and views. Changing it makes a new dataset: see the runbook."
  type        = string
  default     = "fleet_goodput"
}

variable "dataset_location" {
  description = "Location of the BigQuery dataset. Changing it replaces the dataset: see the runbook."
  type        = string
  default     = "US"
}

variable "partition_expiration_days" {
  description = "Days a day partition of the partitioned tables is kept (null: forever)."
  type        = number
  default     = null
}

variable "deletion_protection" {
  description = "Refuse to destroy the tables (and the data in them) with terraform destroy."
  type        = bool
  default     = true
}

# -- Dataflow -----------------------------------------------------------------------------------

variable "container_image" {
  description = "An image built from dataflow/Dockerfile to run (launcher and workers), e.g. \"REGION-docker.pkg.dev/PROJECT/REPO/fleet-goodput:TAG\". Null: the image is built from this checkout (build_image)."
  type        = string
  default     = null
}

variable "build_image" {
  description = "With no container_image: build the image from this checkout with Cloud Build during terraform apply (gcloud, logged in, on the deployer's machine) whenever its sources change. False and no container_image: everything but the Dataflow job is deployed."
  type        = bool
  default     = true
}

variable "machine_type" {
  description = "Dataflow worker machine type."
  type        = string
  default     = "n2-standard-2"
}

variable "num_workers" {
  description = "Dataflow workers at launch, and the fewest autoscaling keeps. Changed on a running job in place (gcloud dataflow jobs update-options)."
  type        = number
  default     = 1
}

variable "max_workers" {
  description = "Most Dataflow workers autoscaling may use. Changed on a running job in place (gcloud dataflow jobs update-options)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_workers >= 1
    error_message = "max_workers must be at least 1."
  }
}

variable "subnetwork" {
  description = "Your own subnetwork for the workers, as a self link or \"regions/REGION/subnetworks/NAME\" in the job's region; it needs Private Google Access unless public_worker_ips. Null: the module makes a network of its own (network.tf)."
  type        = string
  default     = null
}

variable "subnetwork_cidr" {
  description = "IP range of the subnetwork the module makes when subnetwork is null. A range that holds the old one is changed in place; any other replaces the subnetwork (drain the job first)."
  type        = string
  default     = "10.64.0.0/20"

  validation {
    condition     = can(cidrhost(var.subnetwork_cidr, 0))
    error_message = "subnetwork_cidr must be an IPv4 range such as 10.64.0.0/20."
  }
}

variable "public_worker_ips" {
  description = "Give the workers public IPs. Off by default: the workers reach Google's APIs through Private Google Access, and nothing on the internet can reach them. Turn it on only for a subnetwork of yours without Private Google Access (organisation policies often forbid external IPs)."
  type        = bool
  default     = false
}

variable "snapshot_interval_s" {
  description = "Seconds between two snapshots of a run that keeps sending events."
  type        = number
  default     = 30
}

variable "rolling_windows_s" {
  description = "Rolling windows of the interval goodput, in seconds; the shortest one also tells stalled runs."
  type        = list(number)
  default     = [60, 300, 900, 3600]
}

variable "monitoring_min_interval_s" {
  description = "At most one Cloud Monitoring point per series this often (at least 5)."
  type        = number
  default     = 10

  validation {
    condition     = var.monitoring_min_interval_s >= 5
    error_message = "Cloud Monitoring takes at most one point per series every 5 s."
  }
}

variable "gke_metrics_project" {
  description = "Project of the GKE clusters whose JobSet metrics (kubernetes.io/jobset/...) are imported from Cloud Monitoring into the jobset_metrics table, ML Productivity Goodput's scheduling factor, by goodput import gke-metrics on gke_metrics_schedule (gke_metrics.tf). Null: none imported. The import's service account gets roles/monitoring.viewer there (the deployer must be allowed to grant it). Like the Dataflow job, it needs an image (container_image or build_image)."
  type        = string
  default     = null

  validation {
    condition     = var.gke_metrics_project == null || can(regex("^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.gke_metrics_project))
    error_message = "gke_metrics_project must be a Google Cloud project id, e.g. my-gke-project."
  }
}

variable "gke_metrics_schedule" {
  description = "With gke_metrics_project: when GKE's JobSet metrics are imported, as a unix-cron schedule in UTC. Each run reads the last 2 hours (GKE samples each minute and writes a point up to an hour late) and appends only what the table lacks; every 10 minutes by default, so ML Productivity Goodput's hourly run sees points at most 10 minutes older than GKE has them. Each run lists five metrics' series and runs two small queries (on-demand BigQuery bills at least 10 MB a table a query)."
  type        = string
  default     = "*/10 * * * *"

  validation {
    condition     = can(regex("^\\S+( \\S+){4}$", var.gke_metrics_schedule))
    error_message = "gke_metrics_schedule must be a unix-cron schedule of five fields (minute hour day-of-month month day-of-week), e.g. \"*/10 * * * *\"."
  }
}

# -- ML Productivity Goodput --------------------------------------------------------------------

variable "productivity_schedule" {
  description = "When ML Productivity Goodput (goodput productivity: each run's, and the fleet's per accelerator type) is written to Cloud Monitoring, as a unix-cron schedule in UTC, e.g. \"0 * * * *\": a Cloud Run job on the pipeline's image, started by Cloud Scheduler (productivity.tf). Hourly by default: the dashboard's MPG charts have nothing else to draw from, and since GKE's points come up to an hour late, running more often adds little; each run queries the tables MPG is computed from (on-demand BigQuery bills the bytes read). Null: no job, and no MPG in Cloud Monitoring. Like the Dataflow job, it needs an image (container_image or build_image)."
  type        = string
  default     = "0 * * * *"

  validation {
    condition     = var.productivity_schedule == null || can(regex("^\\S+( \\S+){4}$", var.productivity_schedule))
    error_message = "productivity_schedule must be a unix-cron schedule of five fields (minute hour day-of-month month day-of-week), e.g. \"0 * * * *\", or null."
  }
}

# -- Alerts -------------------------------------------------------------------------------------

variable "notification_channels" {
  description = "Cloud Monitoring notification channel ids (projects/P/notificationChannels/N) every alert notifies."
  type        = list(string)
  default     = []
}

variable "goodput_threshold_pct" {
  description = "Alert when a run's cumulative goodput stays below this percentage."
  type        = number
  default     = 80
}

variable "goodput_window_s" {
  description = "How long a run's goodput must stay below the threshold before the alert fires."
  type        = number
  default     = 1800
}

variable "step_deviation_threshold_s" {
  description = "Alert when a run's step-time deviation from its ideal step time exceeds this many seconds."
  type        = number
  default     = 1
}

variable "stall_after_s" {
  description = "Alert when a run that has not ended made no productive progress in its shortest rolling window for this long."
  type        = number
  default     = 600
}

variable "anomaly_alert_kinds" {
  description = "Kinds of anomaly that alert as soon as a run has one: slowdown (steps slower than the run's own baseline), hang (no step for too long), straggler (one host slower than the run's other hosts). Each kind is a policy of its own; leave one out to silence it."
  type        = list(string)
  default     = ["slowdown", "hang", "straggler"]

  validation {
    condition     = alltrue([for kind in var.anomaly_alert_kinds : contains(["slowdown", "hang", "straggler"], kind)])
    error_message = "anomaly_alert_kinds may hold only slowdown, hang and straggler."
  }
}

variable "backlog_threshold" {
  description = "Alert when the pipeline's subscription holds more undelivered messages than this."
  type        = number
  default     = 100000
}

variable "oldest_unacked_threshold_s" {
  description = "Alert when the oldest unacknowledged message of the pipeline's subscription is older than this."
  type        = number
  default     = 600
}

variable "system_lag_threshold_s" {
  description = "Alert when the Dataflow job's system lag exceeds this."
  type        = number
  default     = 300
}
