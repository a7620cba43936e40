"""The ``ctr`` recipe: a small click-through-rate MLP on deterministic synthetic data."""
