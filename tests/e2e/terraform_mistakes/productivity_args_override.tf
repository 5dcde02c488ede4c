# A deliberate mistake: the productivity job run with an option goodput productivity does not take.
resource "google_cloud_run_v2_job" "productivity" {
  template {
    template {
      service_account = google_service_account.productivity[0].email

      containers {
        image   = local.image
        command = ["goodput"]
        args    = ["productivity", "--project=${var.project_id}", "--dataset=${var.project_id}:${var.dataset_id}"]
      }
    }
  }
}
