# The dashboard and alerts on the metrics the pipeline writes: the reference's workload metrics on
# the compute.googleapis.com/Workload resource, so that they also work on the reference's own data
# (goodput % is goodput_time over total_elapsed_time), and the pipeline's own anomaly counts and ML
# Productivity Goodput (written by goodput productivity) on generic_task (job = the run id). And the
# pipeline watching itself: Pub/Sub backlog, Dataflow failure and lag.

locals {
  workload = "resource.type = \"compute.googleapis.com/Workload\""
  # PromQL selectors of the reference's metrics (goodput % is productive over total time).
  promql = {
    goodput_time = "{\"__name__\"=\"compute.googleapis.com/workload/goodput_time\", \"monitored_resource\"=\"compute.googleapis.com/Workload\"}"
    total_time   = "{\"__name__\"=\"compute.googleapis.com/workload/total_elapsed_time\", \"monitored_resource\"=\"compute.googleapis.com/Workload\", \"window_type\"=\"cumulative\"}"
    disruptions  = "{\"__name__\"=\"compute.googleapis.com/workload/disruptions\", \"monitored_resource\"=\"compute.googleapis.com/Workload\", \"window_type\"=\"cumulative\"}"
  }
  # The kinds of anomaly the pipeline finds in a run (pipeline/core/detect.py), as their alerts
  # explain them. The hang's numbers are the pipeline's defaults (--hang_min_s, --hang_factor).
  anomaly_kinds = {
    slowdown  = "steps slower than the run's own baseline"
    hang      = "no step for max(60 s, 10 x the run's median step time)"
    straggler = "one host slower than the run's other hosts"
  }
  stall_window_s = tostring(min(var.rolling_windows_s...))
  # The stall condition's alignment period: two intervals between a run's points (a snapshot
  # interval, and no less than the Monitoring one) in whole minutes, and a minute more. So a point
  # lost or up to a minute late, or a stream that snapshots less often than every 30 s, leaves no
  # alignment period without data, which would start the condition's duration again.
  stall_alignment_s = 60 + 60 * ceil(2 * max(var.snapshot_interval_s, var.monitoring_min_interval_s) / 60)
  job_filter        = "resource.type = \"dataflow_job\" AND resource.label.job_name = \"${var.name}\""
  subscription_filter = {
    pipeline = "resource.type = \"pubsub_subscription\" AND resource.label.subscription_id = \"${google_pubsub_subscription.pipeline.name}\""
  }
  alert_documentation = "Fleet goodput pipeline (${var.name}). The dashboard \"${var.name}\" shows the run; the BigQuery dataset ${var.dataset_id} holds its history (saved queries: goodput query --list)."
}

resource "google_monitoring_dashboard" "fleet" {
  project = var.project_id

  dashboard_json = templatefile("${path.module}/dashboards/fleet_goodput.json.tftpl", {
    display_name               = "Fleet goodput (${var.name})"
    subscription               = google_pubsub_subscription.pipeline.name
    job_name                   = var.name
    stall_window_s             = local.stall_window_s
    goodput_threshold_pct      = var.goodput_threshold_pct
    step_deviation_threshold_s = var.step_deviation_threshold_s
  })

  depends_on = [google_project_service.apis]
}

# -- Training runs ------------------------------------------------------------------------------

resource "google_monitoring_alert_policy" "low_goodput" {
  project = var.project_id

  display_name          = "${var.name}: goodput below ${var.goodput_threshold_pct}%"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "Cumulative goodput of a run below ${var.goodput_threshold_pct}% for ${var.goodput_window_s} s"
    condition_prometheus_query_language {
      query               = "100 * sum by (workload_id) (${local.promql.goodput_time}) / sum by (workload_id) (${local.promql.total_time}) < ${var.goodput_threshold_pct}"
      duration            = "${var.goodput_window_s}s"
      evaluation_interval = "60s"
    }
  }

  documentation {
    content   = local.alert_documentation
    mime_type = "text/markdown"
  }

  depends_on = [google_project_service.apis]
}

resource "google_monitoring_alert_policy" "disruption" {
  project = var.project_id

  display_name          = "${var.name}: a run was disrupted"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "A run's disruption count went up"
    condition_prometheus_query_language {
      query               = "max by (workload_id) (delta(${local.promql.disruptions}[10m])) > 0"
      duration            = "0s"
      evaluation_interval = "60s"
    }
  }

  documentation {
    content   = local.alert_documentation
    mime_type = "text/markdown"
  }

  depends_on = [google_project_service.apis]
}

resource "google_monitoring_alert_policy" "step_deviation" {
  project = var.project_id

  display_name          = "${var.name}: step time off its ideal"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "Step-time deviation of a run above ${var.step_deviation_threshold_s} s"
    condition_threshold {
      filter          = "${local.workload} AND metric.type = \"compute.googleapis.com/workload/step_time_deviation\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.step_deviation_threshold_s
      duration        = "600s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_MEAN"
        cross_series_reducer = "REDUCE_MEAN"
        group_by_fields      = ["resource.label.workload_id"]
      }
    }
  }

  documentation {
    content   = local.alert_documentation
    mime_type = "text/markdown"
  }

  depends_on = [google_project_service.apis]
}

resource "google_monitoring_alert_policy" "stalled" {
  project = var.project_id

  display_name          = "${var.name}: a run is stalled"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "No productive time in a run's last ${local.stall_window_s} s, for ${var.stall_after_s} s"
    condition_threshold {
      filter          = "${local.workload} AND metric.type = \"compute.googleapis.com/workload/interval_goodput\" AND metric.label.rolling_window_size = \"${local.stall_window_s}\""
      comparison      = "COMPARISON_LT"
      threshold_value = 0.001
      duration        = "${var.stall_after_s}s"
      aggregations {
        alignment_period     = "${local.stall_alignment_s}s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = ["resource.label.workload_id"]
      }
    }
  }

  documentation {
    content   = local.alert_documentation
    mime_type = "text/markdown"
  }

  depends_on = [google_project_service.apis]
}

# One policy per kind of anomaly: it fires when a run has one open (found and not yet ended) and
# closes when the count is back to 0, which the pipeline writes at every snapshot.
resource "google_monitoring_alert_policy" "anomaly" {
  for_each = { for kind in toset(var.anomaly_alert_kinds) : kind => local.anomaly_kinds[kind] }
  project  = var.project_id

  display_name          = "${var.name}: a run has a ${each.key}"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "A ${each.key} is open in a run: ${each.value}"
    condition_prometheus_query_language {
      query               = "max by (job) ({\"__name__\"=\"custom.googleapis.com/fleet_goodput/open_anomalies\", \"monitored_resource\"=\"generic_task\", \"kind\"=\"${each.key}\"}) > 0"
      duration            = "0s"
      evaluation_interval = "60s"
    }
  }

  documentation {
    content   = "${local.alert_documentation} A ${each.key} is ${each.value}. Each anomaly found is a row of the view ${var.dataset_id}.latest_anomalies (its host, onset, detection and end, the baseline and observed step times, the time lost); the incident closes when the run has no ${each.key} open."
    mime_type = "text/markdown"
  }

  depends_on = [google_project_service.apis]
}

# -- The pipeline itself ------------------------------------------------------------------------

resource "google_monitoring_alert_policy" "backlog" {
  project = var.project_id

  display_name          = "${var.name}: the pipeline falls behind"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "More than ${var.backlog_threshold} undelivered messages"
    condition_threshold {
      filter          = "${local.subscription_filter.pipeline} AND metric.type = \"pubsub.googleapis.com/subscription/num_undelivered_messages\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.backlog_threshold
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  conditions {
    display_name = "Oldest unacknowledged message older than ${var.oldest_unacked_threshold_s} s"
    condition_threshold {
      filter          = "${local.subscription_filter.pipeline} AND metric.type = \"pubsub.googleapis.com/subscription/oldest_unacked_message_age\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.oldest_unacked_threshold_s
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  conditions {
    display_name = "Dataflow system lag above ${var.system_lag_threshold_s} s"
    condition_threshold {
      filter          = "${local.job_filter} AND metric.type = \"dataflow.googleapis.com/job/system_lag\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.system_lag_threshold_s
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    content   = local.alert_documentation
    mime_type = "text/markdown"
  }

  depends_on = [google_project_service.apis]
}

resource "google_monitoring_alert_policy" "job_failed" {
  project = var.project_id

  display_name          = "${var.name}: the Dataflow job failed"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "Dataflow job ${var.name} failed"
    condition_threshold {
      filter          = "${local.job_filter} AND metric.type = \"dataflow.googleapis.com/job/is_failed\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    content   = local.alert_documentation
    mime_type = "text/markdown"
  }

  depends_on = [google_project_service.apis]
}
