import logging
import os
import sys

from recipes.threads import size_numba_pool

size_numba_pool()  # before anything imports numba

from recipes.errors import UserError  # noqa: E402
from recipes.registry import refuse_shadowing_modules  # noqa: E402

# Before the CLI imports the framework's packages: from a folder holding a user's `units.py`,
# `python -m recipes` would import that file instead, and fail far from the cause.
try:
    refuse_shadowing_modules()
except UserError as ex:
    print(f"error: {ex}", file=sys.stderr)
    sys.exit(2)

from recipes.cli import main  # noqa: E402

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    # A rank whose run ended (done, or stopped with its cause said) has closed its files and
    # committed its checkpoints; it leaves without the interpreter's teardown, whose destruction
    # of gloo's threads sometimes aborted (SIGABRT) and turned exit code 0, 1 or 2 into a crash.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
