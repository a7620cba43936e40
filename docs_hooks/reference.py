"""MkDocs hook: the CLI and config reference pages, generated from the code at every build.

``reference/cli.md`` comes from the parser of ``python -m recipes``, ``reference/config.md`` from the config
dataclasses (``RecipeConfig``, each installed recipe's config, the components every registry holds). Neither page is
a file in the repository, so no stale copy of either can exist. A config field without a docstring is a warning,
which ``mkdocs build --strict`` (scripts/docs.sh) turns into a failed build.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from cli_reference import render_cli
from config_reference import Walk, class_doc, render_components, render_walk, walk

log = logging.getLogger("mkdocs.hooks.reference")

CLI_INTRO = """
`recipes` is also installed as a console script: `recipes train ctr_tiny` is `python -m recipes train ctr_tiny`.
Every command takes `--help`. `PRESET` is a preset name (`python -m recipes list`) or the path of a preset YAML file,
for instance a run's `OUTPUT_DIR/config.yaml`. An override is `section.key=value`, bare or after `--config`; values
parse as YAML (`3`, `0.5`, `null`, `[64, 32]`, `true`). The default output directory is `runs/<preset>`. The keys
are in the [config reference](config.md).

Exit codes: 0 success; 2 a user error (one line on stderr: an unknown preset or key, a bad value or type, a missing
file, a malformed data row, an out-of-range id, an output directory another `train` is using); 1 a runtime failure
(one line with the cause; the traceback is in `OUTPUT_DIR/logs/rank_K.log`); 130 interrupted by Ctrl-C (training
saved a checkpoint first: the same command resumes there).

## Presets

Presets come from, lowest precedence first: installed packages (the built-in recipes' own `presets.yaml` files
among them), the files named in `$RECIPES_PRESET_FILES` (separated by `:`), a `recipes.yaml` in the current
directory, and `recipes.register_preset(...)` from Python. A preset has `recipe`, `description`, `config` (only what
differs), optionally `based_on` (another preset whose config it extends), `imports` (modules imported first, from the
preset file's folder, so a user's recipe registers itself) and `search_path` (folders, relative to its file, to
import them from). A run's `config.yaml` records the imports of the preset's whole `based_on` chain and the absolute
folders they came from, so `train OUTPUT_DIR/config.yaml` works from any directory. Do not name your modules `units`,
`checkpoint`, `gang`, `embedding`, `recsys` or `recipes`: they would hide the framework's packages, and the CLI
refuses them in one line.

A package of recipes is installed the way the built-in ones are: its `pyproject.toml` names the module that
registers each recipe and the package that holds its `presets.yaml`, and `python -m recipes list` shows them
wherever it runs:

```toml
[project.entry-points."recipes.recipes"]
my_recipe = "my_package.my_recipe"      # the module whose @register_recipe("my_recipe", ...) runs on import

[project.entry-points."recipes.presets"]
my_package = "my_package"               # a package with a presets.yaml (ship it as package data)
```

The installed packages' presets:

{presets}

## Commands
"""

CONFIG_INTRO = """
# Config reference

Precedence, lowest to highest: the recipe's dataclass defaults < the preset (and its `based_on` chain) <
`--config-file` files in order < overrides. Unknown keys and wrong types are errors that name the key, the expected
type and the closest valid key (synonyms included: `optimizer.learning_rate` suggests `optimizer.lr`). The resolved
config is written to `OUTPUT_DIR/config.yaml`. `null` in YAML is Python's `None`.

Every number has a valid range, its type below, checked when the config resolves (``error: `optimizer.lr` must be a
finite number > 0, but is inf instead (from the command line).``); `inf` and `nan` may be typed plainly and are
refused where they do not belong. In your own sections, declare ranges in the type, from `recipes`: `lr:
PositiveFloat`, `dims: list[PositiveInt]`, `rate: Annotated[float, Range(ge=0, lt=1)]`, `Range(ge=, gt=, le=, lt=,
finite=True)`.

A component chosen by name (an optimizer, an LR schedule, a recorder, a zoo model, a data format, a sparse optimizer,
an eviction policy) is written as its name alone (`optimizer: sgd`) or with options (`optimizer: {name: sgd,
momentum: 0.9}`); each takes only its own options, listed under [Components by name](#components-by-name). A later
layer that names another component keeps only the options the two share. Recorders are a map of names to options:
`metrics.recorders: {console: false, wandb: {enabled: true}}`.

This page is generated from the config dataclasses and the docstrings of their fields at every build of the site
(`docs_hooks/reference.py`): a field's docstring is where its documentation changes.
"""


METRICS_NOTE = """
The built-in click-prediction recipes validate with `auc`, `pr_auc`, `log_loss`, `ne`, `calibration`, `positive_rate`
and `accuracy` (`recsys.click.units.CTREvalUnit`, which a recipe of your own can reuse). `metrics.group_by` adds
`gauc` (the AUC of each group's rows, averaged with the groups' row counts as weights; groups of one class left out,
as in TorchRec's `gauc`) and `gauc_groups` (how many groups it counts); `metrics.slice_by` adds `ne/<value>` and
`calibration/<value>` per value of the column. Both are exact over data-parallel ranks; `gauc` may be the
`trainer.score_metric`, a metric by slice may not. Both name a single-valued categorical column of the batches (any
of the `tabular` recipe's schema, `C1`..`C26` of `dlrm`, `cat_0`.. of `ctr`); a column the batches lack stops the run
at start-up, and so does a slice column of more than 1,000 values. A row's group or slice is its column's id in the
batch: the value's own with `vocabulary: true` or `model.embeddings.kind: hash`, else its bucket, which two values may
share. A slice is named by its id, or for a derived `hour`, `weekday`, `day` or `month` by its value (`ne/13`). A
recipe of your own passes the columns to `click_prediction_parts(..., columns={name: number of values or None})`; a
metric of your own that groups or slices says so by deriving from `units.ByGroup` or `units.BySlice`.
"""


def cli_page() -> str:
    from recipes.cli.main import build_parser
    from recipes.config.presets import all_presets

    presets = ["| preset | recipe | description |", "| --- | --- | --- |"]
    for name, preset in sorted(all_presets().items()):
        if preset.source.endswith("presets.yaml"):  # an installed package's, not this directory's recipes.yaml
            recipe = f"`{preset.recipe}`" if preset.recipe else f"as `{preset.based_on}`"
            presets.append(f"| `{name}` | {recipe} | {preset.description} |")
    return render_cli(build_parser(), CLI_INTRO.replace("{presets}", "\n".join(presets)))


def installed_recipes() -> dict[str, type]:
    """Each installed recipe's config class, by recipe name."""
    from recipes.config.presets import RECIPE_ENTRY_POINTS, get_recipe

    names = sorted(point.name for point in importlib.metadata.entry_points(group=RECIPE_ENTRY_POINTS))
    return {name: get_recipe(name).config_class for name in names}


def config_page() -> tuple[str, list[str]]:
    """The page, and the fields that have no docstring to explain them."""
    from recipes.config.sections import RecipeConfig

    found = walk(RecipeConfig, "", "config", Walk(), owner="every recipe")
    lines = [CONFIG_INTRO.strip(), "", "## Sections every recipe has", "", *render_walk(found, "###")]
    shared = frozenset(field for field in RecipeConfig.__dataclass_fields__)
    for name, config_class in installed_recipes().items():
        recipe = Walk(registries=found.registries, undocumented=found.undocumented, documented=found.documented)
        walk(config_class, "", name, recipe, skip=shared, owner=f"recipe `{name}`")
        doc = class_doc(config_class)
        lines += [f"## Recipe `{name}` {{#{name}}}", "", f"`{config_class.__module__}.{config_class.__name__}`.", ""]
        lines += [doc, ""] if doc and doc != class_doc(RecipeConfig) else []
        lines += render_walk(recipe, "###")[2:]  # the recipe's own top-level keys, under the recipe's heading
    lines += ["## Components by name", "", *render_components(found)]
    lines += ["## Metrics", "", *metrics_table()]
    return "\n".join(lines), found.undocumented


def metrics_table() -> list[str]:
    """The metrics ``units`` offers a unit's ``MetricBag``, each with the first paragraph of its docstring."""
    from torchmetrics import Metric

    import units

    lines = [
        "A unit registers metrics in its `MetricBag` (`metric_bag.register(name, metric)`); each is reduced exactly "
        "over the data-parallel ranks and written to every recorder under its name. From `units`:",
        "",
        "| metric | what it is |",
        "| --- | --- |",
    ]
    for name in units.__all__:
        value = getattr(units, name)
        if inspect.isclass(value) and issubclass(value, Metric) and value is not Metric:
            summary = " ".join((inspect.getdoc(value) or "").split("\n\n")[0].split())
            lines.append(f"| `{name}` | {summary.replace('``', '`')} |")
    return [*lines, "", METRICS_NOTE.strip(), ""]


def on_files(files: Any, config: Any) -> Any:
    """Add the two generated pages to the site, as if they were files under ``docs/reference``."""
    from mkdocs.structure.files import File

    page, undocumented = config_page()
    for field in undocumented:
        log.warning("The config field %s has no docstring: the config reference cannot explain it.", field)
    for path, content in (("reference/cli.md", cli_page()), ("reference/config.md", page)):
        files.append(File.generated(config, path, content=content))
    return files
