"""The built-in recipes, one folder each (recipe, data reader, presets side by side).

They use only what a user's recipe uses, and the framework finds them as it finds a third-party
package's: through the ``recipes.recipes`` and ``recipes.presets`` entry points in pyproject.toml.
Nothing in the framework names them.
"""
