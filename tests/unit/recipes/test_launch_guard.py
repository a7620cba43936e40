"""Which module ``python ... -m`` runs, as the start-up guard reads it from the interpreter's arguments."""

import pytest

from recipes_launch_guard import launched_module


@pytest.mark.parametrize(
    ("arguments", "module"),
    [
        (["-m", "recipes", "train", "x"], "recipes"),
        (["-mrecipes", "train"], "recipes"),
        (["-u", "-m", "recipes"], "recipes"),
        (["-um", "recipes"], "recipes"),
        (["-W", "ignore", "-X", "dev", "-m", "recipes"], "recipes"),
        (["-Wignore", "-m", "recipes"], "recipes"),
        (["--check-hash-based-pycs", "never", "-m", "recipes"], "recipes"),
        (["-m", "pytest", "-m", "recipes"], "pytest"),
        (["script.py", "-m", "recipes"], None),
        (["-c", "pass", "-m", "recipes"], None),
        (["-", "-m", "recipes"], None),
        (["--", "-m", "recipes"], None),
        ([], None),
    ],
)
def test_the_module_of_dash_m_is_read_past_the_interpreters_options(arguments: list[str], module: str | None) -> None:
    assert launched_module(arguments) == module
