"""The documents stay in step with the code: the README names every built-in preset, and every config key the
README and the pages name is a key of a built-in recipe's config. (Every key's default and meaning are in the
config reference, which the site generates from the config dataclasses.)"""

from __future__ import annotations

import re

from recipes.config.presets import all_presets, get_recipe
from recipes.config.resolution import valid_keys
from support import paths
from support.doc_blocks import DOCUMENTS

README = paths.README.read_text()
SECTIONS = ("trainer", "optimizer", "lr_scheduler", "metrics", "profiler", "checkpoint", "gang", "validation")
RECIPE_SECTIONS = ("model", "dataset")
# A key in backquotes, as the documents name one: `trainer.max_num_steps`, `model.embeddings.hash.min_count`.
NAMED_KEY = re.compile(rf"`((?:{'|'.join(SECTIONS + RECIPE_SECTIONS)})(?:\.\w+)+)`")
# What an error message corrects ("`optimizer.learning_rate` suggests `optimizer.lr`").
MISSPELT_ON_PURPOSE = {"optimizer.learning_rate"}
# Files, not keys: `model.pt`, `model.json`, `trainer.py`.
FILE_NAME = re.compile(r"\.(py|pt|pt2|json|jsonl|yaml|parquet|npz|csv|txt|lock)$")


def named_keys(text: str) -> set[str]:
    return {key for key in NAMED_KEY.findall(text) if not FILE_NAME.search(key)}


def keys_of_the_built_in_recipes() -> set[str]:
    return {key for recipe in ("ctr", "dlrm", "tabular") for key in valid_keys(get_recipe(recipe).config_class)}


def test_every_config_key_the_documents_name_is_a_key() -> None:
    named = {document.relative_to(paths.ROOT).as_posix(): named_keys(document.read_text()) for document in DOCUMENTS}
    valid = keys_of_the_built_in_recipes() | MISSPELT_ON_PURPOSE
    unknown = {document: sorted(keys - valid) for document, keys in named.items() if keys - valid}

    assert len(set().union(*named.values())) > 40  # the pattern finds the keys the pages name
    assert unknown == {}


def test_every_built_in_preset_is_in_the_readme() -> None:
    project = [name for name, preset in all_presets().items() if preset.source.startswith("recsys.builtin.")]
    missing = [name for name in project if f"`{name}`" not in README]

    assert project

    assert missing == []
