# A deliberate mistake: an autoscaling algorithm named as the console shows it, not as the
# Dataflow API takes it (AUTOSCALING_ALGORITHM_*): the launch request is refused with a 400.
resource "google_dataflow_flex_template_job" "pipeline" {
  autoscaling_algorithm = "THROUGHPUT_BASED"
}
