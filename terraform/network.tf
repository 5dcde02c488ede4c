# The workers' network. Workers have no public IP (nothing reaches them from the internet, and
# organisation policies often forbid external IPs), so they reach Pub/Sub, BigQuery, Monitoring
# and Artifact Registry through Private Google Access. A brand-new project may have no network at
# all (or a default one without Private Google Access), so unless var.subnetwork names one of
# yours, the module makes its own: one subnetwork in the job's region, Private Google Access on,
# and the one firewall rule Dataflow's workers need between themselves.

locals {
  own_network = var.subnetwork == null
  subnetwork  = local.own_network ? google_compute_subnetwork.workers[0].self_link : var.subnetwork
}

resource "google_compute_network" "workers" {
  count = local.own_network ? 1 : 0

  project                 = var.project_id
  name                    = "${var.name}-workers"
  description             = "Dataflow workers of the fleet goodput pipeline."
  auto_create_subnetworks = false

  depends_on = [google_project_service.apis]
}

resource "google_compute_subnetwork" "workers" {
  # checkov:skip=CKV_GCP_26: flow logs of one pipeline's worker-to-worker traffic would cost more than they tell; Dataflow logs its workers
  count = local.own_network ? 1 : 0

  project                  = var.project_id
  name                     = "${var.name}-workers"
  region                   = var.region
  network                  = google_compute_network.workers[0].id
  ip_cidr_range            = var.subnetwork_cidr
  private_ip_google_access = true # Google APIs without public IPs
}

# Dataflow's workers talk to each other on TCP 12345-12346; they carry the "dataflow" network tag.
resource "google_compute_firewall" "workers" {
  count = local.own_network ? 1 : 0

  project     = var.project_id
  name        = "${var.name}-workers-internal"
  description = "Dataflow worker to worker traffic of the fleet goodput pipeline."
  network     = google_compute_network.workers[0].id
  direction   = "INGRESS"
  source_tags = ["dataflow"]
  target_tags = ["dataflow"]

  allow {
    protocol = "tcp"
    ports    = ["12345-12346"]
  }
}
