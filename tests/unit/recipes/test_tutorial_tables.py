"""The second tutorial (docs/tutorials/sparse-tables.md) shows the files of ``examples/my_recommender`` and runs its
commands in that folder; ``tests/integration/recipes/test_tutorial_tables.py`` runs them as the page has them."""

from __future__ import annotations

from support.doc_tutorials import TABLES_FOLDER, TABLES_TUTORIAL, command_args, read_tutorial
from support.paths import EXAMPLES


def test_the_tutorials_commands_run_in_its_example_folder() -> None:
    tutorial = read_tutorial(TABLES_TUTORIAL)

    assert set(tutorial.files) == {f"{TABLES_FOLDER}/mf.py", f"{TABLES_FOLDER}/recipes.yaml"}
    assert command_args(tutorial.commands[0]) == ["cd", TABLES_FOLDER]
    assert (EXAMPLES / TABLES_FOLDER).is_dir()
