"""The Python module's refusals: `threads` as the CLI bounds --threads (TypeError for what is
not an int, ValueError outside [1, 4096]), a Model refuses the options of an output it never
writes, and run(quiet=True) is accepted (run is always quiet)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from conftest import MODULE_DIR  # the build's package folder; the fixture mfattn is conftest's too


@pytest.fixture(scope="module")
def model(mfattn):
    return mfattn.Model(n=8, d=3, beta=1.0, threads=1)


@pytest.mark.parametrize("threads", [2.5, "2", True, None.__class__])
def test_threads_that_are_not_an_int_raise_type_error(model, threads):
    x = model.initial_state()
    with pytest.raises(TypeError, match="threads: expected an int"):
        model.velocity(x, threads=threads)
    with pytest.raises(TypeError, match="threads: expected an int"):
        model.energy(x, threads=threads)


@pytest.mark.parametrize("threads", [0, -1, 4097, 10**6, 10**30])
def test_threads_out_of_the_clis_range_raise_value_error_before_any_thread(model, threads):
    with pytest.raises(ValueError, match=r"threads: .* \(must be an integer in \[1, 4096\]\)"):
        model.velocity(model.initial_state(), threads=threads)


def test_numpy_integer_threads_are_accepted_and_give_the_same_bits(model):
    x = model.initial_state()
    assert np.array_equal(model.velocity(x, threads=np.int64(2)), model.velocity(x, threads=1))


@pytest.mark.parametrize("option", [{"out": "/no/such/folder/x.h5"}, {"resume": True}, {"overwrite": True}])
def test_a_model_refuses_the_options_of_an_output(mfattn, option):
    with pytest.raises(ValueError, match="a Model writes no file; this option belongs to mfattn.run"):
        mfattn.Model(n=8, d=3, **option)


def test_run_accepts_quiet(mfattn, tmp_path):
    for quiet in (True, False):
        trajectory = mfattn.run(out=tmp_path / f"q{quiet}.h5", n=8, d=3, horizon=0.5, threads=1, quiet=quiet)
        assert trajectory.run["status"] == "complete"


LIMITED_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
import mfattn
model = mfattn.Model(n=8, d=3, threads=1)
x = model.initial_state()
try:
    model.velocity(x, threads=4096)
    print("no error")
except RuntimeError as error:
    print("RuntimeError:", error)
print("survived", float(model.energy(x, threads=1)) > 0)
"""


def test_threads_beyond_the_process_limit_raise_and_the_interpreter_survives():
    import subprocess
    from test_faults_files import under_a_process_limit
    command = under_a_process_limit([sys.executable, "-c", LIMITED_SCRIPT, str(MODULE_DIR)])
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("RuntimeError: threads=4096: only ") and "threads could be started" in lines[0], lines
    assert lines[-1] == "survived True", lines
