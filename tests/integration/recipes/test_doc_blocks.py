"""Every fenced block of the README and of the documentation pages, run as written, or named with the test that
runs it.

The documents' ``bash`` blocks run in one folder laid out as the checkout (``support.doc_commands``), in the order
the documents give them, so that a later block works on an earlier one's run (``runs/ctr_tiny``, ``runs/dynamic``). A
command changes only by the substitutions of ``SUBSTITUTIONS``, each with its reason (a run too long for CI, a port
of its own); the folder's ``.venv/bin/python -m recipes`` is forked from a warm interpreter that has imported torch
once, about 3 s of CPU spared a command (``support.warm_runs``); a command that never ends on its own is started,
asked, and stopped; ``srun`` is read as Slurm would pass it to torchrun. A ``yaml``, ``python`` or ``toml`` block is
a config resolved, code run or an entry point found, by the check of ``CHECKS`` named after it; plain text is
compared with what the program prints or is a diagram (``PLAIN``). A block run by another test is in ``COVERED``; a
block that repeats an earlier one's text (the README's first commands, again in the getting-started page) is run
once, as the first. A new block that is in none of them fails ``test_every_block_is_run_here_or_by_a_named_test``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import doc_checks
from support.doc_blocks import Block, all_blocks, commands
from support.doc_commands import (
    Outcome,
    checkout_folder,
    env_with,
    run_command,
    run_until_it_waits,
    serve_and_ask,
)
from support.paths import ROOT

# The first test's set-up runs every block: minutes, more than the suite's limit for one test.
pytestmark = pytest.mark.timeout(1200)

BLOCKS = all_blocks()
BY_NAME = {block.name: block for block in BLOCKS}


@dataclass(frozen=True)
class Substitution:
    old: str
    new: str
    why: str


# The only changes made to the documents' commands; each must still find its text.
SUBSTITUTIONS = (
    Substitution("RECIPES/", "{root}/", "the placeholder for the checkout's path"),
    Substitution(
        "--logdir runs/ctr_tiny/tb", "--logdir runs/ctr_tiny/tb --port 0", "tests run side by side: a free port"
    ),
    Substitution("--logdir out/tb ", "--logdir out/tb --port 0 ", "tests run side by side: a free port"),
    Substitution(
        "bash scripts/test.sh",
        "bash scripts/test.sh --collect-only -q",
        "the suite runs this test: lint, types and import rules run, and pytest collects every test",
    ),
    Substitution("--num-rows 20000", "--num-rows 2000", "fewer synthetic rows: seconds in CI"),
    Substitution("--num-rows 5000", "--num-rows 500", "fewer synthetic rows: seconds in CI"),
    Substitution(
        "'dataset.num_embeddings_per_feature=[2000000]'",
        "'dataset.num_embeddings_per_feature=[2000]' dataset.batch_size=64 trainer.max_num_steps=3",
        "26 hash tables of 2,000,000 rows x 64 need 15 GB, and the preset trains until validation stops improving",
    ),
    Substitution(
        "dataset.valid_path=criteo/valid.tsv    #",
        "dataset.valid_path=criteo/valid.tsv trainer.max_num_steps=3"
        " 'dataset.categorical=[{columns: [\"C{1..26}\"], num_buckets: 2000}]'    #",
        "the preset trains until validation stops improving, in tables of 200,000 rows each",
    ),
    Substitution(
        "--nproc-per-node 2 -m recipes train ctr_tiny runs/ctr_dp2",
        "--nproc-per-node 2 -m recipes train ctr_tiny runs/ctr_dp2 trainer.max_num_steps=20",
        "20 steps on 2 processes show it trains; the next command resumes the run",
    ),
    Substitution(
        "-o runs/ctr_dp2 --nproc 2",
        "-o runs/ctr_dp2 --nproc 2 trainer.max_num_steps=40",
        "the run of the command before resumed for 20 steps more",
    ),
    Substitution(
        "-o runs/dynamic     #",
        "-o runs/dynamic trainer.max_num_steps=30     #",
        "30 steps give the hash tables rows and the run a checkpoint",
    ),
    Substitution(
        "-o runs/ctr_dp2tp2 gang.tp_size=2 --nproc 4",
        "-o runs/ctr_dp2tp2 gang.tp_size=2 --nproc 4 trainer.max_num_steps=20",
        "4 processes on 2 cores: 20 steps show it trains",
    ),
    Substitution(
        "train movielens_din -o runs/din",
        "train movielens_din -o runs/din trainer.max_num_steps=20 trainer.validate_every_n_steps=10",
        "two epochs are 312 steps: 20, validated twice, show it trains",
    ),
    Substitution(
        "train movielens_sasrec -o runs/sasrec",
        "train movielens_sasrec -o runs/sasrec trainer.max_num_steps=10 trainer.validate_every_n_steps=10",
        "two epochs are 780 steps: 10, validated once, show it trains and ranks",
    ),
    Substitution(
        "train movielens_online ",
        "train movielens_online trainer.max_num_steps=30 ",
        "the first window alone (the history) takes 1,250 steps",
    ),
)

# The one change to the commands' environment: scripts/setup.sh's `pip install -e ".[dev]"` resolves the project's
# requirements against the environment running the tests, which it must not change: a dry run, from what is there.
ENVIRONMENT = {"PIP_DRY_RUN": "1", "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}

# Commands that do not end by themselves: what shows they started, and what is asked of them.
SERVERS = ("tensorboard",)
TENSORBOARD_ASKS = ("data/plugin/scalars/tags",)
FOLLOWING = "dataset.follow=true"


@dataclass(frozen=True)
class Covered:
    test: str
    what: str


# Blocks another test runs as written.
COVERED = {
    "README.md: ```python class RegressionTrainUnit(TrainUnit[Batch]):": Covered(
        "tests/unit/recipes/test_examples.py", "an excerpt of examples/my_project/linreg.py, which the tests train"
    ),
    'docs/tutorials/your-own-model.md: ```python """Linear regression on synthetic data: a recipe of my own."""': (
        Covered(
            "tests/unit/recipes/test_examples.py",
            "the same text as examples/my_project/linreg.py, which the tests train",
        )
    ),
    "docs/tutorials/your-own-model.md: ```yaml linreg_demo:": Covered(
        "tests/unit/recipes/test_examples.py", "the same text as examples/my_project/recipes.yaml"
    ),
    'docs/tutorials/sparse-tables.md: ```python """Matrix factorisation of MovieLens ratings, with sparse embedding '
    'tables."""': Covered("tests/unit/recipes/test_examples.py", "the same text as examples/my_recommender/mf.py"),
    "docs/tutorials/sparse-tables.md: ```yaml mf_movielens:": Covered(
        "tests/unit/recipes/test_examples.py", "the same text as examples/my_recommender/recipes.yaml"
    ),
    "docs/tutorials/sparse-tables.md: ```bash cd my_recommender": Covered(
        "tests/integration/recipes/test_tutorial_tables.py", "runs each command of the block as the page has it"
    ),
    "docs/how-to/sweeps.md: ```yaml ctr_sweep:": Covered(
        "tests/integration/recipes/test_sweep.py", "the page's recipes.yaml, which its commands sweep"
    ),
    "docs/how-to/sweeps.md: ```bash .venv/bin/python -m recipes sweep ctr_sweep -o sweeps/ctr --trials 2": Covered(
        "tests/integration/recipes/test_sweep.py", "runs each command of the block as the page has it"
    ),
    "docs/tutorials/serving.md: ```python import json": Covered(
        "tests/integration/recipes/test_export.py", "scores exports with the block's code (support/serving_scorer.py)"
    ),
}


def first_with_its_text(block: Block) -> Block:
    """The first block of the documents with ``block``'s language and text: ``block`` itself, or the earlier one
    it repeats."""
    return next(first for first in BLOCKS if (first.language, first.text) == (block.language, block.text))


def planned(block: Block) -> str:
    """How this module runs ``block``: ``commands``, a check of ``CHECKS``, plain text of ``PLAIN``, covered, or
    repeated (run as the earlier block of the same text)."""
    if block.name in COVERED:
        return "covered"
    if first_with_its_text(block) is not block:
        return "repeated"
    if block.language == "bash":
        return "commands"
    if block.language == "":
        return "plain"
    return "check"


def substituted(text: str, root: Path, used: set[str]) -> str:
    for substitution in SUBSTITUTIONS:
        if substitution.old in text:
            used.add(substitution.old)
            text = text.replace(substitution.old, substitution.new.replace("{root}", str(root)))
    return text


def run_commands(block: Block, root: Path, env: dict[str, str], used: set[str]) -> list[Outcome]:
    """The commands of a ``bash`` block in order, from ``root``, ``cd`` kept across them."""
    cwd, outcomes = root, []
    for command in commands(block):
        command = substituted(command, root, used)
        if command.startswith("cd "):
            cwd = cwd / command.split()[1]
        elif Path(command.split()[0]).name in SERVERS:
            outcomes.append(serve_and_ask(command, cwd, env, TENSORBOARD_ASKS))
        elif FOLLOWING in command:
            outcomes.append(run_until_it_waits(command, cwd, env, doc_checks.WAITING_LINE))
        elif command.startswith("srun "):
            outcomes.append(doc_checks.srun_as_slurm_would(command, cwd, env))
        else:
            outcomes.append(run_command(command, cwd, env))
    return outcomes


@dataclass
class Ran:
    root: Path
    outcomes: dict[str, list[Outcome]]
    failures: dict[str, str]
    used: set[str]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """Every block this module runs, in the documents' order, in one folder laid out as the checkout."""
    root = checkout_folder(tmp_path_factory.mktemp("docs") / "checkout")
    doc_checks.user_files(root)
    env = env_with(ENVIRONMENT | {"RECIPES_PRESET_FILES": str(root / doc_checks.USER_PRESETS)})
    outcomes: dict[str, list[Outcome]] = {}
    failures: dict[str, str] = {}
    used: set[str] = set()
    for block in BLOCKS:
        try:
            if planned(block) == "commands":
                outcomes[block.name] = run_commands(block, root, env, used)
            elif planned(block) == "check":
                outcomes[block.name] = CHECKS[block.name](block, root, env)
        except Exception as error:  # the block's test reports it; the blocks after it still run
            failures[block.name] = f"{type(error).__name__}: {error}"
    return Ran(root, outcomes, failures, used)


CHECKS: dict[str, Callable[[Block, Path, dict[str, str]], list[Outcome]]] = {
    "docs/getting-started.md: ```yaml my_clicks:": doc_checks.preset_trains_on_its_files,
    "docs/getting-started.md: ```yaml train_path: ratings.csv                    # userId,movieId,rating,timestamp": (
        doc_checks.dataset_section_of_movielens
    ),
    "docs/getting-started.md: ```yaml movielens_two_tasks:": doc_checks.two_tasks_train_and_predict,
    "docs/how-to/export-tables.md: ```python import numpy as np, pyarrow.parquet as pq": doc_checks.python_in_folder,
    "docs/tutorials/sequence-model.md: ```yaml derived:": doc_checks.dataset_section_of_movielens,
    "docs/tutorials/sequence-model.md: ```yaml categorical:": doc_checks.dataset_section_of_movielens,
    "docs/how-to/hash-tables.md: ```python FNV_OFFSET, FNV_PRIME, MASK = 0xCBF29CE484222325, 0x100000001B3, "
    "2**64 - 1": doc_checks.ids_as_exported,
    "docs/how-to/model-bank.md: ```yaml checkpoint:": doc_checks.config_of_ctr_tiny,
    "docs/how-to/own-components.md: ```python from dataclasses import dataclass": doc_checks.optimizer_trains,
    "docs/how-to/own-components.md: ```python class JsonLinesReader(ArrowReader):": doc_checks.data_format_trains,
    'docs/how-to/own-components.md: ```toml [project.entry-points."recipes.data_formats"]': (
        doc_checks.plugin_entry_point
    ),
    'docs/how-to/own-components.md: ```toml [project.entry-points."recipes.recipes"]': doc_checks.entry_points_list,
}

PLAIN = {
    "docs/how-to/feature-importance.md: ``` Permutation importance on the valid split (8,192 rows), checkpoint step "
    "200, seed 0": doc_checks.importance_printout,
    "docs/getting-started.md: ``` python -m recipes list                      presets with their recipe and "
    "description": doc_checks.synopsis_of_the_parser,
    "docs/architecture.md: ``` +------------------------------------------------------------------------------+": (
        None
    ),
    "docs/architecture.md: ``` recsys.builtin.{ctr, dlrm, movielens, tabular}     built-in recipes, one folder each "
    "(recipe, presets.yaml)": None,
    "docs/architecture.md: ``` __main__.py": None,
    "docs/architecture.md: ``` cli.main                        parse argv; user errors -> exit 2, failures -> exit 1": (
        None
    ),
}
"""Plain text: compared by its check with what the program prints, or ``None`` for a diagram of the code."""


def test_every_block_is_run_here_or_by_a_named_test() -> None:
    plans = {block.name: planned(block) for block in BLOCKS}

    assert sorted(name for name, plan in plans.items() if plan == "check") == sorted(CHECKS)
    assert sorted(name for name, plan in plans.items() if plan == "plain") == sorted(PLAIN)
    assert set(COVERED) <= set(plans)
    for covered in COVERED.values():
        assert (ROOT / covered.test).is_file(), covered.test


def block_id(name: str) -> str:
    """A block's name as a test id: its words, shortened."""
    return re.sub(r"[^\w.:/=-]+", " ", name)[:90].strip()


@pytest.mark.parametrize(
    "name", [block.name for block in BLOCKS if planned(block) in ("commands", "check")], ids=block_id
)
def test_the_block_runs_as_written(name: str, ran: Ran) -> None:
    assert name not in ran.failures, ran.failures.get(name)
    outcomes = ran.outcomes[name]
    assert outcomes, "the block ran nothing"
    for outcome in outcomes:
        assert outcome.returncode == 0, outcome.describe()
    check_after = doc_checks.AFTER.get(name)
    if check_after is not None:
        check_after(ran.root, outcomes)


@pytest.mark.parametrize("name", sorted(name for name, check in PLAIN.items() if check is not None), ids=block_id)
def test_the_plain_text_is_what_the_program_prints(name: str, ran: Ran) -> None:
    check = PLAIN[name]
    assert check is not None
    check(BY_NAME[name], ran.root, ran.outcomes)


def test_every_substitution_is_used(ran: Ran) -> None:
    assert sorted(s.old for s in SUBSTITUTIONS if s.old not in ran.used) == []
