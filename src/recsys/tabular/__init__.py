"""Tabular data declared by a schema: files of any registered data format to click-prediction batches, with stable
hashing.

The built-in data formats (``csv``, ``tsv``, ``libsvm``, ``libffm``, ``parquet``) register in
``recsys.tabular.schema.DATA_FORMATS`` as their modules load, which this package does: a schema
chooses among them by name, as among those other packages add.
"""

from recsys.tabular import libsvm, parquet, reader

__all__ = ["libsvm", "parquet", "reader"]
