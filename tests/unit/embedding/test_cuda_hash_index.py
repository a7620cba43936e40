"""The GPU index against the CPU index: the same lookups must give the same slots, admissions, evictions
and state. Under numba's CUDA simulator on CPU tensors (small sizes: every GPU thread is a Python
thread), or on a GPU with ``NUMBA_ENABLE_CUDASIM=0 pytest tests/unit/embedding/test_cuda_hash_index.py``."""

import numba
import numpy as np
import numpy.typing as npt
import pytest
import torch

from embedding.cuda_hash_index import CudaHashIndex
from embedding.dynamic_rows import DynamicRows
from embedding.eviction import EvictionConfig, TtlConfig
from embedding.hash_index import HashIndex, HashPolicy, TableFullError
from embedding.table_config import EmbeddingTableConfig

# Under the simulator the shared hashing code runs as plain Python, where numpy warns of the
# wrap-around that uint64 arithmetic is meant to do.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

DEVICE = torch.device("cpu" if numba.config.ENABLE_CUDASIM else "cuda")

Steps = list[list[npt.NDArray[np.int64]]]


def random_steps(seed: int, num_steps: int, vocabulary: int, batch: int = 8) -> Steps:
    """Steps of one to three micro-batches of skewed ids drawn from any int64 values."""
    rng = np.random.default_rng(seed)
    words = rng.integers(-(2**63), 2**63 - 1, size=vocabulary, dtype=np.int64, endpoint=True)
    weights = 1.0 / np.arange(1, vocabulary + 1)
    return [
        [
            words[rng.choice(vocabulary, size=int(rng.integers(0, batch + 1)), p=weights / weights.sum())]
            for _ in range(int(rng.integers(1, 4)))
        ]
        for _ in range(num_steps)
    ]


def feed(index: HashIndex, steps: Steps) -> list[list[int]]:
    """Each micro-batch's slots and new slots, as a training step's lookups (``look_up``) give them."""
    device = DEVICE if isinstance(index, CudaHashIndex) else torch.device("cpu")
    answers = []
    for micro_batches in steps:
        answers += [_answer(index.look_up(torch.from_numpy(batch).to(device), True, "t")) for batch in micro_batches]
        index.advance()
    return answers


def _answer(looked_up: tuple[torch.Tensor, torch.Tensor]) -> list[int]:
    slots, inserted = looked_up
    return [*slots.tolist(), -2, *inserted.tolist()]  # -2: no slot's number, a separator


def assert_same_state(first: HashIndex, second: HashIndex) -> None:
    one, other = first.state_dict(), second.state_dict()
    assert one.keys() == other.keys()
    for key, value in one.items():
        assert np.array_equal(value, other[key]), key
    assert first.statistics() == second.statistics()


ADMISSIONS = {"all": {}, "min_count": {"min_count": 2}, "coin": {"admit_probability": 0.6}}
EVICTIONS = {"lru": EvictionConfig("lru"), "lfu": EvictionConfig("lfu"), "ttl": TtlConfig(ttl_steps=2)}


@pytest.mark.parametrize("admission", ADMISSIONS)
@pytest.mark.parametrize("eviction", EVICTIONS)
def test_gpu_index_assigns_the_slots_of_the_cpu_index(eviction: str, admission: str) -> None:
    policy = HashPolicy(eviction=EVICTIONS[eviction], **ADMISSIONS[admission])  # type: ignore[arg-type]
    steps = random_steps(0, num_steps=40, vocabulary=40)
    cpu, gpu = HashIndex(12, policy, seed=3), CudaHashIndex(12, policy, seed=3, device=DEVICE)
    assert feed(gpu, steps) == feed(cpu, steps)
    assert_same_state(gpu, cpu)
    everyone = np.unique(np.concatenate([batch for step in steps for batch in step]))
    assert np.array_equal(gpu.find(everyone), cpu.find(everyone))
    statistics = gpu.statistics()
    assert statistics["admitted"] > 0 and (statistics["evicted"] > 0 or statistics["rejected"] > 0)


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_gpu_index_evicts_like_the_cpu_index_when_many_new_ids_compete(eviction: str) -> None:
    """Batches of many new ids in a full table: most take their best candidate at once, those whose
    best candidate another id also ranks are resolved in order."""
    policy = HashPolicy(eviction=EvictionConfig(eviction))
    steps = random_steps(5, num_steps=12, vocabulary=3000, batch=60)
    cpu, gpu = HashIndex(150, policy, seed=1), CudaHashIndex(150, policy, seed=1, device=DEVICE)
    assert feed(gpu, steps) == feed(cpu, steps)
    assert_same_state(gpu, cpu)
    assert cpu.statistics()["evicted"] > 100


def test_look_up_keeps_ids_and_slots_on_the_device_and_find_changes_nothing() -> None:
    index = CudaHashIndex(8, HashPolicy(), device=DEVICE)
    ids = torch.tensor([5, -7, 5, 2**62], device=DEVICE)
    slots, inserted = index.look_up(ids, training=True, table="t")
    assert slots.device == ids.device and inserted.device == ids.device
    assert slots.tolist() == [1, 0, 1, 2] and inserted.tolist() == [0, 1, 2]  # new ids enter in sorted order
    before = index.state_dict()
    found, none = index.look_up(torch.tensor([2**62, 9, -7], device=DEVICE), training=False, table="t")
    assert found.tolist() == [2, -1, 0] and none.numel() == 0
    assert_same_state(index, _loaded(before))


def test_a_step_that_finds_every_id_reaches_the_host_copy() -> None:
    gpu, cpu = CudaHashIndex(8, HashPolicy(), device=DEVICE), HashIndex(8, HashPolicy())
    for index in (gpu, cpu):
        index.touch_or_insert(np.array([4, 9], np.int64), "t")
        index.advance()
        index.state_dict()  # the host copy is current here
        index.touch_or_insert(np.array([9, 9], np.int64), "t")  # no new id: only last step and counts change
    assert_same_state(gpu, cpu)


def _loaded(state: dict[str, object]) -> HashIndex:
    index = HashIndex(8, HashPolicy())
    index.load_state_dict(state)
    return index


def test_the_index_grows_on_the_device_and_keeps_finding_every_id() -> None:
    index, reference = CudaHashIndex(2000, HashPolicy(), device=DEVICE), HashIndex(2000, HashPolicy())
    batches = [np.arange(start, start + 500, dtype=np.int64) * 7919 for start in range(0, 1500, 500)]
    for batch in batches:
        assert np.array_equal(index.touch_or_insert(batch, "t")[0], reference.touch_or_insert(batch, "t")[0])
        index.advance(), reference.advance()
    everyone = np.concatenate(batches)
    assert index.nbytes > CudaHashIndex(2000, HashPolicy(), device=DEVICE).nbytes  # 1,875 entries, not 1,024
    assert np.array_equal(index.find(everyone), np.arange(1500))


@pytest.mark.parametrize("direction", ["cpu-to-gpu", "gpu-to-cpu"])
def test_a_state_moves_between_cpu_and_gpu_and_both_continue_alike(direction: str) -> None:
    policy = HashPolicy(eviction=EvictionConfig("lru"), min_count=2, admit_probability=0.7)
    steps = random_steps(1, num_steps=40, vocabulary=50)
    source = HashIndex(10, policy, seed=4) if direction == "cpu-to-gpu" else CudaHashIndex(10, policy, 4, device=DEVICE)
    feed(source, steps[:20])
    moved = CudaHashIndex(10, policy, 4, device=DEVICE) if direction == "cpu-to-gpu" else HashIndex(10, policy, 4)
    moved.load_state_dict(source.state_dict())
    assert feed(moved, steps[20:]) == feed(source, steps[20:])
    assert_same_state(moved, source)


def test_load_keys_and_counts_reach_the_device() -> None:
    policy = HashPolicy(eviction=EvictionConfig("lru"), min_count=3)
    gpu, cpu = CudaHashIndex(6, policy, device=DEVICE), HashIndex(6, policy)
    sketch = np.arange(2 * cpu.sketch.shape[1], dtype=np.int32).reshape(2, -1) % 3
    for index in (gpu, cpu):
        index.load_keys(np.array([-4, 9], np.int64), np.array([3, 1], np.int32), np.array([2, 5], np.int32), step=4)
        index.load_counts(sketch, np.array([7, 1, 2, 0], np.int64))
    steps = random_steps(2, num_steps=12, vocabulary=20)
    assert feed(gpu, steps) == feed(cpu, steps)
    assert_same_state(gpu, cpu)


def test_a_full_gpu_index_without_eviction_raises_naming_the_table() -> None:
    index = CudaHashIndex(2, HashPolicy(eviction=EvictionConfig("none")), device=DEVICE)
    index.touch_or_insert(np.array([1, 2], np.int64), "clicks")
    with pytest.raises(TableFullError, match=r"Table 'clicks' is full: all 2 rows.*id 3 finds no row"):
        index.touch_or_insert(np.array([3], np.int64), "clicks")


@pytest.mark.skipif(DEVICE.type != "cuda", reason="rows on a GPU need one")
def test_rows_on_a_gpu_start_and_map_as_on_the_cpu() -> None:
    config = EmbeddingTableConfig(
        "t", 16, 4, ("f",), kind="hash", hash_policy=HashPolicy(eviction=EvictionConfig("lfu"))
    )
    ids = torch.from_numpy(np.concatenate([batch for step in random_steps(3, 10, 30) for batch in step]))
    results = []
    for device in (torch.device("cpu"), DEVICE):
        rows = DynamicRows(config, 16, seed=1, rank=0, num_ranks=1, device=device)
        assert isinstance(rows.index, CudaHashIndex) == (device.type == "cuda")
        weight, state = torch.zeros(17, 4, device=device), {"sum": torch.ones(17, device=device)}
        rows.state_fill = {"sum": 0.5}
        looked_up = rows.rows(ids.to(device), weight, state, training=True)
        results.append((looked_up.cpu(), weight.cpu(), state["sum"].cpu()))
    for cpu_result, gpu_result in zip(*results):
        assert torch.equal(cpu_result, gpu_result)
