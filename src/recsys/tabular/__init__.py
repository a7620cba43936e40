"""Tabular data declared by a schema: CSV/TSV files to click-prediction batches, with stable hashing."""
