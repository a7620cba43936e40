"""``examples/`` is the tutorials' folders, and the checkout's own ``recipes.yaml`` trains them.

A tutorial's page (``docs/tutorials/``) shows each file it has the user write; ``examples/`` holds the same files,
and the tutorials' tests run those. The checkout's ``recipes.yaml`` is a workspace file like a user's: it holds
the tutorials' presets, imported from their folders, so that ``python -m recipes list`` and ``train`` run in the
checkout show and train them. These tests keep the three in step: the pages' text, the example folders, and the
checkout's presets (``tests/integration/recipes/test_examples.py`` lists and trains those presets); and the
README's taste of a recipe is cut from the first tutorial's file.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from recipes.config.presets import Preset, all_presets
from support.doc_blocks import blocks
from support.doc_tutorials import TUTORIALS, example_files, read_tutorial
from support.paths import EXAMPLES, README, ROOT


def tutorial_folder(page: Path) -> str:
    """The one folder a tutorial's files are in (``my_project`` for ``my_project/linreg.py``)."""
    folders = {path.split("/")[0] for path in read_tutorial(page).files}
    assert len(folders) == 1, f"{page.name} shows files of {sorted(folders)}"
    return folders.pop()


def presets_of_the_folder(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Preset]:
    """The presets of ``folder``'s ``recipes.yaml``, as ``python -m recipes`` run in that folder reads them."""
    monkeypatch.chdir(folder)
    source = str(Path.cwd() / "recipes.yaml")
    return {name: preset for name, preset in all_presets().items() if preset.source == source}


def where_from_aside(preset: Preset) -> Preset:
    """The preset without what says where it was read: its file and the folders it imports from."""
    return dataclasses.replace(preset, source="", search_path=())


@pytest.mark.parametrize("page", TUTORIALS, ids=lambda page: page.stem)
def test_the_tutorial_shows_the_example_folders_files_as_they_are(page: Path) -> None:
    shown = read_tutorial(page).files

    assert shown == example_files(tutorial_folder(page))


def excerpts(text: str) -> list[str]:
    """The runs of lines of a block between its elisions (a line that starts with ``...`` or ``# ...``)."""
    runs = re.split(r"^ *(?:\.\.\.|# \.\.\.).*\n", text, flags=re.MULTILINE)
    return [run.strip("\n") for run in runs if run.strip()]


def test_the_readmes_taste_of_a_recipe_is_cut_from_the_first_tutorials_file() -> None:
    taste = next(block for block in blocks(README) if block.language == "python")
    source = (EXAMPLES / "my_project" / "linreg.py").read_text()

    position = 0
    for excerpt in excerpts(taste.text):
        found = source.find(excerpt, position)
        assert found != -1, f"not in examples/my_project/linreg.py in this order:\n{excerpt}"
        position = found + len(excerpt)
    assert len(excerpts(taste.text)) == 3


def test_every_example_folder_belongs_to_a_tutorial() -> None:
    folders = {path.name for path in EXAMPLES.iterdir() if path.is_dir()}

    assert folders == {tutorial_folder(page) for page in TUTORIALS}


def test_the_checkouts_presets_are_the_example_folders_own_imported_from_there(
    isolated_presets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    examples = [presets_of_the_folder(EXAMPLES / tutorial_folder(page), monkeypatch) for page in TUTORIALS]
    checkout = presets_of_the_folder(ROOT, monkeypatch)

    assert sorted(checkout) == sorted(name for presets in examples for name in presets)
    for presets in examples:
        for name, preset in presets.items():
            assert where_from_aside(checkout[name]) == where_from_aside(preset)
            # The example's folder first, so its module is the one imported.
            assert checkout[name].search_path[0] == preset.search_path[0]
