"""The README's reference stays in step with the code: every config key and every preset is documented."""

from __future__ import annotations

import pytest

from recipes.config.presets import all_presets, get_recipe
from recipes.config.resolution import valid_keys
from support import paths

README = paths.README.read_text()


def leaf_keys(config_class: type) -> list[str]:
    keys = valid_keys(config_class)
    return [key for key in keys if not any(other.startswith(key + ".") for other in keys)]


@pytest.mark.parametrize("recipe", ["ctr", "dlrm", "tabular"])
def test_every_config_key_is_in_the_readme(recipe: str) -> None:
    missing = [key for key in leaf_keys(get_recipe(recipe).config_class) if f"`{key}`" not in README]

    assert missing == []


def test_every_built_in_preset_is_in_the_readme() -> None:
    project = [name for name, preset in all_presets().items() if preset.source.startswith("recsys.builtin.")]
    missing = [name for name in project if f"`{name}`" not in README]

    assert project

    assert missing == []
