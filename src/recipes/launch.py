"""``train --nproc N``: the same command on N local processes, launched by torchrun's own launcher."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from recipes.errors import UserError

EXIT_USER_ERROR = 2
EXIT_FAILURE = 1


def without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--nproc N`` / ``--nproc=N``, which the launched ranks must not see."""
    result: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            result.append(arg)
    return result


def launch_with_torchrun(nproc: int, argv: Sequence[str]) -> int:
    """Run ``python -m recipes <argv>`` as ``torchrun --standalone --nproc-per-node N``.

    Returns the exit code: 2 if a rank failed with a user error, 1 for any other failure.
    """
    if nproc < 1:
        raise UserError(f"`--nproc` must be >= 1, but is {nproc} instead.")
    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0", "-m", "recipes", *without_nproc(argv)]
    )
    try:
        run(args)
    except ChildFailedError as ex:
        print(f"error: {describe_failures(ex)}", file=sys.stderr)
        codes = {failure.exitcode for failure in ex.failures.values()}
        return EXIT_USER_ERROR if EXIT_USER_ERROR in codes else EXIT_FAILURE
    return 0


def describe_failures(error: ChildFailedError) -> str:
    """One line naming each failed rank and how it ended (an exit code, or the signal that killed it)."""
    parts = []
    for rank, failure in sorted(error.failures.items()):
        code = failure.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        parts.append(f"rank {rank} {how}")
    return "; ".join(parts) + " (the ranks' own errors are in OUTPUT_DIR/logs/rank_K.log)"
