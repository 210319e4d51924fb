"""Data for examples, benchmarks and tests: ``synthetic`` (the papers' CGM and WU sets),
``scale`` (a table of any size for the scale benchmark) and ``tables`` (the real UCI tables
of the repository's ``data/`` folder, :func:`load_table`)."""
from .tables import TABLES, Table, data_dir, load_table, read_table_text, table_path

__all__ = ["TABLES", "Table", "data_dir", "load_table", "read_table_text", "table_path"]
from .missing import MISSING_MECHANISMS, missing_table
from .raw_tables import RAW_TABLES, RawTable, load_raw_table, raw_string_columns, raw_table_path, read_raw_table_text

__all__ += ["MISSING_MECHANISMS", "missing_table", "RAW_TABLES", "RawTable", "load_raw_table", "raw_string_columns",
            "raw_table_path", "read_raw_table_text"]
