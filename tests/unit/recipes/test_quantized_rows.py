"""Row-wise int8 and int4 rows (``recipes.serving.quantized``): FBGEMM's fused SBHalf rounding and layout, the error
bound of a round trip, constant rows, odd dims; and the serving tutorial's scorer reading what ``export`` writes."""

from __future__ import annotations

from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch

from recipes.cli.export import _write_quantized, export
from recipes.errors import UserError
from recipes.serving.quantized import BITS, code_bytes, dequantize, quantize
from support.cli_runs import assert_one_line_error, run_main
from support.serving_scorer import tutorial_scorer


@pytest.mark.parametrize("dtype", sorted(BITS))
@pytest.mark.parametrize("dim", [1, 7, 16, 33])
def test_a_round_trip_is_within_half_a_step_of_each_row_whatever_its_magnitude(dtype: str, dim: int) -> None:
    bits = BITS[dtype]
    rng = np.random.default_rng(dim)
    magnitudes = np.array([1e-3, 0.05, 1.0, 30.0], dtype=np.float32).repeat(64)
    rows = (rng.standard_normal((len(magnitudes), dim)) * magnitudes[:, None]).astype(np.float32)

    quantized = quantize(rows, bits)
    back = dequantize(quantized, dim, bits)

    assert quantized.codes.shape == (len(rows), code_bytes(dim, bits)) and quantized.codes.dtype == np.uint8
    assert quantized.scale.dtype == quantized.bias.dtype == np.float16
    # (a row's span less its fp16-rounded minimum may be below 0, in one ulp of fp16: a negative scale, as FBGEMM has)
    scale = np.abs(quantized.scale.astype(np.float32)[:, None])
    # half a step of rounding; the fp16 scale's own rounding (2**-11 of it, or 2**-25 where it is subnormal) over up
    # to 2**bits - 1 steps; and, where the span is below fp16's resolution of the minimum (dim 1), the minimum's
    levels = 2**bits - 1
    span = np.ptp(rows, axis=1, keepdims=True)
    bound = 0.5 * scale + span * 2.0**-11 + levels * 2.0**-25 + np.abs(rows).max(axis=1, keepdims=True) * 2.0**-11
    assert (np.abs(back - rows) <= bound).all()
    assert back.dtype == np.float32 and back.shape == rows.shape


def test_int8_codes_are_fbgemms_scale_and_bias_exactly() -> None:
    rows = np.array([[-2.0, -1.5, 125.5, 0.0], [0.0, 0.5, 127.5, 63.75]], dtype=np.float32)

    quantized = quantize(rows, 8)

    assert quantized.bias.tolist() == [-2.0, 0.0]
    assert quantized.scale.tolist() == [0.5, 0.5]  # (max - min) / 255
    assert quantized.codes.tolist() == [[0, 1, 255, 4], [0, 1, 255, 128]]  # rint(63.75 / 0.5 = 127.5) is even: 128
    np.testing.assert_array_equal(dequantize(quantized, 4, 8)[0], rows[0])


def test_int4_packs_two_codes_a_byte_low_nibble_first_and_an_odd_dim_leaves_the_last_high_nibble_zero() -> None:
    rows = np.array([[0, 15, 1, 14, 7], [1, 2, 3, 4, 16]], dtype=np.float32)

    quantized = quantize(rows, 4)

    assert quantized.scale.tolist() == [1.0, 1.0] and quantized.bias.tolist() == [0.0, 1.0]
    assert quantized.codes.tolist() == [[0xF0, 0xE1, 0x07], [0x10, 0x32, 0x0F]]
    np.testing.assert_array_equal(dequantize(quantized, 5, 4), rows)


@pytest.mark.parametrize("bits", sorted(BITS.values()))
def test_a_constant_row_has_scale_1_and_codes_0_and_comes_back_as_its_value_in_fp16(bits: int) -> None:
    rows = np.array([[3.0, 3.0, 3.0], [0.0, 0.0, 0.0], [-1e-4, -1e-4, -1e-4]], dtype=np.float32)

    quantized = quantize(rows, bits)

    assert quantized.scale.tolist() == [1.0, 1.0, 1.0]
    assert not quantized.codes.any()
    np.testing.assert_array_equal(dequantize(quantized, 3, bits), rows.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("dtype", sorted(BITS))
@pytest.mark.parametrize("num_rows", [0, 5])
def test_the_tutorial_scorer_reads_an_exported_table_as_dequantize_gives_it(
    tmp_path: Path, dtype: str, num_rows: int
) -> None:
    rows = np.random.default_rng(3).standard_normal((num_rows, 7)).astype(np.float32)
    ids = np.arange(num_rows, dtype=np.int64) * 3
    _write_quantized(fsspec.filesystem("file"), str(tmp_path / "t.parquet"), ids, rows, BITS[dtype])

    read = tutorial_scorer().read_rows(str(tmp_path / "t.parquet"), 7, dtype)

    expected = dequantize(quantize(rows, BITS[dtype]), 7, BITS[dtype])
    torch.testing.assert_close(read, torch.from_numpy(expected), rtol=0, atol=0)


def test_a_dtype_export_does_not_know_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, "export", str(tmp_path), "-o", str(tmp_path / "a"), "--dtype", "int2")

    assert code == 2
    assert_one_line_error(err, "--dtype", "int2")
    assert not (tmp_path / "a").exists()


def test_export_called_with_a_dtype_it_does_not_know_refuses_before_reading_the_run(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"`--dtype` must be float32, int8 or int4, but is float16 instead\."):
        export(str(tmp_path / "none"), "auto", str(tmp_path / "a"), dtype="float16")


@pytest.mark.parametrize("bits", sorted(BITS.values()))
def test_the_codes_scale_and_bias_side_by_side_are_fbgemms_fused_rows_byte_for_byte(bits: int) -> None:
    pytest.importorskip("fbgemm_gpu", reason="fbgemm-gpu-cpu (the optional benchmark extra) is not installed")
    magnitudes = np.array([1e-3, 0.05, 1.0, 30.0], dtype=np.float32).repeat(100)
    rows = (np.random.default_rng(bits).standard_normal((len(magnitudes), 16)) * magnitudes[:, None]).astype(np.float32)
    rows[:3] = 3.0  # constant rows

    fused = torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(torch.from_numpy(rows), bits).numpy()

    quantized = quantize(rows, bits)
    halves = [half.view(np.uint8).reshape(len(rows), 2) for half in (quantized.scale, quantized.bias)]
    np.testing.assert_array_equal(np.concatenate([quantized.codes, *halves], axis=1), fused)
