"""What people run: the ``goodput`` command (``cli``), the HTML report (``report``), the alerts the
Terraform policies would fire (``alerts``), fleet SQL on DuckDB (``fleet_sql``), the replay
summary (``summary``) and the importer of the reference's history (``importer``)."""
