"""The built-in recipes; importing this package registers them."""

from recipes.builtin import ctr

__all__ = ["ctr"]
