# Results out: one dataset; every table is the JSON schema in goodput_schemas/tables/ with the layout in
# goodput_schemas/table_options.json; the views are goodput_schemas/views/*.sql.

resource "google_bigquery_dataset" "goodput" {
  # checkov:skip=CKV_GCP_81: customer-managed encryption is optional (var.kms_key_name); Google-managed keys by default
  project = var.project_id

  dataset_id                 = var.dataset_id
  location                   = var.dataset_location
  description                = "Fleet goodput: snapshots, badput, disruptions, step statistics and raw events of every training run."
  labels                     = local.labels
  delete_contents_on_destroy = false

  dynamic "default_encryption_configuration" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      kms_key_name = default_encryption_configuration.value
    }
  }

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.agents]
}

resource "google_bigquery_table" "tables" {
  # checkov:skip=CKV_GCP_80: customer-managed encryption is inherited from the dataset's default (var.kms_key_name)
  for_each = local.table_options
  project  = var.project_id

  dataset_id          = google_bigquery_dataset.goodput.dataset_id
  table_id            = each.key
  schema              = file("${local.schemas}/tables/${each.key}.json")
  clustering          = each.value.cluster
  labels              = local.labels
  deletion_protection = var.deletion_protection

  dynamic "time_partitioning" {
    for_each = each.value.partition_field == null ? [] : [each.value.partition_field]
    content {
      type          = "DAY"
      field         = time_partitioning.value
      expiration_ms = var.partition_expiration_days == null ? null : var.partition_expiration_days * 86400000
    }
  }
}

resource "google_bigquery_table" "views" {
  # checkov:skip=CKV_GCP_80: a view holds no data of its own to encrypt
  for_each = fileset("${local.schemas}/views", "*.sql")
  project  = var.project_id

  dataset_id          = google_bigquery_dataset.goodput.dataset_id
  table_id            = trimsuffix(each.value, ".sql")
  labels              = local.labels
  deletion_protection = var.deletion_protection

  view {
    query          = templatefile("${local.schemas}/views/${each.value}", { dataset = "`${var.project_id}.${var.dataset_id}`" })
    use_legacy_sql = false
  }

  depends_on = [google_bigquery_table.tables]
}

# The tables shipped filled, each from its CSV file in goodput_schemas/ and loaded again on every
# change of the file: the example accelerator prices (replace them with your own: the
# lost-chip-hours query reads them) and the accelerators' peak bf16 TFLOP/s from their spec
# sheets (the productivity queries divide a run's TFLOPS by them). Each value is its load jobs'
# id prefix.
locals {
  seeded_tables = { accelerator_prices = "prices", accelerator_peaks = "peaks" }
}

resource "google_storage_bucket_object" "seed" {
  for_each = local.seeded_tables

  bucket       = google_storage_bucket.dataflow.name
  name         = "seed/${each.key}.csv"
  source       = "${local.schemas}/${each.key}.csv"
  content_type = "text/csv"
}

# A load job is never changed, only replaced, and BigQuery refuses a job id used before (even by
# a job since deleted from the state): each load takes a fresh id, made anew with what it loads.
resource "terraform_data" "seed_load" {
  for_each = local.seeded_tables

  triggers_replace = [filemd5("${local.schemas}/${each.key}.csv"), var.dataset_location, local.labels]
}

resource "google_bigquery_job" "seed" {
  for_each = local.seeded_tables

  project = var.project_id

  job_id   = "${replace(var.name, "-", "_")}_${each.value}_${terraform_data.seed_load[each.key].id}"
  location = var.dataset_location
  labels   = local.labels

  load {
    source_uris       = ["gs://${google_storage_bucket.dataflow.name}/${google_storage_bucket_object.seed[each.key].name}"]
    source_format     = "CSV"
    skip_leading_rows = 1
    write_disposition = "WRITE_TRUNCATE"

    destination_table {
      project_id = var.project_id
      dataset_id = google_bigquery_dataset.goodput.dataset_id
      table_id   = google_bigquery_table.tables[each.key].table_id
    }
  }
}

# Where the price list's load lived before the peaks were shipped too.
moved {
  from = google_storage_bucket_object.accelerator_prices
  to   = google_storage_bucket_object.seed["accelerator_prices"]
}

moved {
  from = terraform_data.accelerator_prices_load
  to   = terraform_data.seed_load["accelerator_prices"]
}

moved {
  from = google_bigquery_job.accelerator_prices
  to   = google_bigquery_job.seed["accelerator_prices"]
}
