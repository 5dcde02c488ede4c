"""The saved queries and the views are BigQuery SQL: Google's ZetaSQL analyzer, BigQuery's SQL front
end, resolves each one, its dataset filled in, against the output tables' schemas, offline. A saved
query may read a view: the analyzer finds each view as a table of the columns its query gives.

The analyzer enables every released ZetaSQL feature (BigQuery's are among them; a feature BigQuery
lacks would pass here) in the external product mode, BigQuery's: its type names, no INT32 or
DOUBLE. The negative cases show it refuses what BigQuery refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import wasmtime
from zetasql.api import Analyzer, TypeFactory
from zetasql.core import wasm_client
from zetasql.core.exceptions import ServerError
from zetasql.types import (
    AnalyzerOptions,
    LanguageOptions,
    ProductMode,
    SimpleCatalog,
    SimpleColumn,
    SimpleTable,
    Type,
    TypeKind,
    ZetaSQLBuiltinFunctionOptions,
)

from goodput_schemas import saved_queries, table_names, table_schema, views

PROJECT, DATASET = "goodput-test", "goodput"
#: The dataset as the SQL names it: as ``goodput query --sql --dataset`` and Terraform name it.
QUOTED_DATASET = f"`{PROJECT}.{DATASET}`"

#: BigQuery column types (and their legacy names) as ZetaSQL type kinds.
KINDS = {"STRING": TypeKind.TYPE_STRING, "BYTES": TypeKind.TYPE_BYTES, "INT64": TypeKind.TYPE_INT64,
         "INTEGER": TypeKind.TYPE_INT64, "FLOAT64": TypeKind.TYPE_DOUBLE, "FLOAT": TypeKind.TYPE_DOUBLE,
         "NUMERIC": TypeKind.TYPE_NUMERIC, "BIGNUMERIC": TypeKind.TYPE_BIGNUMERIC,
         "BOOL": TypeKind.TYPE_BOOL, "BOOLEAN": TypeKind.TYPE_BOOL, "TIMESTAMP": TypeKind.TYPE_TIMESTAMP,
         "DATE": TypeKind.TYPE_DATE, "TIME": TypeKind.TYPE_TIME, "DATETIME": TypeKind.TYPE_DATETIME,
         "JSON": TypeKind.TYPE_JSON, "GEOGRAPHY": TypeKind.TYPE_GEOGRAPHY,
         "INTERVAL": TypeKind.TYPE_INTERVAL}


def column_type(field: dict[str, Any]) -> Type:
    """The ZetaSQL type of a field of a BigQuery JSON schema: a RECORD is a STRUCT of its fields, a
    REPEATED field an ARRAY."""
    if field["type"] in ("RECORD", "STRUCT"):
        kind = TypeFactory.create_struct_type([(f["name"], column_type(f)) for f in field["fields"]])
    else:
        kind = TypeFactory.create_simple_type(KINDS[field["type"]])
    return TypeFactory.create_array_type(kind) if field.get("mode") == "REPEATED" else kind


def table(name: str, schema: list[dict[str, Any]]) -> SimpleTable:
    return SimpleTable(name=name, column=[SimpleColumn(name=f["name"], type=column_type(f)) for f in schema])


def view_table(analyzer: Analyzer, name: str, sql: str) -> SimpleTable:
    """A view as the table its query gives, resolved by ``analyzer``: its columns' names and types."""
    columns = analyzer.analyze_statement(sql).output_column_list
    return SimpleTable(name=name, column=[SimpleColumn(name=c.name, type=c.column.type) for c in columns])


def make_analyzer(tables: list[SimpleTable]) -> Analyzer:
    """An analyzer that finds ``tables`` in the dataset ``PROJECT.DATASET`` and nowhere else.

    BigQuery reads the dots of a quoted path as separators (```p.d`.t`` is ``p.d.t``); ZetaSQL's
    catalog does not, so the dataset is both ``DATASET`` in the catalog ``PROJECT`` and a catalog
    named ``PROJECT.DATASET``."""
    language = LanguageOptions.maximum_features()
    language.product_mode = ProductMode.PRODUCT_EXTERNAL
    catalog = SimpleCatalog(
        name="bigquery",
        catalog=[SimpleCatalog(name=PROJECT, catalog=[SimpleCatalog(name=DATASET, table=tables)]),
                 SimpleCatalog(name=f"{PROJECT}.{DATASET}", table=tables)],
        builtin_function_options=ZetaSQLBuiltinFunctionOptions(language_options=language))
    return Analyzer(AnalyzerOptions(language_options=language, default_timezone="UTC"), catalog)


class _CachingConfig(wasmtime.Config):
    """wasmtime's engine settings with its on-disk cache of compiled code turned on."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = True


@pytest.fixture(scope="module")
def analyzer() -> Iterator[Analyzer]:
    """One analyzer for the module. The first analysis in a process compiles ZetaSQL's WebAssembly
    (28 MB), which takes tens of seconds; with wasmtime's cache of compiled code (in the user's
    cache directory) only the first run on a machine pays it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wasm_client, "Config", _CachingConfig)
        tables = [table(name, table_schema(name)) for name in table_names()]
        analyzer = make_analyzer(tables)
        analyzer.analyze_statement("SELECT 1")  # loads the WebAssembly while the patch holds
    # The views read only tables (Terraform creates them all at once, in no order): one analyzer
    # over the tables resolves them, and the next finds them beside the tables.
    yield make_analyzer(tables + [view_table(analyzer, name, sql)
                                  for name, sql in views(QUOTED_DATASET).items()])


@pytest.mark.parametrize("name", sorted(saved_queries(QUOTED_DATASET)))
def test_a_saved_query_is_bigquery_sql(analyzer: Analyzer, name: str):
    """The saved query, its dataset filled in, passes BigQuery's analyzer."""
    statement = analyzer.analyze_statement(saved_queries(QUOTED_DATASET)[name])
    assert statement.output_column_list


@pytest.mark.parametrize("name", sorted(views(QUOTED_DATASET)))
def test_a_view_is_bigquery_sql(analyzer: Analyzer, name: str):
    """The view, its dataset filled in, passes BigQuery's analyzer."""
    statement = analyzer.analyze_statement(views(QUOTED_DATASET)[name])
    assert statement.output_column_list


@pytest.mark.parametrize("dataset", [QUOTED_DATASET, f"`{PROJECT}`.{DATASET}", f"`{PROJECT}`.`{DATASET}`"])
def test_the_tables_resolve_however_their_dataset_is_quoted(analyzer: Analyzer, dataset: str):
    """A table resolves with its dataset's path quoted whole or in parts."""
    assert analyzer.analyze_statement(f"SELECT run_id FROM {dataset}.goodput_snapshots")


SNAPSHOTS = f"{QUOTED_DATASET}.goodput_snapshots"


@pytest.mark.parametrize(("sql", "refusal"), [
    pytest.param("SELECT run_id FROM goodput_snapshots", "Table not found: goodput_snapshots",
                 id="a table with no dataset, there being no default one"),
    pytest.param(f"SELECT run_id FROM {SNAPSHOTS} "
                 "QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1",
                 "QUALIFY clause must be used in conjunction with WHERE or GROUP BY or HAVING",
                 id="QUALIFY without WHERE, GROUP BY or HAVING"),
    pytest.param(f"SELECT TIMESTAMP_DIFF(SECOND, snapshot_time, window_start) FROM {SNAPSHOTS}",
                 "Unrecognized name: SECOND", id="TIMESTAMP_DIFF with its unit first"),
    pytest.param(f"SELECT EPOCH_US(snapshot_time) FROM {SNAPSHOTS}", "Function not found: EPOCH_US",
                 id="a DuckDB function"),
    pytest.param(f"SELECT no_such_column FROM {SNAPSHOTS}", "Unrecognized name: no_such_column",
                 id="an unknown column"),
    pytest.param(f"SELECT TIMESTAMP_SUB(snapshot_time, INTERVAL total_time_s SECOND) FROM {SNAPSHOTS}",
                 "Interval value must be coercible to INT64", id="an INTERVAL of a FLOAT64"),
])
def test_the_analyzer_refuses_what_bigquery_refuses(analyzer: Analyzer, sql: str, refusal: str):
    """The analyzer refuses SQL that BigQuery refuses, saying why."""
    with pytest.raises(ServerError, match=refusal):
        analyzer.analyze_statement(sql)


def test_records_and_repeated_fields_map_to_structs_and_arrays():
    """A REPEATED RECORD column is an ARRAY of STRUCTs with its fields' types."""
    schema = [{"name": "points", "type": "RECORD", "mode": "REPEATED", "fields": [
        {"name": "day", "type": "DATE", "mode": "NULLABLE"},
        {"name": "body", "type": "JSON", "mode": "NULLABLE"}]}]
    analyzer = make_analyzer([table("nested", schema)])
    sql = (f"SELECT p.day, JSON_VALUE(p.body, '$.x') AS x "
           f"FROM {QUOTED_DATASET}.nested AS n, UNNEST(n.points) AS p")
    assert len(analyzer.analyze_statement(sql).output_column_list) == 2
    with pytest.raises(ServerError, match="No matching signature"):  # an ARRAY, not a DATE
        analyzer.analyze_statement(f"SELECT DATE_ADD(points, INTERVAL 1 DAY) FROM {QUOTED_DATASET}.nested")
