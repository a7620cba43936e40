"""The data formats a schema's ``format`` chooses by name, and what a format is (see ``data_format.py``).

``format_config.py`` holds ``DATA_FORMATS`` and the config every format's derives from; each built-in
format is a module of this folder that registers it by decorator: CSV/TSV (``delimited_text.py``),
Parquet (``parquet.py``, over ``arrow.py``, the base of any format pyarrow reads in record batches),
libSVM/libFFM (``libsvm.py``). Every module here is imported with the package, so a new built-in
format is a new module and nothing else; another package offers its own through the entry-point
group ``recipes.data_formats``, with what this package exports.
"""

from components import import_submodules
from recsys.tabular.formats.arrow import ArrowFormatConfig, ArrowReader
from recsys.tabular.formats.data_format import ColumnFormat, ColumnReader, DataFormat, data_format
from recsys.tabular.formats.format_config import DATA_FORMATS, DataFormatConfig

import_submodules(__name__, __path__)

__all__ = [
    "DATA_FORMATS",
    "ArrowFormatConfig",
    "ArrowReader",
    "ColumnFormat",
    "ColumnReader",
    "DataFormat",
    "DataFormatConfig",
    "data_format",
]
