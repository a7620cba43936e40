"""The ``dlrm`` recipe's reader: a ``TabularReader`` of ``criteo_schema``, on Criteo-format day files.

How the tabular reader tokenises, hashes and reports a field is ``tests/unit/recsys/tabular``'s; these
tests check what the recipe relies on: Criteo's layout and DLRM's transforms, gzip, globs and
fsspec paths, malformed lines, steps over ranks, shuffling, resume, and the synthetic writer.
"""

from __future__ import annotations

import gzip
import logging
import math
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch

from recipes.cli.main import main
from recipes.training.data_reader import DataError
from recsys.builtin.dlrm.criteo import SPARSE_FEATURE_NAMES, criteo_schema
from recsys.builtin.dlrm.criteo_synthetic import main as synthetic_main
from recsys.builtin.dlrm.criteo_synthetic import write_synthetic_criteo
from recsys.click.batch import CTRBatch
from recsys.data.step_layout import window_permutation
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.hashing import hash_value

TABLE_SIZE = 1 << 20


def criteo_reader(
    paths: str, num_embeddings_per_feature: int | list[int] = TABLE_SIZE, **kwargs: object
) -> TabularReader:
    """The reader the recipe builds for ``dataset.num_embeddings_per_feature``."""
    return TabularReader(paths, criteo_schema(num_embeddings_per_feature), **kwargs)  # type: ignore[arg-type]


def numbered_line(i: int) -> str:
    """A well-formed line whose first count ``I1`` is ``i``, so that rows can be told apart."""
    dense = [str(i)] + [str(i % 7)] * 12
    cats = [f"{i:08x}"] + [f"{(i * 31 + k) % 4096:08x}" for k in range(25)]
    return "\t".join([str(i % 2), *dense, *cats])


def write_lines(path: Path, lines: list[str]) -> str:
    text = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return str(path)


def row_ids(steps: list[list[CTRBatch]]) -> list[list[list[int]]]:
    """Per step, per micro-batch, the row numbers of numbered lines (their ``I1``, through DLRM's log)."""
    return [[torch.expm1(batch.dense[:, 0].double()).round().long().tolist() for batch in step] for step in steps]


def read_all(reader: TabularReader) -> list[list[CTRBatch]]:
    return list(reader)


def test_the_criteo_schema_reads_known_values_as_dlrm_does(tmp_path: Path) -> None:
    dense = ["0", "1", "", "-3", "42", "7", "", "100", "2", "0", "5", "9", "1000000"]
    cats = ["", "0000000A", "ffffffff", "1", *([f"{k:08x}" for k in range(4, 26)])]
    second = ["0", *[""] * 13, *[""] * 26]
    path = write_lines(tmp_path / "day_0", ["\t".join(["1", *dense, *cats]), "\t".join(second)])
    sizes = [1000 + k for k in range(26)]

    reader = criteo_reader(path, sizes, batch_size=2, shuffle=False)
    [[batch]] = read_all(reader)

    expected_dense = [0.0 if v == "" else math.log(max(int(v), 0) + 1) for v in dense]
    assert batch.dense.dtype == torch.float32
    torch.testing.assert_close(batch.dense[0], torch.tensor(expected_dense, dtype=torch.float32))
    torch.testing.assert_close(batch.dense[1], torch.zeros(13))
    assert batch.labels.tolist() == [1.0, 0.0]
    assert list(batch.sparse) == list(SPARSE_FEATURE_NAMES) == [f"C{k}" for k in range(1, 27)]
    for k, name in enumerate(SPARSE_FEATURE_NAMES):
        expected = 0 if cats[k] == "" else hash_value(cats[k], name, sizes[k])
        assert batch.sparse[name].ids.tolist() == [expected, 0]
        assert batch.sparse[name].offsets.tolist() == [0, 1, 2]
    # The text is hashed, keyed by its column: not its hexadecimal value, not the same in every column.
    assert batch.sparse["C2"].ids[0] == hash_value("0000000A", "C2", 1001) != hash_value("0000000a", "C2", 1001)
    assert hash_value("00000004", "C5", 1000) != hash_value("00000004", "C6", 1000)


def test_one_table_size_serves_every_feature_and_each_feature_can_have_its_own(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day_0", [numbered_line(i) for i in range(3)])

    def read(sizes: int | list[int]) -> CTRBatch:
        [[batch]] = read_all(criteo_reader(path, sizes, batch_size=3, shuffle=False))
        return batch

    one, listed, own = read(50), read([50]), read([50] * 25 + [60])

    for name in SPARSE_FEATURE_NAMES:
        assert one.sparse[name].ids.tolist() == listed.sparse[name].ids.tolist()
        assert all(0 < i < 50 for i in one.sparse[name].ids.tolist())
    for name in SPARSE_FEATURE_NAMES[:-1]:
        assert own.sparse[name].ids.tolist() == one.sparse[name].ids.tolist()
    texts = [line.split("\t")[-1] for line in Path(path).read_text().splitlines()]
    assert own.sparse["C26"].ids.tolist() == [hash_value(text, "C26", 60) for text in texts]


def test_gzip_and_plain_files_read_the_same(tmp_path: Path) -> None:
    lines = [numbered_line(i) for i in range(50)]
    plain = write_lines(tmp_path / "day.tsv", lines)
    packed = write_lines(tmp_path / "day.tsv.gz", lines)

    def read(path: str) -> list[list[list[int]]]:
        return row_ids(read_all(criteo_reader(path, batch_size=8, seed=3)))

    assert read(plain) == read(packed)
    assert sorted(i for step in read(plain) for batch in step for i in batch) == sorted(
        i for step in read(packed) for batch in step for i in batch
    )


def test_steps_have_num_accumulate_micro_batches_and_drop_the_incomplete_step(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day", [numbered_line(i) for i in range(23)])

    reader = criteo_reader(path, batch_size=4, num_accumulate=2, shuffle=False)

    assert row_ids(read_all(reader)) == [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]]]
    with pytest.raises(StopIteration):
        next(reader)


def test_globs_read_files_in_order_and_a_missing_file_is_a_data_error(tmp_path: Path) -> None:
    write_lines(tmp_path / "day_0", [numbered_line(i) for i in range(3)])
    write_lines(tmp_path / "day_1.gz", [numbered_line(i) for i in range(3, 6)])

    reader = criteo_reader(str(tmp_path / "day_*"), batch_size=6, shuffle=False)

    assert row_ids(read_all(reader)) == [[[0, 1, 2, 3, 4, 5]]]
    with pytest.raises(DataError, match="day_9"):
        criteo_reader(str(tmp_path / "day_9"), batch_size=1, num_embeddings_per_feature=10)
    with pytest.raises(DataError, match="matches none"):
        criteo_reader(str(tmp_path / "month_*"), batch_size=1, num_embeddings_per_feature=10)


def test_memory_filesystem_paths() -> None:
    with fsspec.open("memory://criteo/day_0.gz", "wt", compression="gzip") as file:
        file.write("".join(numbered_line(i) + "\n" for i in range(10)))

    reader = criteo_reader("memory://criteo/day_0.gz", batch_size=5, shuffle=False)

    assert row_ids(read_all(reader)) == [[[0, 1, 2, 3, 4]], [[5, 6, 7, 8, 9]]]


def test_malformed_rows_are_logged_skipped_and_then_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = [numbered_line(i) for i in range(6)]
    lines[1] = lines[1].replace("\t", "\t\t", 1)  # 41 fields
    lines[3] = "2" + lines[3][1:]  # bad label
    lines[4] = lines[4].replace("\t4\t", "\tx4\t", 1)  # a count that is no number, in I1
    path = write_lines(tmp_path / "day", lines)

    with caplog.at_level(logging.WARNING, logger="recsys.data.stream"):
        reader = criteo_reader(path, batch_size=3, shuffle=False, max_malformed_rows=3)
        assert row_ids(read_all(reader)) == [[[0, 2, 5]]]
    assert [record.getMessage().split(",")[0] for record in caplog.records] == [
        f"Skipping line {n} of file://{path}" for n in (2, 4, 5)
    ]
    assert "41 instead" in caplog.records[0].getMessage()
    assert "'x4'" in caplog.records[2].getMessage()

    strict = criteo_reader(path, batch_size=3, shuffle=False, max_malformed_rows=2)
    with pytest.raises(DataError, match=rf"Line 5 of file://{path} is malformed: `I1` must be .*'x4'"):
        read_all(strict)


@pytest.mark.parametrize("shuffle", [False, True])
def test_two_ranks_share_every_row_once_with_equal_step_counts(tmp_path: Path, shuffle: bool) -> None:
    path = write_lines(tmp_path / "day", [numbered_line(i) for i in range(103)])

    def rank_rows(rank: int) -> list[list[list[int]]]:
        reader = criteo_reader(
            path,
            batch_size=4,
            num_accumulate=2,
            dp_rank=rank,
            dp_size=2,
            shuffle=shuffle,
            shuffle_buffer_size=30,
        )
        return row_ids(read_all(reader))

    rank_0, rank_1 = rank_rows(0), rank_rows(1)
    assert len(rank_0) == len(rank_1) == 103 // 16
    seen = [i for rank in (rank_0, rank_1) for step in rank for batch in step for i in batch]
    assert len(seen) == len(set(seen)) == 96
    if not shuffle:
        assert set(seen) == set(range(96))


def test_shuffle_is_seeded_by_seed_and_epoch(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day", [numbered_line(i) for i in range(64)])

    def reader(seed: int) -> TabularReader:
        return criteo_reader(path, batch_size=8, seed=seed, shuffle_buffer_size=32)

    first = reader(0)
    epoch_0 = row_ids(read_all(first))
    first.reset()
    epoch_1 = row_ids(read_all(first))

    assert epoch_0 == row_ids(read_all(reader(0)))
    assert epoch_0 != epoch_1
    assert epoch_0 != row_ids(read_all(reader(1)))
    flat = sorted(i for step in epoch_1 for batch in step for i in batch)
    assert flat == list(range(64))
    # The buffer bounds how far a row can move: the first window holds rows 0..31.
    assert {i for step in epoch_0[:4] for batch in step for i in batch} == set(range(32))


def test_window_boundaries_do_not_depend_on_the_read_chunk_size(tmp_path: Path) -> None:
    lines = [numbered_line(i) for i in range(70)]
    lines[20] = "oops"
    path = write_lines(tmp_path / "day", lines)

    def read(chunk_bytes: int) -> list[list[list[int]]]:
        reader = criteo_reader(
            path,
            batch_size=3,
            shuffle_buffer_size=10,
            read_chunk_bytes=chunk_bytes,
        )
        return row_ids(read_all(reader))

    assert read(1) == read(700) == read(1 << 20)


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("stop_after", [0, 1, 3, 4, 7])
def test_resume_reads_exactly_the_rows_an_uninterrupted_run_reads(
    tmp_path: Path, shuffle: bool, stop_after: int, drop_last: bool
) -> None:
    lines = [numbered_line(i) for i in range(90)]
    lines[13] = "malformed"
    lines[47] = "also\tmalformed"
    write_lines(tmp_path / "day_0.gz", lines[:40])
    write_lines(tmp_path / "day_1", lines[40:])

    def reader() -> TabularReader:
        return criteo_reader(
            str(tmp_path / "day_*"),
            batch_size=3,
            num_accumulate=2,
            dp_rank=1,
            dp_size=2,
            shuffle=shuffle,
            shuffle_buffer_size=20,
            seed=5,
            read_chunk_bytes=500,
            max_malformed_rows=2,
            drop_last=drop_last,
        )

    uninterrupted = reader()
    uninterrupted.reset()  # Resume within the second epoch, whose shuffle differs from the first's.
    expected = row_ids(read_all(uninterrupted))
    if drop_last:
        assert len(expected) == 88 // 12
    else:  # 88 rows in steps of 12: seven full steps, and four rows of which rank 1 gets two.
        assert len(expected) == 8 and [len(batch) for batch in expected[-1]] == [1, 1]

    interrupted = reader()
    interrupted.reset()
    head = row_ids([next(interrupted) for _ in range(stop_after)])
    state = interrupted.state_dict()

    resumed = reader()
    resumed.load_state_dict(state)
    assert head + row_ids(read_all(resumed)) == expected


def held_out_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
    positives = labels == 1
    num_pos, num_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


def test_synthetic_data_round_trips_and_carries_a_learnable_signal(tmp_path: Path) -> None:
    path = str(tmp_path / "synthetic.gz")
    write_synthetic_criteo(path, 4000, seed=2, num_malformed=4)
    again = str(tmp_path / "again.gz")
    write_synthetic_criteo(again, 4000, seed=2, num_malformed=4)
    assert gzip.decompress(Path(path).read_bytes()) == gzip.decompress(Path(again).read_bytes())

    [[train], [test]] = read_all(criteo_reader(path, batch_size=2000, shuffle=False, max_malformed_rows=4))
    with pytest.raises(DataError, match="malformed row 4 of this epoch"):  # Each malformed line is one to the reader.
        read_all(criteo_reader(path, batch_size=2000, shuffle=False, max_malformed_rows=3))
    assert 0.2 < train.labels.mean() < 0.8
    assert (train.dense == 0).float().mean() > 0.05
    # Mean label per C1 category, learnt on one half, ranks the other half well above chance
    # (0.5, with a standard error near 0.013 on 2000 rows).
    train_ids, train_labels = train.sparse["C1"].ids.numpy(), train.labels.numpy()
    rate = {int(v): train_labels[train_ids == v].mean() for v in np.unique(train_ids)}
    scores = np.array([rate.get(int(v), train_labels.mean()) for v in test.sparse["C1"].ids.numpy()])
    assert held_out_auc(scores, test.labels.numpy()) > 0.56


def test_synthetic_cli_writes_rows_and_has_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "day.tsv"
    synthetic_main([str(path), "--num-rows", "7", "--num-malformed", "2", "--seed", "3"])
    lines = path.read_text().splitlines()
    assert len(lines) == 9
    assert sum(len(line.split("\t")) == 40 for line in lines) >= 8
    with pytest.raises(SystemExit):
        synthetic_main(["--help"])
    assert "--num-rows" in capsys.readouterr().out


def test_invalid_arguments_are_value_errors(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day", [numbered_line(0)])
    with pytest.raises(ValueError, match="`dp_rank` must be in"):
        criteo_reader(path, batch_size=1, num_embeddings_per_feature=10, dp_rank=2, dp_size=2)
    for sizes in ([10, 10], 1, [1] * 26):
        with pytest.raises(ValueError, match="`num_embeddings_per_feature` must be one int >= 2 or 26 of them, but is"):
            criteo_reader(path, batch_size=1, num_embeddings_per_feature=sizes)
    with pytest.raises(ValueError, match="`batch_size` must be at least 1"):
        criteo_reader(path, batch_size=0, num_embeddings_per_feature=10)


def test_the_recipe_stops_on_a_file_of_another_format_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "train.csv"
    path.write_text("click,hour,site\n" + "1,14102100,abc\n" * 20)  # Avazu-like CSV: one field per tab-split line
    data = ["dataset.synthetic_rows=null", f"dataset.train_path={path}", f"dataset.valid_path={path}"]

    assert main(["train", "dlrm_criteo_tiny", "-o", str(tmp_path / "out"), *data]) == 2

    error = capsys.readouterr().err
    assert f"Line 1 of file://{path} does not fit the schema: it must have 40 fields, but has 1 instead" in error
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_table_of_one_row_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sizes = "dataset.num_embeddings_per_feature=[1]"

    assert main(["train", "dlrm_criteo_tiny", "-o", str(tmp_path / "out"), sizes]) == 2

    assert "num_embeddings_per_feature" in capsys.readouterr().err


def interleave(per_rank: list[list[int]]) -> list[int]:
    """The epoch's order back from the ranks' reads: row ``p`` is rank ``p % dp``'s ``p // dp``-th."""
    dp_size = len(per_rank)
    return [per_rank[p % dp_size][p // dp_size] for p in range(sum(len(reads) for reads in per_rank))]


def epoch_rows(steps: list[list[list[int]]]) -> list[int]:
    return [i for step in steps for batch in step for i in batch]


@pytest.mark.parametrize("num_accumulate", [1, 2])
@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_without_drop_last_the_ranks_read_every_row_once_in_file_order(
    tmp_path: Path, dp_size: int, num_accumulate: int
) -> None:
    lines = [numbered_line(i) for i in range(101)]
    lines[40] = "malformed"
    path = write_lines(tmp_path / "day", lines)
    expected = [i for i in range(101) if i != 40]

    def read(rank: int) -> list[list[list[int]]]:
        reader = criteo_reader(
            path,
            batch_size=4,
            num_accumulate=num_accumulate,
            dp_rank=rank,
            dp_size=dp_size,
            shuffle=False,
            shuffle_buffer_size=30,  # Several windows; only the last holds a short step.
            drop_last=False,
        )
        return row_ids(read_all(reader))

    epochs = [read(rank) for rank in range(dp_size)]

    num_steps = -(-len(expected) // (4 * num_accumulate * dp_size))
    assert [len(steps) for steps in epochs] == [num_steps] * dp_size
    assert all(len(step) == num_accumulate for steps in epochs for step in steps)
    assert interleave([epoch_rows(steps) for steps in epochs]) == expected


def test_without_drop_last_a_shuffled_epoch_is_its_windows_permutations_dealt_out(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day", [numbered_line(i) for i in range(101)])

    def read(rank: int) -> list[int]:
        reader = criteo_reader(
            path,
            batch_size=4,
            dp_rank=rank,
            dp_size=3,
            shuffle_buffer_size=30,
            seed=9,
            drop_last=False,
        )
        reader.reset()
        return epoch_rows(row_ids(read_all(reader)))

    order = interleave([read(rank) for rank in range(3)])

    # Windows of 36 rows (30 rounded up to whole steps of 12): 36, 36 and the last 29.
    windows = [np.arange(start, min(start + 36, 101)) for start in (0, 36, 72)]
    expected = [int(i) for w, rows in enumerate(windows) for i in rows[window_permutation(len(rows), 9, 1, w)]]
    assert order == expected


def test_a_rank_the_short_last_step_does_not_reach_reads_a_valid_zero_row_batch(tmp_path: Path) -> None:
    # 25 rows, steps of 3 ranks x 4: two full steps, then one row, for rank 0 only.
    path = write_lines(tmp_path / "day", [numbered_line(i) for i in range(25)])

    def last_step(rank: int) -> list[CTRBatch]:
        reader = criteo_reader(
            path,
            batch_size=4,
            dp_rank=rank,
            dp_size=3,
            shuffle=False,
            drop_last=False,
        )
        return read_all(reader)[-1]

    last_steps = [last_step(rank) for rank in range(3)]

    assert [[batch.batch_size for batch in step] for step in last_steps] == [[1], [0], [0]]
    empty = last_steps[2][0]
    assert empty.dense.shape == (0, 13) and empty.dense.dtype == torch.float32
    assert empty.labels.shape == (0,) and empty.labels.dtype == torch.float32
    assert list(empty.sparse) == list(SPARSE_FEATURE_NAMES)
    for feature in empty.sparse.values():
        assert feature.ids.shape == (0,) and feature.ids.dtype == torch.int64
        assert feature.offsets.tolist() == [0] and feature.offsets.dtype == torch.int64


@pytest.mark.parametrize(
    ("num_rows", "shuffle_buffer_size", "dropped"),
    [
        (103, 30, 7),  # Windows of 32 rows: the last read finds 7, no step.
        (90, 64, 10),  # Windows of 64 rows: the last holds 26, one step and 10 dropped.
    ],
)
def test_drop_last_logs_once_per_epoch_how_many_rows_it_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, num_rows: int, shuffle_buffer_size: int, dropped: int
) -> None:
    path = write_lines(tmp_path / "day", [numbered_line(i) for i in range(num_rows)])

    def reader() -> TabularReader:
        return criteo_reader(
            path,
            batch_size=4,
            num_accumulate=2,
            dp_rank=1,
            dp_size=2,
            shuffle_buffer_size=shuffle_buffer_size,
        )

    with caplog.at_level(logging.INFO, logger="recsys.data.stream"):
        first = reader()
        steps = read_all(first)
        read_all(first)  # Past the end: nothing more to say.
        first.reset()
        read_all(first)
        # A resume within the epoch's last window counts the rows that window drops.
        interrupted = reader()
        for _ in steps:
            next(interrupted)
        resumed = reader()
        resumed.load_state_dict(interrupted.state_dict())
        read_all(resumed)

    assert len(steps) == num_rows // 16
    assert [record.getMessage().split(":")[0] for record in caplog.records] == [
        f"Data epoch {epoch} dropped its last {dropped} rows" for epoch in (0, 1, 0)
    ]
    assert all(record.levelno == logging.INFO for record in caplog.records)


def test_nothing_is_logged_without_drop_last(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_lines(tmp_path / "day", [numbered_line(i) for i in range(103)])
    reader = criteo_reader(path, batch_size=4, dp_size=2, drop_last=False)

    with caplog.at_level(logging.INFO, logger="recsys.data.stream"):
        assert sum(batch.batch_size for step in read_all(reader) for batch in step) == 52

    assert caplog.records == []
