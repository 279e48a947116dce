"""mfattn: self-attention as an interacting particle system (docs/python.md).

One package of two parts:

- ``mfattn._core``, the compiled engine (python/mfattn_module.cpp): ``Model``, ``run``,
  ``meanfield``, ``options``, ``NumericalError``, ``__version__``;
- pure-Python modules: ``mfattn.io`` (the file loader: ``load``, ``Trajectory``, ``Density``,
  ``export_torch``), ``mfattn.animate``, ``mfattn.view``, ``mfattn.plotting``, ``mfattn.cli``
  (the scripts' one error convention) and the analysis scripts' modules (``mfattn.plot_run``,
  ``mfattn.plot_sweep``, ...), each with the ``main()`` that ``analysis/<script>.py`` and
  ``python3 -m mfattn.<module>`` run.

The build's package folder (``build/python/mfattn``, ``PYTHONPATH=build/python``) and ``pip
install .`` hold both parts. The checkout's ``analysis/mfattn`` holds the pure-Python part
alone (the analysis scripts import it from there, built or not): there the loader and the
scripts work, and the compiled names raise ImportError saying how to build them.
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from . import io
from .io import Density, Trajectory, export_torch, load

try:
    _core = importlib.import_module(f"{__name__}._core")
except ModuleNotFoundError as missing:
    if missing.name != f"{__name__}._core":
        raise  # something _core itself imports is missing: not a folder without _core
    _core = None

# The names that _core defines (mfattn.Model, ...). The other modules of the package are
# imported when first used (mfattn.animate, mfattn.plot_run, ...: __getattr__): mfattn.io,
# which this file imports, imports none of them, so importing it loads neither matplotlib nor
# the animation code, and no module imports another that imports it back.
_COMPILED = ("Model", "run", "meanfield", "options", "NumericalError", "_last_call_released_gil", "gradient")

if _core is not None:
    from ._core import Model, NumericalError, __version__, _last_call_released_gil, meanfield, options, run

    Model.__module__ = __name__  # mfattn.Model, as the public name is

__all__ = ["load", "Trajectory", "Density", "export_torch", "io", "animate"]
if _core is not None:
    __all__ += ["Model", "run", "meanfield", "options", "NumericalError", "gradient"]

    def gradient(cotangent=None, loss=None, target=None, loss_gamma=None, wrt=None, checkpoints=None, out=None,
                 loss_times=None, loss_epsilon=None, **options):
        """The gradient of a loss of x(T) of the run these options describe (docs/model.md
        section 5b, docs/python.md): sum(cotangent * x(T)), or loss="tokens" (sum of squared
        distances to target, the state's shape) or a distance of measures against the target
        points: "mmd" (the kernel exp(loss_gamma <x, y>)), "w2" (exact, by assignment),
        "energy" or "sinkhorn" (blur loss_epsilon); or the loss summed over the frame times
        `loss_times`, by
        the discrete adjoint of its steps from `checkpoints` stored states (None: the default).
        Returns (loss, gradients, trajectory, plan): gradients a dict of the keys in `wrt`
        (None: "x0", the initial state, and every key of Model.vjp's dict; in a run of layers in
        time, layer_time= or regen_period=, the matrices' with a leading layer axis), the
        trajectory mfattn.run(out=out, **options) (its last frame is the x(T) differentiated, to
        the bit), plan {"steps", "stored_states", "recomputed_steps", "step_sizes"}."""
        value, gradients, _, plan = _core.gradient(cotangent, loss=loss, target=target, loss_gamma=loss_gamma,
                                                   loss_epsilon=loss_epsilon, wrt=wrt, checkpoints=checkpoints,
                                                   loss_times=loss_times, **options)
        return value, gradients, run(out=out, **options), plan


def _missing_core(name: str) -> ImportError:
    from pathlib import Path
    here = Path(__file__).resolve().parent
    return ImportError(
        f"mfattn.{name} is in the compiled module mfattn._core, which {here} does not have (this folder holds "
        "the pure-Python modules: mfattn.load and the analysis scripts work without it). Build it (tests/run.sh, "
        "or cmake -S . -B build && cmake --build build; pybind11-dev and python3-dev must be installed) and "
        "import mfattn from the build's package folder: PYTHONPATH=build/python; or pip install "
        "--no-build-isolation .", name=f"{__name__}._core")


def __getattr__(name: str):
    """A module of the package (mfattn.animate, mfattn.plot_run, ...), imported when first
    used; a compiled name without _core an ImportError saying how to build it."""
    if name in _COMPILED and _core is None:
        raise _missing_core(name)
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {module.name for module in pkgutil.iter_modules(__path__)})


def analyze(source, min_decades: float = 0.05, replica: int = 0) -> dict:
    """`mfattn analyze --json` of a file or a Trajectory read from one (docs/analyze.md): a dict
    with the collapse, the plateaus, the merge and split times and the energy staircase of
    replica `replica`. Every plateau, merge and split is there, each with "listed": whether the
    text report at `min_decades` lists it (a change: on its own line rather than folded into a
    net step between listed plateaus); each plateau with "initial" (the first, before
    clustering starts). ValueError for a Trajectory with no file, a file that is not an mfattn
    particle file, or a replica it does not have."""
    import json
    if _core is None:
        raise _missing_core("analyze")
    path = getattr(source, "path", source)
    if path is None:
        raise ValueError("analyze: this Trajectory was not read from a file (give mfattn.run out=)")
    return json.loads(_core.analyze_json(str(path), replica, min_decades))


__all__ += ["analyze"]
