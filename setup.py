"""Builds the Python package mfattn (docs/python.md) for `pip install .`: its pure-Python
modules are analysis/mfattn/ (pyproject.toml's package-dir), and its compiled module
mfattn._core is built with the project's CMake: a build folder configured for the running
interpreter, its target mfattn_python, whose python/mfattn/_core*.so goes into the wheel.
MFATTN_BUILD_DIR names an already configured build folder to build in instead (nothing is
reconfigured there)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        given = os.environ.get("MFATTN_BUILD_DIR")
        build = Path(given).resolve() if given else Path(self.build_temp).resolve() / "cmake"
        if not given:
            subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                            f"-DPython_EXECUTABLE={sys.executable}", "-DMFATTN_TESTS=OFF"], check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build), "--target", "mfattn_python", "-j", jobs], check=True)
        built = sorted((build / "python" / "mfattn").glob("_core*.so"))
        if not built:
            raise RuntimeError(f"no python/mfattn/_core*.so in {build}: pybind11 and Python's headers must be "
                               "found by CMake")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], target)


setup(ext_modules=[Extension("mfattn._core", sources=[])], cmdclass={"build_ext": CMakeBuild})
