"""Makes `import mfattn` find the module of this checkout's build (build/mfattn*.so), or the
folder in MFATTN_PYTHON_MODULE_DIR, when it is not installed."""
import os
import sys
from pathlib import Path

_folder = Path(os.environ.get("MFATTN_PYTHON_MODULE_DIR", Path(__file__).resolve().parents[1] / "build"))
if str(_folder) not in sys.path:
    sys.path.insert(0, str(_folder))
