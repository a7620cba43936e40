"""``python -m recipes ...`` run by the tests without paying for the interpreter's start each time: forked from a
warm interpreter that has imported torch (``support.warm_interpreter``, one per test worker, started at its first
run), as a process of its own with the command's folder, environment, streams and exit code.

Only runs that end by themselves go this way (``run``, and the documents' commands through ``warm_venv``'s
``python``), and the ranks of a ``train --nproc N`` that ``run`` started (torchrun starts them with ``$PYTHON_EXEC``,
``write_warm_python``'s); the tests that signal or kill a run, or time its start, start it in a new interpreter as
before, and so start its ranks. So do the runs whose environment differs from the tests' in what the interpreter
reads as it starts: the warm interpreter refuses them. Run as a script (``python warm_runs.py -m recipes ARGS``),
this module is the client a shell command runs: the run gets its standard streams, its signals are passed on to the
run, and its exit code is the run's.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import json
import locale
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, NoReturn

SERVER = Path(__file__).with_name("warm_interpreter.py")
# The warm interpreter's socket, in the environment of the commands whose `python` is `warm_venv`'s.
SOCKET_ENV = "RECIPES_TEST_WARM_SOCKET"
# The packages whose modules run warm: the framework's CLI and the recommenders' data tools; anything else gets a new
# interpreter.
WARM_PACKAGES = frozenset({"recipes", "recsys"})
# What the client passes on to the run: a stop (Ctrl-C, SIGTERM), a terminal closing, the user signals.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_PDEATHSIG = 1  # From <linux/prctl.h>.
PYTHON_NAMES = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")


class WarmInterpreter:
    """This process's warm interpreter, started at the first run, with this process's environment as it was when
    the tests were collected (before a test changed it), and stopped when this process ends."""

    def __init__(self) -> None:
        self._env = dict(os.environ)
        self._lock = threading.Lock()
        self._socket_path: str | None = None

    def socket_path(self) -> str:
        with self._lock:
            if self._socket_path is None:
                self._socket_path = self._start()
            return self._socket_path

    def run_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` for a run forked here, with what makes the ranks of its ``train --nproc N`` forks from here too:
        torchrun starts them with ``$PYTHON_EXEC`` (``write_warm_python``'s, beside the socket), which finds this
        interpreter by ``SOCKET_ENV``. A new interpreter's rank spends 2 to 4 s of CPU
        importing before its first step (2.3 s on an idle machine, 3.6 s on a busy one)."""
        socket_path = self.socket_path()
        return {**env, SOCKET_ENV: socket_path, "PYTHON_EXEC": str(Path(socket_path).with_name("python"))}

    def _start(self) -> str:
        folder = tempfile.mkdtemp(prefix="warm-interpreter-")
        path = os.path.join(folder, "socket")
        write_warm_python(Path(folder) / "python")
        errors = open(os.path.join(folder, "stderr"), "w+b")  # noqa: SIM115 - the server's, kept open as it runs
        server = subprocess.Popen(
            [sys.executable, str(SERVER), path],
            cwd=folder,
            env=self._env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
        )
        assert server.stdout is not None and server.stdin is not None
        if server.stdout.readline() != b"ready\n":
            server.wait()
            errors.seek(0)
            raise RuntimeError(f"the warm interpreter did not start:\n{errors.read().decode(errors='replace')}")

        server.wait()  # The process started exits once its child, in a session of its own, serves.

        def stop() -> None:
            assert server.stdin is not None
            server.stdin.close()  # The server exits when its stdin closes.
            errors.close()
            shutil.rmtree(folder, ignore_errors=True)

        atexit.register(stop)
        return path


WARM = WarmInterpreter()


class WarmRun:
    """A run forked by the warm interpreter: its pid, and its exit code once it has ended."""

    def __init__(self, connection: socket.socket, pid: int) -> None:
        self.pid = pid
        self._connection = connection
        self._replies = connection.makefile("rb")

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (negative: the signal that ended it); ``TimeoutError`` after ``timeout`` seconds."""
        self._connection.settimeout(timeout)
        returncode = int(_reply(self._replies)["returncode"])
        self._replies.close()
        self._connection.close()
        return returncode


class Refused(Exception):
    """The warm interpreter cannot be what a new interpreter would be for this run (the reason is the message)."""


def start_run(
    socket_path: str,
    module: str,
    args: Sequence[str],
    cwd: Path | str,
    env: Mapping[str, str],
    streams: Sequence[int],
    parent: int | None = None,
) -> WarmRun:
    """``python -m MODULE ARGS`` forked by the warm interpreter at ``socket_path``, with ``streams`` (stdin, stdout,
    stderr descriptors) as its own; ``Refused`` where the run needs a new interpreter. ``parent``: the pid of the
    process that started the caller as its ``python`` (torchrun's launcher for a rank), whom the run must take
    for its parent (``warm_interpreter.PARENT_VARIABLES``)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_path)
    except (ConnectionRefusedError, FileNotFoundError) as error:
        errors = Path(socket_path).with_name("stderr")
        said = errors.read_text(errors="replace") if errors.is_file() else ""
        raise RuntimeError(f"the warm interpreter at {socket_path} has ended ({error}); it said:\n{said}") from None
    fields = {"module": module, "args": list(args), "cwd": str(cwd), "env": dict(env), "parent": parent}
    request = json.dumps(fields).encode() + b"\n"
    sent = socket.send_fds(connection, [request], list(streams))
    connection.sendall(request[sent:])
    replies = connection.makefile("rb")
    reply = _reply(replies)
    replies.close()
    if "refused" in reply:
        connection.close()
        raise Refused(str(reply["refused"]))
    return WarmRun(connection, int(reply["pid"]))


def _reply(replies: IO[bytes]) -> dict[str, object]:
    line = replies.readline()
    if not line:
        raise ConnectionError("the warm interpreter closed the connection without an answer")
    reply: dict[str, object] = json.loads(line)
    return reply


def warm_module(command: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(module, args)`` where ``command`` is this Python's ``-m`` of a module run warm; ``None`` otherwise."""
    this_python = len(command) >= 3 and os.path.abspath(command[0]) == os.path.abspath(sys.executable)
    if this_python and command[1] == "-m" and command[2].split(".")[0] in WARM_PACKAGES:
        return command[2], list(command[3:])
    return None


def run(
    command: Sequence[str], cwd: Path | str, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``command`` to its end, as ``subprocess.run(command, capture_output=True, text=True, timeout=timeout)``
    runs it: ``python -m recipes ...`` (a module of ``WARM_PACKAGES``) forked from the warm interpreter, its stdin
    empty; anything else as given."""
    module = warm_module(command)
    if module is not None:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull, "rb") as null:
            try:
                streams = (null.fileno(), out.fileno(), err.fileno())
                started = start_run(WARM.socket_path(), *module, cwd, WARM.run_env(env), streams)
            except Refused as refused:
                warnings.warn(f"a new interpreter ran {shlex.join(command[1:])}: {refused}", stacklevel=2)
            else:
                try:
                    returncode = started.wait(timeout)
                except TimeoutError:
                    os.kill(started.pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(list(command), timeout, _text(out), _text(err)) from None
                return subprocess.CompletedProcess(list(command), returncode, _text(out), _text(err))
    return subprocess.run(
        list(command), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def _text(file: IO[bytes]) -> str:
    """What a run wrote to ``file``, decoded as ``subprocess``'s text mode does."""
    file.seek(0)
    return io.TextIOWrapper(io.BytesIO(file.read()), encoding=locale.getpreferredencoding(False)).read()


def warm_venv(folder: Path) -> Path:
    """``folder`` made a stand-in for this virtual environment: its entries linked, but ``bin/python`` a script
    that runs ``python -m recipes ...`` (or a module of ``WARM_PACKAGES``) through this module's client when the
    environment names a warm interpreter (``SOCKET_ENV``), and anything else with this Python."""
    prefix = Path(sys.prefix)
    folder.mkdir(parents=True)
    for entry in prefix.iterdir():
        if entry.name != "bin":
            (folder / entry.name).symlink_to(entry)
    (folder / "bin").mkdir()
    for entry in (prefix / "bin").iterdir():
        (folder / "bin" / entry.name).symlink_to(entry)
    for name in PYTHON_NAMES:
        path = folder / "bin" / name
        path.unlink(missing_ok=True)
        write_warm_python(path)
    return folder


def write_warm_python(path: Path) -> None:
    """A ``python`` at ``path`` that runs ``-m`` of a module of ``WARM_PACKAGES`` through this module's client when
    the environment names a warm interpreter (``SOCKET_ENV``), and anything else with this Python. A first ``-u``
    (torchrun starts its ranks so) is read as ``PYTHONUNBUFFERED``, which the warm interpreter emulates."""
    warm = "|".join(sorted(WARM_PACKAGES))
    path.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "${1-}" == -u ]]; then export PYTHONUNBUFFERED=1; shift; fi\n'
        f'if [[ "${{1-}}" == -m && "${{2-}}" =~ ^({warm})(\\.|$) && -n "${{{SOCKET_ENV}-}}" ]]; then\n'
        f'  exec {shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} "$@"\n'
        "fi\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    path.chmod(0o755)


def client(argv: Sequence[str]) -> NoReturn:
    """``-m MODULE ARGS`` run by the warm interpreter named in the environment, as if this process were it."""
    env = dict(os.environ)
    socket_path = env[SOCKET_ENV]  # Kept: the ranks of the run's `train --nproc N` find the interpreter by it.
    module, args = argv[1], list(argv[2:])
    # Ended by the kernel with the process that started it, as a rank is with its launcher: the warm interpreter
    # then ends the run's parent, whose death ends a rank (``warm_interpreter.PARENT_VARIABLES``).
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        started = start_run(socket_path, module, args, os.getcwd(), env, (0, 1, 2), parent=os.getppid())
    except Refused:
        os.execve(sys.executable, [sys.executable, "-m", module, *args], env)

    def forward(received: int, _: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # It has just ended.
            os.kill(started.pid, received)

    for number in FORWARDED_SIGNALS:
        signal.signal(number, forward)
    returncode = started.wait()
    if returncode < 0:
        signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode)


if __name__ == "__main__":
    client(sys.argv[1:])
