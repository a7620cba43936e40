"""Where the tests find the checkout's files. Every path a test reads outside its own temporary folders is named
here, relative to this file, so that moving a test never changes what it reads."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
SRC = ROOT / "src"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOCS_HOOKS = ROOT / "docs_hooks"
BENCHMARKS = ROOT / "benchmarks"
DOCS_SCRIPT = ROOT / "scripts" / "docs.sh"
MKDOCS_CONFIG = ROOT / "mkdocs.yml"
EXAMPLES = ROOT / "examples"
PLUGIN_PACKAGE = TESTS / "plugin_package"
STALLING_CLI = SUPPORT / "stalling_cli.py"
NAN_RECIPE = SUPPORT / "nan_recipe.py"
