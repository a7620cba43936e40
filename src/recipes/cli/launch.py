"""``train --nproc N``: the same command on N local processes, launched by torchrun's own launcher.

torchrun starts each rank in a session of its own, so what happens to the launcher does not
reach the ranks by itself. Two things make the ranks follow it:

- Signals: SIGINT (Ctrl-C) and SIGTERM to the launcher go on to every rank, which finishes its
  step, commits a checkpoint and exits (130 and 0); the launcher waits for them, at most
  ``STOP_GRACE_S``, and exits with their code. torchrun would forward the signal too, but then
  it raises, dropping the ranks' exit codes, and kills them after 30 s, which a large
  checkpoint may need. SIGHUP (the terminal closing) and SIGQUIT stay torchrun's: the ranks are
  stopped at once, without saving (a launcher started under ``nohup`` keeps ignoring SIGHUP).
- Death: a launcher killed outright (``kill -9``) can forward nothing, so each rank asks the
  kernel at start-up to kill it when its launcher dies (``die_with_launcher``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import get_args_parser, run

from recipes.errors import UserError

EXIT_USER_ERROR = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

# How long the launcher waits for its ranks to save and exit after it forwarded SIGINT or
# SIGTERM, before it kills them; the default of ``gang.timeout_s``, which bounds the collectives
# of the save too. A second Ctrl-C makes the ranks exit at once.
STOP_GRACE_S = 300.0

# The launcher's pid, in the ranks' environment: the parent each rank must die with.
LAUNCHER_PID_ENV = "RECIPES_LAUNCHER_PID"

# A folder of the launcher's, in the ranks' environment: a rank that fails writes its one-line error there
# (``rank_K.txt``) for the launcher to say once, rather than every rank printing the same line.
ERROR_DIR_ENV = "RECIPES_ERROR_DIR"

_PR_SET_PDEATHSIG = 1  # From <linux/prctl.h>.


def without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--nproc N`` / ``--nproc=N``, which the launched ranks must not see."""
    result: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            result.append(arg)
    return result


def launch_with_torchrun(nproc: int, argv: Sequence[str], grace_s: float = STOP_GRACE_S) -> int:
    """Run ``python -m recipes <argv>`` as ``torchrun --standalone --nproc-per-node N``.

    Returns the exit code: the ranks' 130 after Ctrl-C, 2 if a rank failed with a user error,
    1 for any other failure, 128 + the signal when SIGHUP or SIGQUIT stopped the launcher.
    """
    if nproc < 1:
        raise UserError(f"`--nproc` must be >= 1, but is {nproc} instead.")
    parser = get_args_parser()
    # torchrun's own handling of the stop signals gives way to the forwarder where torchrun can
    # be told so (its ``--signals-to-handle``, in recent torch); SIGHUP is left ignored when it was (``nohup``).
    can_choose = any("--signals-to-handle" in action.option_strings for action in parser._actions)
    forwarder = _StopForwarder(grace_s, enabled=can_choose and os.path.isdir("/proc/self"))
    options = []
    if forwarder.enabled:
        handled = ["SIGQUIT"] + ([] if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else ["SIGHUP"])
        options.append(f"--signals-to-handle={','.join(handled)}")
    command = ["-m", "recipes", *without_nproc(argv)]
    args = parser.parse_args(["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0", *options, *command])
    error_dir = tempfile.mkdtemp(prefix="recipes-errors-")
    try:
        with _launcher_environment(error_dir), forwarder, _quiet_torchrun_logs():
            run(args)
    except ChildFailedError as ex:
        return _failure_exit_code(ex, forwarder, _rank_errors(error_dir))
    except SignalException as ex:
        _say(f"error: the launcher got {ex.sigval.name}; its ranks were stopped.")
        return 128 + int(ex.sigval)
    finally:
        shutil.rmtree(error_dir, ignore_errors=True)
    return 0


def report_rank_error(line: str) -> bool:
    """In a rank of ``launch_with_torchrun``: leave the rank's one-line error for the launcher to say (``True``);
    ``False`` elsewhere, where the caller prints it."""
    error_dir, rank = os.environ.get(ERROR_DIR_ENV), os.environ.get("RANK")
    if error_dir is None or rank is None:
        return False
    try:
        with open(os.path.join(error_dir, f"rank_{int(rank)}.txt"), "w") as file:
            file.write(line)
    except OSError:
        return False
    return True


def _rank_errors(error_dir: str) -> list[str]:
    """The ranks' error lines, each said once, in rank order."""
    lines: list[str] = []
    for name in sorted(os.listdir(error_dir), key=lambda name: int(name[5:-4])):
        with open(os.path.join(error_dir, name)) as file:
            lines.append(file.read().strip())
    return list(dict.fromkeys(line for line in lines if line))


def _failure_exit_code(error: ChildFailedError, forwarder: _StopForwarder, rank_errors: list[str]) -> int:
    codes = {failure.exitcode for failure in error.failures.values()}
    if forwarder.killed:
        _say(
            f"error: the ranks did not save and exit within {forwarder.grace_s:g} s of "
            f"{signal.Signals(forwarder.received or signal.SIGINT).name}, so they were killed; "
            "the last committed checkpoint is intact."
        )
        return EXIT_FAILURE
    # After Ctrl-C: the ranks that saw it exit 130, having said so; torchrun ends any rank
    # still closing down with SIGTERM; a rank interrupted before it could catch SIGINT died of it.
    if forwarder.received == signal.SIGINT and codes <= {EXIT_INTERRUPTED, -signal.SIGINT, -signal.SIGTERM}:
        if EXIT_INTERRUPTED not in codes:
            _say("error: interrupted before training started; nothing was saved.")
        return EXIT_INTERRUPTED
    # A rank that died of a signal said nothing, and its death is the cause of the others' errors: it comes first.
    signalled = any(failure.exitcode < 0 for failure in _causes(error))
    if signalled or not rank_errors:
        _say(f"error: {describe_failures(error)}")
    for line in rank_errors:
        _say(line)
    return EXIT_USER_ERROR if EXIT_USER_ERROR in codes else EXIT_FAILURE


def _causes(error: ChildFailedError) -> list[ProcessFailure]:
    """The failures less the ranks that torchrun itself stopped with SIGTERM once a peer had exited with an error,
    which are its doing, not a cause: a rank that exits with its error line leaves the others to that SIGTERM."""
    failures = list(error.failures.values())
    exited = [failure.timestamp for failure in failures if failure.exitcode > 0]
    if not exited:
        return failures
    return [f for f in failures if f.exitcode != -signal.SIGTERM or f.timestamp < min(exited)]


@contextlib.contextmanager
def _quiet_torchrun_logs() -> Iterator[None]:
    """torchrun logs a rank's failure at length on the terminal; the ranks and the launcher say it in one line."""
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.distributed.run")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def describe_failures(error: ChildFailedError) -> str:
    """One line naming each failed rank and how it ended (an exit code, or the signal that killed it)."""
    parts = []
    for rank, failure in sorted(error.failures.items()):
        code = failure.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        parts.append(f"rank {rank} {how}")
    return "; ".join(parts) + " (the ranks' own errors are in OUTPUT_DIR/logs/rank_K.log)"


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # The terminal may be gone (SIGHUP).
        print(line, file=sys.stderr)


@contextlib.contextmanager
def _launcher_environment(error_dir: str) -> Iterator[None]:
    """The ranks inherit this process's environment: there they learn whom to die with, and where to say why
    they failed."""
    values = {LAUNCHER_PID_ENV: str(os.getpid()), ERROR_DIR_ENV: error_dir}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _StopForwarder:
    """In the launcher: SIGINT and SIGTERM go on to the ranks, which are then given ``grace_s`` to exit.

    The ranks are this process's children (torchrun's agent runs in it), each the leader of its
    own process group, which gets the signal as a terminal's Ctrl-C would reach it. Finding them
    takes Linux's /proc; when not ``enabled``, torchrun's own forwarding stays.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, grace_s: float, enabled: bool) -> None:
        self.grace_s = grace_s
        self.enabled = enabled
        self.received: int | None = None
        self.killed = False
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopForwarder:
        if self.enabled:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum: int, frame: Any) -> None:
        ranks = child_pids(os.getpid())
        if not ranks:
            # No rank started yet: torchrun's agent stops the job as it does for its own signals.
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
        if self.received is None:
            self.received = signum
            self._timer = threading.Timer(self.grace_s, self._kill_ranks)
            self._timer.daemon = True
            self._timer.start()
            # torchrun would now log each rank's exit 130 as a failure; the ranks say what happened.
            for name in list(logging.root.manager.loggerDict):
                if name.startswith("torch.distributed.elastic"):
                    logging.getLogger(name).setLevel(logging.CRITICAL)
        _signal_groups(ranks, signum)

    def _kill_ranks(self) -> None:
        self.killed = True
        _signal_groups(child_pids(os.getpid()), signal.SIGKILL)


def _signal_groups(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signum)
        except OSError:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)


def child_pids(pid: int) -> list[int]:
    """The live child processes of ``pid``, from Linux's /proc (zombies left out)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                stat = file.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # The name in parentheses may hold spaces.
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            children.append(int(entry))
    return children


def die_with_launcher() -> None:
    """In a rank started by torchrun: die (SIGKILL) as soon as the launcher does.

    Without this a rank whose launcher is killed outright trains on as an orphan, holding the
    output directory and its device. Linux's parent-death signal makes the kernel kill the rank
    when the thread that started it ends, which is the launcher's main thread, where torchrun's
    agent runs. SIGKILL rather than SIGTERM: with the launcher gone there is no one to wait for
    a save, and the last committed checkpoint is intact. Where there is no prctl, a thread
    watches for the parent to change. A rank whose launcher died before this ran dies now.
    """
    launcher = os.environ.pop(LAUNCHER_PID_ENV, None)  # Not for this rank's own children.
    if launcher is None and "TORCHELASTIC_RUN_ID" not in os.environ:
        return  # Not a rank of a torchrun agent: the parent's death is none of our business.
    parent = int(launcher) if launcher is not None else os.getppid()
    if not _set_parent_death_signal(signal.SIGKILL):
        threading.Thread(target=_watch_parent, args=(parent,), name="die-with-launcher", daemon=True).start()
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _set_parent_death_signal(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)
