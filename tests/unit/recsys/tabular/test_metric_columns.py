"""The schema's columns that may group or slice the metrics, refused in one line when the config names another,
and the time-part slices named by their values."""

from __future__ import annotations

import numpy as np
import pytest

from recipes import ConfigError, RecipeConfig
from recsys.click.batch import make_ctr_batch
from recsys.click.metric_columns import metric_columns, row_ids
from recsys.tabular.hashing import bucket_ids, integer_keys
from recsys.tabular.schema import CategoricalColumns, DerivedColumn, SplitByValue, TabularDataSection
from recsys.tabular.schema_metric_columns import single_valued_columns, value_names
from recsys.tabular.vocabulary import Encodings, Vocabulary


def schema(hour_buckets: int = 1000) -> TabularDataSection:
    return TabularDataSection(
        categorical=[
            CategoricalColumns(["user"], num_buckets=100),
            CategoricalColumns(["hour"], num_buckets=hour_buckets),
            CategoricalColumns(["tags"], multi_hot=True),
        ],
        derived=[DerivedColumn("hour", "time", "hour")],
        split=SplitByValue("time", valid_from=10.0),
    )


def config(**metrics: str) -> RecipeConfig:
    recipe_config = RecipeConfig()
    for key, value in metrics.items():
        setattr(recipe_config.metrics, key, value)
    return recipe_config


def test_single_valued_columns_may_group_and_slice_and_a_vocabulary_knows_its_size() -> None:
    keys = integer_keys(np.array([1.0, 2.0, 3.0]), "user")
    vocabulary = Vocabulary.from_counts(keys, np.array([5, 4, 3]), min_count=1, num_buckets=100)
    columns = single_valued_columns(schema(), Encodings({"user": vocabulary}, {}))

    assert columns == {"user": 5, "hour": None}, "a multi-hot bag has no one value per row"


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        (
            {"group_by": "nope"},
            r"^`metrics.group_by` must name a single-valued categorical column of the batches "
            r"\(user, hour\), but is 'nope' instead.$",
        ),
        ({"slice_by": "tags"}, r"`metrics.slice_by` .* but is 'tags' instead.$"),
        ({"slice_by": "usr"}, r"but is 'usr' instead. Did you mean 'user'\?$"),
    ],
)
def test_a_column_the_batches_lack_is_refused_in_one_line(metrics: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        metric_columns(config(**metrics), single_valued_columns(schema(), None))


def test_a_slice_column_known_to_have_too_many_values_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match=r"at most 1000 values, but 'user' has 1002"):
        metric_columns(config(slice_by="user"), {"user": 1002})
    assert metric_columns(config(slice_by="user", group_by="user"), {"user": 1000}).slice_by == "user"


def test_hour_slices_are_named_by_their_values_whatever_their_ids() -> None:
    hours = [float(h) for h in range(24)]
    for buckets, full_keys in ((1000, False), (5, False), (1000, True)):
        names = value_names(schema(buckets), "hour", None, full_keys)
        ids = bucket_ids(integer_keys(np.array(hours), "hour"), 0 if full_keys else buckets).tolist()
        for hour, id_ in enumerate(ids):
            assert str(hour) in names[id_].split("_"), "hours that share an id name it together"
        assert len(names) == len(set(ids))
    assert value_names(schema(), "user", None, False) == {}, "a hashed user id has no name to give"


def test_a_column_a_validation_batch_lacks_is_one_line_naming_those_it_holds() -> None:
    batch = make_ctr_batch(
        np.zeros((2, 1), np.float32),
        {"users": (np.array([3, 4]), np.array([0, 1, 2])), "hour": (np.array([1, 2]), np.array([0, 1, 2]))},
        np.zeros(2, np.float32),
    )

    with pytest.raises(ConfigError) as info:  # Before: a raw KeyError at the first validation.
        row_ids(batch, "user")

    assert str(info.value) == (
        "`metrics.group_by` and `metrics.slice_by` must name a sparse feature of the validation batches (users, hour), "
        "but 'user' is not one. Did you mean 'users'?"
    )
