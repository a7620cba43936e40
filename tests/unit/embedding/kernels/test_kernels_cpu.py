"""The numba CPU kernel against the torch reference."""

import pytest
import torch

from embedding.kernels import SortedIds, fused_step
from embedding.kernels.cpu import count_distinct, sum_by_id
from embedding.optimizers import SPARSE_OPTIMIZERS, SparseOptimizerError, sparse_optimizer_config
from embedding.optimizers.sgd import SGDConfig

NUM_ROWS = 200


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS.names())
@pytest.mark.parametrize("dim", [1, 3, 16, 64])
@pytest.mark.parametrize("duplicates", [True, False])
@pytest.mark.parametrize("with_scale", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_matches_reference_over_steps(
    name, dim, duplicates, with_scale, weight_decay, make_step_inputs, reference_check
):
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=weight_decay)
    steps = [make_step_inputs(seed, NUM_ROWS, dim, 80, duplicates, with_scale) for seed in range(3)]

    reference_check(config, NUM_ROWS, dim, steps, "cpu")


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS.names())
@pytest.mark.parametrize("num_ids", [0, 1])
def test_matches_reference_on_empty_and_single_id_batches(name, num_ids, make_step_inputs, reference_check):
    config = sparse_optimizer_config(name, weight_decay=0.01)
    steps = [make_step_inputs(seed, NUM_ROWS, 8, num_ids, False, True) for seed in range(2)]

    reference_check(config, NUM_ROWS, 8, steps, "cpu")


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS.names())
def test_lr_argument_overrides_config(name, make_step_inputs, make_table):
    inputs = make_step_inputs(0, NUM_ROWS, 4, 50, True, False)
    overridden = make_table(sparse_optimizer_config(name), NUM_ROWS, 4)
    configured = overridden.clone()
    args = (inputs.ids, inputs.grad_rows, inputs.grad_index, None, 1)

    fused_step(sparse_optimizer_config(name, lr=0.01), overridden.weight, overridden.state, *args, lr=0.3)
    fused_step(sparse_optimizer_config(name, lr=0.3), configured.weight, configured.state, *args, backend="reference")

    torch.testing.assert_close(overridden.weight, configured.weight, rtol=1e-5, atol=1e-6)


def zipf_steps(make_step_inputs):
    """Many ids crowding onto a few hot rows: the case where summation order shows."""
    steps = []
    for seed in range(2):
        inputs = make_step_inputs(seed, 2000, 16, 20_000, True, True)
        inputs.ids = (inputs.ids.double().pow(2) / 1000).long()  # skew towards small ids
        steps.append(inputs)
    return steps


@pytest.mark.parametrize("name", ["rowwise_adagrad", "adam"])
def test_is_bitwise_deterministic_across_runs_and_thread_counts(name, make_step_inputs, make_table, determinism_check):
    config = sparse_optimizer_config(name, weight_decay=0.01)

    determinism_check(config, make_table(config, 2000, 16), zipf_steps(make_step_inputs))


def test_updates_a_parameter_that_requires_grad():
    config = SGDConfig(lr=1.0)
    weight = torch.nn.Parameter(torch.zeros(4, 2))

    fused_step(config, weight, {}, torch.tensor([1, 1]), torch.ones(1, 2), torch.tensor([0, 0]), None, 1)

    assert torch.equal(weight.detach(), torch.tensor([[0.0, 0.0], [-2.0, -2.0], [0.0, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS.names())
def test_gradient_rows_in_pieces_are_read_in_place_as_their_concatenation(name, make_table):
    """Pieces as autograd hands them: contiguous, rows strided inside a wider tensor, one row
    expanded (row stride 0), and empty; the reference gets their concatenation."""
    generator = torch.Generator().manual_seed(3)
    dim = 8
    pieces = (
        torch.randn(5, dim, generator=generator),
        torch.randn(4, 3, dim, generator=generator)[:, 1],
        torch.randn(1, dim, generator=generator).expand(3, dim),
        torch.empty(0, dim),
    )
    num_rows = sum(piece.size(0) for piece in pieces)
    ids = torch.randint(0, NUM_ROWS, (40,), generator=generator)
    grad_index = torch.randint(0, num_rows, (40,), generator=generator)
    grad_scale = torch.rand(40, generator=generator)
    config = sparse_optimizer_config(name, weight_decay=0.01)
    in_pieces = make_table(config, NUM_ROWS, dim)
    concatenated = in_pieces.clone()

    fused_step(config, in_pieces.weight, in_pieces.state, ids, pieces, grad_index, grad_scale, 1, backend="cpu")
    fused_step(
        config,
        concatenated.weight,
        concatenated.state,
        ids,
        torch.cat(pieces),
        grad_index,
        grad_scale,
        1,
        backend="reference",
    )

    torch.testing.assert_close(in_pieces.weight, concatenated.weight, rtol=1e-5, atol=1e-6)
    for key in in_pieces.state:
        torch.testing.assert_close(in_pieces.state[key], concatenated.state[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS.names())
@pytest.mark.parametrize("dim", [1, 16])
@pytest.mark.parametrize("duplicates", [True, False])
def test_matches_reference_with_weight_decay_by_frequency(name, dim, duplicates, make_step_inputs, reference_check):
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=0.05, weight_decay_by_frequency=True)
    steps = [make_step_inputs(seed, NUM_ROWS, dim, 80, duplicates, True) for seed in range(3)]

    reference_check(config, NUM_ROWS, dim, steps, "cpu")


@pytest.mark.parametrize("name", ["rowwise_adagrad", "adam"])
@pytest.mark.parametrize("key_dtype", [torch.int32, torch.int64])
def test_a_sort_made_ahead_gives_the_bits_of_the_kernels_own_sort(name, key_dtype, make_step_inputs, make_table):
    config = sparse_optimizer_config(name, weight_decay=0.01)
    own_sort = make_table(config, 2000, 16)
    sorted_ahead = own_sort.clone()

    for step, inputs in enumerate(zipf_steps(make_step_inputs), start=1):
        args = (inputs.ids, inputs.grad_rows, inputs.grad_index, inputs.grad_scale, step)
        fused_step(config, own_sort.weight, own_sort.state, *args)
        keys, order = torch.sort(inputs.ids.to(key_dtype), stable=True)
        fused_step(config, sorted_ahead.weight, sorted_ahead.state, *args, sorted_ids=SortedIds(keys, order))

    assert torch.equal(sorted_ahead.weight, own_sort.weight)
    for key in own_sort.state:
        assert torch.equal(sorted_ahead.state[key], own_sort.state[key])


def wrong_sorts(ids):
    """Sorts that do not sort ``ids``: keys that are not the ids they point at, keys that decrease, an order out
    of range (which the kernel must not follow), an order that names one occurrence twice and another never
    (every key still the id it points at)."""
    keys, order = torch.sort(ids, stable=True)
    other_keys = keys.clone()
    other_keys[-1] = keys[-1] - 1 if keys[-1] > keys[0] else keys[-1] + 1
    out_of_range = order.clone()
    out_of_range[0] = ids.numel()
    repeated = order.clone()
    first_repeat = int(torch.nonzero(keys[1:] == keys[:-1])[0])  # two occurrences of one id, side by side
    repeated[first_repeat + 1] = repeated[first_repeat]
    return {
        "keys not the ids": SortedIds(other_keys, order),
        "keys decreasing": SortedIds(keys.flip(0), order.flip(0)),
        "order out of range": SortedIds(keys, out_of_range),
        "an occurrence twice": SortedIds(keys, repeated),
    }


@pytest.mark.parametrize("case", ["keys not the ids", "keys decreasing", "order out of range", "an occurrence twice"])
def test_a_sort_that_does_not_sort_the_ids_is_refused_before_any_write(case, make_step_inputs, make_table):
    config = sparse_optimizer_config("rowwise_adagrad")
    inputs = make_step_inputs(0, NUM_ROWS, 4, 50, True, True)
    table = make_table(config, NUM_ROWS, 4)
    before = table.clone()

    args = (inputs.ids, inputs.grad_rows, inputs.grad_index, inputs.grad_scale, 1)

    with pytest.raises(SparseOptimizerError, match=r"`sorted_ids` must sort `ids`.* nothing was updated"):
        fused_step(config, table.weight, table.state, *args, sorted_ids=wrong_sorts(inputs.ids)[case])

    assert torch.equal(table.weight, before.weight)
    assert all(torch.equal(table.state[key], before.state[key]) for key in table.state)


@pytest.mark.parametrize("with_scale", [True, False])
def test_the_sums_by_id_are_each_distinct_ids_gradient_in_sorted_order(with_scale, make_step_inputs):
    inputs = make_step_inputs(4, NUM_ROWS, 5, 300, True, with_scale)
    pieces = (inputs.grad_rows[:7], inputs.grad_rows[7:])  # read in place, as autograd's pieces
    distinct = torch.unique(inputs.ids)
    ids, sums = torch.empty_like(distinct), torch.empty(distinct.numel(), 5)

    sum_by_id(SortedIds.of(inputs.ids, NUM_ROWS), pieces, inputs.grad_index, inputs.grad_scale, ids, sums)

    assert torch.equal(ids, distinct)
    occurrences = inputs.grad_rows[inputs.grad_index]
    if inputs.grad_scale is not None:
        occurrences = occurrences * inputs.grad_scale.unsqueeze(1)
    expected = torch.zeros_like(sums).index_add_(0, torch.searchsorted(distinct, inputs.ids), occurrences)
    torch.testing.assert_close(sums, expected, rtol=1e-5, atol=1e-6)
    assert count_distinct(SortedIds.of(inputs.ids, NUM_ROWS)) == distinct.numel()
    assert count_distinct(SortedIds.of(inputs.ids[:0], NUM_ROWS)) == 0


def test_the_sums_by_id_refuse_indices_out_of_bounds_and_too_few_ids(make_step_inputs):
    inputs = make_step_inputs(5, NUM_ROWS, 4, 60, True, False)
    sort = SortedIds.of(inputs.ids, NUM_ROWS)
    distinct = count_distinct(sort)
    bad_index = inputs.grad_index.clone()
    bad_index[3] = inputs.grad_rows.size(0)
    cases = [
        (sort, bad_index, distinct),
        (SortedIds(sort.keys, sort.order + 1), inputs.grad_index, distinct),
        (sort, inputs.grad_index, distinct - 1),
    ]
    for sorted_ids, grad_index, num_ids in cases:
        ids, sums = torch.empty(num_ids, dtype=torch.int64), torch.empty(num_ids, 4)
        with pytest.raises(SparseOptimizerError, match="must point into `grad_index` and `grad_rows`"):
            sum_by_id(sorted_ids, (inputs.grad_rows,), grad_index, None, ids, sums)
    with pytest.raises(SparseOptimizerError, match=r"`sums` must have a row per distinct id"):
        sum_by_id(
            sort,
            (inputs.grad_rows,),
            inputs.grad_index,
            None,
            torch.empty(distinct, dtype=torch.int64),
            torch.empty(distinct, 5),
        )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"ids": [3, NUM_ROWS, 3]}, rf"`ids` must be in \[0, {NUM_ROWS}\) .* but contains {NUM_ROWS}"),
        ({"ids": [3, -1, 3]}, rf"`ids` must be in \[0, {NUM_ROWS}\) .* but contains -1"),
        ({"ids": [3, 2**40, 3]}, rf"`ids` must be in \[0, {NUM_ROWS}\) .* but contains {2**40}"),
        ({"grad_index": [0, 3, 1]}, r"`grad_index` must be in \[0, 3\) .* but contains 3"),
    ],
)
def test_ids_out_of_range_raise_before_any_write(bad, message, make_table):
    """An id past 2**31, which an int32 sort key would wrap onto a row, is an id out of range too."""
    config = sparse_optimizer_config("adam", lr=0.05)
    table = make_table(config, NUM_ROWS, 4)
    before = table.clone()
    inputs = {"ids": [3, 7, 3], "grad_index": [0, 1, 2]} | bad

    with pytest.raises(SparseOptimizerError, match=message):
        fused_step(
            config, table.weight, table.state, torch.tensor(inputs["ids"]), torch.ones(3, 4),
            torch.tensor(inputs["grad_index"]), None, 1,
        )  # fmt: skip

    assert torch.equal(table.weight, before.weight)
    assert all(torch.equal(table.state[key], before.state[key]) for key in table.state)
