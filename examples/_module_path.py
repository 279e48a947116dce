"""Makes `import mfattn` find the module of this checkout's build (build/mfattn*.so), or the
folder in MFATTN_PYTHON_MODULE_DIR, when it is not installed, and puts analysis/ on the path
for the figure styles the project's scripts share (plotting_common)."""
import os
import sys
from pathlib import Path

_folder = Path(os.environ.get("MFATTN_PYTHON_MODULE_DIR", Path(__file__).resolve().parents[1] / "build"))
if str(_folder) not in sys.path:
    sys.path.insert(0, str(_folder))

_analysis = Path(__file__).resolve().parents[1] / "analysis"
if str(_analysis) not in sys.path:
    sys.path.append(str(_analysis))
