"""Presets from YAML files and Python, their precedence, inheritance and imports; recipes by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from recipes.cli.job import config_document, resolve_job
from recipes.cli.job_spec import JobSpec
from recipes.config import presets as preset_registry
from recipes.config.presets import all_presets, find_preset, get_recipe, register_preset, resolve_preset
from recipes.config.resolution import dump_yaml, to_dict
from recipes.errors import UserError

pytestmark = pytest.mark.usefixtures("isolated_presets")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def lr_of(preset: str) -> float:
    return resolve_job(JobSpec(preset)).config.optimizer.lr


def test_the_built_in_presets_are_found_from_any_directory() -> None:
    presets = all_presets()

    assert presets["ctr_tiny"].recipe == "ctr"
    assert presets["ctr_tiny"].source == "recsys.builtin.ctr/presets.yaml"
    assert presets["ctr_tiny_long"].based_on == "ctr_tiny"


def test_a_recipes_yaml_in_the_current_directory_adds_presets(isolated_presets: Path) -> None:
    write(isolated_presets / "recipes.yaml", "mine:\n  recipe: ctr\n  description: Mine.\n  config: {seed: 3}\n")

    preset = find_preset("mine")

    assert (preset.recipe, preset.description, dict(preset.config)) == ("ctr", "Mine.", {"seed": 3})
    assert "ctr_tiny" in all_presets()


def test_files_in_the_environment_variable_add_presets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write(tmp_path / "a.yaml", "from_a:\n  recipe: ctr\n")
    second = write(tmp_path / "b.yaml", "from_b:\n  recipe: ctr\n")
    monkeypatch.setenv(preset_registry.PRESET_FILES_ENV, f"{first}:{second}")

    assert {"from_a", "from_b", "ctr_tiny"} <= set(all_presets())


def test_a_missing_file_in_the_environment_variable_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(preset_registry.PRESET_FILES_ENV, str(tmp_path / "nope.yaml"))

    with pytest.raises(UserError, match=r"nope\.yaml named in \$RECIPES_PRESET_FILES does not exist"):
        all_presets()


def test_precedence_project_then_env_files_then_cwd_then_python(
    isolated_presets: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_dir = tmp_path_factory.mktemp("env")
    env_file = write(env_dir / "env.yaml", "ctr_tiny:\n  recipe: ctr\n  config: {optimizer: {lr: 0.2}}\n")
    assert lr_of("ctr_tiny") == 0.003  # The project's.

    monkeypatch.setenv(preset_registry.PRESET_FILES_ENV, str(env_file))
    assert lr_of("ctr_tiny") == 0.2  # An environment file over the project's.

    write(isolated_presets / "recipes.yaml", "ctr_tiny:\n  recipe: ctr\n  config: {optimizer: {lr: 0.3}}\n")
    assert lr_of("ctr_tiny") == 0.3  # The current directory's over an environment file.

    register_preset("ctr_tiny", "ctr", {"optimizer": {"lr": 0.4}})
    assert lr_of("ctr_tiny") == 0.4  # Python over every file.


def test_a_python_preset_can_be_based_on_a_yaml_preset() -> None:
    register_preset("py_long", "ctr", {"seed": 11}, description="From Python.", based_on="ctr_tiny_long")

    config = resolve_job(JobSpec("py_long")).config

    assert (config.seed, config.trainer.max_num_steps, config.optimizer.lr) == (11, 2000, 0.003)
    assert find_preset("py_long").source == "python"


def test_based_on_layers_from_the_farthest_base(isolated_presets: Path) -> None:
    write(
        isolated_presets / "recipes.yaml",
        "child:\n  based_on: ctr_tiny_long\n  config: {trainer: {max_num_steps: 7}, seed: 4}\n",
    )

    recipe, layers = resolve_preset(find_preset("child"))
    config = resolve_job(JobSpec("child")).config

    assert recipe.name == "ctr"
    assert [source.split(" (")[0] for source, _ in layers] == [
        "preset 'ctr_tiny'",
        "preset 'ctr_tiny_long'",
        "preset 'child'",
    ]
    assert config.trainer.max_num_steps == 7  # child over ctr_tiny_long's 2000 over ctr_tiny's 300
    assert config.trainer.early_stopping.patience == 3  # from ctr_tiny_long
    assert config.optimizer.lr == 0.003  # from ctr_tiny


def test_an_inheritance_loop_is_an_error(isolated_presets: Path) -> None:
    write(isolated_presets / "recipes.yaml", "a:\n  based_on: b\nb:\n  based_on: c\nc:\n  based_on: a\n")

    with pytest.raises(UserError, match="Preset inheritance must not loop, but does: a -> b -> c -> a"):
        resolve_preset(find_preset("a"))


def test_a_preset_based_on_itself_is_a_loop(isolated_presets: Path) -> None:
    write(isolated_presets / "recipes.yaml", "a:\n  recipe: ctr\n  based_on: a\n")

    with pytest.raises(UserError, match="must not loop, but does: a -> a"):
        resolve_preset(find_preset("a"))


def test_a_chain_without_a_recipe_is_an_error(isolated_presets: Path) -> None:
    write(isolated_presets / "recipes.yaml", "orphan:\n  description: no recipe\n")

    with pytest.raises(UserError, match=r"Preset 'orphan' .* must name a `recipe`, but none in its chain does"):
        resolve_preset(find_preset("orphan"))


USER_RECIPE = """\
from dataclasses import dataclass

from recsys.builtin.ctr.recipe import CTRConfig, build_ctr
from recipes.config.presets import register_recipe


@dataclass
class MyConfig(CTRConfig):
    my_knob: int = 1


register_recipe("my_ctr", MyConfig, "A user's recipe.")(build_ctr)
"""


def test_imports_import_the_users_module_from_the_presets_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    write(folder / "my_recipe_module.py", USER_RECIPE)
    presets = write(
        folder / "presets.yaml", "mine:\n  recipe: my_ctr\n  imports: [my_recipe_module]\n  config: {my_knob: 5}\n"
    )
    monkeypatch.setenv(preset_registry.PRESET_FILES_ENV, str(presets))

    job = resolve_job(JobSpec("mine"))

    assert job.recipe.name == "my_ctr" and job.recipe.description == "A user's recipe."
    assert job.config.my_knob == 5  # type: ignore[attr-defined]
    assert get_recipe("my_ctr") is job.recipe


def test_a_single_preset_file_imports_from_its_own_folder(tmp_path: Path) -> None:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    write(folder / "my_recipe_module.py", USER_RECIPE)
    preset = write(folder / "mine.yaml", "recipe: my_ctr\nimports: [my_recipe_module]\nconfig: {my_knob: 6}\n")

    job = resolve_job(JobSpec(str(preset)))

    assert (job.preset.name, job.recipe.name, job.config.my_knob) == ("mine", "my_ctr", 6)  # type: ignore[attr-defined]


def test_a_failing_import_is_a_user_error(isolated_presets: Path) -> None:
    write(isolated_presets / "recipes.yaml", "mine:\n  recipe: ctr\n  imports: [no_such_module_here]\n")

    with pytest.raises(UserError, match=r"Preset 'mine' .* imports 'no_such_module_here', which fails: No module"):
        resolve_preset(find_preset("mine"))


def test_an_unknown_preset_suggests_the_closest_names() -> None:
    with pytest.raises(UserError) as info:
        find_preset("ctr_tiny_lng")

    assert "Unknown preset 'ctr_tiny_lng'. Did you mean 'ctr_tiny_long' or 'ctr_tiny'?" in str(info.value)


def test_an_unknown_recipe_suggests_the_closest_name(isolated_presets: Path) -> None:
    write(isolated_presets / "recipes.yaml", "mine:\n  recipe: crt\n")

    with pytest.raises(UserError, match=r"Unknown recipe 'crt'\. Did you mean 'ctr'\?"):
        resolve_preset(find_preset("mine"))


def test_an_unknown_recipe_of_a_module_that_registers_none_says_to_decorate_it(isolated_presets: Path) -> None:
    write(isolated_presets / "my_module.py", "def build(context):\n    pass\n")  # No @register_recipe.
    write(isolated_presets / "recipes.yaml", "mine:\n  recipe: my_own\n  imports: [my_module]\n")

    with pytest.raises(UserError) as info:
        resolve_preset(find_preset("mine"))

    assert str(info.value) == (
        "Unknown recipe 'my_own'. The preset imports my_module, but no module registered a recipe 'my_own': "
        'decorate its build function with `@register_recipe("my_own", ...)`.'
    )


def test_an_unknown_recipe_of_a_preset_that_imports_nothing_says_to_import_its_module(isolated_presets: Path) -> None:
    write(isolated_presets / "recipes.yaml", "mine:\n  recipe: my_own\n")

    with pytest.raises(UserError) as info:
        resolve_preset(find_preset("mine"))

    assert str(info.value).startswith(
        "Unknown recipe 'my_own'. No installed package offers it, and the preset imports no module: name the module "
        "that registers it in the preset's `imports:`"
    )


def test_a_file_path_works_where_a_preset_name_does(isolated_presets: Path) -> None:
    write(isolated_presets / "one.yaml", "based_on: ctr_tiny\nconfig:\n  seed: 21\n")
    (isolated_presets / "sub").mkdir()
    write(isolated_presets / "sub" / "two", "recipe: ctr\nconfig: {seed: 22}\n")

    assert resolve_job(JobSpec("one.yaml")).config.seed == 21
    assert resolve_job(JobSpec("one.yaml")).config.trainer.max_num_steps == 300
    assert resolve_job(JobSpec("sub/two")).config.seed == 22  # A path with a separator, whatever its suffix.


def test_register_recipe_needs_a_recipe_config() -> None:
    class NotAConfig:
        pass

    with pytest.raises(TypeError, match="`config_class` must subclass RecipeConfig, but is NotAConfig instead"):
        preset_registry.register_recipe("bad", NotAConfig)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mine: [1, 2\n", r"recipes\.yaml is not valid YAML"),
        ("- mine\n", r"must map preset names to presets, but holds a list"),
        ("mine: 3\n", r"A preset must be a mapping, but 'mine' in .* is a int"),
        (
            "mine:\n  recipe: ctr\n  confg: {}\n",
            r"Unknown preset key 'confg' \(.*, preset 'mine'\)\. Did you mean 'config'\?",
        ),
        ("mine:\n  recipe: ctr\n  config: [1]\n", r"The `config` of a preset must be a mapping"),
        ("mine:\n  recipe: ctr\n  imports: my_module\n", r"The `imports` of a preset must be a list of module names"),
        ("mine:\n  recipe: ctr\n  search_path: lib\n", r"The `search_path` of a preset must be a list of folders"),
    ],
)
def test_a_malformed_presets_file_is_a_clear_error(isolated_presets: Path, text: str, message: str) -> None:
    write(isolated_presets / "recipes.yaml", text)

    with pytest.raises(UserError, match=message):
        all_presets()


def test_a_single_preset_file_without_a_recipe_is_an_error(isolated_presets: Path) -> None:
    write(isolated_presets / "plain.yaml", "trainer:\n  max_num_steps: 3\n")

    with pytest.raises(UserError, match=r"plain\.yaml must hold one preset with a `recipe` key, but does not"):
        find_preset("plain.yaml")


# Where a user's recipe lives: recorded in config.yaml, and not hiding the framework ----------------


def forget_module(name: str, recipe: str, folder: Path) -> None:
    """As a new process would be: the module not imported, its recipe not registered, its folder not on sys.path."""
    sys.modules.pop(name, None)
    preset_registry._recipes.pop(recipe, None)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != folder.resolve()]


def test_the_written_config_records_where_the_recipe_lives_and_reruns_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "my project"
    folder.mkdir()
    write(folder / "my_recipe_module.py", USER_RECIPE)
    preset = write(folder / "mine.yaml", "recipe: my_ctr\nimports: [my_recipe_module]\nconfig: {my_knob: 6}\n")
    job = resolve_job(JobSpec(str(preset)))
    (tmp_path / "out").mkdir()
    written = write(tmp_path / "out" / "config.yaml", dump_yaml(config_document(job)))
    forget_module("my_recipe_module", "my_ctr", folder)
    monkeypatch.chdir(tmp_path / "out")

    again = resolve_job(JobSpec(str(written)))

    document = yaml.safe_load(written.read_text())
    assert (document["imports"], document["search_path"]) == (["my_recipe_module"], [str(folder.resolve())])
    assert again.recipe.name == "my_ctr" and to_dict(again.config) == to_dict(job.config)
    assert config_document(again) == document  # The same file again: re-running adds no folder.


def test_the_written_config_records_the_imports_of_the_whole_based_on_chain(
    isolated_presets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_folder = isolated_presets / "base"
    base_folder.mkdir()
    write(base_folder / "my_recipe_module.py", USER_RECIPE)
    base_file = write(base_folder / "presets.yaml", "base:\n  recipe: my_ctr\n  imports: [my_recipe_module]\n")
    monkeypatch.setenv(preset_registry.PRESET_FILES_ENV, str(base_file))
    write(isolated_presets / "child_helpers.py", "HELPED = True\n")
    write(isolated_presets / "recipes.yaml", "child:\n  based_on: base\n  imports: [child_helpers]\n")

    document = config_document(resolve_job(JobSpec("child")))

    assert document["recipe"] == "my_ctr"
    assert document["imports"] == ["my_recipe_module", "child_helpers"]
    assert document["search_path"] == [str(base_folder.resolve()), str(isolated_presets.resolve())]


def test_a_built_in_presets_config_records_no_imports() -> None:
    document = config_document(resolve_job(JobSpec("ctr_tiny")))

    assert "imports" not in document and "search_path" not in document


def test_a_relative_search_path_is_relative_to_the_preset_file(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "presets").mkdir()
    write(tmp_path / "lib" / "my_recipe_module.py", USER_RECIPE)
    preset = write(
        tmp_path / "presets" / "mine.yaml", "recipe: my_ctr\nimports: [my_recipe_module]\nsearch_path: [../lib]\n"
    )

    job = resolve_job(JobSpec(str(preset)))

    assert find_preset(str(preset)).search_path[0] == str((tmp_path / "lib").resolve())
    assert job.recipe.name == "my_ctr" and job.search_path == (str((tmp_path / "lib").resolve()),)


@pytest.mark.parametrize(
    "shadow", ["units.py", "checkpoint.py", "gang.py", "embedding.py", "recipes.py", "gang/__init__.py"]
)
def test_a_users_module_named_like_a_framework_package_is_refused(
    shadow: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "elsewhere"
    (folder / shadow).parent.mkdir(parents=True, exist_ok=True)
    write(folder / shadow, "X = 1\n")
    write(folder / "my_recipe_module.py", USER_RECIPE)
    presets = write(folder / "presets.yaml", "mine:\n  recipe: my_ctr\n  imports: [my_recipe_module]\n")
    monkeypatch.setenv(preset_registry.PRESET_FILES_ENV, str(presets))
    name = shadow.split("/")[0].removesuffix(".py")
    hidden = folder.resolve() / shadow.split("/")[0]

    with pytest.raises(UserError) as info:
        resolve_job(JobSpec("mine"))

    assert str(info.value) == (
        f"{hidden} hides the framework's package `{name}` (it comes first on sys.path); "
        f"rename it, e.g. to my_{name}, and the imports of it."
    )


def test_a_data_folder_named_like_a_framework_package_hides_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "elsewhere"
    (folder / "checkpoint").mkdir(parents=True)  # No __init__.py: a namespace folder, found after the package.
    write(folder / "my_recipe_module.py", USER_RECIPE)
    presets = write(folder / "presets.yaml", "mine:\n  recipe: my_ctr\n  imports: [my_recipe_module]\n")
    monkeypatch.setenv(preset_registry.PRESET_FILES_ENV, str(presets))

    assert resolve_job(JobSpec("mine")).recipe.name == "my_ctr"
