"""The CTR model zoo: every model by name builds, scores and learns what its form can represent, on either backend,
and its config refuses values out of range."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pytest
import torch
from torch import nn

from embedding import JaggedIds, ShardedEmbeddingCollection, SparseFeatures
from gang import FakeGang
from recipes.cli.main import main
from recipes.config.resolution import ConfigError, resolve_config
from recipes.config.sections import RecipeConfig
from recipes.training.sparse_tables import find_sparse_tables
from recsys.click.batch import CTRBatch
from recsys.models.embeddings import TableSpec
from recsys.zoo import ZOO_MODELS, ZooEmbeddingSection, ZooModelConfig, build_zoo_model
from recsys.zoo.deep import CrossLayer
from recsys.zoo.linear import FM, fm_interaction
from recsys.zoo.zoo_model import cardinality_dim, sized_tables
from support.zoo_data import (
    FEATURES,
    NUM_DENSE,
    NUM_IDS,
    NUM_TAGS,
    TABLES,
    ZOO_MODEL_NAMES,
    Backend,
    XorData,
    optimizer,
    small_section,
    train_and_score,
)


def build(name: str, backend: Backend = "sparse", num_dense: int = NUM_DENSE, **kwargs: Any) -> nn.Module:
    return build_zoo_model(small_section(name, backend, **kwargs), TABLES, FEATURES, num_dense, FakeGang(), seed=3)


def table_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"{path}/{name}": shard.weight.clone()
        for path, collection in find_sparse_tables(model).items()
        for name, shard in collection.shards.items()
    }


# The section ---------------------------------------------------------------------------------


@dataclass
class ZooHolder(RecipeConfig):
    model: Annotated[ZooModelConfig, ZOO_MODELS] = field(default_factory=ZOO_MODELS.default("dcn_v2"))


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"dropout": 1.0}, "`model.dropout`"),
        ({"dropout": -0.1}, "`model.dropout`"),
        ({"cross_layers": 0}, "`model.cross_layers`"),
        ({"cross_rank": 0}, "`model.cross_rank`"),
        ({"hidden_dims": [16, 0]}, "`model.hidden_dims[1]`"),
        ({"name": "dlrm", "bottom_dims": [-1]}, "`model.bottom_dims[0]`"),
        ({"name": "fm", "cross_rank": 4}, "Unknown config key 'model.cross_rank'"),
        ({"name": "fm", "hidden_dims": [8]}, "Unknown config key 'model.hidden_dims'"),
        ({"embeddings": {"dim": 0}}, "`model.embeddings.dim`"),
        ({"embeddings": {"table_dims": {"a": 0}}}, "`model.embeddings.table_dims.a`"),
        ({"name": "xgboost"}, "`model.name` must be one of"),
    ],
)
def test_the_section_refuses_values_out_of_range(changes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        resolve_config(ZooHolder, [("the test", {"model": changes})])


@pytest.mark.parametrize("name", ZOO_MODEL_NAMES)
def test_the_default_section_builds_every_model(name: str) -> None:
    section = ZOO_MODELS.get(name).default_config()
    model = build_zoo_model(section, TABLES, FEATURES, NUM_DENSE, FakeGang(), seed=0)

    assert model(XorData.make(5, seed=0).batch(torch.arange(5))).shape == (5,)
    has_dropout = any(isinstance(module, nn.Dropout) and module.p == 0.2 for module in model.modules())
    assert has_dropout == (name not in ("logistic_regression", "fm"))  # Every deep MLP has it.


@pytest.mark.parametrize(
    ("features", "message"),
    [
        (["a", "b"], "`features` must be the features the tables look up"),
        (["a", "b", "tags", "c"], "`features` must be the features the tables look up"),
        (["a", "a", "b", "tags"], "`features` must name each feature once"),
        ([], "`features` must name at least one feature"),
    ],
)
def test_build_refuses_features_that_do_not_match_the_tables(features: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_zoo_model(small_section("mlp"), TABLES, features, NUM_DENSE, FakeGang(), seed=0)


def test_the_same_seed_builds_the_same_model_whatever_ran_before() -> None:
    first = build("dcn_v2").state_dict()
    torch.rand(100)  # Advances the global generator.
    second = build("dcn_v2").state_dict()

    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)


# Scoring and gradients -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ZOO_MODEL_NAMES)
def test_every_model_takes_a_table_that_several_features_share(name: str) -> None:
    tables = [TableSpec("ids", NUM_IDS, ("a", "b")), TableSpec("tags", NUM_TAGS, ("tags",), pooling="mean")]
    model = build_zoo_model(small_section(name), tables, FEATURES, NUM_DENSE, FakeGang(), seed=0)

    assert model(XorData.make(5, seed=0).batch(torch.arange(5))).shape == (5,)
    names = {table for collection in find_sparse_tables(model).values() for table in collection.shards}
    assert "first_order_ids" in names or name not in ("logistic_regression", "fm", "deepfm", "wide_deep")


@pytest.mark.parametrize("backend", ["sparse", "dense"])
@pytest.mark.parametrize("name", ZOO_MODEL_NAMES)
def test_every_model_scores_each_sample_and_trains_every_parameter_and_table(name: str, backend: Backend) -> None:
    model = build(name, backend)
    batch = XorData.make(16, seed=0).batch(torch.arange(16))
    step = optimizer(model)
    before = table_weights(model)

    logits = model(batch)
    assert logits.shape == (16,) and logits.dtype == torch.float32
    nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None and bool(param.grad.ne(0).any()), f"{name}: no gradient for {param_name}"
    step.step()

    after = table_weights(model)
    if backend == "dense":
        assert not before
    else:
        tables = {key.split("/")[1] for key in before}
        first_order = {"first_order_a", "first_order_b", "first_order_tags"}
        vectors = {"a", "b", "tags"}
        assert tables == {"logistic_regression": first_order, "fm": first_order | vectors}.get(
            name, first_order | vectors if name in ("deepfm", "wide_deep") else vectors
        )
    for key in before:
        assert not torch.equal(before[key], after[key]), f"{name}: table {key} was not stepped"


@pytest.mark.parametrize("num_dense", [NUM_DENSE, 0])
@pytest.mark.parametrize("backend", ["sparse", "dense"])
@pytest.mark.parametrize("name", ZOO_MODEL_NAMES)
def test_every_model_scores_a_batch_of_zero_rows(name: str, backend: Backend, num_dense: int) -> None:
    """A data-parallel rank gets an empty last batch in validation; a data set may have no dense column."""
    model = build(name, backend, num_dense)
    empty = CTRBatch(
        torch.zeros(0, num_dense),
        SparseFeatures({feature: JaggedIds.from_dense(torch.zeros(0, 1, dtype=torch.int64)) for feature in FEATURES}),
        torch.zeros(0),
    )
    for train in (True, False):
        model.train(train)
        logits = model(empty)
        assert logits.shape == (0,) and logits.dtype == torch.float32
    logits.sum().backward()


# The interactions, against their formulas -----------------------------------------------------


def test_fm_interaction_equals_the_explicit_pairwise_sum() -> None:
    vectors = torch.randn(5, 7, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    explicit = sum((vectors[:, i] * vectors[:, j]).sum(dim=1) for i, j in itertools.combinations(range(7), 2))

    torch.testing.assert_close(fm_interaction(vectors), explicit)


@pytest.mark.parametrize("backend", ["sparse", "dense"])
def test_fm_is_bias_plus_linear_terms_plus_every_pair_of_fields_dense_ones_included(backend: Backend) -> None:
    model = build("fm", backend)
    assert isinstance(model, FM)
    batch = XorData.make(8, seed=1).batch(torch.arange(8))
    with torch.no_grad():
        model.dense.bias.fill_(0.3)
        model.dense.weight.copy_(torch.tensor([0.5, -0.2]))
        first = model.first_order(batch.sparse)
        fields = model.embeddings(batch.sparse)
        vectors = [batch.dense[:, j, None] * model.dense_vectors[j] for j in range(NUM_DENSE)]
        vectors += [fields[name] for name in FEATURES]
        pairs = sum((u * v).sum(dim=1) for u, v in itertools.combinations(vectors, 2))
        linear = 0.3 + batch.dense @ torch.tensor([0.5, -0.2]) + sum(first[name].squeeze(1) for name in FEATURES)

        torch.testing.assert_close(model(batch), linear + pairs)


@pytest.mark.parametrize("rank", [None, 3])
def test_cross_layer_equals_x0_times_wx_plus_b_plus_x(rank: int | None) -> None:
    torch.manual_seed(0)
    layer = CrossLayer(6, rank)
    nn.init.normal_(layer.up.bias)  # Starts at zero; any b must hold.
    x0, x = torch.randn(4, 6), torch.randn(4, 6)
    weight = layer.up.weight if layer.down is None else layer.up.weight @ layer.down.weight

    expected = x0 * (x @ weight.T + layer.up.bias) + x

    torch.testing.assert_close(layer(x0, x), expected)
    if rank is not None:
        assert weight.shape == (6, 6) and torch.linalg.matrix_rank(weight) == rank


# Learning ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ZOO_MODEL_NAMES)
def test_every_model_learns_what_its_form_can_represent(name: str) -> None:
    """An interaction of two categorical features: the models that model interactions learn it in 100
    steps (they reach an AUC near 1); logistic regression, a weight per id, cannot (it stays near 0.5)."""
    train, test = XorData.make(4096, seed=10), XorData.make(1024, seed=11)
    section = small_section(name, dim=8, hidden_dims=[32, 16], bottom_dims=[64])
    model = build_zoo_model(section, TABLES, FEATURES, NUM_DENSE, FakeGang(), seed=0)

    auc = train_and_score(model, train, test, steps=100)

    if name == "logistic_regression":
        assert auc < 0.6
    else:
        assert auc > 0.7, f"{name} reached a test AUC of only {auc:.3f}"


# Through the framework: a user error stops a run before it trains ------------------------------


def test_an_out_of_range_value_stops_the_run_with_one_line(
    zoo_recipe: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "zoo_test", "-o", "out", "model.dropout=1.5"])

    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "`model.dropout` must be a finite number in [0, 1), but is 1.5 instead" in err


def test_a_sparse_model_still_has_its_tables_as_modules_of_the_model() -> None:
    """What the framework relies on to find, step and checkpoint them."""
    assert all(isinstance(c, ShardedEmbeddingCollection) for c in find_sparse_tables(build("deepfm")).values())
    assert set(find_sparse_tables(build("deepfm"))) == {"first_order", "embeddings"}
    assert set(find_sparse_tables(build("dcn_v2"))) == {"embeddings"}


# Tables sized apart ---------------------------------------------------------------------------

MIXED_DIM_MODELS = ["dcn_v2", "mlp", "wide_deep"]


@pytest.mark.parametrize(("cardinality", "dim"), [(1, 6), (2, 7), (16, 12), (100, 16), (10**6, 16)])
def test_a_table_of_c_ids_gets_six_times_the_fourth_root_of_c_dims_at_most_the_sections(
    cardinality: int, dim: int
) -> None:
    assert cardinality_dim(cardinality, 16) == dim


def test_a_table_dim_wins_over_the_cardinality_and_the_cardinality_over_the_sections_dim() -> None:
    section = ZooEmbeddingSection(dim=16, dim_by_cardinality=True, table_dims={"tags": 3})

    sized = sized_tables(section, TABLES, {"a": 2, "b": 10**6, "tags": 16})

    assert [(t.name, t.dim) for t in sized] == [("a", 7), ("b", 16), ("tags", 3)]
    assert [(t.name, t.dim) for t in sized_tables(ZooEmbeddingSection(dim=5), TABLES, None)] == [
        ("a", 5),
        ("b", 5),
        ("tags", 5),
    ]


def test_a_table_dim_of_no_table_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=re.escape("must name the model's tables (a, b, tags), but names c instead")):
        sized_tables(ZooEmbeddingSection(table_dims={"c": 4}), TABLES, None)


@pytest.mark.parametrize("backend", ["sparse", "dense"])
@pytest.mark.parametrize("name", MIXED_DIM_MODELS)
def test_a_model_that_concatenates_vectors_takes_tables_of_different_dims(name: str, backend: Backend) -> None:
    section = small_section(name, backend)
    section.embeddings = ZooEmbeddingSection(dim=4, backend=backend, table_dims={"a": 2, "tags": 7})
    model = build_zoo_model(section, TABLES, FEATURES, NUM_DENSE, FakeGang(), seed=0)
    batch = XorData.make(16, seed=0).batch(torch.arange(16))

    vectors = model.deep.embeddings if name == "wide_deep" else model.embeddings
    assert {feature: tuple(pooled.shape) for feature, pooled in vectors(batch.sparse).items()} == {
        "a": (16, 2),
        "b": (16, 4),
        "tags": (16, 7),
    }
    nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels).backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None and bool(param.grad.ne(0).any()), f"{name}: no gradient for {param_name}"


@pytest.mark.parametrize("key", [{"dim_by_cardinality": True}, {"table_dims": {"a": 8}}])
@pytest.mark.parametrize("name", ["deepfm", "dlrm", "fm", "logistic_regression"])
def test_a_model_of_one_dim_refuses_tables_sized_apart(name: str, key: dict[str, Any]) -> None:
    option = next(iter(key))
    with pytest.raises(ConfigError, match=re.escape(f"`model.embeddings.{option}` must be used with a model whose")):
        resolve_config(ZooHolder, [("the test", {"model": {"name": name, "embeddings": key}})])
