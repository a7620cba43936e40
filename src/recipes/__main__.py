"""``python -m recipes`` and the ``recipes`` console script: the CLI in a process of its own."""

import logging
import os
import sys
from typing import NoReturn


def run() -> NoReturn:
    """Run the CLI with the process set up for it, and leave with its exit code."""
    from recipes.runtime.threads import size_numba_pool

    size_numba_pool()  # before anything imports numba

    from recipes.errors import UserError
    from recipes.runtime.shadowing import refuse_shadowing_modules

    # Before the CLI imports the framework's packages: from a folder holding a user's `units.py`,
    # `python -m recipes` would import that file instead, and fail far from the cause.
    try:
        refuse_shadowing_modules()
    except UserError as ex:
        print(f"error: {ex}", file=sys.stderr)
        sys.exit(2)

    from recipes.cli.main import main

    code = main()
    # The command has ended (done, or stopped with its cause said): its files are closed and its checkpoints
    # committed. The process leaves without the interpreter's teardown, whose destruction of native threads
    # (gloo's in a rank, others in one process: "terminate called without an active exception", 1 exit in 12
    # on a loaded machine) sometimes aborted (SIGABRT) and turned exit code 0, 1 or 2 into a crash.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
