# A deliberate mistake: Pub/Sub's service agent granted by its name, though nothing made it: on a
# new project the grant fails until something first uses Pub/Sub.
resource "google_pubsub_topic_iam_member" "agent_publishes" {
  project = var.project_id
  topic   = google_pubsub_topic.events.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:service-123456789012@gcp-sa-pubsub.iam.gserviceaccount.com"

  depends_on = [google_project_service.apis]
}
