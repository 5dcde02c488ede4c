# A deliberate mistake: an argument google_pubsub_topic does not have.
resource "google_pubsub_topic" "events" {
  message_ordering = true
}
