# The pipeline's image (the flex template launcher and the workers' SDK container in one, from
# dataflow/Dockerfile): an Artifact Registry repository, and a Cloud Build of this checkout into it
# whenever the sources change, run by `terraform apply` itself (gcloud on the deployer's machine).
# With var.container_image set, that image is used and nothing is built.

locals {
  build          = var.container_image == null && var.build_image
  image_registry = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}"
  # What the image is built from (dataflow/Dockerfile copies these; .gcloudignore keeps the rest
  # out of the upload). Its digest tags the image, so a change of any of them builds a new one.
  image_sources = sort([
    for file in setunion(
      fileset(local.repository, "{emitter,pipeline,goodput_schemas}/**"),
      ["pyproject.toml", "README.md", "dataflow/Dockerfile", "dataflow/main.py", "dataflow/cloudbuild.yaml"],
    ) : file if !strcontains(file, "__pycache__") && !strcontains(file, ".egg-info")
  ])
  image_digest = sha256(join("\n", [for file in local.image_sources : "${file} ${filesha256("${local.repository}/${file}")}"]))
  image        = coalesce(var.container_image, "${local.image_registry}/fleet-goodput:${substr(local.image_digest, 0, 16)}")
  build_source = "gs://${google_storage_bucket.dataflow.name}/build/"
  # Run from the repository's root (the Dockerfile's build context).
  build_command = join(" ", [
    "gcloud builds submit . --quiet",
    "--project=${var.project_id}",
    "--region=${var.region}",
    "--config=dataflow/cloudbuild.yaml",
    "--substitutions=_IMAGE=${local.image}",
    "--service-account=projects/${var.project_id}/serviceAccounts/${var.name}-builder@${var.project_id}.iam.gserviceaccount.com",
    "--gcs-source-staging-dir=${local.build_source}source",
  ])
}

resource "google_artifact_registry_repository" "images" {
  # checkov:skip=CKV_GCP_84: customer-managed encryption is optional (var.kms_key_name); Google-managed keys by default
  project       = var.project_id
  location      = var.region
  repository_id = var.name
  format        = "DOCKER"
  description   = "Images of the fleet goodput pipeline (Dataflow flex template launcher and workers)."
  labels        = local.labels
  kms_key_name  = var.kms_key_name

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.agents]
}

# Cloud Build runs as an account of its own that may only read the uploaded source, push to this
# repository and write its logs: a new project's default build account may have no rights at all.
resource "google_service_account" "builder" {
  project      = var.project_id
  account_id   = "${var.name}-builder"
  display_name = "Fleet goodput image builder (Cloud Build)"

  depends_on = [google_project_service.apis]
}

resource "google_artifact_registry_repository_iam_member" "builder" {
  project    = var.project_id
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.writer"
  member     = google_service_account.builder.member
}

resource "google_project_iam_member" "builder" {
  project = var.project_id
  role    = "roles/logging.logWriter" # the build's log (dataflow/cloudbuild.yaml logs to Cloud Logging only)
  member  = google_service_account.builder.member
}

resource "google_storage_bucket_iam_member" "builder" {
  bucket = google_storage_bucket.dataflow.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.builder.member

  condition {
    title       = "build-sources-only"
    description = "Cloud Build reads the source archive gcloud uploads; nothing else in the bucket."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.dataflow.name}/objects/build/\")"
  }
}

resource "terraform_data" "image" {
  count = local.build ? 1 : 0

  triggers_replace = [local.image]

  provisioner "local-exec" {
    working_dir = local.repository
    command     = local.build_command
  }

  depends_on = [
    google_artifact_registry_repository_iam_member.builder,
    google_project_iam_member.builder,
    google_storage_bucket_iam_member.builder,
  ]

  lifecycle {
    replace_triggered_by = [google_artifact_registry_repository.images.id] # a new repository is empty
  }
}
