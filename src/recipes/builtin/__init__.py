"""The built-in recipes; importing this package registers them."""

from recipes.builtin import ctr, dlrm, movielens

__all__ = ["ctr", "dlrm", "movielens"]
