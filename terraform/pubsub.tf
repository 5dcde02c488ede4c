# Events in: the topic enforces the event schema; the pipeline reads its own subscription.

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

# Dataflow reads this subscription, and acknowledges a message once its first stage's output is
# durable: it never nacks one, so Pub/Sub's retry and dead-letter policies never apply (Pub/Sub's
# "handle message failures" page says Dataflow does not honour them), and a bad message becomes a
# row of the dead_letter table instead. Message ordering buys nothing after Dataflow's shuffle and
# costs delivery throughput. None is set. Changing ordering replaces the subscription: see the
# README's runbook for a switch that loses no message.
resource "google_pubsub_subscription" "pipeline" {
  project = var.project_id

  name   = "${var.name}-pipeline"
  topic  = google_pubsub_topic.events.id
  labels = local.labels

  ack_deadline_seconds       = var.ack_deadline_seconds
  message_retention_duration = var.message_retention_duration

  expiration_policy {
    ttl = "" # never expires, however long the pipeline is stopped
  }
}
