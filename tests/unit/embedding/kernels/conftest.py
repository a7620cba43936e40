"""Random inputs for one fused step, and a way to run several steps on copies of a table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numba
import pytest
import torch

from embedding.kernels import fused_step
from embedding.optimizers import SparseOptimizerConfig, init_optimizer_state


@dataclass
class StepInputs:
    ids: torch.Tensor
    grad_rows: torch.Tensor
    grad_index: torch.Tensor
    grad_scale: torch.Tensor | None

    def to(self, device: torch.device) -> StepInputs:
        scale = None if self.grad_scale is None else self.grad_scale.to(device)
        return StepInputs(self.ids.to(device), self.grad_rows.to(device), self.grad_index.to(device), scale)


def random_step_inputs(
    seed: int, num_rows: int, dim: int, num_ids: int, duplicates: bool, with_scale: bool
) -> StepInputs:
    """Ids that touch only the first half of the table, so that the other half must stay as it is.

    With ``duplicates`` the ids crowd onto a few rows; without, every id is a different row.
    """
    generator = torch.Generator().manual_seed(seed)
    touchable = num_rows // 2
    if duplicates:
        ids = torch.randint(0, max(1, touchable // 8), (num_ids,), generator=generator)
    else:
        ids = torch.randperm(touchable, generator=generator)[:num_ids]
    num_grad_rows = max(1, num_ids // 3)
    grad_rows = torch.randn(num_grad_rows, dim, generator=generator)
    grad_index = torch.randint(0, num_grad_rows, (ids.numel(),), generator=generator)
    grad_scale = torch.rand(ids.numel(), generator=generator) * 2 - 0.5 if with_scale else None
    return StepInputs(ids, grad_rows, grad_index, grad_scale)


@dataclass
class Table:
    weight: torch.Tensor
    state: dict[str, torch.Tensor]

    def clone(self) -> Table:
        return Table(self.weight.clone(), {name: t.clone() for name, t in self.state.items()})

    def to(self, device: torch.device) -> Table:
        return Table(self.weight.to(device), {name: t.to(device) for name, t in self.state.items()})


def backend_device(backend: str) -> torch.device:
    """Where ``backend`` computes: the GPU for ``cuda``, unless numba's simulator stands in for it."""
    return torch.device("cuda" if backend == "cuda" and not numba.config.ENABLE_CUDASIM else "cpu")


def random_table(config: SparseOptimizerConfig, num_rows: int, dim: int, seed: int = 0) -> Table:
    generator = torch.Generator().manual_seed(seed)
    state = init_optimizer_state(config, num_rows, dim)
    for tensor in state.values():  # a used state, not a fresh one, so every term of the update matters
        tensor.copy_(torch.rand(tensor.shape, generator=generator))
    return Table(torch.randn(num_rows, dim, generator=generator), state)


def run_steps(config: SparseOptimizerConfig, table: Table, steps: list[StepInputs], backend: str) -> None:
    for step_nr, inputs in enumerate(steps, start=1):
        inputs = inputs.to(table.weight.device)
        fused_step(
            config,
            table.weight,
            table.state,
            inputs.ids,
            inputs.grad_rows,
            inputs.grad_index,
            inputs.grad_scale,
            step_nr,
            backend=backend,
        )


def assert_matches_reference(
    config: SparseOptimizerConfig, num_rows: int, dim: int, steps: list[StepInputs], backend: str
) -> Table:
    """Run ``steps`` with ``backend`` and with the reference on copies of one table; they must
    agree to float32 rounding, and rows no step touched must be bitwise untouched. Returns the table ``backend``
    left (on the CPU), which started as ``random_table(config, num_rows, dim)``."""
    initial = random_table(config, num_rows, dim)
    expected, actual = initial.clone(), initial.clone().to(backend_device(backend))
    run_steps(config, expected, steps, "reference")
    run_steps(config, actual, steps, backend)
    actual = actual.to(torch.device("cpu"))

    torch.testing.assert_close(actual.weight, expected.weight, rtol=1e-5, atol=1e-6)
    for name in expected.state:
        torch.testing.assert_close(actual.state[name], expected.state[name], rtol=1e-5, atol=1e-6)

    touched = torch.zeros(num_rows, dtype=torch.bool)
    for inputs in steps:
        touched[inputs.ids] = True
    assert torch.equal(actual.weight[~touched], initial.weight[~touched])
    for name in initial.state:
        assert torch.equal(actual.state[name][~touched], initial.state[name][~touched])
    assert touched.any() == (not torch.equal(actual.weight, initial.weight))
    return actual


def assert_bitwise_same_across_threads(config: SparseOptimizerConfig, initial: Table, steps: list[StepInputs]) -> None:
    """Run ``steps`` with the CPU kernel on copies of ``initial``, twice with numba's threads and
    once with one thread: every run must end with the very same bits."""
    results = []
    threads_before = numba.get_num_threads()
    try:
        for num_threads in (threads_before, threads_before, 1):
            numba.set_num_threads(num_threads)
            table = initial.clone()
            run_steps(config, table, steps, "cpu")
            results.append(table)
    finally:
        numba.set_num_threads(threads_before)

    for table in results[1:]:
        assert torch.equal(table.weight, results[0].weight)
        for key in table.state:
            assert torch.equal(table.state[key], results[0].state[key])


def assert_rounds_as_reference(
    config: SparseOptimizerConfig, table: Table, steps: list[StepInputs], backend: str
) -> None:
    """Step by step from the reference's half-precision ``table``: wherever ``backend``'s float32 value is the
    reference's (the same step on float32 copies of the rows), its rounded bits are the reference's too; elsewhere
    (the kernels and torch may round a float32 operation apart) they are at most one value apart. Rows no step
    touched stay bitwise; the state stays float32, to float32 rounding."""
    dtype = table.weight.dtype
    touched = torch.zeros(table.weight.size(0), dtype=torch.bool)
    for step, inputs in enumerate(steps, start=1):
        touched[inputs.ids] = True
        results = {}
        for name in ("reference", backend):
            for widened in (False, True):
                rows = table.clone()
                if widened:
                    rows.weight = rows.weight.float()  # the float32 values the half-precision step rounds
                rows = rows.to(backend_device(name))
                on_device = inputs.to(backend_device(name))
                fused_step(
                    config, rows.weight, rows.state, on_device.ids, on_device.grad_rows, on_device.grad_index,
                    on_device.grad_scale, step, backend=name,
                )  # fmt: skip
                results[name, widened] = rows.to(torch.device("cpu"))
        expected, actual = results["reference", False], results[backend, False]
        same_values = results["reference", True].weight == results[backend, True].weight

        assert actual.weight.dtype == dtype
        bits, expected_bits = actual.weight.view(torch.int16), expected.weight.view(torch.int16)
        assert torch.equal(bits[same_values], expected_bits[same_values])
        assert int((bits.int() - expected_bits.int()).abs().max()) <= 1
        assert torch.equal(actual.weight[~touched], table.weight[~touched])
        for key, state in expected.state.items():
            assert actual.state[key].dtype == torch.float32
            torch.testing.assert_close(actual.state[key], state, rtol=1e-5, atol=1e-6)
        table = expected


# Test modules reach these helpers through fixtures: test directories are not packages.


@pytest.fixture
def make_step_inputs() -> Callable[..., StepInputs]:
    return random_step_inputs


@pytest.fixture
def make_table() -> Callable[..., Table]:
    return random_table


@pytest.fixture
def device_of() -> Callable[[str], torch.device]:
    return backend_device


@pytest.fixture
def steps_runner() -> Callable[[SparseOptimizerConfig, Table, list[StepInputs], str], None]:
    return run_steps


@pytest.fixture
def determinism_check() -> Callable[[SparseOptimizerConfig, Table, list[StepInputs]], None]:
    return assert_bitwise_same_across_threads


@pytest.fixture
def reference_check() -> Callable[[SparseOptimizerConfig, int, int, list[StepInputs], str], Table]:
    return assert_matches_reference


@pytest.fixture
def half_reference_check() -> Callable[[SparseOptimizerConfig, Table, list[StepInputs], str], None]:
    return assert_rounds_as_reference
