"""Tables of float16 and bfloat16 rows on the GPU path against the CPU path: the same ids, gradients, steps and seed
end with the same bits, as the rounding's keys (seed and table, step, global row or a hash table's id, element) depend
on no device. On the GPU path a hash table's index keeps its ids on the device, and the CUDA kernels read them there.

Under numba's CUDA simulator on CPU tensors (tiny sizes): the GPU path is then the CUDA kernels and the device's hash
index (:class:`CudaHashIndex`, put in place of the CPU one, as a collection picks it by its tensors' device), on the
CPU's tensors. On a GPU (``NUMBA_ENABLE_CUDASIM=0``) the collection is built on the device itself."""

from collections.abc import Callable

import numba
import numpy as np
import pytest
import torch

from embedding import EmbeddingTableConfig, ShardedEmbeddingCollection, SparseFeatures, SparseOptimizer
from embedding import dynamic_rows as dynamic_rows_module
from embedding.cuda_hash_index import CudaHashIndex
from embedding.kernels import DeviceRowKeys, RowKeys, fused_step
from embedding.optimizers import (
    SPARSE_OPTIMIZERS,
    SparseOptimizerConfig,
    SparseOptimizerError,
    sparse_optimizer_config,
)
from embedding.planner import plan_sharding
from embedding.sharding import ShardGroup, build_groups
from gang import FakeGang
from support.jagged_ids import jagged

# The simulator runs the compiled hashes as numpy scalars, whose wrapping multiplications numpy warns of.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

SIMULATED = numba.config.ENABLE_CUDASIM
DEVICE = torch.device("cpu" if SIMULATED else "cuda")
HALF_DTYPES = ["float16", "bfloat16"]
DIM = 4

Path = tuple[ShardedEmbeddingCollection, SparseOptimizer]


def tables(dtype: str) -> list[EmbeddingTableConfig]:
    """Two fixed tables that share a buffer (its rows keyed by table and global row) and a hash table (by id)."""
    return [
        EmbeddingTableConfig("t", num_rows=10, dim=DIM, features=("a",), dtype=dtype),  # type: ignore[arg-type]
        EmbeddingTableConfig("u", num_rows=7, dim=DIM, features=("b",), dtype=dtype),  # type: ignore[arg-type]
        EmbeddingTableConfig("h", 16, DIM, ("x",), kind="hash", dtype=dtype),  # type: ignore[arg-type]
    ]


def batch(seed: int, weighted: bool) -> SparseFeatures:
    """Bags of ids of the three tables (the hash table's large, some negative); ``weighted``: random weights."""
    generator = torch.Generator().manual_seed(seed)

    def feature(ids: torch.Tensor, lengths: list[int]) -> object:
        weights = torch.rand(ids.numel(), generator=generator).tolist() if weighted else None
        return jagged(ids.tolist(), lengths, weights)

    return SparseFeatures(
        {
            "a": feature(torch.randint(0, 10, (8,), generator=generator), [2, 2, 2, 2]),  # type: ignore[dict-item]
            "b": feature(torch.randint(0, 7, (6,), generator=generator), [1, 2, 1, 2]),  # type: ignore[dict-item]
            "x": feature(  # type: ignore[dict-item]
                torch.randint(0, 12, (10,), generator=generator) * 1_000_003 - 7, [3, 2, 3, 2]
            ),
        }
    )


GRAD = torch.tensor([-1.0, -0.5, 0.25, 1.0])
"""Each bag's gradient: multiples of 1/4, so that a row's summed gradient, and SGD's step of 0.5 times it, are exact
in float32 whatever the order or fusion of the operations."""


def backward(collection: ShardedEmbeddingCollection, seed: int, weighted: bool) -> None:
    outputs = collection(batch(seed, weighted))
    sum((output * GRAD.to(output.device)).sum() for output in outputs.values()).backward()


@pytest.fixture
def gpu_path(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, SparseOptimizerConfig], Path]:
    """A collection and its optimizer on the GPU path, of ``tables(dtype)``."""

    def build(dtype: str, config: SparseOptimizerConfig) -> Path:
        with monkeypatch.context() as patch:
            if SIMULATED:
                patch.setattr(
                    dynamic_rows_module,
                    "_index_on",
                    lambda device, capacity, policy, seed: CudaHashIndex(capacity, policy, seed=seed, device=DEVICE),
                )
            collection = ShardedEmbeddingCollection(tables(dtype), FakeGang(DEVICE), seed=3)
        return collection, SparseOptimizer(collection, config, backend="cuda")

    return build


def cpu_path(dtype: str, config: SparseOptimizerConfig) -> Path:
    collection = ShardedEmbeddingCollection(tables(dtype), seed=3)
    return collection, SparseOptimizer(collection, config, backend="cpu")


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().view(torch.int16)


def hash_group(collection: ShardedEmbeddingCollection) -> ShardGroup:
    return next(group for group in collection.groups if group.dynamic is not None)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_sgd_on_the_gpu_path_steps_the_bits_of_the_cpu_path(dtype, gpu_path):
    """Training through the whole path (lookups, the device's hash index, the CUDA kernels), with gradients whose
    update is exact: every row's bits are the CPU path's, step after step."""
    config = sparse_optimizer_config("sgd", lr=0.5)
    paths = [cpu_path(dtype, config), gpu_path(dtype, config)]
    for seed in range(3):
        for collection, optimizer in paths:
            backward(collection, seed, weighted=False)
            optimizer.step()
            optimizer.zero_grad()

    (cpu, _), (gpu, _) = paths
    for name, shard in cpu.shards.items():
        assert gpu.shards[name].weight.dtype == getattr(torch, dtype)
        assert torch.equal(bits(gpu.shards[name].weight), bits(shard.weight)), name
    assert not torch.equal(bits(cpu.shards["t"].weight), bits(cpu_path(dtype, config)[0].shards["t"].weight))
    keys = hash_group(gpu).row_keys()
    assert isinstance(keys, DeviceRowKeys)
    held = keys.device_slot_ids.cpu().numpy()
    assert np.array_equal(held, hash_group(cpu).dynamic.index.keys)  # type: ignore[union-attr]
    # The index's host copy lags behind (it is brought up to date for a checkpoint): the kernels did not read it.
    assert not np.array_equal(held, hash_group(gpu).dynamic.index.keys)  # type: ignore[union-attr]


@pytest.mark.parametrize("name", SPARSE_OPTIMIZERS.names())
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_every_optimizer_rounds_on_the_gpu_path_as_on_the_cpu_path(name, dtype, gpu_path):
    """Each group's step, fixed and hash: wherever the two paths compute the same float32 value (the same step on
    float32 copies of the rows; the kernels may round a float32 operation apart, a GPU fuse a multiplication and an
    addition), the rounded bits are the same; elsewhere at most one value apart."""
    config = sparse_optimizer_config(name, lr=0.05, weight_decay=0.01)
    paths = [cpu_path(dtype, config), gpu_path(dtype, config)]
    for step, seed in enumerate(range(2), start=1):
        widened = []
        for (collection, optimizer), backend in zip(paths, ("cpu", "cuda")):
            backward(collection, seed, weighted=True)
            widened.append([float32_step(config, group, step, backend) for group in collection.groups])
            optimizer.step()
            optimizer.zero_grad()

        (cpu, _), (gpu, _) = paths
        for cpu_group, gpu_group, cpu_values, gpu_values in zip(cpu.groups, gpu.groups, *widened):
            same_values = cpu_values == gpu_values
            assert bool(same_values.any())
            actual, expected = bits(gpu_group.weight), bits(cpu_group.weight)
            assert torch.equal(actual[same_values], expected[same_values])
            assert int((actual.int() - expected.int()).abs().max()) <= 1


def float32_step(config: SparseOptimizerConfig, group: ShardGroup, step: int, backend: str) -> torch.Tensor:
    """The float32 rows that ``group``'s recorded step computes before it rounds them (on copies)."""
    grads = group.accumulated_grads()
    assert grads is not None
    weight = group.weight.float()
    state = {key: tensor.clone() for key, tensor in group.optimizer_state.items()}
    fused_step(
        config, weight, state, grads.ids, grads.grad_rows, grads.grad_index, grads.grad_scale, step,
        backend=backend,
    )  # fmt: skip
    return weight.cpu()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_slot_ids_on_the_device_key_the_rows_as_on_the_host(dtype):
    """A hash table's keys given as the device's tensor of slot ids round a step as the same ids on the host do, on
    the CUDA backend and, copied to the host, on the CPU's."""
    config = sparse_optimizer_config("sgd", lr=0.5)
    slot_ids = torch.tensor([5, -9, 2**62, 7, -(2**40), 11], dtype=torch.int64)
    host = RowKeys.of_buffer(6, salt=19)
    host = RowKeys(host.salts, host.ends, host.bases, slot_ids.numpy())
    on_device = DeviceRowKeys(host.salts, host.ends, host.bases, device_slot_ids=slot_ids.to(DEVICE))
    ids, grad_index = torch.tensor([0, 1, 3, 4, 5, 1]), torch.tensor([0, 1, 2, 3, 1, 0])
    grad_rows = torch.linspace(-2.0, 2.0, 4 * DIM).reshape(4, DIM) / 8
    initial = (torch.linspace(-1.0, 1.0, 6 * DIM).reshape(6, DIM) / 3).to(dtype)
    results = []
    for backend, keys in (("cpu", host), ("cuda", on_device), ("cpu", on_device)):
        device = DEVICE if backend == "cuda" else torch.device("cpu")
        weight = initial.to(device)
        fused_step(
            config, weight, {}, ids.to(device), grad_rows.to(device), grad_index.to(device), None, 4,
            backend=backend, row_keys=keys,
        )  # fmt: skip
        results.append(bits(weight))

    assert torch.equal(results[1], results[0]) and torch.equal(results[2], results[0])


def test_slot_ids_of_another_type_are_refused_in_one_line():
    config = sparse_optimizer_config("sgd")
    keys = RowKeys.of_buffer(3)
    narrow = DeviceRowKeys(keys.salts, keys.ends, keys.bases, device_slot_ids=torch.zeros(3, dtype=torch.int32))
    weight = torch.zeros(3, DIM, dtype=torch.float16, device=DEVICE)
    ids, grad_rows = torch.tensor([1], device=DEVICE), torch.ones(1, DIM, device=DEVICE)

    with pytest.raises(SparseOptimizerError, match=r"^`row_keys.device_slot_ids` must be 1-D int64 on the device of "
                       r"`weight` \(.*\), but is 1-D torch.int32 on .* instead.$"):  # fmt: skip
        fused_step(config, weight, {}, ids, grad_rows, ids * 0, None, 1, backend="cuda", row_keys=narrow)


def test_a_half_precision_table_off_the_cpu_is_built_in_its_dtype():
    """No device refuses half-precision rows (a GPU trained them on the CPU only before); built on the meta device,
    as a test without a GPU can."""
    specs = [*tables("float16"), EmbeddingTableConfig("v", 5, DIM, ("c",), dtype="bfloat16")]
    groups = build_groups(specs, plan_sharding(specs, 1), 1, 0, 0, torch.device("meta"))

    dtypes = {shard.config.name: shard.weight.dtype for group in groups for shard in group.shards}
    assert dtypes == {"t": torch.float16, "u": torch.float16, "h": torch.float16, "v": torch.bfloat16}
    assert {group.weight.device.type for group in groups} == {"meta"}
