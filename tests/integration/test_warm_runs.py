"""The warm interpreter of the tests (``support.warm_runs``): a run forked from it is the process a new interpreter
would have been, in all that a test of ``python -m recipes`` reads, and what it cannot make so goes to a new one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recipes.cli.launch import child_pids
from support import warm_runs

# A module that says what its process looks like, then waits for SIGUSR1 where asked (and exits 7 on it), else exits 3.
PROBE = textwrap.dedent(
    """
    import json, os, signal, sys
    print(json.dumps({
        "argv": sys.argv, "orig_argv": sys.orig_argv[1:], "path0": sys.path[0], "cwd": os.getcwd(),
        "name": __name__, "probe_variable": os.environ.get("PROBE_VARIABLE"), "stdin": sys.stdin.read(),
        "numba": "numba" in sys.modules, "torch": "torch" in sys.modules,
        "launcher_is_parent": os.environ.get("RECIPES_LAUNCHER_PID") == str(os.getppid()),
    }), flush=True)
    print("to stderr", file=sys.stderr)
    if sys.argv[1:] == ["wait"]:
        signal.signal(signal.SIGUSR1, lambda *_: sys.exit(7))
        print("waiting", flush=True)
        signal.pause()
    sys.exit(3)
    """
)


@pytest.fixture
def probe_folder(tmp_path: Path) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


def fresh(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probe", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )


def warm(folder: Path, env: dict[str, str], *args: str, parent: int | None = None) -> tuple[int, str, str] | None:
    """The probe forked by the warm interpreter: exit code, stdout, stderr; None if it refused."""
    out, err = folder / "out.txt", folder / "err.txt"
    with open(os.devnull, "rb") as null, open(out, "wb") as stdout, open(err, "wb") as stderr:
        streams = (null.fileno(), stdout.fileno(), stderr.fileno())
        try:
            socket_path = warm_runs.WARM.socket_path()
            started = warm_runs.start_run(socket_path, "probe", args, folder, env, streams, parent=parent)
        except warm_runs.Refused:
            return None
        returncode = started.wait(timeout=120)
    return returncode, out.read_text(), err.read_text()


def test_a_warm_run_has_the_folder_environment_command_line_streams_and_exit_code_of_a_new_interpreter(
    probe_folder: Path,
) -> None:
    env = {**os.environ, "PROBE_VARIABLE": "given"}
    expected = fresh(probe_folder, env, "an argument")
    ran = warm(probe_folder, env, "an argument")

    assert ran is not None
    returncode, out, err = ran
    assert (returncode, err) == (expected.returncode, expected.stderr) == (3, "to stderr\n")
    seen, fresh_seen = json.loads(out), json.loads(expected.stdout)
    assert seen.pop("torch") and not fresh_seen.pop("torch")  # the one difference: torch imported already
    assert seen == fresh_seen
    assert seen["probe_variable"] == "given" and not seen["numba"] and seen["name"] == "__main__"
    assert seen["path0"] == str(probe_folder) and seen["argv"] == [str(probe_folder / "probe.py"), "an argument"]


def test_a_run_whose_start_up_variables_differ_is_refused_and_run_by_a_new_interpreter(probe_folder: Path) -> None:
    # numpy's OpenBLAS sizes its threads from it as the warm interpreter imports numpy.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1" if os.environ.get("OPENBLAS_NUM_THREADS") != "1" else "2"}

    assert warm(probe_folder, env) is None
    with pytest.warns(UserWarning, match="a new interpreter ran -m recipes list: the environment differs in OPENBLAS"):
        result = warm_runs.run([sys.executable, "-m", "recipes", "list"], probe_folder, env, timeout=120)
    assert result.returncode == 0 and "ctr_tiny" in result.stdout


def test_a_rank_that_torchrun_starts_runs_warm_with_its_variables_and_its_launcher_for_parent(
    probe_folder: Path,
) -> None:
    """What torchrun gives a rank (its variables, ``OMP_NUM_THREADS``) is no reason for a new interpreter, and the
    launcher the rank must die with (``recipes.cli.launch.die_with_launcher``) is its parent, the waiter, there."""
    launcher = os.getpid()  # This process stands for torchrun's launcher, which started the rank's client.
    ranks = {"OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "job", "RECIPES_LAUNCHER_PID": str(launcher)}
    env = {**warm_runs.WARM.run_env(os.environ), **ranks}

    ran = warm(probe_folder, env, parent=launcher)

    assert ran is not None
    seen = json.loads(ran[1])
    assert seen["torch"] and seen["launcher_is_parent"]
    assert Path(env["PYTHON_EXEC"]).is_file()  # The `python` torchrun starts the ranks with.


def test_the_client_passes_signals_on_and_exits_with_the_runs_code(probe_folder: Path) -> None:
    env = {**os.environ, warm_runs.SOCKET_ENV: warm_runs.WARM.socket_path()}
    client = subprocess.Popen(
        [sys.executable, warm_runs.__file__, "-m", "probe", "wait"],
        cwd=probe_folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None
    seen = json.loads(client.stdout.readline())
    assert seen["torch"] and client.stdout.readline() == "waiting\n"
    client.send_signal(signal.SIGUSR1)
    _, err = client.communicate(timeout=120)

    assert client.returncode == 7 and err == "to stderr\n"


def test_the_stand_in_environments_python_runs_the_cli_warm_and_anything_else_as_itself(tmp_path: Path) -> None:
    venv = warm_runs.warm_venv(tmp_path / ".venv")
    env = {**os.environ, warm_runs.SOCKET_ENV: warm_runs.WARM.socket_path()}
    check = "import sys; print('torch' in sys.modules, sys.executable)"

    listed = subprocess.run(
        ["bash", "-c", ".venv/bin/python -m recipes list"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    itself = subprocess.run([venv / "bin" / "python", "-c", check], env=env, capture_output=True, text=True)

    assert listed.returncode == 0 and "ctr_tiny" in listed.stdout, listed.stderr
    assert itself.stdout.split() == ["False", sys.executable]


def test_the_warm_interpreter_is_not_a_child_of_the_tests_process_which_may_signal_all_of_them() -> None:
    warm_runs.WARM.socket_path()
    commands = []
    for pid in child_pids(os.getpid()):
        with contextlib.suppress(OSError):
            commands.append(Path(f"/proc/{pid}/cmdline").read_bytes())

    assert not any(b"warm_interpreter" in command for command in commands)
