"""``python -m recipes``: list, show, train, sweep, evaluate and predict with presets; rank a run's features by
permutation importance; export a run's tables, or the whole model for serving.

Exit codes: 0 success, 2 a user error (one line, no traceback), 1 a runtime failure (one line
with the cause; the traceback goes to the rank's log file), 130 interrupted by Ctrl-C (after
saving a checkpoint when training had started).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Sequence

from recipes.cli.job_spec import JobSpec, default_output_dir
from recipes.cli.launch import EXIT_INTERRUPTED, die_with_launcher, launch_with_torchrun, report_rank_error
from recipes.errors import TrainingInterrupted, UserError

# The framework is imported by the command that needs it, not here: the launcher of `train --nproc N`, which only
# starts the ranks, took a second and a half of CPU to import what it never ran, at every launch.

log = logging.getLogger(__name__)


def is_user_error(ex: Exception) -> bool:
    """A mistake in what the user asked for or gave: a bad preset, key, value, path, checkpoint or id.
    A slice column whose values the ranks' data only together show to be too many is found at a validation."""
    if isinstance(ex, UserError):
        return True
    from checkpoint import CheckpointError
    from embedding import EmbeddingConfigError, ShardedStateError, SparseFeatureError
    from units import TooManySlicesError

    return isinstance(
        ex, (CheckpointError, EmbeddingConfigError, ShardedStateError, SparseFeatureError, TooManySlicesError)
    )


EXIT_USER_ERROR = 2
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 like every other user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see --help)")


CHECKPOINT_HELP = "which checkpoint: auto (default: the best scored one if any, else the last), last, best, or a step"


def _job_arguments(parser: argparse.ArgumentParser, with_output: bool) -> None:
    parser.add_argument("preset", help="a preset name (see `list`) or the path of a preset YAML file")
    help_text = "OUTPUT_DIR and/or overrides `section.key=value`" if with_output else "overrides `section.key=value`"
    parser.add_argument("args", nargs="*", metavar="ARG", help=help_text)
    if with_output:
        parser.add_argument("-o", "--output-dir", help="where the run writes (default: runs/<preset>)")
    parser.add_argument(
        "--config-file",
        action="append",
        default=[],
        metavar="F",
        help="a YAML config file; repeatable, later wins",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override; repeatable (values are YAML)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="recipes", description="Train and evaluate recipe presets.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser("list", help="list presets with their recipe and description")
    show = commands.add_parser("show", help="print a preset's resolved config as YAML")
    _job_arguments(show, with_output=False)
    train_parser = commands.add_parser("train", help="train a preset")
    _job_arguments(train_parser, with_output=True)
    train_parser.add_argument(
        "--nproc", type=int, default=None, help="run N processes on this machine through torchrun's launcher"
    )
    sweep_parser = commands.add_parser(
        "sweep", help="search a preset's hyper-parameters: trials as runs under one folder"
    )
    _job_arguments(sweep_parser, with_output=True)
    sweep_parser.add_argument("--trials", type=int, required=True, help="how many trials the study holds when done")
    sweep_parser.add_argument("--parallel", type=int, default=1, help="trials at a time, the cores split (default 1)")
    sweep_parser.add_argument("--space", metavar="FILE", help="a YAML space (default: the preset's `sweep:`)")
    sweep_parser.add_argument("--storage", metavar="URL", help="an Optuna database URL (default: DIR/study.db)")
    sweep_parser.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    _prune_after(sweep_parser)
    trial_parser = commands.add_parser("sweep-trial", help="one trial of a sweep (`sweep` starts it)")
    _job_arguments(trial_parser, with_output=True)
    trial_parser.add_argument("--storage", required=True, metavar="URL", help="the study's Optuna database URL")
    trial_parser.add_argument("--study", required=True, metavar="NAME", help="the study's name")
    trial_parser.add_argument("--trial-id", type=int, required=True, help="the trial's id in the storage")
    _prune_after(trial_parser)
    eval_parser = commands.add_parser("eval", help="score a checkpoint of a run on a split of its data")
    predict_parser = commands.add_parser("predict", help="write a checkpoint's predictions for every row of a split")
    importance_parser = commands.add_parser(
        "importance", help="rank the features of a split by how much a checkpoint's AUC drops when they are shuffled"
    )
    _scoring_arguments(eval_parser, "eval")
    _scoring_arguments(predict_parser, "predict")
    _scoring_arguments(importance_parser, "importance")
    importance_parser.add_argument(
        "--seed", type=int, default=0, help="the seed of the permutations (default 0): the same seed, the same table"
    )
    checkpoints = commands.add_parser("checkpoints", help="list the checkpoints of an output directory")
    checkpoints.add_argument("output_dir", metavar="OUTPUT_DIR")
    serving = commands.add_parser("export", help="write a checkpoint for serving: dense program, tables, schema")
    serving.add_argument("output_dir", metavar="OUTPUT_DIR", help="a run's output directory")
    serving.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    serving.add_argument("-o", "--output", required=True, metavar="DIR", help="a new or empty folder")
    serving.add_argument("--since", metavar="STEP", help="only the rows changed since this checkpoint, and evictions")
    serving.add_argument(
        "--no-values",
        dest="values",
        action="store_false",
        help="leave out the texts behind the ids (which take a pass over the training files)",
    )
    serving.add_argument(
        "--dtype",
        choices=["float32", "int8", "int4"],
        default="float32",
        help="the tables' rows: float32 (default), or int8 or int4 quantised row-wise with an fp16 scale and bias",
    )
    export = commands.add_parser("export-tables", help="write a checkpoint's sparse tables as Parquet files")
    export.add_argument("output_dir", metavar="OUTPUT_DIR", help="a run's output directory")
    export.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    export.add_argument("-o", "--output", required=True, metavar="DIR", help="a new folder: one <table>.parquet each")
    return parser


def _prune_after(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prune-after",
        type=int,
        default=5,
        metavar="N",
        help="prune trials below the median once N trials have completed (default 5)",
    )


def _scoring_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """``eval``, ``predict`` and ``importance`` share one signature: a run's OUTPUT_DIR (its config.yaml names the
    recipe), or ``PRESET OUTPUT_DIR``; then the checkpoint, the split and overrides. ``-o`` is the predictions'
    file, the importance table's, or (for ``eval``) the run's output directory after a PRESET."""
    parser.add_argument("preset", metavar="OUTPUT_DIR|PRESET", help="a run's output directory, or a preset name/file")
    parser.add_argument("args", nargs="*", metavar="ARG", help="OUTPUT_DIR (after a PRESET) and/or overrides")
    if command == "predict":
        parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the predictions: .csv or .parquet")
    elif command == "importance":
        parser.add_argument("-o", "--output", metavar="FILE", help="also write the table: .csv or .parquet")
    else:
        parser.add_argument("-o", "--output-dir", help="the run's output directory (after a PRESET)")
    parser.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    parser.add_argument("--split", default="valid", help="which data: valid (default), or a split such as test")
    parser.add_argument("--config-file", action="append", default=[], metavar="F", help="a YAML config file")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="an override")
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        # `importance` takes it only to refuse it in a line of its own.
        help=argparse.SUPPRESS if command == "importance" else "run N processes through torchrun's launcher",
    )


def _scoring_spec(args: argparse.Namespace) -> JobSpec:
    """The job of ``eval``/``predict``: ``OUTPUT_DIR`` alone stands for its own ``config.yaml``."""
    target = args.preset
    if os.path.isfile(os.path.join(target, "config.yaml")):
        overrides = [a for a in args.args if "=" in a]
        extra = [a for a in args.args if "=" not in a] + list(filter(None, [getattr(args, "output_dir", None)]))
        if extra:
            raise UserError(f"{target} is a run's output directory; give no other one, but got {extra}.")
        return JobSpec(os.path.join(target, "config.yaml"), target, args.config_file, [*overrides, *args.config])
    if os.path.isdir(target) or (os.sep in target and not target.endswith((".yaml", ".yml"))):
        why = "it has no config.yaml" if os.path.isdir(target) else "it does not exist"
        raise UserError(f"{target} must be a run's output directory (or a preset), but is not: {why}.")
    spec = _job_spec(args, with_output=True)
    _check_output_dir(spec)
    return spec


def _job_spec(args: argparse.Namespace, with_output: bool) -> JobSpec:
    overrides = [a for a in args.args if "=" in a]
    positional = [a for a in args.args if "=" not in a]
    output_dir = getattr(args, "output_dir", None)
    if with_output and positional:
        if output_dir is not None or len(positional) > 1:
            raise UserError(f"Give one output directory, but got {[*positional, *filter(None, [output_dir])]}.")
        output_dir = positional[0]
    elif positional:
        raise UserError(f"Overrides must look like `section.key=value`, but got '{positional[0]}'.")
    if output_dir is not None and not output_dir.strip():
        raise UserError(
            "The output directory must be a path, but is empty: give one, or leave `-o` out for runs/PRESET."
        )
    return JobSpec(args.preset, output_dir, args.config_file, [*overrides, *args.config])


def _list() -> None:
    from recipes.config.presets import all_presets

    presets = all_presets()
    width = max((len(name) for name in presets), default=0)
    for name, preset in sorted(presets.items()):
        recipe = preset.recipe or f"(from {preset.based_on})"
        print(f"{name:<{width}}  {recipe:<10}  {preset.description}")


def _show(spec: JobSpec) -> None:
    from recipes.cli.job import config_document, resolve_job
    from recipes.config.resolution import dump_yaml

    print(dump_yaml(config_document(resolve_job(spec))), end="")


def _check_output_dir(spec: JobSpec) -> None:
    """Refuse an output directory that is a file, or lies under one, before anything is written:
    later it would fail deep inside logging or a checkpoint save, with a traceback."""
    output_dir = default_output_dir(spec)
    path = os.path.abspath(output_dir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if os.path.exists(path) and not os.path.isdir(path):
        where = "is a file" if path == os.path.abspath(output_dir) else f"lies under the file {path}"
        raise UserError(f"The output directory {output_dir} must be a directory or not exist yet, but {where}.")


def _train(spec: JobSpec) -> None:
    from recipes.cli.train import train

    output_dir = train(spec)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"Done. TensorBoard logs: {output_dir}/tb")
        print(f"Browse them with: tensorboard --logdir {output_dir}/tb")


def _sweep(args: argparse.Namespace) -> None:
    from recipes.cli.sweep import SweepRequest, sweep

    spec = _job_spec(args, with_output=True)
    _check_output_dir(spec)
    request = SweepRequest(spec, args.trials, args.parallel, args.space, args.storage, args.seed, args.prune_after)
    for line in sweep(request):
        print(line)


def _sweep_trial(args: argparse.Namespace) -> None:
    from recipes.cli.sweep_trial import run_trial

    run_trial(_job_spec(args, with_output=True), args.storage, args.study, args.trial_id, args.prune_after)


def _score(args: argparse.Namespace) -> None:
    from recipes.cli.scoring import score

    predictions = getattr(args, "output", None)
    results = score(_scoring_spec(args), args.checkpoint, args.split, predictions)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    for name, values in results.items():
        label = name if args.split == "valid" else args.split
        print(f"{label}: " + " ".join(f"{metric}={value:.6g}" for metric, value in values.items()))
    if predictions is not None:
        print(f"Wrote the predictions for every row of the {args.split} split to {predictions}.")


def _importance(args: argparse.Namespace) -> None:
    from recipes.cli.importance import format_table, importance

    report = importance(_scoring_spec(args), args.checkpoint, args.split, args.seed, args.output)
    print(format_table(report))
    if args.output is not None:
        print(f"Wrote the table to {args.output}.")


def _checkpoints(output_dir: str) -> None:
    from recipes.cli.job import list_checkpoints

    infos = list_checkpoints(output_dir)
    if not infos:
        print(f"No checkpoints in {output_dir}.")
        return
    print(f"{'step':>8}  {'score':>10}  {'size':>10}  {'resumable':<9}  kept by")
    for info in infos:
        score = "-" if info.score is None else f"{info.score:.6g}"
        kept = ", ".join(info.kept_by) or "(deleted at the next save)"
        if info.damage is not None:
            name = os.path.basename(info.path)
            where = f"moved aside to {name}" if ".damaged" in name else "moved aside at the next train"
            kept = f"DAMAGED, never used ({where}): {info.damage}"
        best = "  <- best" if info.is_best else ""
        size = f"{info.size_bytes / 1e6:.1f} MB"
        print(f"{info.step:>8}  {score:>10}  {size:>10}  {'yes' if info.resumable else 'no':<9}  {kept}{best}")


def _export_tables(args: argparse.Namespace) -> None:
    from recipes.cli.export_tables import export_tables

    for table in export_tables(args.output_dir, args.checkpoint, args.output):
        print(f"{table.name}: {table.num_rows:,} rows x {table.dim} -> {table.path}")


def _export(args: argparse.Namespace) -> None:
    from recipes.cli.export import export

    summary = export(args.output_dir, args.checkpoint, args.output, args.since, values=args.values, dtype=args.dtype)
    what = "full" if summary.since is None else f"delta since step {summary.since}"
    print(
        f"Exported step {summary.step} ({what}, {summary.dtype} tables) to {args.output}: "
        f"{summary.num_bytes / 1e6:.2f} MB"
    )
    print(f"  dense part: {summary.program}")
    for name, rows in summary.rows.items():
        evicted = f", {summary.evicted[name]:,} evicted" if name in summary.evicted else ""
        values = f", values of {summary.values[name]:,} ids" if name in summary.values else ""
        print(f"  {name}: {rows:,} rows{evicted}{values}")


def _quiet_tracebacks() -> None:
    """Keep tracebacks off the terminal, where an error is one line: before the rank's log file is set up,
    records go nowhere (Python's last-resort handler would print them); a thread's uncaught exception goes to
    the log (the main thread then meets it and says it in a line); a record that cannot be written (a full
    disk) is dropped rather than printed with a traceback."""
    root = logging.getLogger()
    if not any(isinstance(handler, logging.NullHandler) for handler in root.handlers):
        root.addHandler(logging.NullHandler())
    logging.raiseExceptions = False
    threading.excepthook = _log_thread_exception


def _log_thread_exception(hook: threading.ExceptHookArgs) -> None:
    if hook.exc_type is SystemExit:
        return
    thread = hook.thread.name if hook.thread is not None else "a thread"
    log.error("Thread %s failed: %s: %s", thread, hook.exc_type.__name__, hook.exc_value, exc_info=hook.exc_value)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    die_with_launcher()
    _quiet_tracebacks()
    try:
        parser = build_parser()
        # Overrides may come after options (`-o DIR a.b=1`), which argparse leaves over.
        args, extra = parser.parse_known_args(argv)
        unknown = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "args")]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if hasattr(args, "args"):
            args.args += extra
        if args.command == "list":
            _list()
        elif args.command == "show":
            _show(_job_spec(args, with_output=False))
        elif args.command == "importance" and args.nproc is not None:
            raise UserError(
                "`importance` permutes each feature across all the split's rows, which one process holds, so "
                f"`--nproc` must be left out, but is {args.nproc}."
            )
        elif getattr(args, "nproc", None) is not None:
            if args.command == "train":
                _check_output_dir(_job_spec(args, with_output=True))
            return launch_with_torchrun(args.nproc, argv)
        elif args.command == "train":
            spec = _job_spec(args, with_output=True)
            _check_output_dir(spec)
            _train(spec)
        elif args.command == "sweep":
            _sweep(args)
        elif args.command == "sweep-trial":
            _sweep_trial(args)
        elif args.command in ("eval", "predict"):
            _score(args)
        elif args.command == "importance":
            _importance(args)
        elif args.command == "checkpoints":
            _checkpoints(args.output_dir)
        elif args.command == "export":
            _export(args)
        elif args.command == "export-tables":
            _export_tables(args)
        return 0
    except TrainingInterrupted as ex:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {ex}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        if int(os.environ.get("RANK", "0")) == 0:
            print("error: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as ex:
        if is_user_error(ex):
            _report(f"error: {ex}")
            return EXIT_USER_ERROR
        log.exception("The job failed.")
        _report(f"error: {type(ex).__name__}: {ex}")
        return EXIT_FAILURE


def _report(line: str) -> None:
    """The one line of a failed command: for the launcher to say once in a rank it launched, else on stderr."""
    if not report_rank_error(line):
        print(line, file=sys.stderr)
