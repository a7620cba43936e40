"""The documentation site builds with warnings as errors (scripts/docs.sh), its generated config reference names
every key of the framework's sections and every registered optimizer, and a broken link fails the build."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from recipes.cli.main import build_parser
from recipes.config.sections import RecipeConfig
from recipes.optimizers import OPTIMIZERS
from support.paths import DOCS, DOCS_HOOKS, DOCS_SCRIPT, MKDOCS_CONFIG


def run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VENV": sys.prefix, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=280, check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    result = run(["bash", str(DOCS_SCRIPT), str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def section_keys(cls: type, prefix: str) -> Iterator[str]:
    """Every key under a config dataclass, as the reference spells it: nested sections dotted, a list's items
    ``[]``."""
    hints = typing.get_type_hints(cls)
    for config_field in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f"{prefix}.{config_field.name}"
        yield key
        hint = hints[config_field.name]
        element = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
        if isinstance(element, type) and dataclasses.is_dataclass(element):
            yield from section_keys(element, key if element is hint else f"{key}[]")


def test_the_config_reference_names_every_key_of_the_sections_and_every_optimizer(site: Path) -> None:
    page = (site / "reference" / "config" / "index.html").read_text()
    hints = typing.get_type_hints(RecipeConfig, include_extras=True)  # a component chosen by name is Annotated
    sections = {name: hint for name, hint in hints.items() if dataclasses.is_dataclass(hint)}
    keys = [key for name, section in sections.items() for key in section_keys(section, name)]
    assert len(keys) > 50
    missing = [key for key in keys if f"<code>{key}</code>" not in page]
    assert missing == []
    for name in OPTIMIZERS.names():
        assert f'id="components-optimizer-{name}"' in page


def test_the_cli_reference_has_every_command(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert len(commands.choices) > 5
    for name in commands.choices:
        assert f"<code>{name}</code>" in page
    assert "<code>--checkpoint CHECKPOINT</code>" in page


def test_the_api_reference_shows_the_public_api(site: Path) -> None:
    page = (site / "reference" / "api" / "index.html").read_text()
    for name in (
        "recipes.RecipeConfig",
        "recipes.register_recipe",
        "units.TrainUnit",
        "units.MetricBag",
        "gang.setup_gangs",
        "checkpoint.CheckpointManager",
    ):
        assert f'id="{name}"' in page


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(MKDOCS_CONFIG, tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copytree(DOCS_HOOKS, tmp_path / "docs_hooks", ignore=shutil.ignore_patterns("__pycache__"))
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md), [nowhere](architecture.md#no-such-anchor)\n")
    result = run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")], cwd=tmp_path)
    assert result.returncode != 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert any("no-such-page.md" in line for line in warnings), result.stderr[-3000:]
    assert any("no-such-anchor" in line for line in warnings), result.stderr[-3000:]
    assert all("no-such" in line for line in warnings), warnings  # nothing else in the copy is wrong
