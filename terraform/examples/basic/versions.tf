terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 8.0"
    }
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 6.0, < 8.0"
    }
  }
}

# The module has no provider blocks of its own: it takes these.
provider "google" {
  project = var.project_id
}

provider "google-beta" {
  project = var.project_id
}
