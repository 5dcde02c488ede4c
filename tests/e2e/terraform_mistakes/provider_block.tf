# A deliberate mistake: a provider block inside the module, which a caller cannot then configure.
provider "google" {
  project = var.project_id
}
