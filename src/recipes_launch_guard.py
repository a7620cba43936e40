"""Stops ``python -m recipes`` run in a folder whose own ``recipes.py`` (or ``recipes/`` package) would run instead.

``-m`` searches the current folder first, so such a file hides the framework before any of its code runs: a helper
module of that name made ``train`` exit 0 having done nothing, a recipe module of that name gave Python's
circular-import traceback. Only code that runs before the ``-m`` lookup can see it, and Python's ``site`` runs the
``.pth`` files of site-packages at start-up: ``recipes_launch_guard.pth``, installed beside the packages (see
setup.py), calls :func:`refuse_a_hidden_framework` from every interpreter of the environment whose command line
says ``recipes``. So it imports no more than the interpreter has imported already (``importlib.machinery``, only
under ``-m recipes``), returns at once unless the command line is ``-m recipes``, and never raises: a failing
``.pth`` line would print a traceback from every Python started there.
"""

from __future__ import annotations

import os
import sys

# Options of the interpreter that take a value (``-W default``, ``-X dev``, ``--check-hash-based-pycs never``): the
# value is not the module. ``-c`` and a script end the options, so ``-m`` after them is the program's.
_OPTIONS_WITH_VALUE = frozenset("WXQ")
_LONG_OPTIONS_WITH_VALUE = frozenset({"--check-hash-based-pycs"})
_FRAMEWORK_FOLDER = os.path.dirname(os.path.realpath(__file__))


def refuse_a_hidden_framework() -> None:
    """Under ``python -m recipes``, a ``recipes`` module in the current folder that is not the framework's: say what
    to rename in one line and leave with exit code 2 (a user's error), as the ``recipes`` command does."""
    try:
        hidden_by = _module_hiding_the_framework()
    except Exception:  # A guard that fails must not stop Python: the framework's own checks follow.
        return
    if hidden_by is not None:
        print(f"error: {hidden_package_message(hidden_by, 'recipes')}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(2)  # SystemExit from a .pth line is a fatal error of `site`, with a traceback


def hidden_package_message(origin: os.PathLike[str] | str, package: str) -> str:
    """The one line for a user's module that hides one of the framework's packages."""
    return (
        f"{origin} hides the framework's package `{package}` (it comes first on sys.path); "
        f"rename it, e.g. to my_{package}, and the imports of it."
    )


def _module_hiding_the_framework() -> str | None:
    if launched_module(sys.orig_argv[1:]) != "recipes" or getattr(sys.flags, "safe_path", False):
        return None  # `-P`, `-I` or PYTHONSAFEPATH: `-m` does not search the current folder
    import importlib.machinery

    spec = importlib.machinery.PathFinder.find_spec("recipes", [os.getcwd()])
    if spec is None or spec.origin is None or not spec.has_location:
        return None  # nothing there, or a folder without __init__.py, which hides nothing found elsewhere
    origin = os.path.realpath(spec.origin)
    module = os.path.dirname(origin) if os.path.basename(origin) == "__init__.py" else origin
    return None if os.path.dirname(module) == _FRAMEWORK_FOLDER else module


def launched_module(interpreter_arguments: list[str]) -> str | None:
    """The module of ``-m`` in the interpreter's own arguments (``sys.orig_argv`` without the executable), or
    ``None`` when it runs a script, ``-c`` code or standard input. Options may be joined, as in ``-um recipes``."""
    arguments = iter(interpreter_arguments)
    for argument in arguments:
        if argument in _LONG_OPTIONS_WITH_VALUE:
            next(arguments, None)
            continue
        if argument.startswith("--") or argument == "-" or not argument.startswith("-"):
            return None  # `--` or a long option without a value is followed by the program; the rest are programs
        for position, letter in enumerate(argument[1:], start=1):
            value = argument[position + 1 :]
            if letter == "m":
                return value or next(arguments, None)
            if letter == "c":
                return None
            if letter in _OPTIONS_WITH_VALUE:
                if not value:
                    next(arguments, None)
                break
    return None
