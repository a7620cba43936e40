"""Recommendation content built on the framework: the pieces a recommender's recipe is made of.

- ``recsys.data``: generic readers of the ``DataReader`` contract (in memory, streaming chunks);
- ``recsys.tabular``: the ``dataset`` schema and its readers (CSV/TSV, Parquet, libSVM/libFFM);
- ``recsys.click``: the click-prediction task (batch, train/eval units) and its model zoo;
- ``recsys.models``: model blocks (MLPs, embedding tables);
- ``recsys.builtin``: the built-in recipes and their presets, one folder each.

Everything here uses only the framework's public API (``from recipes import ...``), as a user's
own package would; nothing in the framework names it.
"""
