# Events in: the topic enforces the event schema; the pipeline reads its own subscription; what
# cannot be delivered goes to a dead-letter topic, kept by a subscription of its own.

resource "google_pubsub_schema" "events" {
  project = var.project_id

  name       = "${var.name}-events"
  type       = "PROTOCOL_BUFFER"
  definition = file("${local.schemas}/goodput_event.proto")

  depends_on = [google_project_service.apis]
}

resource "google_pubsub_topic" "events" {
  # checkov:skip=CKV_GCP_83: customer-managed encryption is optional (var.kms_key_name); Google-managed keys by default
  project = var.project_id

  name                       = "${var.name}-events"
  labels                     = local.labels
  message_retention_duration = var.message_retention_duration
  kms_key_name               = var.kms_key_name

  schema_settings {
    schema   = google_pubsub_schema.events.id
    encoding = "JSON"
  }

  depends_on = [google_kms_crypto_key_iam_member.agents]
}

resource "google_pubsub_subscription" "pipeline" {
  project = var.project_id

  name   = "${var.name}-pipeline"
  topic  = google_pubsub_topic.events.id
  labels = local.labels

  ack_deadline_seconds       = var.ack_deadline_seconds
  message_retention_duration = var.message_retention_duration
  enable_message_ordering    = true # the emitter orders each run's messages by its run id

  expiration_policy {
    ttl = "" # never expires, however long the pipeline is stopped
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter.id
    max_delivery_attempts = var.max_delivery_attempts
  }

  depends_on = [google_pubsub_topic_iam_member.dead_letter_publisher]
}

resource "google_pubsub_topic" "dead_letter" {
  # checkov:skip=CKV_GCP_83: customer-managed encryption is optional (var.kms_key_name); Google-managed keys by default
  project = var.project_id

  name                       = "${var.name}-dead-letter"
  labels                     = local.labels
  message_retention_duration = var.message_retention_duration
  kms_key_name               = var.kms_key_name

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.agents]
}

resource "google_pubsub_subscription" "dead_letter" {
  project = var.project_id

  name                       = "${var.name}-dead-letter"
  topic                      = google_pubsub_topic.dead_letter.id
  labels                     = local.labels
  message_retention_duration = var.message_retention_duration

  expiration_policy {
    ttl = ""
  }
}
