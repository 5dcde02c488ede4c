# A deliberate mistake: a comparison Cloud Monitoring does not know (it takes COMPARISON_GT).
resource "google_monitoring_alert_policy" "backlog" {
  conditions {
    display_name = "Backlog"
    condition_threshold {
      filter          = "resource.type = \"pubsub_subscription\" AND metric.type = \"pubsub.googleapis.com/subscription/num_undelivered_messages\""
      comparison      = "GREATER_THAN"
      threshold_value = 1000
      duration        = "300s"
    }
  }
}
