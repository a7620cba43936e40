"""What a model declares so ``export`` can split it into sparse lookups and a dense program for serving."""
