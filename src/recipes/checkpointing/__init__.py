"""A run's checkpoints: what a training run saves and resumes from, the model bank, and state a config leaves out.

The ``checkpoint`` package writes and keeps checkpoints; this room knows what a run puts in them.
"""
