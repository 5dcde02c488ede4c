# A deliberate mistake: private worker IPs on the default network, which has no Private Google
# Access: the launcher cannot pull the image and the workers cannot reach Pub/Sub or BigQuery.
resource "google_dataflow_flex_template_job" "pipeline" {
  subnetwork = null
}
