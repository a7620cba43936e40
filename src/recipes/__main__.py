import sys

from recipes.errors import UserError
from recipes.registry import refuse_shadowing_modules

# Before the CLI imports the framework's packages: from a folder holding a user's `units.py`,
# `python -m recipes` would import that file instead, and fail far from the cause.
try:
    refuse_shadowing_modules()
except UserError as ex:
    print(f"error: {ex}", file=sys.stderr)
    sys.exit(2)

from recipes.cli import main

sys.exit(main())
