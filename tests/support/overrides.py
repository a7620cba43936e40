"""Config overrides that tests of both trees give the built-in presets."""

from __future__ import annotations

# ctr_tiny on hash tables, for a few steps.
CTR_HASH = ["model.embeddings.kind=hash", "trainer.max_num_steps=4", "metrics.recorders.console=false"]
# dlrm_criteo_tiny_dynamic with 300 rows per table for about 1000 values a feature (C1-C26): the tables fill within
# a few dozen steps.
SMALL_DYNAMIC = [
    "dataset.synthetic_rows=6000",
    "dataset.batch_size=64",
    "dataset.num_embeddings_per_feature=[300]",
    "metrics.recorders.console=false",
]
