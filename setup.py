"""Build hook: the model shipped in weights/ goes into the package as minirt/weights/.

So an installed minirt (a wheel, run from any directory) finds it with no --model.  weights/ stays
the one copy in the repository; this copies it into the build, never into the source tree.
Everything else about the package is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

WEIGHTS = Path(__file__).resolve().parent / "weights"


class BuildPyWithWeights(build_py):
    def run(self):
        super().run()
        if (
            WEIGHTS.is_dir()
        ):  # an sdist carries weights/ too (MANIFEST.in), so a wheel built from it has them
            shutil.copytree(
                WEIGHTS, Path(self.build_lib) / "minirt" / "weights", dirs_exist_ok=True
            )


setup(cmdclass={"build_py": BuildPyWithWeights})
