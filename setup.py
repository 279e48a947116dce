"""Builds the Python module mfattn with the project's CMake (docs/python.md) for
`pip install .`: configures a build folder for the running interpreter, builds the target
mfattn_python and puts the module in the wheel. MFATTN_BUILD_DIR names an already
configured build folder to build in instead (nothing is reconfigured there)."""
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
        built = sorted(build.glob("mfattn*.so"))
        if not built:
            raise RuntimeError(f"no mfattn*.so in {build}: pybind11 and Python's headers must be found by CMake")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], target)


setup(ext_modules=[Extension("mfattn", sources=[])], cmdclass={"build_ext": CMakeBuild})
