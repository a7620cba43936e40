"""Every training path that works on the CPU, run on a device: one line per check, then ``gpu_paths: N of M passed``.

The unit and integration tests run on CPU (and the CUDA kernels under numba's simulator); a lent GPU
machine's time is short, so this runs the end-to-end paths there in a few minutes: fixed and hash
tables, with the train pipeline on and off, blocking and async saves; ``kill -9`` and a resume,
compared with an uninterrupted run tensor by tensor; ``eval``, ``predict`` and ``export-tables`` of a
run trained on the device; and a checkpoint written on the device resumed and evaluated on the CPU,
and one written on the CPU resumed on the device.

    python3 benchmarks/gpu_paths.py OUT_DIR [--device cuda] [--jobs 6] [--timeout 150] [--budget 240]

``OUT_DIR`` must be new or empty; each check keeps its processes' output in ``OUT_DIR/<check>.log``
and its runs under ``OUT_DIR/<check>/``. With ``--device cpu`` (a machine without a GPU) the
cross-device checks print ``SKIP`` and do not count. Exit 1 if any check failed.

Runs are tiny (``dlrm_criteo_tiny`` and ``_dynamic`` for 40 steps of 64 rows, a checkpoint every 10),
up to ``--jobs`` processes at once, each killed after ``--timeout`` seconds, and all once ``--budget`` is
spent, so that a hang is a failure, not a stuck script. Here on 2 cores:
``NUMBA_CACHE_DIR=$PWD/.numba_cache PYTHONPATH=$PWD/src .venv/bin/python benchmarks/gpu_paths.py OUT
--device cpu --jobs 2``; ``benchmarks/gpu_checks.sh`` runs it on the GPU.

Determinism: on the CPU a resumed run is bit-exact, and anything less fails. On a GPU the sparse
update kernel and the hash index are deterministic by design (see ``embedding/kernels/cuda.py`` and
``embedding/cuda_hash_index.py``), but torch's CUDA backward of ``embedding_bag`` and ``index_add_``
may add with atomics in a varying order; there a resume that is not bit-exact passes when the logged
losses agree to 1e-4 relative, and its line says which tensors differ and by how much.

The cross-device checks move a run as a user would: the same command with another
``trainer.device`` (a resumable change: checkpoints load to the CPU, then move).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

PRESETS = {"fixed": "dlrm_criteo_tiny", "hash": "dlrm_criteo_tiny_dynamic"}
STEPS = 40
EVERY = 10
SMALL_RUN = (
    f"trainer.max_num_steps={STEPS}",
    f"checkpoint.every_n_steps={EVERY}",
    "checkpoint.keep_last_n=null",  # every checkpoint kept: the checks count them
    "checkpoint.keep_best_n=null",
    "trainer.validate_every_n_steps=20",
    "trainer.publish_metrics_every_n_steps=5",
    "dataset.synthetic_rows=4000",
    "dataset.batch_size=64",
    "metrics.recorders.console=false",
    # Fixed, not "the cores free now": concurrent checks load the machine, and a different thread count would
    # change the CPU's float sums between two runs that must agree bit for bit.
    "gang.threads_per_rank=2",
)
# 300 rows for about 1000 values a feature: the hash tables fill within a few dozen steps, so eviction runs too.
KIND_OVERRIDES = {"fixed": (), "hash": ("dataset.num_embeddings_per_feature=[300]",)}
# Metrics that measure the clock, not the arithmetic: they differ between any two runs.
WALL_CLOCK = ("/metrics/throughput/",)
LOSS_RTOL = 1e-4
AUC_ATOL = 1e-3


@dataclass(frozen=True)
class Result:
    status: Literal["PASS", "FAIL", "SKIP"]
    detail: str


def passed(detail: str) -> Result:
    return Result("PASS", detail)


def failed(detail: str) -> Result:
    return Result("FAIL", detail)


class CheckFailed(Exception):
    """A check's failure, with its one-line detail."""


@dataclass
class Outcome:
    """How one process ended: its exit code (None: timed out) and the log its output went to."""

    returncode: int | None
    log: Path
    seconds: float
    killed: bool = False

    def require_ok(self, what: str) -> None:
        if self.returncode is None:
            raise CheckFailed(f"{what} timed out after {self.seconds:.0f} s ({self.log.name})")
        if self.returncode != 0:
            raise CheckFailed(f"{what} exited {self.returncode}: {last_error_line(self.log)}")


def last_error_line(log: Path) -> str:
    """The line that says what went wrong: the CLI's ``error: ...`` line, else the last exception or line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("$ ", "# gpu_paths: "))]
    for marks in (("error: ",), ("Error", "Exception", "Traceback")):
        hits = [line for line in lines if any(mark in line for mark in marks)]
        if hits:
            return hits[-1][:300]
    return lines[-1][:300] if lines else "(no output)"


# Processes ---------------------------------------------------------------------------------------


@dataclass
class Runner:
    """Runs ``python -m recipes ...`` in ``out``, at most ``jobs`` at once, each within ``timeout`` seconds and
    all before ``deadline`` (a ``time.monotonic()`` value)."""

    out: Path
    jobs: int
    timeout: float
    deadline: float
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._slots = threading.Semaphore(self.jobs)

    def _start(
        self, check: str, args: Sequence[str], env: Mapping[str, str] | None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.out / f"{check}.log"
        command = [sys.executable, "-m", "recipes", *args]
        with log.open("a") as file:
            extra = " ".join(f"{k}={v!r}" for k, v in (env or {}).items())
            file.write(f"$ {extra + ' ' if extra else ''}{' '.join(command)}\n")
            file.flush()
            process = subprocess.Popen(
                command,
                cwd=self.out,
                env={**self.env, **(env or {})},
                stdout=file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a kill reaches whatever it started
            )
        return process, log

    @staticmethod
    def _kill(process: subprocess.Popen[bytes], log: Path, why: str) -> None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        with log.open("a") as file:
            file.write(f"# gpu_paths: killed with SIGKILL {why}\n")

    def run(self, check: str, *args: str, env: Mapping[str, str] | None = None) -> Outcome:
        return self.run_until(check, args, None, env)

    def run_until(
        self,
        check: str,
        args: Sequence[str],
        kill_when: Callable[[], bool] | None,
        env: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Run to the end, or SIGKILL the process as soon as ``kill_when()`` holds (polled every 2 ms)."""
        with self._slots:
            started = time.monotonic()
            if started >= self.deadline:
                raise CheckFailed("not started: the script's --budget was spent")
            process, log = self._start(check, args, env)
            deadline = min(started + self.timeout, self.deadline)
            while process.poll() is None and time.monotonic() < deadline:
                if kill_when is not None and kill_when():
                    self._kill(process, log, "as asked")
                    return Outcome(process.returncode, log, time.monotonic() - started, killed=True)
                time.sleep(0.002 if kill_when is not None else 0.05)
            if process.poll() is None:  # a hang, or the budget spent: killed, and a failure
                self._kill(process, log, "on timeout")
                return Outcome(None, log, time.monotonic() - started)
            return Outcome(process.returncode, log, time.monotonic() - started)


# What a run leaves -------------------------------------------------------------------------------


def committed_steps(run: Path) -> list[int]:
    """The steps of the run's committed checkpoints, as the checkpoint store lists them."""
    from checkpoint.store import CheckpointStore

    try:
        return sorted(CheckpointStore(str(run / "checkpoints")).scan().committed)
    except (OSError, ValueError):  # a directory renamed while listed: ask again later
        return []


def checkpoint_state(run: Path, step: int) -> dict[str, Any]:
    """Every file of a checkpoint (shared parts and rank files), each checked against its SHA-256."""
    from checkpoint.loaded import read_file
    from checkpoint.store import CheckpointStore

    store = CheckpointStore(str(run / "checkpoints"))
    metadata = store.read_metadata(store.step_dir(step))
    return {name: read_file(store, metadata, name) for name in metadata.files}


def flatten(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from flatten(item, f"{path}/{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from flatten(item, f"{path}/{index}")
    else:
        yield path, value


def logged(run: Path, split: str) -> dict[int, dict[str, float]]:
    """``metrics/<split>.jsonl`` by step."""
    path = run / "metrics" / f"{split}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return {line["step"]: line for line in lines}


@dataclass
class StateDiff:
    num_tensors: int
    differing: list[str]  # tensors (and float values) whose bits differ
    max_abs: float  # over the differing floating-point ones
    mismatched: list[str]  # anything else: keys, shapes, dtypes, plain values other than floats


def compare_states(left: dict[str, Any], right: dict[str, Any]) -> StateDiff:
    import torch

    ours = {p: v for p, v in flatten(left) if not any(mark in p for mark in WALL_CLOCK)}
    theirs = {p: v for p, v in flatten(right) if not any(mark in p for mark in WALL_CLOCK)}
    mismatched = sorted(set(ours) ^ set(theirs))
    differing: list[str] = []
    max_abs = 0.0
    num_tensors = 0
    for path in sorted(set(ours) & set(theirs)):
        a, b = ours[path], theirs[path]
        if isinstance(a, float) and isinstance(b, float):  # a plain number computed in training: a score
            if a != b:
                differing.append(path)
                max_abs = max(max_abs, abs(a - b))
            continue
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if a != b:
                mismatched.append(path)
            continue
        num_tensors += 1
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            mismatched.append(path)
        elif a.numel() and not a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)):
            differing.append(path)
            if a.is_floating_point():
                max_abs = max(max_abs, (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item())
    return StateDiff(num_tensors, differing, max_abs, mismatched)


def max_loss_rdiff(left: Path, right: Path) -> tuple[float, int]:
    """The largest relative difference of the logged training losses at the steps both logged, and how many."""
    a, b = logged(left, "train"), logged(right, "train")
    steps = sorted(set(a) & set(b))
    diffs = [abs(a[s]["loss"] - b[s]["loss"]) / max(abs(a[s]["loss"]), 1e-12) for s in steps]
    return max(diffs, default=float("inf")), len(steps)


def short(paths: Sequence[str], n: int = 3) -> str:
    names = ", ".join(p.lstrip("/") for p in paths[:n])
    return names + (f" and {len(paths) - n} more" if len(paths) > n else "")


# The checks --------------------------------------------------------------------------------------


class Checks:
    """Each check a method returning its ``Result``; the ones that need another's run wait for its future."""

    def __init__(self, runner: Runner, device: str) -> None:
        self.runner = runner
        self.out = runner.out
        self.device = device
        self.trained: dict[str, Future[Result]] = {}

    def train_args(self, kind: str, run: Path, *extra: str) -> list[str]:
        return ["train", PRESETS[kind], "-o", str(run), *SMALL_RUN, *KIND_OVERRIDES[kind], *extra]

    def needs(self, check: str) -> Path:
        """The run of an earlier check, once it passed."""
        if self.trained[check].result().status != "PASS":
            raise CheckFailed(f"needs {check}, which failed")
        return self.out / check

    def device_check(self, check: str) -> Result:
        code = (
            "import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
        )
        log = self.out / f"{check}.log"
        result = subprocess.run(
            [sys.executable, "-c", code], env=self.runner.env, capture_output=True, text=True, timeout=120
        )
        log.write_text(result.stdout + result.stderr)
        words = result.stdout.split(maxsplit=1)
        if result.returncode != 0 or not words:
            return failed(f"torch did not import: {last_error_line(log)}")
        gpu = words[1].strip() if len(words) > 1 and words[1].strip() != "False" else ""
        if self.device == "cuda" and not gpu:
            return failed(f"torch {words[0]} sees no CUDA device")
        return passed(f"torch {words[0]} on {gpu or 'the CPU'}")

    def train(self, check: str, kind: str, pipeline: bool, async_save: bool, like: str | None = None) -> Result:
        """A run of 40 steps, checkpointed every 10; ``like``: a check whose run this one's final checkpoint is
        compared with, for the record only (the pipelined loop is the plain loop, bit for bit, on the CPU)."""
        run = self.out / check
        overrides = [f"trainer.device={self.device}", f"trainer.pipeline={str(pipeline).lower()}"]
        outcome = self.runner.run(
            check, *self.train_args(kind, run, *overrides, f"checkpoint.async_save={str(async_save).lower()}")
        )
        outcome.require_ok("train")
        steps = committed_steps(run)
        if len(steps) < 2 or steps[-1] != STEPS:
            raise CheckFailed(f"checkpoints of steps {steps}: expected at least 2, the last of step {STEPS}")
        loss = logged(run, "train")[STEPS]["loss"]
        auc = logged(run, "valid")[STEPS]["auc"]
        detail = f"checkpoints {steps}, loss {loss:.4f}, valid auc {auc:.4f} at step {STEPS} ({outcome.seconds:.0f} s)"
        if like is not None and self.trained[like].result().status == "PASS":
            diff = compare_states(checkpoint_state(self.out / like, STEPS), checkpoint_state(run, STEPS))
            same = not diff.differing and not diff.mismatched
            detail += f"; {'bit-exact with' if same else f'max |diff| {diff.max_abs:.3g} from'} {like}"
        return passed(detail)

    def kill_and_resume(self, check: str, kind: str, reference: str) -> Result:
        """The reference check's command, killed with SIGKILL at its first checkpoint, then run again."""
        run = self.out / check
        args = self.train_args(kind, run, f"trainer.device={self.device}", "trainer.pipeline=true")
        args += ["checkpoint.async_save=false"]
        first = self.runner.run_until(check, args, lambda: bool(committed_steps(run)))
        if not first.killed:
            first.require_ok("the run to kill")
            raise CheckFailed("the run ended before its first checkpoint was seen")
        killed_at = committed_steps(run)
        if not killed_at or killed_at[-1] >= STEPS:
            raise CheckFailed(f"killed with checkpoints {killed_at}: none, or the last, so nothing to resume")
        second = self.runner.run(check, *args)
        second.require_ok("the resumed run")
        if "Resumed from the checkpoint of step" not in (run / "logs" / "rank_0.log").read_text():
            raise CheckFailed("the second run did not say it resumed")
        diff = compare_states(checkpoint_state(self.needs(reference), STEPS), checkpoint_state(run, STEPS))
        where = f"killed at step {killed_at[-1]}, resumed to {STEPS}"
        if diff.mismatched:
            raise CheckFailed(f"{where}; the checkpoints differ in more than values: {short(diff.mismatched)}")
        if not diff.differing:
            return passed(f"bit-exact: {diff.num_tensors} tensors equal the uninterrupted run's ({where})")
        rdiff, num_steps = max_loss_rdiff(self.out / reference, run)
        summary = (
            f"not bit-exact: {len(diff.differing)} of {diff.num_tensors} tensors differ, max |diff| "
            f"{diff.max_abs:.3g} ({short(diff.differing)}); losses differ by {rdiff:.2g} relative at most "
            f"over {num_steps} logged steps ({where})"
        )
        if self.device == "cpu":
            return failed(summary + "; the CPU kernels are deterministic, so a resume must be bit-exact")
        if rdiff <= LOSS_RTOL:
            return passed(summary + f", within {LOSS_RTOL:g}: CUDA backward atomics add in a varying order")
        return failed(summary + f", beyond {LOSS_RTOL:g}")

    def evaluate(self, check: str, trained: str) -> Result:
        """``eval --checkpoint last`` of a run: its AUC must be the run's own last validation's."""
        run = self.needs(trained)
        outcome = self.runner.run(check, "eval", str(run), "--checkpoint", "last")
        outcome.require_ok("eval")
        return passed(self.eval_agrees(outcome.log, run, STEPS) + f" ({outcome.seconds:.0f} s)")

    @staticmethod
    def eval_agrees(log: Path, run: Path, step: int) -> str:
        lines = [line for line in log.read_text().splitlines() if line.startswith("valid: ")]
        if not lines:
            raise CheckFailed("eval printed no `valid: ...` line")
        metrics = dict(word.split("=", 1) for word in lines[-1].removeprefix("valid: ").split())
        auc, validated = float(metrics["auc"]), logged(run, "valid")[step]["auc"]
        if abs(auc - validated) > AUC_ATOL:
            raise CheckFailed(f"eval auc {auc:.6f}, but the validation of step {step} scored {validated:.6f}")
        return f"auc {auc:.6f}, the validation of step {step}: {validated:.6f}"

    def predict(self, check: str, trained: str) -> Result:
        import pyarrow.parquet as pq

        run = self.needs(trained)
        path = self.out / f"{check}.parquet"
        outcome = self.runner.run(check, "predict", str(run), "--checkpoint", "last", "-o", str(path))
        outcome.require_ok("predict")
        if not path.exists():
            raise CheckFailed(f"predict wrote no {path.name}")
        table = pq.read_table(path)
        if table.num_rows == 0 or "score" not in table.column_names:
            raise CheckFailed(f"{path.name} has {table.num_rows} rows, columns {table.column_names}")
        return passed(f"{table.num_rows} rows, columns {table.column_names} ({outcome.seconds:.0f} s)")

    def export_tables(self, check: str, trained: str) -> Result:
        import pyarrow.parquet as pq

        run = self.needs(trained)
        folder = self.out / check
        outcome = self.runner.run(check, "export-tables", str(run), "--checkpoint", "last", "-o", str(folder))
        outcome.require_ok("export-tables")
        files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
        if len(files) != 26:
            raise CheckFailed(f"{len(files)} parquet files in {folder.name}, expected 26 (C1-C26)")
        rows = [pq.ParquetFile(f).metadata.num_rows for f in files]
        if min(rows) == 0:
            raise CheckFailed(f"{files[rows.index(0)].name} holds no row")
        return passed(f"{len(files)} tables, {min(rows)} to {max(rows)} ids each ({outcome.seconds:.0f} s)")

    def to_cpu(self, check: str, kind: str) -> Result:
        """Trained on the device; evaluated with trainer.device=cpu, then resumed on the CPU."""
        return self.moved(check, kind, self.device, "cpu")

    def to_device(self, check: str, kind: str) -> Result:
        """Trained on the CPU; resumed on the device, then evaluated there."""
        return self.moved(check, kind, "cpu", self.device)

    def moved(self, check: str, kind: str, first: str, then: str) -> Result:
        """20 steps on ``first``; eval on ``then`` (the same AUC as the run's validation), then
        the run resumed on ``then`` to its end."""
        if self.device == "cpu":
            return Result("SKIP", "a cross-device check, with --device cpu")
        run = self.out / check
        start = self.train_args(kind, run, f"trainer.device={first}", "trainer.max_num_steps=20")
        self.runner.run(check, *start).require_ok(f"train on {first}")
        evaluated = self.runner.run(check, "eval", str(run), "--checkpoint", "last", f"trainer.device={then}")
        evaluated.require_ok(f"eval on {then}")
        agrees = self.eval_agrees(evaluated.log, run, 20)
        self.runner.run(check, *self.train_args(kind, run, f"trainer.device={then}")).require_ok(f"resume on {then}")
        return passed(f"eval on {then}: {agrees}; {self.resumed(run, 20)} on {then}")

    @staticmethod
    def resumed(run: Path, step: int) -> str:
        if f"Resumed from the checkpoint of step {step}." not in (run / "logs" / "rank_0.log").read_text():
            raise CheckFailed(f"the second run did not resume from step {step}")
        steps = committed_steps(run)
        if not steps or steps[-1] != STEPS:
            raise CheckFailed(f"after the resume, checkpoints {steps}; expected the last of step {STEPS}")
        loss = logged(run, "train")[STEPS]["loss"]
        return f"resumed from step {step} to {STEPS} (loss {loss:.4f})"


def plan(checks: Checks) -> dict[str, Callable[[], Result]]:
    """Every check by name, in the order they start: the runs others need and the long chains first."""
    planned: dict[str, Callable[[], Result]] = {"device": partial(checks.device_check, "device")}
    reference = {kind: f"train_{kind}_pipeline_blocking" for kind in PRESETS}
    for kind in PRESETS:
        planned[reference[kind]] = partial(checks.train, reference[kind], kind, pipeline=True, async_save=False)
    for kind in PRESETS:
        planned[f"kill9_resume_{kind}"] = partial(checks.kill_and_resume, f"kill9_resume_{kind}", kind, reference[kind])
        planned[f"to_cpu_{kind}"] = partial(checks.to_cpu, f"to_cpu_{kind}", kind)
        planned[f"to_device_{kind}"] = partial(checks.to_device, f"to_device_{kind}", kind)
    for kind in PRESETS:
        name = f"train_{kind}_nopipeline_async"
        planned[name] = partial(checks.train, name, kind, pipeline=False, async_save=True, like=reference[kind])
    for kind in PRESETS:
        planned[f"eval_{kind}"] = partial(checks.evaluate, f"eval_{kind}", reference[kind])
        planned[f"predict_{kind}"] = partial(checks.predict, f"predict_{kind}", reference[kind])
        planned[f"export_tables_{kind}"] = partial(checks.export_tables, f"export_tables_{kind}", reference[kind])
    return planned


def guarded(check: Callable[[], Result]) -> Result:
    try:
        return check()
    except CheckFailed as ex:
        return failed(str(ex))
    except Exception as ex:  # a bug here or an unexpected file: still one line, and the others go on
        return failed(f"{type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}")


def ensure_installed(out: Path, env: Mapping[str, str]) -> Result:
    """The built-in recipes are found through the project's entry points: install it in editable mode if
    nothing has (as ``benchmarks/gpu_checks.sh`` does later)."""
    if "dlrm" in {ep.name for ep in importlib.metadata.entry_points(group="recipes.recipes")}:
        return passed("the project's entry points are installed")
    log = out / "setup.log"
    with log.open("w") as file:
        code = subprocess.call(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(ROOT)],
            stdout=file,
            stderr=subprocess.STDOUT,
            env=dict(env),
            timeout=180,
        )
    if code != 0:
        return failed(f"pip install -e exited {code}: {last_error_line(log)}")
    return passed("installed the project in editable mode (its entry points were missing)")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    # After what is there already (a numpy wheel put first, as docs/benchmarks.md, "On a GPU", says, stays first).
    env["PYTHONPATH"] = os.pathsep.join(paths if str(SRC) in paths else [*paths, str(SRC)])
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", PYTHONUNBUFFERED="1")
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a new or empty folder for the runs and logs")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--jobs", type=int, default=6, help="processes at once")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds each process may run")
    parser.add_argument("--budget", type=float, default=240.0, help="seconds all checks may take together")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    out: Path = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} must be new or empty: runs left there would be resumed")
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(SRC))

    env = child_env()
    setup = ensure_installed(out, env)
    results: dict[str, Result] = {"setup": setup}
    print(f"{setup.status} setup: {setup.detail}", flush=True)
    if setup.status == "PASS":
        importlib.invalidate_caches()
        checks = Checks(Runner(out, args.jobs, args.timeout, deadline, env), args.device)
        planned = plan(checks)
        with ThreadPoolExecutor(max_workers=len(planned)) as pool:  # threads wait; the runner bounds processes
            futures: dict[str, Future[Result]] = {}
            for name, check in planned.items():  # a check's dependencies are submitted before it
                futures[name] = checks.trained[name] = pool.submit(guarded, check)
            for future in as_completed(futures.values()):
                name = next(n for n, f in futures.items() if f is future)
                results[name] = future.result()
                print(f"{results[name].status} {name}: {results[name].detail}", flush=True)

    counted = [r for r in results.values() if r.status != "SKIP"]
    num_passed = sum(r.status == "PASS" for r in counted)
    print(f"gpu_paths: {num_passed} of {len(counted)} passed", flush=True)
    return 0 if num_passed == len(counted) else 1


if __name__ == "__main__":
    sys.exit(main())
