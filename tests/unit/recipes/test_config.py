"""Config resolution: defaults < preset < config files < overrides, checked key by key."""

from __future__ import annotations

import importlib.metadata
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pytest

from recipes.cli.job import config_document, resolve_job
from recipes.cli.job_spec import JobSpec
from recipes.cli.main import main
from recipes.config.presets import RECIPE_ENTRY_POINTS, get_recipe
from recipes.config.resolution import (
    ConfigError,
    NumericField,
    PositiveInt,
    Range,
    dump_yaml,
    numeric_fields,
    overrides_to_dict,
    parse_override,
    resolve_config,
    to_dict,
    valid_keys,
)
from recipes.config.sections import RecipeConfig
from recipes.errors import UserError
from recsys.builtin.ctr.recipe import CTRConfig

pytestmark = pytest.mark.usefixtures("isolated_presets")


@dataclass
class ToySection:
    width: int = 4
    scale: float = 1.0
    tags: list[str] = field(default_factory=list)
    note: str | None = None
    fraction: Annotated[float, Range(gt=0, le=1)] = 0.5
    sizes: list[PositiveInt] = field(default_factory=lambda: [2])
    limit: Annotated[int, Range(ge=-3, lt=10)] | None = None
    ceiling: Annotated[float, Range(le=5, finite=False)] = 1.0


@dataclass
class ToyConfig(RecipeConfig):
    toy: ToySection = field(default_factory=ToySection)


def resolve(*layers: dict[str, object]) -> ToyConfig:
    return resolve_config(ToyConfig, [(f"layer {i}", layer) for i, layer in enumerate(layers)])


def resolve_overrides(*overrides: str) -> ToyConfig:
    return resolve(overrides_to_dict(list(overrides)))


def test_no_layer_gives_the_dataclass_defaults() -> None:
    assert resolve() == ToyConfig()


def test_later_layers_win_key_by_key_and_keep_the_rest() -> None:
    config = resolve(
        {"toy": {"width": 8, "scale": 2.0}, "trainer": {"max_num_steps": 50}},
        {"toy": {"width": 16}},
    )

    assert config.toy == ToySection(width=16, scale=2.0)
    assert config.trainer.max_num_steps == 50
    assert config.trainer.grad_accumulation == 1  # Untouched: the default.


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("toy.width=12", {"toy": {"width": 12}}),
        ("toy.scale=0.5", {"toy": {"scale": 0.5}}),
        ("toy.tags=[a, b]", {"toy": {"tags": ["a", "b"]}}),
        ("toy.note=null", {"toy": {"note": None}}),
        ("toy.note=", {"toy": {"note": None}}),
        ("metrics.recorders.jsonl=false", {"metrics": {"recorders": {"jsonl": False}}}),
        ("trainer.early_stopping.patience=3", {"trainer": {"early_stopping": {"patience": 3}}}),
        ("toy.note=a=b", {"toy": {"note": "a=b"}}),
    ],
)
def test_override_values_parse_as_yaml(override: str, expected: dict[str, object]) -> None:
    assert overrides_to_dict([override]) == expected


def test_overrides_build_typed_values() -> None:
    config = resolve_overrides("toy.width=12", "toy.scale=3", "toy.tags=[x]", "metrics.recorders.console=false")

    assert config.toy.width == 12
    assert config.toy.scale == 3.0 and type(config.toy.scale) is float
    assert config.toy.tags == ["x"]
    assert config.metrics.recorders["console"].enabled is False


def test_an_exponent_without_a_dot_is_a_float() -> None:
    assert resolve_overrides("optimizer.lr=1e-3").optimizer.lr == pytest.approx(1e-3)


@pytest.mark.parametrize("text", ["toy.width", "=3", " =3"])
def test_an_override_without_key_or_equals_is_an_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"must look like `section\.key=value`"):
        parse_override(text)


def test_an_override_with_malformed_yaml_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"The value of override 'toy.tags' is not valid YAML: '\[a'"):
        parse_override("toy.tags=[a")


def test_an_override_inside_a_scalar_override_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"Override 'toy\.width\.x' conflicts with an earlier override of 'width'"):
        overrides_to_dict(["toy.width=3", "toy.width.x=4"])


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"traner": {"max_num_steps": 1}}, "Unknown config key 'traner' (from layer 0). Did you mean 'trainer'?"),
        (
            {"trainer": {"max_num_step": 1}},
            "Unknown config key 'trainer.max_num_step' (from layer 0). Did you mean 'trainer.max_num_steps'?",
        ),
        (
            {"trainer": {"early_stopping": {"patiense": 1}}},
            "Unknown config key 'trainer.early_stopping.patiense' (from layer 0). "
            "Did you mean 'trainer.early_stopping.patience'?",
        ),
    ],
)
def test_an_unknown_key_names_it_and_the_closest_valid_key(layer: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(layer)

    assert message in str(info.value)


def test_an_unknown_key_far_from_any_valid_key_suggests_nothing() -> None:
    with pytest.raises(ConfigError, match=r"^Unknown config key 'zzzz' \(from layer 0\)\.$"):
        resolve({"zzzz": 1})


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"toy": {"width": "wide"}}, "Config key 'toy.width' must be int, but is 'wide' (str) instead (from layer 0)."),
        ({"toy": {"width": 2.5}}, "Config key 'toy.width' must be int, but is 2.5 (float)"),
        ({"toy": {"width": True}}, "Config key 'toy.width' must be int, but is True (bool)"),
        ({"toy": {"scale": "big"}}, "Config key 'toy.scale' must be float, but is 'big' (str)"),
        ({"toy": {"tags": "a"}}, "Config key 'toy.tags' must be a list of str, but is 'a' (str)"),
        ({"toy": {"tags": [1]}}, "Config key 'toy.tags' must be a list of str, but is [1] (list)"),
        ({"toy": {"note": 3}}, "Config key 'toy.note' must be str or null, but is 3 (int)"),
        ({"trainer": {"max_num_steps": "x"}}, "Config key 'trainer.max_num_steps' must be int or null"),
        ({"trainer": 5}, "Config key 'trainer' must be a mapping (TrainerSection), but is 5 (int)"),
        (
            {"trainer": {"mixed_precision": "fp32"}},
            "Config key 'trainer.mixed_precision' must be one of 'none', 'bf16', 'fp16', but is 'fp32' (str)",
        ),
        (
            {"metrics": {"recorders": {"jsonl": "yes please"}}},
            "Config key 'metrics.recorders.jsonl' must be true, false",
        ),
    ],
)
def test_a_wrong_type_names_the_key_and_the_expected_type(layer: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(layer)

    assert message in str(info.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.grad_accumulation=0", "`trainer.grad_accumulation` must be an integer >= 1, but is 0 instead"),
        ("trainer.max_num_steps=0", "`trainer.max_num_steps` must be an integer >= 1 or null, but is 0 instead"),
        ("optimizer.lr=-1", "`optimizer.lr` must be a finite number > 0, but is -1 instead (from layer 0)."),
        ("optimizer.betas=[0.9]", "Invalid config in 'optimizer': `betas` must have 2 values, but has 1 instead."),
        ("optimizer.betas=[0.9, 1]", "`optimizer.betas[1]` must be a finite number in [0, 1), but is 1 instead"),
        ("trainer.early_stopping.patience=0", "`trainer.early_stopping.patience` must be an integer >= 1 or null"),
        ("checkpoint.keep_last_n=0", "`checkpoint.keep_last_n` must be an integer >= 1 or null, but is 0 instead"),
        ("gang.tp_size=0", "`gang.tp_size` must be an integer >= 1, but is 0 instead (from layer 0)."),
        ("seed=-1", "`seed` must be an integer in [0, 4294967295], but is -1 instead"),
        ("gang.timeout_s=.inf", "`gang.timeout_s` must be a finite number in (0, 2592000], but is inf instead"),
    ],
)
def test_an_invalid_value_is_a_clear_error(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_overrides(override)

    assert message in str(info.value)


def test_both_step_and_epoch_limits_null_is_an_error() -> None:
    with pytest.raises(ConfigError, match="must not both be null, or training never ends"):
        resolve_overrides("trainer.max_num_steps=null")


def test_valid_keys_lists_nested_keys_with_dots() -> None:
    keys = valid_keys(ToyConfig)

    assert {"seed", "toy", "toy.width", "trainer.early_stopping.patience", "metrics.recorders.wandb.mode"} <= set(keys)


# Through presets and files (resolve_job) -------------------------------------------------------


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_precedence_defaults_preset_files_overrides(tmp_path: Path) -> None:
    first = write(tmp_path / "first.yaml", "optimizer:\n  lr: 0.01\n  weight_decay: 0.1\nseed: 5\n")
    second = write(tmp_path / "second.yaml", "optimizer:\n  lr: 0.02\n  eps: 1.0e-6\n")

    files_only = resolve_job(JobSpec("ctr_tiny", config_files=[first, second])).config
    overridden = resolve_job(
        JobSpec("ctr_tiny", config_files=[first, second], overrides=["optimizer.lr=0.05", "seed=9"]),
    ).config

    assert isinstance(files_only, CTRConfig)
    assert files_only.trainer.max_num_steps == 300  # preset over default (1000)
    assert files_only.trainer.score_metric == "auc"  # preset over default (None)
    assert files_only.optimizer.lr == 0.02  # the later file over the earlier, over the preset's 0.003
    assert files_only.optimizer.weight_decay == 0.1  # the earlier file, not overridden by the later
    assert files_only.optimizer.eps == 1e-6
    assert files_only.trainer.grad_accumulation == 1  # the default, touched by no layer
    assert (overridden.optimizer.lr, overridden.seed) == (0.05, 9)  # overrides over files
    assert overridden.optimizer.weight_decay == 0.1


def test_an_error_names_the_file_it_came_from(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", "trainer:\n  max_num_steps: many\n")

    with pytest.raises(ConfigError, match=rf"'trainer.max_num_steps' must be int or null.*from --config-file {bad}"):
        resolve_job(JobSpec("ctr_tiny", config_files=[bad]))


def test_an_error_in_a_preset_names_the_preset(tmp_path: Path) -> None:
    write(tmp_path / "recipes.yaml", "mine:\n  recipe: ctr\n  config:\n    optimiser:\n      lr: 0.1\n")

    with pytest.raises(ConfigError, match=r"Unknown config key 'optimiser' \(from preset 'mine' .*Did you mean"):
        resolve_job(JobSpec("mine"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [1", "is not valid YAML"),
        ("- 1\n- 2\n", "must hold a mapping, but holds a list"),
        ("recipe: other\nconfig: {}\n", "is for recipe 'other', not 'ctr'"),
    ],
)
def test_a_bad_config_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "c.yaml", text)

    with pytest.raises(UserError, match=message):
        resolve_job(JobSpec("ctr_tiny", config_files=[path]))


def test_a_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"The config file .*nope\.yaml does not exist"):
        resolve_job(JobSpec("ctr_tiny", config_files=[str(tmp_path / "nope.yaml")]))


def test_the_dumped_config_resolves_to_the_same_config(tmp_path: Path) -> None:
    job = resolve_job(JobSpec("ctr_tiny_long", overrides=["optimizer.lr=0.5", "model.hidden_dims=[8]"]))
    dumped = write(tmp_path / "config.yaml", dump_yaml(config_document(job)))

    as_preset = resolve_job(JobSpec(dumped))
    as_config_file = resolve_job(JobSpec("ctr_tiny", config_files=[dumped]))

    assert as_preset.config == job.config
    assert as_config_file.config == job.config
    assert as_preset.recipe.name == "ctr"
    assert to_dict(as_preset.config)["model"]["hidden_dims"] == [8]


# Typos: synonyms, spellings and keys in the wrong section ----------------------------------------


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("optimizer.learning_rate", "'optimizer.lr'"),  # difflib alone says 'optimizer.name'
        ("optimizer.weightDecay", "'optimizer.weight_decay'"),
        ("optimizer.weight-decay", "'optimizer.weight_decay'"),
        ("optimizer.wd", "'optimizer.weight_decay'"),
        ("trainer.num_steps", "'trainer.max_num_steps'"),
        ("trainer.epochs", "'trainer.max_num_data_epochs'"),
        ("trainer.gradient_accumulation_steps", "'trainer.grad_accumulation'"),
        ("lr_scheduler.warmup_steps", "'lr_scheduler.num_warmup_steps'"),
        ("lr", "'optimizer.lr'"),  # a key in the wrong section
        ("max_num_steps", "'trainer.max_num_steps'"),
        ("toy.batch", "'validation.batch_size'"),
    ],
)
def test_an_unknown_key_suggests_its_synonym_or_the_same_name_elsewhere(key: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_overrides(f"{key}=1")

    message = str(info.value)
    assert message.startswith(f"Unknown config key '{key}' ") and "(from layer 0)." in message
    assert message.endswith(f" Did you mean {suggestion}?")


def test_an_option_of_another_component_names_the_components_that_take_it() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_overrides("optimizer.momentum=0.9")

    assert str(info.value) == (
        "Unknown config key 'optimizer.momentum' for optimizer 'adamw' (from layer 0). It is an option of sgd."
    )


def test_choosing_another_component_keeps_the_options_it_shares_and_drops_the_others() -> None:
    config = resolve({"optimizer": {"name": "adam", "lr": 0.01, "betas": [0.5, 0.6]}}, {"optimizer": "sgd"})

    assert to_dict(config.optimizer) == {"name": "sgd", "lr": 0.01, "weight_decay": 0.0, "momentum": 0.0}


# Declared ranges -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("toy.fraction=0", "`toy.fraction` must be a finite number in (0, 1], but is 0 instead (from layer 0)."),
        ("toy.fraction=1.5", "`toy.fraction` must be a finite number in (0, 1], but is 1.5 instead"),
        ("toy.sizes=[3, 0]", "`toy.sizes[1]` must be an integer >= 1, but is 0 instead"),
        ("toy.limit=10", "`toy.limit` must be an integer in [-3, 10) or null, but is 10 instead"),
        ("toy.limit=-4", "`toy.limit` must be an integer in [-3, 10) or null, but is -4 instead"),
        ("toy.ceiling=6", "`toy.ceiling` must be a number <= 5, but is 6 instead"),
        ("toy.ceiling=nan", "`toy.ceiling` must be a number <= 5, but is nan instead"),
        ("toy.scale=nan", "`toy.scale` must be a finite number, but is nan instead"),  # no range declared
        ("toy.scale=-inf", "`toy.scale` must be a finite number, but is -inf instead"),
    ],
)
def test_a_value_outside_its_declared_range_names_the_key_and_the_range(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_overrides(override)

    assert message in str(info.value)


@pytest.mark.parametrize(
    "override", ["toy.fraction=1", "toy.limit=null", "toy.limit=-3", "toy.ceiling=-inf", "toy.sizes=[]"]
)
def test_a_value_on_the_edge_of_its_range_or_null_is_valid(override: str) -> None:
    resolve_overrides(override)


def test_inf_and_nan_typed_plainly_are_numbers_only_where_a_float_goes() -> None:
    config = resolve_overrides("toy.ceiling=-INF", "toy.note=nan", "toy.tags=[inf]")

    assert config.toy.ceiling == -math.inf
    assert (config.toy.note, config.toy.tags) == ("nan", ["inf"])


def test_a_default_outside_its_range_is_an_error_naming_the_class() -> None:
    @dataclass
    class BadDefaults(RecipeConfig):
        width: PositiveInt = 0

    with pytest.raises(ConfigError, match=r"`width` must be an integer >= 1, but is 0 instead \(from the defaults of"):
        resolve_config(BadDefaults, [])


def test_a_range_takes_one_bound_per_side() -> None:
    with pytest.raises(TypeError, match="at most one lower bound"):
        Range(ge=0, gt=0)


def test_numeric_fields_lists_nested_list_and_optional_fields_with_their_ranges() -> None:
    fields = {f.key: f for f in numeric_fields(ToyConfig)}

    assert fields["toy.fraction"] == NumericField("toy.fraction", float, Range(gt=0, le=1), False, False)
    assert fields["toy.sizes"] == NumericField("toy.sizes", int, Range(ge=1), True, False)
    assert fields["toy.limit"] == NumericField("toy.limit", int, Range(ge=-3, lt=10), False, True)
    assert fields["toy.width"].range is None
    assert fields["trainer.early_stopping.patience"].range == Range(ge=1)
    assert "toy.tags" not in fields and "metrics.recorders.jsonl" not in fields


# Every numeric field of every built-in recipe: a declared range, enforced with one line -------------

RECIPE_NAMES = sorted(ep.name for ep in importlib.metadata.entry_points(group=RECIPE_ENTRY_POINTS))
RECIPE_FIELDS = [(name, f) for name in RECIPE_NAMES for f in numeric_fields(get_recipe(name).config_class)]


def outside(declared: Range, kind: type) -> list[float]:
    """Values just outside each bound of ``declared``, and what no finite float range holds."""
    integer = kind is int
    values: list[float] = []
    if declared.ge is not None:
        values.append(math.ceil(declared.ge) - 1 if integer else math.nextafter(declared.ge, -math.inf))
    if declared.gt is not None:
        values.append(math.floor(declared.gt) if integer else declared.gt)
    if declared.le is not None:
        values.append(math.floor(declared.le) + 1 if integer else math.nextafter(declared.le, math.inf))
    if declared.lt is not None:
        values.append(math.ceil(declared.lt) if integer else declared.lt)
    if not integer:
        values += [math.nan, math.inf, -math.inf] if declared.finite else [math.nan]
    return values


def test_the_walk_covers_every_built_in_recipe_and_nested_and_list_fields() -> None:
    keys = {(name, f.key) for name, f in RECIPE_FIELDS}

    assert {"ctr", "dlrm", "tabular"} <= set(RECIPE_NAMES)
    assert ("ctr", "model.hidden_dims") in keys
    assert ("tabular", "model.embeddings.sparse_optimizer.lr") in keys
    assert ("ctr", "model.embeddings.sparse_optimizer.beta1") in keys  # an option of adam and adamw only
    assert ("dlrm", "trainer.early_stopping.min_delta") in keys


def default_of(recipe: str, chosen: list[str], key: str) -> Any:
    """The default value of the dotted ``key`` of ``recipe``'s config, with the components ``chosen``."""
    value = to_dict(resolve_config(get_recipe(recipe).config_class, [("the choices", overrides_to_dict(chosen))]))
    for part in key.split("."):
        value = value[part]
    return value or []


@pytest.mark.parametrize(
    ("recipe", "numeric"),
    RECIPE_FIELDS,
    ids=[f"{n}:{f.key}" + "".join(f"[{name}]" for _, name in f.choices) for n, f in RECIPE_FIELDS],
)
def test_every_numeric_field_declares_a_range_and_rejects_what_lies_outside_it(
    recipe: str, numeric: NumericField, isolated_presets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert numeric.range is not None, (
        f"{recipe}: `{numeric.key}` must declare its range (recipes.config.resolution.Range)"
    )
    preset = write(isolated_presets / f"{recipe}.yaml", f"recipe: {recipe}\n")
    chosen = [f"{key}={name}" for key, name in numeric.choices]  # The component the field belongs to.
    # A list's other elements keep their defaults. (Only then is the config resolved with just the choices: a
    # component may need an option set first, as `libffm` its `num_fields`.)
    others = default_of(recipe, chosen, numeric.key)[1:] if numeric.element else []

    for value in outside(numeric.range, numeric.kind):  # None for an int declared unbounded, `Range()`.
        text = repr(value)
        if numeric.element:
            text = "[" + ", ".join([text, *map(repr, others)]) + "]"
        code = main(["show", preset, *chosen, f"{numeric.key}={text}"])
        lines = capsys.readouterr().err.strip().splitlines()

        assert code == 2, (numeric.key, text)
        assert len(lines) == 1 and lines[0].startswith(f"error: `{numeric.key}"), lines
        assert lines[0].endswith(f"but is {value!r} instead (from the command line)."), lines[0]


@pytest.mark.parametrize(
    "overrides",
    [["optimizer=sgd", "optimizer.momentum=0.9"], ["optimizer.momentum=0.9", "optimizer=sgd"]],
)
def test_a_component_named_alone_takes_options_from_other_overrides(overrides: list[str]) -> None:
    config = resolve_overrides(*overrides)

    assert (config.optimizer.name, config.optimizer.momentum) == ("sgd", 0.9)  # type: ignore[attr-defined]
