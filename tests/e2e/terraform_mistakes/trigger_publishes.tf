# A deliberate mistake: the account Cloud Scheduler uses to start the productivity job may also
# publish events, a role the emitter holds (so allowed on that topic, but not for this account).
resource "google_pubsub_topic_iam_member" "trigger_publishes" {
  project = var.project_id
  topic   = google_pubsub_topic.events.name
  role    = "roles/pubsub.publisher"
  member  = google_service_account.productivity_trigger[0].member
}
