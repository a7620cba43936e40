"""The build, beyond pyproject.toml: ``recipes_launch_guard.pth`` goes beside the packages.

Python's ``site`` runs a ``.pth`` file's import lines at start-up only from site-packages itself, so the file is put
there by a wheel (at its root) and by an editable install (``pip install -e .``, whose wheel holds the ``.pth`` that
puts ``src/`` on the path) alike. Why the guard exists: src/recipes_launch_guard.py.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

GUARD = "recipes_launch_guard.pth"


class BuildPyWithLaunchGuard(build_py):
    """build_py, plus the guard's ``.pth`` at the root of what is installed."""

    def run(self) -> None:
        super().run()
        # An editable build's build_lib is thrown away: what it installs is the install command's folder.
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(os.path.join("src", GUARD), os.path.join(root, GUARD))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, GUARD)]


setup(cmdclass={"build_py": BuildPyWithLaunchGuard})
