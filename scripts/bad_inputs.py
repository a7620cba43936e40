"""A catalogue of bad inputs, each given to ``python -m recipes`` as a user would, and what came of it.

Every case is a command run in a fresh folder (with the files it needs written there first) and the
outcome it must have: ``user`` (exit 2 and one line on stderr starting with ``error: ``), ``failure``
(exit 1 and one such line: a runtime failure such as a full disk), or ``ok`` (exit 0, for inputs that
look odd but are valid, such as CRLF line ends). No outcome may print a traceback. The script prints
a line per case that did not end as it must, then the counts; it exits 1 if any did not.

    python scripts/bad_inputs.py [--jobs 2] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import gzip
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    name: str
    args: str
    outcome: str = "user"  # user | failure | ok
    setup: Setup | None = None
    expect: str = ""
    """A fragment the error line must hold (for ``user`` and ``failure``)."""


TINY = "trainer.max_num_steps=4 trainer.validate_every_n_steps=2 metrics.recorders.console=false"


def write(path: str, text: str, gz: bool = False) -> Setup:
    def setup(folder: Path) -> None:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if gz:
            target.write_bytes(gzip.compress(text.encode()))
        else:
            target.write_text(text)

    return setup


PICTURE = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
"""The start of a PNG image, then every byte: a binary file, given where a YAML file is wanted."""


def write_bytes(path: str, data: bytes) -> Setup:
    def setup(folder: Path) -> None:
        (folder / path).write_bytes(data)

    return setup


def both(*setups: Setup) -> Setup:
    def setup(folder: Path) -> None:
        for step in setups:
            step(folder)

    return setup


def csv_rows(num_rows: int, header: str = "click,user,item,age", crlf: bool = False) -> str:
    end = "\r\n" if crlf else "\n"
    lines = [header] if header else []
    lines += [f"{i % 2},u{i % 37},i{i % 11},{i % 7}" for i in range(num_rows)]
    return end.join(lines) + end


SCHEMA = """
mine:
  recipe: tabular
  config:
    dataset:
      train_path: {train}
      valid_path: {valid}
      format: {fmt}
      label: {{column: click}}
      categorical: [{{columns: [user, item], num_buckets: 100}}]
      dense: [{{columns: [age]}}]
      batch_size: {batch}
    model: {{name: logistic_regression}}
    trainer: {{max_num_steps: 4, validate_every_n_steps: 2}}
    metrics: {{recorders: {{console: false}}}}
"""


def preset(train: str = "train.csv", valid: str = "valid.csv", fmt: str = "csv", batch: int = 8) -> Setup:
    return write("recipes.yaml", SCHEMA.format(train=train, valid=valid, fmt=fmt, batch=batch))


def data(train: str, valid: str | None = None) -> Setup:
    return both(write("train.csv", train), write("valid.csv", valid if valid is not None else csv_rows(40)))


def parquet(path: str, table: pa.Table) -> Setup:
    def setup(folder: Path) -> None:
        pq.write_table(table, folder / path)

    return setup


def symlink(path: str, target: str) -> Setup:
    def setup(folder: Path) -> None:
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, folder / path)

    return setup


def config_cases() -> list[Case]:
    """Bad values of the standard sections and of the built-in recipes' own, through ``show`` and ``train``."""
    bad = {
        "trainer.max_num_steps": ["0", "-1", "abc", "1.5"],
        "trainer.grad_accumulation": ["0", "x"],
        "trainer.max_grad_norm": ["-1", ".nan", "0"],
        "trainer.mixed_precision": ["fp32", "true"],
        "trainer.nan_policy": ["ignore"],
        "trainer.device": ["tpu"],
        "trainer.validate_every_n_steps": ["0"],
        "trainer.publish_metrics_every_n_steps": ["0"],
        "trainer.early_stopping.patience": ["0"],
        "trainer.early_stopping.min_delta": ["-0.1"],
        "trainer.max_consecutive_skipped_steps": ["0"],
        "optimizer.lr": ["0", "-1", ".inf", ".nan", "fast"],
        "optimizer.name": ["adamx", "7"],
        "optimizer.momentum": ["0.9"],
        "optimizer.betas": ["[0.9]", "[1.0, 0.9]", "0.9"],
        "optimizer.weight_decay": ["-1"],
        "lr_scheduler.name": ["step"],
        "lr_scheduler.num_warmup_steps": ["-1"],
        "lr_scheduler.final_lr_scale": ["0.1"],
        "metrics.recorders.foo": ["true"],
        "metrics.recorders.console": ["maybe", "3"],
        "metrics.recorders.wandb.mode": ["cloud"],
        "checkpoint.keep_last_n": ["0"],
        "checkpoint.every_n_steps": ["-5"],
        "checkpoint.model_only": ["some"],
        "gang.tp_size": ["0"],
        "gang.timeout_s": ["0", "1e300"],
        "gang.threads_per_rank": ["0"],
        "validation.batch_size": ["0"],
        "seed": ["-1", "4294967296", "x"],
        "model.embeddings.dim": ["0"],
        "model.embeddings.placement": ["diagonal"],
        "model.embeddings.backend": ["gpu"],
        "model.embeddings.kind": ["magic"],
        "model.embeddings.sparse_optimizer.name": ["lamb"],
        "model.embeddings.sparse_optimizer.lr": ["-1"],
        "model.embeddings.sparse_optimizer.beta1": ["0.5"],
        "model.embeddings.hash.eviction": ["fifo"],
        "model.embeddings.hash.eviction.ttl_steps": ["10"],
        "model.embeddings.hash.min_count": ["0"],
        "model.embeddings.hash.admit_probability": ["0", "1.5"],
        "model.hidden_dims": ["[0]", "[-3]", "64"],
        "dataset.batch_size": ["0"],
        "dataset.num_sparse": ["0"],
        "dataset.vocab_size": ["0"],
        "nonexistent": ["1"],
        "trainer.max_steps": ["10"],
    }
    cases = [
        Case(f"show ctr_tiny {key}={value}", f"show ctr_tiny {shlex.quote(f'{key}={value}')}")
        for key, values in bad.items()
        for value in values
    ]
    cases += [
        Case(
            "train: patience without a score metric",
            f"train ctr_tiny -o out {TINY} trainer.score_metric=null trainer.early_stopping.patience=2",
        ),
        Case("train: a score metric no unit has", f"train ctr_tiny -o out {TINY} trainer.score_metric=recall"),
        Case("train: keep_best_n without a score", f"train ctr_tiny -o out {TINY} trainer.score_metric=null"),
        Case(
            "train: cosine without max_num_steps",
            "train ctr_tiny -o out trainer.max_num_steps=null trainer.max_num_data_epochs=1 lr_scheduler.name=cosine",
        ),
        Case("train: cuda on a machine without", f"train ctr_tiny -o out {TINY} trainer.device=cuda"),
        Case("train: tp_size not dividing the world", f"train ctr_tiny -o out {TINY} gang.tp_size=3"),
        *(
            Case(
                f"train: threads_per_rank={count}, more than the cores",
                f"train ctr_tiny -o out {TINY} gang.threads_per_rank={count}",
                expect="`gang.threads_per_rank` must be at most the",
            )
            for count in (100000, 50000)
        ),
        Case(
            "train: a hidden layer too big for memory",
            f"train ctr_tiny -o out {TINY} 'model.hidden_dims=[200000000]'",
            expect="Building the model needs a tensor of",
        ),
        Case(
            "train: a vocabulary too big for memory", f"train ctr_tiny -o out {TINY} dataset.vocab_size=1000000000000"
        ),
        Case(
            "train: hash tables on the dense backend",
            f"train ctr_tiny -o out {TINY} model.embeddings.kind=hash model.embeddings.backend=dense",
        ),
        Case(
            "train: a min_count no sketch reaches",
            f"train dlrm_criteo_tiny_dynamic -o out {TINY} model.embeddings.hash.min_count=100000000",
        ),
        Case("train: init_from a path that is not there", f"train ctr_tiny -o out {TINY} checkpoint.init_from=nowhere"),
        Case("train: a batch no multiple of the ranks", f"train ctr_tiny -o out {TINY} dataset.batch_size=3 --nproc 2"),
    ]
    return cases


def cli_cases() -> list[Case]:
    return [
        Case("no command", ""),
        Case("an unknown command", "fly ctr_tiny"),
        Case("an unknown preset", "train ctr_tini"),
        Case("a preset file that is not there", "train missing.yaml"),
        Case("an empty -o", "train ctr_tiny -o ''"),
        Case("-o a file", "train ctr_tiny -o afile", setup=write("afile", "x")),
        Case("-o under a file", "train ctr_tiny -o afile/run", setup=write("afile", "x")),
        Case("--nproc 0", "train ctr_tiny -o out --nproc 0"),
        Case("--nproc abc", "train ctr_tiny -o out --nproc abc"),
        Case("an unknown flag", "train ctr_tiny --fast"),
        Case("an override without a value", "train ctr_tiny -o out trainer.max_num_steps"),
        Case("an override with bad YAML", "show ctr_tiny 'trainer.max_num_steps=[1,'"),
        Case("an override in a scalar's place", "show ctr_tiny trainer.max_num_steps=4 trainer.max_num_steps.x=1"),
        Case("a config file that is not there", "show ctr_tiny --config-file nope.yaml"),
        Case("a config file of bad YAML", "show ctr_tiny --config-file bad.yaml", setup=write("bad.yaml", "a: [")),
        Case("a config file holding a list", "show ctr_tiny --config-file list.yaml", setup=write("list.yaml", "- 1")),
        Case(
            "a config file of another recipe",
            "show ctr_tiny --config-file other.yaml",
            setup=write("other.yaml", "recipe: dlrm\nconfig: {}\n"),
        ),
        Case(
            "a binary config file",
            "show ctr_tiny --config-file some.bin",
            setup=write_bytes("some.bin", PICTURE),
            expect="The file some.bin must be YAML",
        ),
        Case(
            "a binary preset file",
            "train ./some.bin",
            setup=write_bytes("some.bin", PICTURE),
            expect="The file some.bin must be YAML",
        ),
        Case("a preset file of bad YAML", "list", setup=write("recipes.yaml", "mine: [")),
        Case("a preset without a recipe", "train mine", setup=write("recipes.yaml", "mine:\n  config: {}\n")),
        Case("a preset naming an unknown recipe", "train mine", setup=write("recipes.yaml", "mine:\n  recipe: x\n")),
        Case(
            "a preset importing a missing module",
            "train mine",
            setup=write("recipes.yaml", "mine:\n  recipe: ctr\n  imports: [nope_module]\n"),
        ),
        Case(
            "presets based on each other",
            "train a",
            setup=write("recipes.yaml", "a:\n  based_on: b\nb:\n  based_on: a\n"),
        ),
        Case("a module named like a framework package", "list", setup=write("units.py", "")),
        Case("eval of a directory that is not there", "eval runs/nothing"),
        Case("eval of a folder that is no run", "eval folder", setup=write("folder/x.txt", "")),
        Case("predict without -o", "predict runs/nothing"),
        Case("checkpoints of a folder that is no run", "checkpoints folder", setup=write("folder/x.txt", "")),
        Case(
            "export-tables of a folder that is no run",
            "export-tables folder -o tables",
            setup=write("folder/x.txt", ""),
        ),
    ]


def run_cases() -> list[Case]:
    """Bad requests about a run that exists (trained first by the case's setup)."""

    def trained(folder: Path) -> None:
        command = f"{sys.executable} -m recipes train ctr_tiny -o run {TINY} checkpoint.every_n_steps=2"
        subprocess.run(shlex.split(command), cwd=folder, capture_output=True, check=True)

    def tampered(change: Callable[[Path], None]) -> Setup:
        return lambda folder: (trained(folder), change(folder / "run"))  # type: ignore[func-returns-value]

    def flip_byte(run: Path) -> None:
        path = run / "checkpoints" / "step_4" / "model.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    def lose_metadata(run: Path) -> None:
        (run / "checkpoints" / "step_4" / "metadata.json").unlink()

    def lose_rank_file(run: Path) -> None:
        (run / "checkpoints" / "step_4" / "rank_0.pt").unlink()

    def file_at_step_6(run: Path) -> None:
        (run / "checkpoints" / "step_6").write_text("my notes")

    return [
        Case("resume with a changed lr", f"train ctr_tiny -o run {TINY} optimizer.lr=0.5", setup=trained),
        Case(
            "resume with max_num_steps below the checkpoint",
            f"train ctr_tiny -o run {TINY} checkpoint.every_n_steps=2 trainer.max_num_steps=2",
            setup=trained,
            expect="must be at least 4",
        ),
        Case("eval --split test of a run without test data", "eval run --split test", setup=trained),
        Case("eval --checkpoint of a step not saved", "eval run --checkpoint 3", setup=trained),
        Case("eval --checkpoint best of an unscored run", "eval run --checkpoint bestest", setup=trained),
        Case("predict -o of an unknown extension", "predict run -o p.txt", setup=trained),
        Case("predict -o into a folder not made yet", "predict run -o nofolder/p.csv", outcome="ok", setup=trained),
        Case(
            "export-tables into a non-empty folder",
            "export-tables run -o full",
            setup=both(trained, write("full/x.txt", "")),
        ),
        Case(
            "a flipped byte in the last checkpoint: resumes the one before",
            f"train ctr_tiny -o run {TINY} trainer.max_num_steps=6 checkpoint.every_n_steps=2",
            outcome="ok",
            setup=tampered(flip_byte),
        ),
        Case(
            "a lost metadata.json: resumes the one before",
            f"train ctr_tiny -o run {TINY} trainer.max_num_steps=6 checkpoint.every_n_steps=2",
            outcome="ok",
            setup=tampered(lose_metadata),
        ),
        Case(
            "a lost rank file: resumes the one before",
            f"train ctr_tiny -o run {TINY} trainer.max_num_steps=6 checkpoint.every_n_steps=2",
            outcome="ok",
            setup=tampered(lose_rank_file),
        ),
        Case(
            "a file at checkpoints/step_N: set aside",
            f"train ctr_tiny -o run {TINY} trainer.max_num_steps=6 checkpoint.every_n_steps=2",
            outcome="ok",
            setup=tampered(file_at_step_6),
        ),
    ]


def data_cases() -> list[Case]:
    good = csv_rows(40)
    cases = [
        Case("data: a missing training file", "train mine -o out", setup=both(preset(train="none.csv"), data(good))),
        Case(
            "data: a directory as the file",
            "train mine -o out",
            setup=both(preset(train="adir"), data(good), write("adir/x.csv", good)),
        ),
        Case("data: a glob matching nothing", "train mine -o out", setup=both(preset(train="*.nothing"), data(good))),
        Case("data: an empty file", "train mine -o out", setup=both(preset(), data(""))),
        Case("data: a header only", "train mine -o out", setup=both(preset(), data(csv_rows(0)))),
        Case(
            "data: fewer rows than a batch",
            "train mine -o out",
            setup=both(preset(batch=64), data(csv_rows(20))),
            expect="a step takes 64 rows",
        ),
        Case(
            "data: too much accumulation",
            "train mine -o out trainer.grad_accumulation=16",
            setup=both(preset(), data(csv_rows(40))),
        ),
        Case(
            "data: CRLF line ends",
            "train mine -o out",
            outcome="ok",
            setup=both(preset(), data(csv_rows(40, crlf=True))),
        ),
        Case(
            "data: a duplicate header name",
            "train mine -o out",
            setup=both(preset(), data(csv_rows(40, header="click,user,user,age"))),
        ),
        Case(
            "data: a missing label column",
            "train mine -o out",
            setup=both(preset(), data(csv_rows(40, header="clack,user,item,age"))),
        ),
        Case(
            "data: another delimiter", "train mine -o out", setup=both(preset(), data(csv_rows(40).replace(",", ";")))
        ),
        Case(
            "data: bad labels, skipped up to the limit",
            "train mine -o out",
            outcome="ok",
            setup=both(preset(), data(csv_rows(40).replace("\n1,", "\n7,"))),
        ),
        Case(
            "data: bad labels, none allowed",
            "train mine -o out dataset.max_malformed_rows=0",
            setup=both(preset(), data(csv_rows(40).replace("\n1,", "\n7,"))),
        ),
        *(
            Case(
                f"data: a time of 1e20 under a derived {part}, {how}",
                f"train mine -o out 'dataset.derived=[{{name: when, source: age, transform: {part}}}]' "
                "'dataset.categorical=[{columns: [user, item, when], num_buckets: 100}]' dataset.dense=[]" + extra,
                outcome=outcome,
                setup=both(preset(), data(csv_rows(40) + "1,u1,i1,1e20\n")),
                expect="the time of the derived column 'when', must be seconds since 1970" if outcome == "user" else "",
            )
            for part in ("hour", "year")
            for how, extra, outcome in (
                ("skipped up to the limit", "", "ok"),
                ("none allowed", " dataset.max_malformed_rows=0", "user"),
            )
        ),
        Case(
            "data: parse_threads more than the cores",
            "train mine -o out dataset.parse_threads=100000",
            setup=both(preset(), data(good)),
            expect="`dataset.parse_threads` must be at most the",
        ),
        Case(
            "data: text in a dense column",
            "train mine -o out",
            setup=both(preset(), data("click,user,item,age\n" + "1,u,i,old\n" * 40)),
        ),
        Case(
            "data: too many fields",
            "train mine -o out",
            setup=both(preset(), data("click,user,item,age\n" + "1,u,i,3,extra\n" * 40)),
        ),
        Case(
            "data: too few fields",
            "train mine -o out",
            setup=both(preset(), data("click,user,item,age\n" + "1,u\n" * 40)),
        ),
        Case(
            "data: an unclosed quote",
            "train mine -o out",
            setup=both(preset(), data('click,user,item,age\n1,"u,i,3\n' * 40)),
        ),
        Case(
            "data: binary garbage",
            "train mine -o out",
            setup=both(preset(), write("train.csv", "\x00\x01\xff" * 400), write("valid.csv", good)),
        ),
        Case(
            "data: a truncated gzip",
            "train mine -o out",
            setup=both(
                preset(train="train.csv.gz"),
                write("valid.csv", good),
                lambda folder: (folder / "train.csv.gz").write_bytes(gzip.compress(csv_rows(4000).encode())[:500]),
            ),
        ),
        Case(
            "data: a .gz that is no gzip",
            "train mine -o out",
            setup=both(preset(train="train.csv.gz"), write("train.csv.gz", good), write("valid.csv", good)),
        ),
        Case("data: an empty validation file", "train mine -o out", setup=both(preset(), data(good, ""))),
        Case(
            "data: parquet missing a column",
            "train mine -o out",
            setup=both(
                preset(train="t.parquet", valid="t.parquet", fmt="parquet"),
                parquet("t.parquet", pa.table({"click": [1, 0] * 20, "user": ["a", "b"] * 20})),
            ),
        ),
        Case(
            "data: parquet of a wrong type",
            "train mine -o out",
            setup=both(
                preset(train="t.parquet", valid="t.parquet", fmt="parquet"),
                parquet(
                    "t.parquet",
                    pa.table({"click": ["yes"] * 40, "user": ["a"] * 40, "item": ["b"] * 40, "age": [1.0] * 40}),
                ),
            ),
        ),
        Case(
            "data: not a parquet file",
            "train mine -o out",
            setup=both(preset(train="t.parquet", valid="t.parquet", fmt="parquet"), write("t.parquet", good)),
        ),
        Case(
            "data: a delimiter on parquet",
            "show mine dataset.format.delimiter=';'",
            setup=preset(train="t.parquet", fmt="parquet"),
        ),
        Case("data: libffm without num_fields", "show mine dataset.format=libffm", setup=preset()),
        Case(
            "data: libsvm lines short of num_fields",
            "train mine -o out dataset.format.num_fields=3 "
            "dataset.categorical=[] dataset.dense=[] dataset.label.negative=[-1]",
            setup=both(
                preset(train="t.svm", valid="t.svm", fmt="{name: libsvm, num_fields: 3}"),
                write("t.svm", "1 1:1 2:1\n-1 3:1\n" * 20),
            ),
        ),
    ]
    return cases


def recipe_cases() -> list[Case]:
    """Bad values of the built-in recipes' own sections (``dlrm``, ``tabular``) and of a user's schema."""
    shows = {
        "dlrm_criteo_tiny": [
            "dataset.num_embeddings_per_feature=[1]",
            "dataset.num_embeddings_per_feature=[10,10]",
            "dataset.synthetic_rows=2",
            "model.bottom_dims=[0]",
            "model.top_dims=[-1]",
            "model.shared_table=maybe",
            "dataset.parse_threads=0",
            "dataset.shuffle_buffer_size=0",
            "dataset.max_malformed_rows=-1",
            "model.embeddings=3",
            "trainer=5",
            "trainer.max_num_data_epochs=0",
            "checkpoint.start_over=maybe",
        ],
        "criteo_kaggle": [
            "model.name=xgboost",
            "model.name=fm model.cross_rank=4",
            "model.name=fm model.hidden_dims=[8]",
            "model.dropout=1",
            "model.cross_layers=0",
            "model.cross_rank=0",
            "dataset.format.delimiter=';;'",
            "dataset.format=parquet dataset.format.header=false",
            "dataset.format.name=excel",
            "dataset.delimiter=';'",
            "dataset.libsvm_buckets=10",
            "'dataset.label.negative=[\"1\"]' 'dataset.label.positive=[\"1\"]'",
            "dataset.categorical=[{columns: [C1], num_buckets: 0}]",
            "dataset.categorical=[{columns: [C1], colour: red}]",
            "dataset.dense=[{columns: [I1], fill: .nan}]",
            "dataset.derived=[{name: h, source: C1, transform: hour2}]",
            "dataset.derived=[{name: h, source: C1, transform: history}]",
            "dataset.derived=[{name: h, source: C1, transform: count_before}]",
            "dataset.joins=[{path: x.csv}]",
            "dataset.batch_size=-4",
            "dataset.format.column_names=[label]",
        ],
    }
    cases = [
        Case(f"show {name} {override}", f"show {name} {override}")
        for name, overrides in shows.items()
        for override in overrides
    ]
    good = csv_rows(40)
    schema = both(preset(), data(good))
    cases += [
        Case("train criteo_kaggle without paths", "train criteo_kaggle -o out"),
        Case("train dlrm_criteo without paths", "train dlrm_criteo -o out"),
        Case(
            "train criteo_kaggle on files not there",
            "train criteo_kaggle -o out dataset.train_path=a.tsv dataset.valid_path=b.tsv",
        ),
        Case(
            "data: a join file not there",
            "train mine -o out 'dataset.joins=[{path: side.csv, key: item, columns: [genre]}]'",
            setup=schema,
        ),
        Case(
            "data: a join key the file lacks",
            "train mine -o out 'dataset.joins=[{path: side.csv, key: item, columns: [genre]}]'",
            setup=both(schema, write("side.csv", "film,genre\ni1,x\n")),
        ),
        Case(
            "data: a joined column the rows already have",
            "train mine -o out 'dataset.joins=[{path: side.csv, key: item, columns: [user]}]'",
            setup=both(schema, write("side.csv", "item,user\ni1,x\n")),
        ),
        Case(
            "data: a history without a split column",
            "train mine -o out 'dataset.derived=[{name: h, source: item, transform: history, key: user}]'",
            setup=schema,
        ),
        Case(
            "data: a split by a column the files lack",
            "train mine -o out dataset.split.column=when dataset.split.valid_from=3",
            setup=schema,
        ),
        Case(
            "data: a split leaving validation empty",
            "train mine -o out dataset.split.column=age dataset.split.valid_from=1000 dataset.valid_path=train.csv",
            setup=schema,
        ),
        Case(
            "data: a categorical column the files lack",
            "train mine -o out 'dataset.categorical=[{columns: [user, shop], num_buckets: 10}]'",
            setup=schema,
        ),
        Case(
            "data: a dense column the files lack",
            "train mine -o out 'dataset.dense=[{columns: [height]}]'",
            setup=schema,
        ),
        Case(
            "data: a vocabulary of a column the files lack",
            "train mine -o out 'dataset.categorical=[{columns: [shop], vocabulary: true}]'",
            setup=schema,
        ),
        Case("data: no header and no column names", "train mine -o out dataset.format.header=false", setup=schema),
        Case(
            "data: column names short of the fields",
            "train mine -o out dataset.format.header=false 'dataset.format.column_names=[click, user]'",
            setup=schema,
        ),
        Case(
            "data: a label column that is also a feature",
            "train mine -o out 'dataset.categorical=[{columns: [click, user], num_buckets: 10}]'",
            setup=schema,
        ),
        Case(
            "init_from a file that is no checkpoint",
            f"train ctr_tiny -o out {TINY} checkpoint.init_from=note.txt",
            setup=write("note.txt", "x"),
        ),
        Case(
            "init_from a folder without checkpoints",
            f"train ctr_tiny -o out {TINY} checkpoint.init_from=empty",
            setup=write("empty/readme.txt", "x"),
        ),
        Case("eval of a preset with a run folder not there", "eval ctr_tiny nothing/here"),
        Case("predict -o a folder", "predict ctr_tiny run -o adir", setup=write("adir/x", "")),
    ]
    return cases


def run(case: Case) -> str | None:
    """What went wrong with ``case`` (``None``: it ended as it must)."""
    with tempfile.TemporaryDirectory() as folder:
        if case.setup is not None:
            case.setup(Path(folder))
        env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
        result = subprocess.run(
            [sys.executable, "-m", "recipes", *shlex.split(case.args)],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if "Traceback" in result.stderr or "Traceback" in result.stdout:
        return f"a traceback (exit {result.returncode})"
    wanted = {"user": 2, "failure": 1, "ok": 0}[case.outcome]
    if result.returncode != wanted:
        return f"exit {result.returncode}, not {wanted}: {' | '.join(lines[-3:])}"
    if case.outcome != "ok":
        errors = [line for line in lines if line.startswith("error: ")]
        if len(errors) != 1 or not lines[-1].startswith("error: "):
            return f"not one error line: {' | '.join(lines[-3:])}"
        if case.expect and case.expect not in errors[0]:
            return f"the line lacks {case.expect!r}: {errors[0]}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    cases = [
        c for c in (*cli_cases(), *config_cases(), *recipe_cases(), *run_cases(), *data_cases()) if args.only in c.name
    ]
    with ThreadPoolExecutor(args.jobs) as pool:
        problems = list(pool.map(run, cases))
    failed = [(case, problem) for case, problem in zip(cases, problems) if problem is not None]
    for case, problem in failed:
        print(f"{case.name}  [recipes {case.args}]: {problem}")
    counts = {outcome: sum(c.outcome == outcome for c in cases) for outcome in ("user", "failure", "ok")}
    print(f"{len(cases)} cases ({counts}); {len(cases) - len(failed)} ended as they must, {len(failed)} did not")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
