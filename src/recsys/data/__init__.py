"""Data readers: the ``DataReader`` contract the Trainer reads (``reader``), and generic readers any recipe uses."""
