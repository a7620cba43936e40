"""The generators of the site's CLI and config reference (docs_hooks/): what they read from a parser and from config
dataclasses, and that every field of the real config has a docstring for the page to show. The whole site, built
with warnings as errors, is tests/integration/test_docs_site.py."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Annotated, Literal

from components import PositiveInt, Range, Registry
from support.paths import DOCS_HOOKS

sys.path.insert(0, str(DOCS_HOOKS))

import cli_reference
import config_reference
import reference


@dataclass
class ColourConfig:
    name: str = "red"


@dataclass
class BlueConfig(ColourConfig):
    shade: Annotated[float, Range(ge=0, lt=1)] = 0.5
    """How dark: 0 is sky, 1 would be night."""


COLOURS: Registry[str] = Registry("colour", "tests.colours", ColourConfig)
COLOURS.add("red", ColourConfig, "red")
COLOURS.add("blue", BlueConfig, "blue")


@dataclass
class Source:
    path: str = ""
    """Where it comes from."""
    colour: Annotated[ColourConfig, COLOURS] | None = None
    """The source's own colour; ``None``: the outer one."""


@dataclass
class Inner:
    depth: PositiveInt | None = None
    """How deep; ``None``: all the way."""


@dataclass
class Outer:
    """The example's own sections."""

    mode: Literal["fast", "slow"] = "fast"
    """Which way."""
    inner: Inner = field(default_factory=Inner)
    sources: list[Source] = field(default_factory=list)
    """Where to read."""
    colour: Annotated[ColourConfig, COLOURS] = field(default_factory=COLOURS.default("blue"))
    """The colour, by name."""
    forgotten: int = 3


def test_field_docs_are_the_strings_under_the_fields_inherited_ones_too() -> None:
    assert config_reference.field_docs(BlueConfig) == {"shade": "How dark: 0 is sky, 1 would be night."}
    docs = config_reference.field_docs(Outer)
    assert docs["mode"] == "Which way."
    assert "inner" not in docs and "forgotten" not in docs


def test_types_read_as_a_yaml_writer_needs_them() -> None:
    describe = config_reference.describe_type
    assert describe(PositiveInt | None) == "int >= 1 | null"
    assert describe(Annotated[float, Range(ge=0, lt=1)]) == "float in [0, 1)"
    assert describe(Literal["fast", "slow"]) == "`fast` | `slow`"
    assert describe(list[str]) == "list of str"
    assert describe(dict[str, PositiveInt]) == "map of str to int >= 1"
    assert describe(Annotated[ColourConfig, COLOURS]) == "colour by name"
    assert describe(Annotated[ColourConfig, COLOURS] | None) == "colour by name | null"


def test_a_walk_lists_every_key_with_its_nested_sections_and_the_registries_it_chooses_from() -> None:
    found = config_reference.walk(Outer, "", "example", config_reference.Walk(), owner="the example")
    keys = [[row.key for row in section.rows] for section in found.sections]
    assert keys == [
        ["mode", "inner", "sources", "colour", "forgotten"],
        ["inner.depth"],
        ["sources[].path", "sources[].colour"],
    ]
    rows = {row.key: row for section in found.sections for row in section.rows}
    assert rows["inner.depth"].type == "int >= 1 | null" and rows["inner.depth"].default == "`null`"
    assert rows["colour"].default == "`blue`"
    assert "One of: `blue`, `red`" in rows["colour"].meaning and "(#components-colour)" in rows["colour"].meaning
    assert "(#example.inner)" in rows["inner"].meaning and "(#example.sources)" in rows["sources"].meaning
    assert "(#components-colour)" in rows["sources[].colour"].meaning  # a registry where null may stand too
    assert found.registries == {"colour": COLOURS}
    assert found.undocumented == [f"{__name__}.Outer.forgotten"]  # a section (`inner`) has its own heading


def test_a_dataclass_met_twice_is_listed_once_and_linked_to() -> None:
    found = config_reference.Walk()
    config_reference.walk(Outer, "", "first", found, owner="recipe `first`")
    config_reference.walk(Outer, "", "second", found, owner="recipe `second`")
    text = "\n".join(config_reference.render_walk(found, "###"))
    assert "The same keys as recipe `first` [there](#first)." in text
    assert text.count("| `inner.depth` |") == 1


def test_each_component_is_listed_with_its_own_options() -> None:
    found = config_reference.walk(Outer, "", "example", config_reference.Walk())
    text = "\n".join(config_reference.render_components(found))
    assert "### Colours {#components-colour}" in text
    assert "#### `blue` {#components-colour-blue}" in text and "#### `red` {#components-colour-red}" in text
    assert "| `shade` | float in [0, 1) | `0.5` | How dark: 0 is sky, 1 would be night. |" in text
    assert "`tests.colours`" in text


def test_the_cli_page_lists_every_command_and_argument_but_hidden_ones() -> None:
    parser = argparse.ArgumentParser(prog="tool")
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="run a thing")
    run.add_argument("target", metavar="DIR|NAME", help="where | what")
    run.add_argument("--times", type=int, default=2, help="how often")
    run.add_argument("--secret", help=argparse.SUPPRESS)
    commands.add_parser("stop", help="stop it")
    page = cli_reference.render_cli(parser, "Intro.")
    assert "## `run`" in page and "## `stop`" in page and "Run a thing." in page
    assert "| `DIR\\|NAME` |  | where \\| what |" in page
    assert "| `--times TIMES` | `2` | how often |" in page
    assert "secret" not in page


def test_every_field_of_the_real_config_has_a_docstring_for_the_page() -> None:
    page, undocumented = reference.config_page()
    assert undocumented == []
    for key in ("trainer.max_num_steps", "checkpoint.model_bank[].path", "model.embeddings.hash.eviction"):
        assert f"| `{key}` |" in page
