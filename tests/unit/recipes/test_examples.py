"""``examples/`` is the README tutorials' folders, and the checkout's own ``recipes.yaml`` trains them.

The README shows each file a tutorial has the user write; ``examples/`` holds the same files, and the
tutorials' tests run those. The checkout's ``recipes.yaml`` is a workspace file like a user's: it holds the
tutorials' presets, imported from their folders, so that ``python -m recipes list`` and ``train`` run in the
checkout show and train them. These tests keep the three in step: the README's text, the example folders,
and the checkout's presets (``tests/integration/recipes/test_examples.py`` lists and trains those presets).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from recipes.config.presets import Preset, all_presets
from support.paths import EXAMPLES, ROOT
from support.readme_tutorial import TUTORIALS, example_files, read_tutorial


def tutorial_folder(heading: str) -> str:
    """The one folder a tutorial's files are in (``my_project`` for ``my_project/linreg.py``)."""
    folders = {path.split("/")[0] for path in read_tutorial(heading).files}
    assert len(folders) == 1, f"{heading!r} shows files of {sorted(folders)}"
    return folders.pop()


def presets_of_the_folder(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Preset]:
    """The presets of ``folder``'s ``recipes.yaml``, as ``python -m recipes`` run in that folder reads them."""
    monkeypatch.chdir(folder)
    source = str(Path.cwd() / "recipes.yaml")
    return {name: preset for name, preset in all_presets().items() if preset.source == source}


def where_from_aside(preset: Preset) -> Preset:
    """The preset without what says where it was read: its file and the folders it imports from."""
    return dataclasses.replace(preset, source="", search_path=())


@pytest.mark.parametrize("heading", TUTORIALS)
def test_the_readme_shows_the_example_folders_files_as_they_are(heading: str) -> None:
    shown = read_tutorial(heading).files

    assert shown == example_files(tutorial_folder(heading))


def test_every_example_folder_belongs_to_a_tutorial() -> None:
    folders = {path.name for path in EXAMPLES.iterdir() if path.is_dir()}

    assert folders == {tutorial_folder(heading) for heading in TUTORIALS}


def test_the_checkouts_presets_are_the_example_folders_own_imported_from_there(
    isolated_presets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    examples = [presets_of_the_folder(EXAMPLES / tutorial_folder(heading), monkeypatch) for heading in TUTORIALS]
    checkout = presets_of_the_folder(ROOT, monkeypatch)

    assert sorted(checkout) == sorted(name for presets in examples for name in presets)
    for presets in examples:
        for name, preset in presets.items():
            assert where_from_aside(checkout[name]) == where_from_aside(preset)
            # The example's folder first, so its module is the one imported.
            assert checkout[name].search_path[0] == preset.search_path[0]
