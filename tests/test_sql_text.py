"""Pure tests of the SQL and command text the SQL sources generate (dpone_dagster.sources.sql.text).

No MSSQL server runs on these machines, so every MSSQL statement (bounded selects, CDC, Change
Tracking, bcp) is asserted here as generated text. The postgres and mysql variants are asserted
here too and additionally executed for real in test_sql_source.py.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from dpone_dagster.sources.sql import text as T

ORDERS = T.Table("dbo", "orders")


# --------------------------------------------------------------------------- identifiers, literals


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        ("mssql", "[we]]ird]"),
        ("postgres", '"we]ird"'),
        ("mysql", "`we]ird`"),
    ],
)
def test_quote_ident(dialect, expected):
    assert T.quote_ident(dialect, "we]ird") == expected


def test_quote_ident_escapes_the_quote_character():
    assert T.quote_ident("mssql", "a]b") == "[a]]b]"
    assert T.quote_ident("postgres", 'a"b') == '"a""b"'
    assert T.quote_ident("mysql", "a`b") == "`a``b`"
    with pytest.raises(ValueError):
        T.quote_ident("postgres", "")
    with pytest.raises(ValueError):
        T.quote_ident("oracle", "x")


def test_qualified_name():
    assert T.qualified_name("mssql", ORDERS) == "[dbo].[orders]"
    assert T.qualified_name("postgres", ("sales", "Orders")) == '"sales"."Orders"'
    assert T.qualified_name("mysql", (None, "orders")) == "`orders`"


@pytest.mark.parametrize(
    ("dialect", "value", "expected"),
    [
        ("mssql", "O'Brien", "N'O''Brien'"),
        ("postgres", "O'Brien \\ x", "'O''Brien \\ x'"),
        ("mysql", "O'Brien \\ x", "'O''Brien \\\\ x'"),
        ("mssql", None, "NULL"),
        ("mssql", True, "1"),
        ("postgres", False, "FALSE"),
        ("mysql", True, "TRUE"),
        ("postgres", 42, "42"),
        ("mysql", Decimal("12.50"), "12.50"),
        ("mssql", 1.5, "1.5"),
        ("mssql", datetime(2024, 1, 2, 3, 4, 5), "'2024-01-02T03:04:05'"),
        ("mssql", datetime(2024, 1, 2, 3, 4, 5, 3000), "'2024-01-02T03:04:05.003'"),
        ("postgres", datetime(2024, 1, 2, 3, 4, 5, 123456), "'2024-01-02T03:04:05.123456'"),
        ("mysql", datetime(2024, 1, 2, 3, 4, 5, 123456), "'2024-01-02 03:04:05.123456'"),
        ("mssql", date(2024, 1, 2), "'2024-01-02'"),
        ("mssql", b"\x00\xff", "0x00FF"),
        ("postgres", b"\x00\xff", "'\\x00FF'::bytea"),
        ("mysql", b"\x00\xff", "X'00FF'"),
    ],
)
def test_literal(dialect, value, expected):
    assert T.literal(dialect, value) == expected


def test_aware_datetimes_become_utc():
    berlin = timezone(timedelta(hours=1))
    value = datetime(2024, 1, 2, 4, 4, 5, tzinfo=berlin)
    assert T.literal("mssql", value) == "'2024-01-02T03:04:05+00:00'"
    assert T.literal("postgres", value) == "'2024-01-02T03:04:05+00:00'"
    assert T.literal("mysql", value) == "CAST('2024-01-02 03:04:05' AS DATETIME(6))"


def test_literal_refuses_what_sql_cannot_carry():
    with pytest.raises(ValueError):
        T.literal("postgres", "nul\x00byte")
    with pytest.raises(ValueError):
        T.literal("mssql", float("nan"))
    with pytest.raises(TypeError):
        T.literal("mssql", object())


@pytest.mark.parametrize(
    ("dialect", "kind", "value", "expected"),
    [
        ("mssql", "timestamp", "2024-01-02T03:04:05.1234567", "'2024-01-02T03:04:05.1234567'"),
        ("postgres", "timestamp", "2024-01-02T03:04:05.123456", "'2024-01-02T03:04:05.123456'"),
        ("mysql", "timestamp", "2024-01-02T03:04:05.123456", "'2024-01-02 03:04:05.123456'"),
        ("postgres", "timestamp_tz", "2024-01-02T03:04:05", "'2024-01-02T03:04:05+00:00'"),
        ("mssql", "timestamp_tz", "2024-01-02T03:04:05.5+00:00", "'2024-01-02T03:04:05.5+00:00'"),
        ("mssql", "date", "2024-01-02", "'2024-01-02'"),
        ("mysql", "integer", 42, "42"),
        ("mssql", "integer", "42", "42"),
        ("postgres", "decimal", "12.3400", "12.3400"),
        ("mssql", "rowversion", "0x00000000000007d1", "0x00000000000007D1"),
        ("mssql", "string", "A'b", "N'A''b'"),
        ("mysql", "string", "A'b", "'A''b'"),
    ],
)
def test_watermark_literal(dialect, kind, value, expected):
    assert T.watermark_literal(dialect, kind, value) == expected


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("timestamp", "2024-01-02'; DROP TABLE x; --"),
        ("timestamp", "yesterday"),
        ("date", "2024-01-02T00:00:00"),
        ("integer", "1 OR 1=1"),
        ("integer", True),
        ("decimal", "1; --"),
        ("rowversion", "00FF"),
        ("lsn", "0x00"),
    ],
)
def test_watermark_literal_validates_stored_values(kind, value):
    with pytest.raises(ValueError):
        T.watermark_literal("mssql", kind, value)


# --------------------------------------------------------------------------- bounded selects


def test_select_query_full_mssql():
    assert T.select_query("mssql", ORDERS) == "SELECT * FROM [dbo].[orders]"
    assert (
        T.select_query("mssql", ORDERS, ["order_id", "total"], "status <> 'x'")
        == "SELECT [order_id], [total] FROM [dbo].[orders] WHERE (status <> 'x')"
    )


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        (
            "mssql",
            "SELECT [id], [updated_at] FROM [dbo].[orders] WHERE (region = 'eu') "
            "AND [updated_at] >= '2024-01-01T00:00:00' AND [updated_at] <= '2024-01-02T00:00:00.003'",
        ),
        (
            "postgres",
            'SELECT "id", "updated_at" FROM "dbo"."orders" WHERE (region = \'eu\') '
            "AND \"updated_at\" >= '2024-01-01T00:00:00' AND \"updated_at\" <= '2024-01-02T00:00:00.003'",
        ),
        (
            "mysql",
            "SELECT `id`, `updated_at` FROM `dbo`.`orders` WHERE (region = 'eu') "
            "AND `updated_at` >= '2024-01-01 00:00:00' AND `updated_at` <= '2024-01-02 00:00:00.003'",
        ),
    ],
)
def test_select_query_incremental_inclusive(dialect, expected):
    query = T.select_query(
        dialect,
        ORDERS,
        ["id", "updated_at"],
        "region = 'eu'",
        "updated_at",
        "2024-01-01T00:00:00",
        True,
        "2024-01-02T00:00:00.003",
        kind="timestamp",
    )
    assert query == expected


def test_select_query_exclusive_lower_and_python_values():
    query = T.select_query("postgres", ("s", "t"), ["id"], None, "id", 10, False, 20)
    assert query == 'SELECT "id" FROM "s"."t" WHERE "id" > 10 AND "id" <= 20'
    query = T.select_query(
        "mssql", ORDERS, ["id"], None, "updated_at", datetime(2024, 1, 1, tzinfo=UTC), True, None
    )
    assert query == "SELECT [id] FROM [dbo].[orders] WHERE [updated_at] >= '2024-01-01T00:00:00+00:00'"


def test_select_query_with_read_expressions():
    query = T.select_query(
        "mssql", ORDERS, ["id", "price"], expressions={"price": "CAST([price] AS DECIMAL(19,4))"}
    )
    assert query == "SELECT [id], CAST([price] AS DECIMAL(19,4)) AS [price] FROM [dbo].[orders]"


def test_bounds_without_column_are_refused():
    with pytest.raises(ValueError):
        T.where_conditions("mssql", None, None, 1, True, 2)


@pytest.mark.parametrize(
    ("dialect", "kind", "expected"),
    [
        (
            "mssql",
            "timestamp",
            "SELECT CONVERT(VARCHAR(27), MAX([updated_at]), 126) AS [max_value] FROM [dbo].[orders] "
            "WHERE (region = 'eu')",
        ),
        (
            "postgres",
            "timestamp",
            'SELECT to_char(MAX("updated_at"), \'YYYY-MM-DD"T"HH24:MI:SS.US\') AS "max_value" '
            'FROM "dbo"."orders" WHERE (region = \'eu\')',
        ),
        (
            "mysql",
            "timestamp",
            "SELECT DATE_FORMAT(MAX(`updated_at`), '%Y-%m-%dT%H:%i:%s.%f') AS `max_value` FROM `dbo`.`orders` "
            "WHERE (region = 'eu')",
        ),
        (
            "postgres",
            "timestamp_tz",
            "SELECT to_char(MAX(\"updated_at\") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') "
            'AS "max_value" FROM "dbo"."orders" WHERE (region = \'eu\')',
        ),
        (
            "mssql",
            "timestamp_tz",
            "SELECT CONVERT(VARCHAR(27), CONVERT(DATETIME2(7), SWITCHOFFSET(MAX([updated_at]), '+00:00')), 126) "
            "AS [max_value] FROM [dbo].[orders] WHERE (region = 'eu')",
        ),
        (
            "mssql",
            "rowversion",
            "SELECT CONVERT(VARCHAR(18), MAX([updated_at]), 1) AS [max_value] FROM [dbo].[orders] "
            "WHERE (region = 'eu')",
        ),
        (
            "mssql",
            "integer",
            "SELECT MAX([updated_at]) AS [max_value] FROM [dbo].[orders] WHERE (region = 'eu')",
        ),
    ],
)
def test_max_query(dialect, kind, expected):
    assert T.max_query(dialect, ORDERS, "updated_at", "region = 'eu'", kind=kind) == expected


def test_max_query_with_lower_bound_and_count():
    assert T.max_query("mssql", ORDERS, "id", kind="integer", lower=41, with_count=True) == (
        "SELECT MAX([id]) AS [max_value], COUNT_BIG([id]) AS [row_count] FROM [dbo].[orders] WHERE [id] >= 41"
    )
    assert T.max_query("postgres", ORDERS, "id", kind="integer", lower=41, with_count=True) == (
        'SELECT MAX("id") AS "max_value", COUNT("id") AS "row_count" FROM "dbo"."orders" WHERE "id" >= 41'
    )


def test_count_and_bounds_queries():
    assert T.count_query("mssql", ORDERS, "x = 1") == (
        "SELECT COUNT_BIG(*) AS [row_count] FROM [dbo].[orders] WHERE (x = 1)"
    )
    assert T.count_query("mysql", (None, "orders")) == "SELECT COUNT(*) AS `row_count` FROM `orders`"
    assert T.bounds_query("postgres", ORDERS, "id", '"id" >= 5') == (
        'SELECT MIN("id") AS "lower_value", MAX("id") AS "upper_value" FROM "dbo"."orders" WHERE ("id" >= 5)'
    )


def test_columns_query():
    assert T.columns_query("mssql", ORDERS) == (
        "SELECT COLUMN_NAME AS column_name, DATA_TYPE AS data_type, NUMERIC_PRECISION AS numeric_precision, "
        "NUMERIC_SCALE AS numeric_scale, CAST(NULL AS VARCHAR(1)) AS column_type FROM INFORMATION_SCHEMA.COLUMNS "
        "WHERE TABLE_SCHEMA = N'dbo' AND TABLE_NAME = N'orders' ORDER BY ORDINAL_POSITION"
    )
    assert "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'orders'" in T.columns_query(
        "mysql", (None, "orders")
    )
    assert "COLUMN_TYPE AS column_type" in T.columns_query("mysql", (None, "orders"))
    assert "TABLE_SCHEMA = current_schema()" in T.columns_query("postgres", (None, "orders"))


# --------------------------------------------------------------------------- lookback


def test_parse_duration():
    assert T.parse_duration(90) == timedelta(seconds=90)
    assert T.parse_duration("90") == timedelta(seconds=90)
    assert T.parse_duration("PT15M") == timedelta(minutes=15)
    assert T.parse_duration("P1DT2H30M5.5S") == timedelta(days=1, hours=2, minutes=30, seconds=5.5)
    assert T.parse_duration("P2W") == timedelta(weeks=2)
    for bad in ("P1M", "P1Y", "PT", "P", "15 minutes", "-5"):
        with pytest.raises(ValueError):
            T.parse_duration(bad)


def test_apply_lookback():
    assert T.apply_lookback("integer", 100, 10) == 90
    assert T.apply_lookback("integer", "100", "10") == 90
    assert T.apply_lookback("decimal", "10.50", "0.75") == "9.75"
    assert T.apply_lookback("timestamp", "2024-01-01T00:10:00", "PT15M") == "2023-12-31T23:55:00"
    assert T.apply_lookback("timestamp", "2024-01-01T00:00:00.1234567", 1) == "2023-12-31T23:59:59.123456"
    assert T.apply_lookback("timestamp_tz", "2024-01-01T00:00:00+00:00", 60) == "2023-12-31T23:59:00"
    assert T.apply_lookback("date", "2024-01-10", "PT36H") == "2024-01-08"  # floored: wider, never narrower
    assert T.apply_lookback("timestamp", "2024-01-01T00:00:00", None) == "2024-01-01T00:00:00"
    with pytest.raises(ValueError):
        T.apply_lookback("integer", 100, "PT1H")
    with pytest.raises(ValueError):
        T.apply_lookback("string", "abc", 1)


def test_lookback_renders_an_inclusive_wider_window():
    lower = T.apply_lookback("timestamp", "2024-01-01T00:10:00", "PT5M")
    query = T.select_query(
        "mssql", ORDERS, ["id"], None, "updated_at", lower, True, "2024-01-01T01:00:00", kind="timestamp"
    )
    assert query == (
        "SELECT [id] FROM [dbo].[orders] WHERE [updated_at] >= '2024-01-01T00:05:00' "
        "AND [updated_at] <= '2024-01-01T01:00:00'"
    )


# --------------------------------------------------------------------------- types


@pytest.mark.parametrize(
    ("dialect", "data_type", "kind"),
    [
        ("mssql", "datetime2", "timestamp"),
        ("mssql", "datetime", "timestamp"),
        ("mssql", "datetimeoffset", "timestamp_tz"),
        ("mssql", "timestamp", "rowversion"),  # MSSQL timestamp is rowversion
        ("mssql", "bigint", "integer"),
        ("mssql", "money", "decimal"),
        ("mssql", "nvarchar", "string"),
        ("mssql", "bit", None),
        ("postgres", "timestamp without time zone", "timestamp"),
        ("postgres", "timestamp with time zone", "timestamp_tz"),
        ("postgres", "date", "date"),
        ("postgres", "bytea", None),
        ("mysql", "timestamp", "timestamp_tz"),  # an instant: read in the UTC session
        ("mysql", "datetime", "timestamp"),
        ("mysql", "double", "float"),
    ],
)
def test_watermark_kind(dialect, data_type, kind):
    assert T.watermark_kind(dialect, data_type) == kind


@pytest.mark.parametrize(
    ("dialect", "column", "target", "expression"),
    [
        ("mssql", T.ColumnInfo("c", "decimal", 18, 2), "decimal(18,2)", None),
        ("mssql", T.ColumnInfo("c", "money", 19, 4), "decimal(19,4)", "CAST([c] AS DECIMAL(19,4))"),
        ("mssql", T.ColumnInfo("c", "smallmoney", 10, 4), "decimal(10,4)", "CAST([c] AS DECIMAL(10,4))"),
        ("mssql", T.ColumnInfo("c", "datetime2"), "timestamp", None),
        (
            "mssql",
            T.ColumnInfo("c", "datetimeoffset"),
            "timestamp",
            "CONVERT(DATETIME2(7), SWITCHOFFSET([c], '+00:00'))",
        ),
        ("mssql", T.ColumnInfo("c", "date"), "date", None),
        ("mssql", T.ColumnInfo("c", "varbinary"), "binary", None),
        ("mssql", T.ColumnInfo("c", "uniqueidentifier"), "string", "CONVERT(CHAR(36), [c])"),
        ("mssql", T.ColumnInfo("c", "bit"), "boolean", None),
        ("mssql", T.ColumnInfo("c", "tinyint", 3, 0), "smallint", "CAST([c] AS SMALLINT)"),
        ("mssql", T.ColumnInfo("c", "geography"), "string", "[c].STAsText()"),
        ("postgres", T.ColumnInfo("c", "numeric", 18, 2), "decimal(18,2)", None),
        ("postgres", T.ColumnInfo("c", "numeric"), None, None),  # unconstrained: Spark's default
        ("postgres", T.ColumnInfo("c", "money"), "decimal(19,4)", 'CAST("c" AS NUMERIC(19,4))'),
        ("postgres", T.ColumnInfo("c", "uuid"), "string", 'CAST("c" AS TEXT)'),
        ("postgres", T.ColumnInfo("c", "timestamp with time zone"), "timestamp", None),
        ("postgres", T.ColumnInfo("c", "bytea"), "binary", None),
        ("mysql", T.ColumnInfo("c", "decimal", 18, 2), "decimal(18,2)", None),
        ("mysql", T.ColumnInfo("c", "varbinary"), "binary", None),
        ("mysql", T.ColumnInfo("c", "time"), "string", "CAST(`c` AS CHAR)"),
    ],
)
def test_type_mapping(dialect, column, target, expression):
    assert T.target_type(dialect, column) == target
    assert T.read_expression(dialect, column) == expression


# --------------------------------------------------------------------------- hash partitions


def test_hash_predicates_per_dialect():
    assert T.hash_predicates("mssql", "code", 3) == [
        "(ABS(CAST(CHECKSUM([code]) AS BIGINT)) % 3 = 0 OR [code] IS NULL)",
        "ABS(CAST(CHECKSUM([code]) AS BIGINT)) % 3 = 1",
        "ABS(CAST(CHECKSUM([code]) AS BIGINT)) % 3 = 2",
    ]
    assert T.hash_predicates("postgres", "code", 2) == [
        '(abs(hashtext("code"::text)::bigint) % 2 = 0 OR "code" IS NULL)',
        'abs(hashtext("code"::text)::bigint) % 2 = 1',
    ]
    assert T.hash_predicates("mysql", "code", 2) == [
        "(CRC32(`code`) % 2 = 0 OR `code` IS NULL)",
        "CRC32(`code`) % 2 = 1",
    ]
    with pytest.raises(ValueError):
        T.hash_predicate("mysql", "code", 2, 2)


# --------------------------------------------------------------------------- CDC


def test_lsn_validation_and_order():
    assert T.normalize_lsn("0x0000002a000001f40003") == "0x0000002A000001F40003"
    assert T.normalize_lsn(bytes.fromhex("0000002A000001F40003")) == "0x0000002A000001F40003"
    for bad in ("0000002A000001F40003", "0x2A", "0x0000002A000001F4000G", "0x0000002A000001F4000300", ""):
        with pytest.raises(ValueError):
            T.normalize_lsn(bad)
    with pytest.raises(ValueError):
        T.normalize_lsn(b"\x00" * 9)
    assert T.compare_lsn("0x0000002A000001F40003", "0x0000002A000001F40004") == -1
    assert T.compare_lsn("0x0000002B000000000000", "0x0000002A00000FF40004") == 1
    assert T.increment_lsn("0x0000002A000001F4FFFF") == "0x0000002A000001F50000"
    with pytest.raises(ValueError):
        T.increment_lsn("0x" + "F" * 20)


def test_cdc_query():
    query = T.cdc_query(
        "dbo_orders",
        "0x0000002a000001f40003",
        "0x0000002A000002000001",
        ["order_id", "amount"],
        expressions={"amount": "CAST([amount] AS DECIMAL(19,4))"},
    )
    assert query == (
        "SELECT CONVERT(VARCHAR(22), [__$start_lsn], 1) AS [__dpone__cdc_start_lsn], "
        "CONVERT(VARCHAR(22), [__$seqval], 1) AS [__dpone__cdc_seqval], "
        "[__$operation] AS [__dpone__cdc_operation], [order_id], CAST([amount] AS DECIMAL(19,4)) AS [amount] "
        "FROM [cdc].[fn_cdc_get_all_changes_dbo_orders](0x0000002A000001F40003, 0x0000002A000002000001, N'all') "
        "WHERE [__$operation] <> 3"
    )
    empty = T.cdc_query(
        "dbo_orders", "0x0000002A000002000001", "0x0000002A000002000001", ["order_id"], empty=True
    )
    assert empty.startswith("SELECT TOP 0 ")
    with pytest.raises(ValueError, match="after to_lsn"):
        T.cdc_query("dbo_orders", "0x0000002A000002000002", "0x0000002A000002000001", ["order_id"])
    with pytest.raises(ValueError):
        T.cdc_query("dbo_orders", "0x1", "0x0000002A000002000001", ["order_id"])
    assert "[cdc].[fn_cdc_get_all_changes_a]]b]" in T.cdc_query("a]b", T.ZERO_LSN, T.ZERO_LSN, ["x"])
    assert T.CDC_DELETE == 1 and T.CDC_INSERT == 2 and T.CDC_UPDATE_AFTER == 4


def test_cdc_lsn_queries():
    assert T.cdc_max_lsn_query() == "SELECT CONVERT(VARCHAR(22), sys.fn_cdc_get_max_lsn(), 1) AS [max_lsn]"
    assert T.cdc_min_lsn_query("dbo_orders") == (
        "SELECT CONVERT(VARCHAR(22), sys.fn_cdc_get_min_lsn(N'dbo_orders'), 1) AS [min_lsn]"
    )
    assert T.cdc_increment_lsn_query("0x0000002a000001f40003") == (
        "SELECT CONVERT(VARCHAR(22), sys.fn_cdc_increment_lsn(0x0000002A000001F40003), 1) AS [next_lsn]"
    )
    with pytest.raises(ValueError):
        T.cdc_increment_lsn_query("0x00; DROP TABLE x")
    assert T.default_capture_instance(ORDERS) == "dbo_orders"


# --------------------------------------------------------------------------- Change Tracking


def test_change_tracking_queries():
    assert T.change_tracking_query(ORDERS, ["order_id"], ["order_id", "status"], 42, 57) == (
        "SELECT [ct].[SYS_CHANGE_VERSION] AS [__dpone__ct_version], "
        "[ct].[SYS_CHANGE_OPERATION] AS [__dpone__ct_operation], [ct].[order_id], [t].[status] "
        "FROM CHANGETABLE(CHANGES [dbo].[orders], 42) AS [ct] "
        "LEFT OUTER JOIN [dbo].[orders] AS [t] ON [t].[order_id] = [ct].[order_id] "
        "WHERE [ct].[SYS_CHANGE_VERSION] <= 57"
    )
    assert T.change_tracking_current_version_query() == (
        "SELECT CHANGE_TRACKING_CURRENT_VERSION() AS [current_version]"
    )
    assert T.change_tracking_min_valid_version_query(ORDERS) == (
        "SELECT CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(N'dbo.orders')) AS [min_valid_version]"
    )
    with pytest.raises(ValueError):
        T.change_tracking_query(ORDERS, [], ["x"], 1)


# --------------------------------------------------------------------------- bcp


def test_bcp_select_escaping_scheme():
    query, specs = T.bcp_select(
        ORDERS,
        [
            T.ColumnInfo("id", "int"),
            T.ColumnInfo("note", "nvarchar"),
            T.ColumnInfo("at", "datetime2"),
            T.ColumnInfo("blob", "varbinary"),
            T.ColumnInfo("flag", "bit"),
            T.ColumnInfo("price", "money"),
            T.ColumnInfo("ratio", "float"),
        ],
        ["[id] >= 5"],
    )
    assert query == (
        "SELECT [id], "
        "N'\"~' + REPLACE(REPLACE(REPLACE(CAST([note] AS NVARCHAR(MAX)) COLLATE Latin1_General_BIN2, "
        "NCHAR(27), NCHAR(27) + NCHAR(27)), NCHAR(30), NCHAR(27) + N'r'), N'\"', N'\"\"') + N'\"' AS [note], "
        "CONVERT(VARCHAR(27), [at], 126) AS [at], "
        "'x' + CONVERT(VARCHAR(MAX), CAST([blob] AS VARBINARY(MAX)), 2) AS [blob], "
        "CAST([flag] AS TINYINT) AS [flag], "
        "CAST([price] AS DECIMAL(19,4)) AS [price], "
        "CONVERT(VARCHAR(32), [ratio], 3) AS [ratio] "
        "FROM [dbo].[orders] WHERE [id] >= 5"
    )
    assert specs == [
        T.BcpColumn("id", "plain", "int"),
        T.BcpColumn("note", "text", "string"),
        T.BcpColumn("at", "plain", "timestamp"),
        T.BcpColumn("blob", "hex", "binary"),
        T.BcpColumn("flag", "plain", "boolean"),
        T.BcpColumn("price", "plain", "decimal(19,4)"),
        T.BcpColumn("ratio", "plain", "double"),
    ]
    with pytest.raises(ValueError):
        T.bcp_select(ORDERS, [])


def test_bcp_datetimeoffset_is_exported_in_utc():
    query, specs = T.bcp_select(ORDERS, [T.ColumnInfo("at", "datetimeoffset")])
    assert "CONVERT(VARCHAR(27), CONVERT(DATETIME2(7), SWITCHOFFSET([at], '+00:00')), 126) AS [at]" in query
    assert specs == [T.BcpColumn("at", "plain", "timestamp")]


def test_bcp_command_keeps_the_password_out_of_argv():
    secret = "p@ss w'rd$(rm -rf /)"
    command = T.bcp_command(
        "SELECT [id] FROM [dbo].[orders]",
        "/tmp/out.dat",
        server="db.local",
        database="sales",
        user="etl",
        password_env_var="DPONE_BCP_PASSWORD",
        password=secret,
        port=1433,
        batch_size=50_000,
    )
    assert command.argv == (
        "sh",
        "-c",
        'exec "$@" -P "$DPONE_BCP_PASSWORD"',
        "sh",
        "bcp",
        "SELECT [id] FROM [dbo].[orders]",
        "queryout",
        "/tmp/out.dat",
        "-c",
        "-t",
        "\x1f",
        "-r",
        "\x1e",
        "-S",
        "tcp:db.local,1433",
        "-d",
        "sales",
        "-U",
        "etl",
    )
    assert "-b" not in command.argv  # -b applies to imports only
    assert all(secret not in arg for arg in command.argv)
    assert command.env["DPONE_BCP_PASSWORD"] == secret
    assert command.env["LC_ALL"] == "C.UTF-8"
    shown = command.redacted()
    assert secret not in shown and secret not in repr(command) and secret not in str(command)
    assert "DPONE_BCP_PASSWORD=**********" in shown
    assert "-t '\\x1f' -r '\\x1e'" in shown


def test_bcp_command_table_mode_trusted_login_and_options():
    command = T.bcp_command(
        "sales.dbo.orders", "/tmp/o.dat", "db", None, None, trust_server_certificate=True, packet_size=32768
    )
    assert command.argv == (
        "bcp",
        "sales.dbo.orders",
        "out",
        "/tmp/o.dat",
        "-c",
        "-t",
        "\x1f",
        "-r",
        "\x1e",
        "-S",
        "db",
        "-u",
        "-a",
        "32768",
        "-T",
    )
    assert command.secret_env == ()


def test_bcp_terminators_are_validated():
    for field, row in (
        ("", "\x1e"),
        ("\x1f", ""),
        ("\x1f", "\x1f"),
        ("~", "\x1e"),
        (",", "."),
        ("|", "\r\n"),
        ("\t", "5"),
    ):
        with pytest.raises(ValueError):
            T.bcp_command("SELECT 1", "/tmp/x", "db", "d", "u", field_terminator=field, row_terminator=row)
    T.bcp_command("SELECT 1", "/tmp/x", "db", "d", "u", field_terminator="\t", row_terminator="\n")
    with pytest.raises(ValueError):
        T.bcp_command("SELECT 1", "/tmp/x", "db", "d", "u", password_env_var="BAD NAME")


def test_mysql_utc_sessions_in_every_spelling():
    from dpone_dagster.sources.sql.text.mysql import is_utc_session

    for zone in ("+00:00", "UTC", "Etc/UTC", "GMT"):
        assert is_utc_session(zone, "CEST")
    assert is_utc_session("SYSTEM", "UTC") and is_utc_session("SYSTEM", "Etc/UTC")
    assert not is_utc_session("SYSTEM", "CET") and not is_utc_session("+02:00", "UTC") and not is_utc_session("Europe/London", "UTC")
