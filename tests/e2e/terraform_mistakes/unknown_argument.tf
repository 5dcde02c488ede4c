# A deliberate mistake: an argument google_pubsub_topic does not have.
resource "google_pubsub_topic" "typo" {
  name             = "typo"
  message_ordering = true
}
