"""The checks of the documents' blocks that are not commands (``tests/integration/recipes/test_doc_blocks.py``):
a config resolved or trained, code run, an entry point found, printed text compared; and the files of a user's
own that the commands name (``my_preset``'s data in windows, ``my_clicks``' files).

Each check takes the block, the folder laid out as the checkout and the commands' environment, and returns what
it ran; an ``AFTER`` check looks further at what a block's commands left."""

from __future__ import annotations

import csv
import gzip
import json
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tomllib
import yaml

from support.doc_blocks import Block
from support.doc_commands import Outcome, run_command
from support.doc_tutorials import copy_example
from support.paths import EXAMPLES

RECIPES = ".venv/bin/python -m recipes"
USER_PRESETS = "user_presets.yaml"

# The online-training page's `my_preset`, a user's own preset of the `tabular` recipe, over Parquet files in hourly
# windows.
MY_PRESET = {
    "my_preset": {
        "recipe": "tabular",
        "description": "A user's own preset: the online-training page's my_preset.",
        "config": {
            "dataset": {
                "valid_path": "valid.parquet",
                "label": {"column": "clicked", "positive": ["1"]},
                "dense": [{"columns": ["price"]}],
                "categorical": [{"columns": ["item"], "num_buckets": 1000}],
                "batch_size": 64,
            },
            "model": {"name": "logistic_regression"},
            "trainer": {"max_num_steps": None, "max_num_data_epochs": 1},
            "metrics": {"recorders": {"console": False}},
        },
    }
}
WINDOWS = ("logs/2026-11-27/hour=14", "logs/2026-11-27/hour=15")
WAITING_LINE = "Waiting for the next window after"
CITIES = (" Paris ", "Zürich", "São Paulo", "Washington, D.C.", "東京", "007", "7", '"quoted"')
GENRES = ("Comedy", "Drama", "Film-Noir", " Sci-Fi ")


def user_files(root: Path) -> None:
    """The files of a user's own that the documents' commands name: the first tutorial's folder, ``my_preset``
    and its windows of data."""
    copy_example("my_project", root)
    (root / USER_PRESETS).write_text(yaml.safe_dump(MY_PRESET))
    rng = np.random.default_rng(0)
    for folder in [root / window for window in WINDOWS] + [root]:
        items = rng.integers(0, 50, 256)
        table = {"clicked": (items % 3 == 0).astype(np.int64), "price": rng.random(256), "item": items.astype(str)}
        if folder == root:
            pq.write_table(pa.table(table), root / "valid.parquet")
            continue
        folder.mkdir(parents=True)
        pq.write_table(pa.table(table), folder / "part-0.parquet")
        (folder / "_SUCCESS").write_text("")


def _click_rows(num_rows: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_rows):
        city = CITIES[rng.integers(len(CITIES))]
        clicked = "yes" if (city.strip() in ("Paris", "007")) != (rng.random() < 0.2) else "no"
        genres = "|".join(rng.choice(GENRES, size=rng.integers(1, 3), replace=False))
        counts = [str(rng.integers(0, 20)) for _ in range(3)]
        user = f"u{rng.integers(0, 40)}"
        rows.append([clicked, f"{rng.random():.3f}", *counts, city, ("ios", "android")[rng.integers(2)], user, genres])
    return rows


def _write_clicks(root: Path) -> tuple[str, str]:
    """Files of the shape the getting-started page's ``my_clicks`` preset reads; their paths in ``root``."""
    header = ["clicked", "price", "count1", "count2", "count3", "city", "device", "user_id", "genres"]
    (root / "clicks").mkdir()
    with gzip.open(root / "clicks" / "train-1.csv.gz", "wt", newline="") as file:
        csv.writer(file).writerows([header, *_click_rows(2000, seed=0)])
    with open(root / "clicks" / "valid.csv", "w", newline="") as file:
        csv.writer(file).writerows([header, *_click_rows(500, seed=1)])
    return "clicks/train-*.csv.gz", "clicks/valid.csv"


def _run(command: str, root: Path, env: Mapping[str, str]) -> Outcome:
    outcome = run_command(command, root, env)
    assert outcome.returncode == 0, outcome.describe()
    return outcome


def config_of_ctr_tiny(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """A config section: resolved over the ``ctr_tiny`` preset as a ``--config-file``."""
    (root / "model_bank.yaml").write_text(block.text)
    outcome = _run(f"{RECIPES} show ctr_tiny --config-file model_bank.yaml", root, env)
    for source in yaml.safe_load(block.text)["checkpoint"]["model_bank"]:
        assert f"path: {source['path']}" in outcome.output, outcome.output
    return [outcome]


def python_in_folder(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """Code that reads what the commands before it wrote: run as a script in the folder."""
    (root / "block.py").write_text(block.text)
    return [run_command(".venv/bin/python block.py", root, env)]


def optimizer_trains(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """A dense optimizer of one's own: its module imported by a preset whose config names it, as the block's
    comment says, and trained."""
    (root / "nesterov").mkdir()
    (root / "nesterov" / "nesterov.py").write_text(block.text)
    preset = {
        "ctr_nesterov": {
            "recipe": "ctr",
            "based_on": "ctr_tiny",
            "imports": ["nesterov"],
            "config": {"optimizer": {"name": "nesterov", "momentum": 0.95}, "trainer": {"max_num_steps": 3}},
        }
    }
    (root / "nesterov" / "recipes.yaml").write_text(yaml.safe_dump(preset))
    outcome = _run(f"{root}/{RECIPES} train ctr_nesterov -o out", root / "nesterov", env)
    config = yaml.safe_load((root / "nesterov" / "out" / "config.yaml").read_text())
    optimizer = config["config"]["optimizer"]
    assert (optimizer["name"], optimizer["momentum"]) == ("nesterov", 0.95), optimizer
    return [outcome]


def _installed_metadata(site: Path, name: str, block: Block) -> None:
    """In ``site``, the metadata an install of package ``name`` would write, with the block's entry points."""
    metadata = site / f"{name}-1.0.dist-info"
    metadata.mkdir(parents=True)
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    groups = tomllib.loads(block.text)["project"]["entry-points"]
    (metadata / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) for group, items in groups.items())
    )


def entry_points_list(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """A package's entry points, as the block declares them, found by ``list`` wherever it runs: the package on
    the path with its metadata (the entry points an install would write), not installed."""
    site = root / "site"
    package = site / "my_package"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    recipe = (EXAMPLES / "my_project" / "linreg.py").read_text()
    (package / "my_recipe.py").write_text(recipe.replace('@register_recipe("linreg"', '@register_recipe("my_recipe"'))
    presets = {"my_recipe_demo": {"recipe": "my_recipe", "description": "From my_package.", "config": {}}}
    (package / "presets.yaml").write_text(yaml.safe_dump(presets))
    _installed_metadata(site, "my_package", block)
    outcome = _run(f"{root}/{RECIPES} list", site, {**env, "PYTHONPATH": str(site)})
    assert re.search(r"^my_recipe_demo\s+my_recipe\s", outcome.output, re.MULTILINE), outcome.output
    return [outcome]


def preset_trains_on_its_files(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """A preset of the ``tabular`` recipe: listed and trained from a ``recipes.yaml`` of a folder of one's own, on
    files of the shape it declares (its ``/data/clicks`` paths given on the command line)."""
    folder = root / "my_clicks"
    folder.mkdir()
    (folder / "recipes.yaml").write_text(block.text)
    train, valid = _write_clicks(folder)
    limit = "trainer.max_num_steps=4 metrics.recorders.console=false"
    paths = f"dataset.train_path='{train}' dataset.valid_path={valid}"
    outcome = _run(f"{root}/{RECIPES} train my_clicks -o out {paths} {limit}", folder, env)
    return [outcome]


def two_tasks_train_and_predict(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """A preset of several labels, on the shipped MovieLens ratings: trained a few steps from a ``recipes.yaml`` of a
    folder of one's own, scored by its task's AUC, and predicted, a label and a score column per task."""
    folder = root / "two_tasks"
    folder.mkdir()
    (folder / "recipes.yaml").write_text(block.text)
    limit = "trainer.max_num_steps=4 trainer.validate_every_n_steps=4 metrics.recorders.console=false"
    trained = _run(f"{root}/{RECIPES} train movielens_two_tasks -o out {limit}", folder, env)
    predicted = _run(f"{root}/{RECIPES} predict out -o predictions.csv", folder, env)
    header = (folder / "predictions.csv").read_text().split("\n", 1)[0]
    assert header == '"liked_label","liked_score","rating_label","rating_score"', header
    assert "valid/liked/auc" in (folder / "out" / "config.yaml").read_text()
    return [trained, predicted]


def _num_buckets(config: dict[str, Any]) -> dict[str, int | None]:
    """Each hashed column's ``num_buckets`` (None: a hash table's full keys), vocabulary columns left out."""
    hashed = config["model"]["embeddings"]["kind"] == "hash"
    return {
        column: None if hashed else group["num_buckets"]
        for group in config["dataset"]["categorical"]
        if not group.get("vocabulary")
        for column in group["columns"]
    }


def ids_as_exported(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """The block's ``value_id`` of every text ``export`` writes beside the tables equals the id written there: a
    fixed-table run (``my_clicks``, of the getting-started page) and a hash-table run (``runs/kaggle_hash``, of the
    block's own page): pages the documents' order runs first."""
    namespace: dict[str, Any] = {}
    exec(compile(block.text, f"{block.file}:value_id", "exec"), namespace)
    value_id: Callable[[str, str, int | None], int] = namespace["value_id"]
    outcomes, checked = [], 0
    for folder, run, export in (
        (root / "my_clicks", "out", root / "exports" / "my_clicks"),
        (root, "runs/kaggle_hash", root / "exports" / "kaggle_hash"),
    ):
        outcomes.append(_run(f"{root}/{RECIPES} export {run} -o {export}", folder, env))
        buckets = _num_buckets(json.loads((export / "config.json").read_text())["config"])
        for table in json.loads((export / "model.json").read_text())["tables"].values():
            if table.get("values") is None:
                continue
            rows = pq.read_table(export / table["values"]).to_pylist()
            hashed = [row for row in rows if row["feature"] in buckets]
            wrong = [
                row for row in hashed if value_id(row["feature"], row["value"], buckets[row["feature"]]) != row["id"]
            ]
            assert wrong == [], f"{run}: the page's value_id gives other ids than export wrote: {wrong[:5]}"
            checked += len(hashed)
    assert checked > 1000, checked
    return outcomes


def dataset_section_of_movielens(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """Keys of the ``dataset`` section (the block is indented as in a preset): resolved under it, over the
    ``movielens_small`` preset, from a folder holding the files it names (the shipped MovieLens files)."""
    section = "dataset:\n" + "\n".join(line[2:] if line.strip() else line for line in block.text.splitlines())
    (root / "movielens_dataset.yaml").write_text(section)
    return [_run(f"{RECIPES} show movielens_small --config-file movielens_dataset.yaml", root, env)]


JSONL_IMPORTS = """import pyarrow.json

from recsys.tabular.formats import DATA_FORMATS, ArrowFormatConfig, ArrowReader, ColumnFormat


"""


def data_format_trains(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """A data format of one's own: the block, after the imports it uses, as a module a preset imports, and a run
    of the ``tabular`` recipe on JSON lines in that format."""
    folder = root / "jsonl"
    folder.mkdir()
    (folder / "readme_jsonl.py").write_text(JSONL_IMPORTS + block.text)
    rng = np.random.default_rng(0)
    for split, num_rows in (("train", 512), ("valid", 128)):
        items = rng.integers(0, 20, num_rows)
        lines = [json.dumps({"clicked": int(item % 2), "item": f"i{item}"}) for item in items]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    dataset = {
        "train_path": "train.jsonl",
        "valid_path": "valid.jsonl",
        "format": "jsonl",
        "label": {"column": "clicked"},
        "categorical": [{"columns": ["item"], "num_buckets": 100}],
        "batch_size": 64,
    }
    config = {"dataset": dataset, "model": {"name": "logistic_regression"}, "trainer": {"max_num_steps": 4}}
    preset = {"jsonl_demo": {"recipe": "tabular", "imports": ["readme_jsonl"], "config": config}}
    (folder / "recipes.yaml").write_text(yaml.safe_dump(preset))
    return [_run(f"{root}/{RECIPES} train jsonl_demo -o out metrics.recorders.console=false", folder, env)]


def plugin_entry_point(block: Block, root: Path, env: Mapping[str, str]) -> list[Outcome]:
    """The entry point of the plugin package's data format, as its ``pyproject.toml`` declares it (which
    ``test_plugin_package.py`` installs and trains with): found by ``show`` through it, the package on the path."""
    site = root / "plugin_site"
    _installed_metadata(site, "recipes_plugin_readme", block)
    plugin = Path(__file__).resolve().parent.parent / "plugin_package"
    overrides = "dataset.format=jsonl dataset.train_path=train.jsonl"
    outcome = _run(f"{RECIPES} show criteo_kaggle {overrides}", root, {**env, "PYTHONPATH": f"{site}:{plugin}"})
    assert "name: jsonl" in outcome.output, outcome.output
    return [outcome]


def tensorboard_tags(outcome: Outcome) -> dict[str, set[str]]:
    """The tags of each run, as the TensorBoard server answered them."""
    answered = outcome.answered["data/plugin/scalars/tags"]
    assert isinstance(answered, dict)
    return {run: set(tags) for run, tags in answered.items()}


def overlays_only_accuracy(root: Path, outcomes: list[Outcome]) -> None:
    """ "`tb/train` holds the loss curve, `tb/valid` the AUC ..., and only `accuracy` ... shows the two runs on one
    chart": TensorBoard's own answer."""
    tags = tensorboard_tags(outcomes[0])
    assert set(tags) == {"train", "valid"}
    assert "loss" in tags["train"] and "loss" not in tags["valid"]
    assert "auc" in tags["valid"] and "auc" not in tags["train"]
    assert tags["train"] & tags["valid"] == {"accuracy"}


def tutorial_trained(root: Path, outcomes: list[Outcome]) -> None:
    """The first tutorial's commands: the preset listed, trained with the overrides, and its charts served."""
    listed, _, served = outcomes
    assert re.search(r"^linreg_demo\s+linreg\s", listed.output, re.MULTILINE), listed.output
    config = yaml.safe_load((root / "my_project" / "out" / "config.yaml").read_text())["config"]
    assert (config["data"]["batch_size"], config["optimizer"]["lr"]) == (128, 0.02)
    tags = tensorboard_tags(served)
    assert "loss" in tags["train"] and "mse" in tags["valid"], tags  # "loss in tb/train, mse in tb/valid"


def windows_trained_then_stopped_while_waiting(root: Path, outcomes: list[Outcome]) -> None:
    """The following run trained both windows of ``my_preset``'s data, waited for the next, and the SIGTERM that
    stopped it there saved a checkpoint ("SIGTERM while waiting saves a checkpoint and exits 0")."""
    _, following = outcomes
    scored = [row["window"] for row in map(json.loads, (root / "runs/my_preset/metrics/window.jsonl").open())]
    assert scored == ["2026-11-27T14", "2026-11-27T15"], scored
    assert f"{WAITING_LINE} 2026-11-27T15" in following.output, following.output
    assert list((root / "runs/my_preset/checkpoints").glob("step_*")), following.output


AFTER: dict[str, Callable[[Path, list[Outcome]], None]] = {
    "docs/tutorials/online-training.md: ```bash .venv/bin/python -m recipes train movielens_online     # MovieLens "
    "in daily windows; TensorBoard run `window`": windows_trained_then_stopped_while_waiting,
    "README.md: ```bash .venv/bin/tensorboard --logdir runs/ctr_tiny/tb": overlays_only_accuracy,
    "docs/tutorials/your-own-model.md: ```bash cd my_project": tutorial_trained,
}


def importance_printout(block: Block, root: Path, outcomes: Mapping[str, list[Outcome]]) -> None:
    """The sample printout of ``importance``: the lines the command printed, with the same features, in the same
    layout (the numbers are this machine's)."""
    command = next(name for name in outcomes if "recipes importance runs/ctr_tiny" in name)
    printed = [line for line in outcomes[command][0].output.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(printed) if line.startswith("Permutation importance"))
    printed = printed[start : start + len(block.text.strip().splitlines())]
    shown = block.text.strip().splitlines()

    def layout(line: str) -> str:
        return re.sub(r"-?[\d,]+(\.\d+)?", "N", line)

    assert [layout(line) for line in printed] == [layout(line) for line in shown]
    assert sorted(line.split()[1] for line in printed[3:-1]) == sorted(line.split()[1] for line in shown[3:-1])


def synopsis_of_the_parser(block: Block, root: Path, outcomes: Mapping[str, list[Outcome]]) -> None:
    """The command-line synopsis: every command it names is one of the CLI's, with every option it shows."""
    from recipes.cli.main import build_parser

    parser = build_parser()
    subparsers = next(action for action in parser._actions if action.choices and isinstance(action.choices, dict))
    for line in block.text.strip().splitlines():
        words = shlex.split(line.replace("|", " ").replace("[", " ").replace("]", " ").replace("(", " "))
        assert words[:3] == ["python", "-m", "recipes"], line
        command = subparsers.choices[words[3]]
        options = {option for action in command._actions for option in action.option_strings}
        assert {word for word in words[4:] if word.startswith("-")} <= options, line


# A Slurm job of 2 nodes, as `srun` would see it.
SLURM = {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "42"}
SLURM_STAND_INS = 'srun() { printf "%s\\0" "$@" > srun.args; }\nscontrol() { printf "node1\\nnode2\\n"; }\n'


def srun_as_slurm_would(command: str, cwd: Path, env: Mapping[str, str]) -> Outcome:
    """``srun torchrun ...`` where there is no Slurm: through bash with a 2-node job's variables, and ``srun`` and
    ``scontrol`` as functions (the one writes what it would launch, the other names the nodes); torchrun's own
    parser reads the launch, and ``show`` resolves the config of the recipes command it starts."""
    from torch.distributed.run import parse_args

    from recipes.cli.main import build_parser

    launched = run_command(SLURM_STAND_INS + command, cwd, {**env, **SLURM})
    assert launched.returncode == 0, launched.describe()
    args = (cwd / "srun.args").read_text().split("\0")[:-1]
    assert args[0] == "torchrun", args
    torchrun = parse_args(args[1:])
    launch = (torchrun.nnodes, torchrun.nproc_per_node, torchrun.rdzv_backend, torchrun.rdzv_endpoint)
    assert launch == ("2", "8", "c10d", "node1:29500"), launch
    assert (torchrun.rdzv_id, torchrun.module, torchrun.training_script) == ("42", True, "recipes")
    job, overrides = build_parser().parse_known_args(torchrun.training_script_args)  # as the CLI parses them
    assert job.command == "train" and job.output_dir, torchrun.training_script_args
    shown = run_command(shlex.join([*RECIPES.split(), "show", job.preset, *job.args, *overrides]), cwd, env)
    return Outcome(command, shown.returncode, launched.output + shown.output, seconds=shown.seconds)
