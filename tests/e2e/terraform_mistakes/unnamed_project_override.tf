# A deliberate mistake: a resource that takes its project from the provider settings.
resource "google_pubsub_topic" "events" {
  project = null
}
