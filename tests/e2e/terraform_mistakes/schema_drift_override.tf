# A deliberate mistake: table schemas written out here instead of read from goodput_schemas/tables/.
resource "google_bigquery_table" "tables" {
  schema = replace(file("${local.schemas}/tables/${each.key}.json"), "FLOAT64", "STRING")
}
