"""What both test trees share: helpers, the programs some tests run (``stalling_cli.py``, ``nan_recipe.py``) and the
checkout's paths (``paths.py``). ``tests/`` is on ``sys.path`` (pytest puts it there for ``tests/conftest.py``), so
tests import ``support.NAME``."""
