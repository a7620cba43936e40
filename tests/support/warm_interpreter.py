"""A Python interpreter that has imported torch once and forks a ``python -m recipes`` from there for each test
run that asks for one (``support.warm_runs`` is its client).

A test's ``python -m recipes train ...`` spends most of its CPU before its first step: a 2-step run of
``ctr_tiny`` took 3.4 s of CPU, of which importing torch, its compiler front-end (``torch.optim`` imports
``torch._dynamo``) and the libraries below took 3.1 s. A few hundred such runs made most of the suite's time. A run
forked from here starts with those modules imported and is otherwise the process a new interpreter would be: its
own pid, folder, environment, command line, standard streams and exit code, and numba, our own packages and
everything else imported fresh. What could differ is refused, and the client then starts a new interpreter: a
request whose environment differs from this one's in a variable read while the modules below were imported
(``START_UP_VARIABLES``).

Run as ``python warm_interpreter.py SOCKET``: it prints ``ready`` once it listens on the Unix socket ``SOCKET``,
from a process that is no longer the worker's child, and exits when its standard input closes (the test worker
that started it has ended). Each connection is one run:
a waiter process is forked for it, which reads the request (a JSON line, with the run's stdin, stdout and stderr
passed as file descriptors), forks the run, answers ``{"pid": N}`` and, when the run has ended,
``{"returncode": R}`` (negative for a signal, as ``subprocess`` says it).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import socket
import sys
from typing import Any

# Imported once here; none of them imports numba (whose settings come from each run's environment) nor our packages.
PRELOADED = (
    "torch",
    "torch._dynamo",
    "torch.optim",
    "torch.distributed",
    "torch.distributed.run",
    "torch.distributed.checkpoint.state_dict",
    "torch.utils.tensorboard",
    "torchmetrics",
    "yaml",
    "fsspec",
    "tqdm",
)
NOT_PRELOADED = ("numba", "recipes", "recsys", "units", "gang", "checkpoint", "embedding", "components")

# Variables read by the interpreter's start-up, the C libraries or the modules above when imported: a run whose
# environment differs from this one's in any of them gets a new interpreter, but for those emulated here.
START_UP_VARIABLES = (
    *("PYTHON", "LD_", "MALLOC_"),
    *("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_"),
    *("TORCH", "PYTORCH", "CUDA"),
)
# Emulated: PYTHONUNBUFFERED (its streams made unbuffered, as the interpreter makes them) and OMP_NUM_THREADS (torch's
# threads set to it, as torch sets them from it), which torchrun gives its ranks.
EMULATED = frozenset({"PYTHONUNBUFFERED", "OMP_NUM_THREADS"})
# What torchrun gives its ranks, read when they run, not while anything above is imported.
LAUNCH_VARIABLES = ("TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTHON_EXEC")
# Variables that name a run's parent: a rank of `train --nproc N` must die with its launcher, whose pid it is given
# (recipes.cli.launch.die_with_launcher). A rank forked here has the waiter for its parent, not the launcher that
# started its client: there the variable names the waiter, which ends when the client does (the launcher ending
# it), so the rank dies with its launcher still.
PARENT_VARIABLES = ("RECIPES_LAUNCHER_PID",)

STANDARD_STREAMS = 3
MAX_REQUEST_BYTES = 1 << 20


def serve(socket_path: str) -> tuple[dict[str, Any], list[int]]:
    """Import the modules, then fork a waiter per connection. Returns only in a forked run: its request and the
    descriptors of its standard streams."""
    start_up_env = {key: value for key, value in os.environ.items() if key.startswith(START_UP_VARIABLES)}
    for name in PRELOADED:
        importlib.import_module(name)
    imported = [name for name in NOT_PRELOADED if name in sys.modules]
    if imported:
        raise RuntimeError(f"the preloaded modules must not import {imported}, but they do")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    _leave_the_test_worker()
    os.write(sys.stdout.fileno(), b"ready\n")
    while True:
        readable, _, _ = select.select([listener, sys.stdin.fileno()], [], [])
        _reap_waiters()
        if sys.stdin.fileno() in readable and not os.read(sys.stdin.fileno(), 1):
            os._exit(0)  # The test worker has ended.
        if listener in readable:
            connection, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                return _wait_on_a_run(connection, start_up_env)
            connection.close()


def _leave_the_test_worker() -> None:
    """Go on in a child of a session of its own, the process started by the worker exiting: a test that signals the
    worker's children or process group (the launcher's own tests stop every child of the process they run in) does
    not reach this server. It still ends with the worker, which holds its stdin."""
    if os.fork() != 0:
        os._exit(0)
    os.setsid()


def _reap_waiters() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass
    except ChildProcessError:
        pass


def _wait_on_a_run(connection: socket.socket, start_up_env: dict[str, str]) -> tuple[dict[str, Any], list[int]]:
    """The waiter: read the request, fork the run, say its pid and then its exit code. Returns only in the run."""
    request, descriptors = _receive(connection)
    env = request["env"]
    differing = sorted(
        key
        for key in {*start_up_env, *env}
        if key.startswith(START_UP_VARIABLES)
        and not key.startswith(LAUNCH_VARIABLES)
        and key not in EMULATED
        and start_up_env.get(key) != env.get(key)
    )
    if differing:
        _send(connection, {"refused": f"the environment differs in {', '.join(differing)}"})
        os._exit(0)
    for name in PARENT_VARIABLES:
        if request.get("parent") is not None and env.get(name) == str(request["parent"]):
            env[name] = str(os.getpid())
    pid = os.fork()
    if pid == 0:
        connection.close()
        return request, descriptors
    for descriptor in descriptors:
        os.close(descriptor)
    _send(connection, {"pid": pid})
    run_ended = os.pidfd_open(pid)
    if run_ended not in select.select([connection, run_ended], [], [])[0]:
        os._exit(0)  # The client has ended (nothing else comes from it): so does the run's parent.
    _, status = os.waitpid(pid, 0)
    _send(connection, {"returncode": os.waitstatus_to_exitcode(status)})
    os._exit(0)


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, descriptors, _, _ = socket.recv_fds(connection, MAX_REQUEST_BYTES, STANDARD_STREAMS)
    while not data.endswith(b"\n"):
        more = connection.recv(MAX_REQUEST_BYTES)
        if not more:
            raise ConnectionError("the request ended before its newline")
        data += more
    return json.loads(data), list(descriptors)


def _send(connection: socket.socket, message: dict[str, Any]) -> None:
    connection.sendall(json.dumps(message).encode() + b"\n")


def become_the_run(request: dict[str, Any], descriptors: list[int]) -> None:
    """Make this forked process what ``python -m MODULE ARGS`` started in the request's folder and environment
    would be, then run the module as ``-m`` does (its exit, exception or ``os._exit`` ends the process)."""
    for target, descriptor in enumerate(descriptors):
        os.dup2(descriptor, target)
        os.close(descriptor)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import io
    import runpy
    import tempfile

    import numpy

    tempfile.tempdir = None  # Found again from this environment's TMPDIR.
    numpy.random.seed()  # A new interpreter's numpy generator starts from fresh entropy (`random` reseeds at fork).
    if "OMP_NUM_THREADS" in os.environ:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if os.environ.get("PYTHONUNBUFFERED"):
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            raw = io.FileIO(stream.fileno(), "w", closefd=False)
            unbuffered = io.TextIOWrapper(raw, stream.encoding, stream.errors, write_through=True)  # type: ignore[type-var]
            setattr(sys, name, unbuffered)
            setattr(sys, f"__{name}__", unbuffered)
    module, args = request["module"], request["args"]
    sys.path[0] = os.getcwd()  # What `-m` puts first.
    sys.argv = ["-m", *args]
    sys.orig_argv = [sys.executable, "-m", module, *args]
    _run_command_line_hooks()
    runpy._run_module_as_main(module)  # type: ignore[attr-defined]  # What the interpreter runs for `-m`.


def _run_command_line_hooks() -> None:
    """The lines of the environment's ``.pth`` files that look at the command line (``recipes_launch_guard.pth``)
    ran at this interpreter's start, before the run's command line was known: they run again now."""
    import site

    for folder in site.getsitepackages():
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if name.endswith(".pth"):
                with open(os.path.join(folder, name)) as file:
                    for line in file:
                        if line.startswith("import ") and "orig_argv" in line:
                            exec(line)


if __name__ == "__main__":
    become_the_run(*serve(sys.argv[1]))
