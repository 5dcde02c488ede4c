# A deliberate mistake: an alert on a metric the pipeline does not write.
resource "google_monitoring_alert_policy" "step_deviation" {
  conditions {
    display_name = "Step-time variance of a run above ${var.step_deviation_threshold_s} s"
    condition_threshold {
      filter          = "${local.workload} AND metric.type = \"compute.googleapis.com/workload/step_time_variance\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.step_deviation_threshold_s
      duration        = "600s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_MEAN"
      }
    }
  }
}
