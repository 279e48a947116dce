"""Makes `import mfattn` find the package of this checkout's build (build/python/mfattn, the
compiled mfattn._core beside the pure-Python modules), or the folder holding mfattn/ named by
MFATTN_PYTHON_MODULE_DIR, ahead of an installed one. An installed package (pip install .)
needs none of this: the examples import mfattn and mfattn.plotting as any script would."""
import os
import sys
from pathlib import Path

_folder = Path(os.environ.get("MFATTN_PYTHON_MODULE_DIR", Path(__file__).resolve().parents[1] / "build" / "python"))
if (_folder / "mfattn" / "__init__.py").is_file() and str(_folder) not in sys.path:
    sys.path.insert(0, str(_folder))
