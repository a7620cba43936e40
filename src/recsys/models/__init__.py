"""Model blocks for any recipe: the MLP and the embedding tables (sparse sharded or dense)."""
