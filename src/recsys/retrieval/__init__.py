"""Retrieval: models that score a query (a user, their history) against every item of a corpus, trained with
in-batch negatives and validated by ranking the whole corpus (HR@K, NDCG@K)."""
