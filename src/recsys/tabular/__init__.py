"""Tabular data declared by a schema: files of any registered data format to click-prediction batches, with stable
hashing.

The built-in data formats (``csv``, ``tsv``, ``libsvm``, ``libffm``, ``parquet``) register in
``recsys.tabular.formats.DATA_FORMATS`` as the modules of that folder load, which this package does
first, before its schema (``schema.py``), which chooses among them by name, as among those other
packages add.
"""

from recsys.tabular import formats

__all__ = ["formats"]
