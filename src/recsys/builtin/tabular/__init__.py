"""The ``tabular`` recipe: click prediction on your own files, declared by a schema, with a zoo model."""
