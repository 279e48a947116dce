"""`mfattn meanfield` and `mfattn.meanfield` under the conditions a researcher meets: growth
rates measured at the default tolerances, solves from a Python thread pool, initial densities
in every layout a file of the grid's values takes, the last line after SIGTERM and a full
disk, and the options that were taken silently or misreported (docs/meanfield.md,
docs/failure-model.md)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import MODULE_DIR, bits
from mfattn.plot_meanfield import growth_rates
from test_faults_run import tmpfs  # noqa: F401 (a fixture)

from mfattn import io as mfattn_io  # noqa: E402  (conftest puts the package on sys.path)


def meanfield(binary: Path, out: Path, *args, timeout: float = 120.0) -> subprocess.CompletedProcess:
    command = [str(binary), "meanfield", *map(str, args), "--quiet", "--threads", "1", "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def solved(binary: Path, out: Path, *args) -> Path:
    done = meanfield(binary, out, *args)
    assert done.returncode == 0, done.stderr
    return out


# --- Growth rates at the default tolerances --------------------------------------------------

# (grid, d, beta, kernel, mode k, extra options, bound on the relative error of the rate): the
# circle at 2048 cells (its grid error is below 3e-5 here), zonal grids of 400 cells at d = 3,
# 8 and 128 (the grid's own error at d = 128 is about 8e-4), S^2 at L = 16.
RATE_CASES = [
    *[(2048, 2, beta, kernel, k, [], 1e-3) for kernel in ("usa", "sa") for beta in (1.0, 4.0) for k in (1, 2, 4)],
    *[(400, d, 2.0, kernel, k, ["--zonal"], 2e-3) for d in (3, 8) for kernel in ("usa", "sa") for k in (1, 2)],
    *[(400, 128, 30.0, kernel, 1, ["--zonal"], 2e-3) for kernel in ("usa", "sa")],
    *[(16, 3, 2.0, kernel, k, [], 2e-3) for kernel in ("usa", "sa") for k in (1, 2, 4)],
]


@pytest.mark.parametrize("grid, d, beta, kernel, k, extra, bound", RATE_CASES,
                         ids=[f"{'zonal' if c[5] else 'circle' if c[1] == 2 else 'sphere'}-d{c[1]}-b{c[2]:g}-{c[3]}-k{c[4]}"
                              for c in RATE_CASES])
def test_growth_rates_at_the_default_tolerances(mfattn_binary, tmp_path, grid, d, beta, kernel, k, extra, bound):
    """A perturbation 1e-7 of mode k, to the horizon 2 / gamma_k, frames every tenth of it, the
    rate fitted over every frame: the linear theory's rate, with no tolerance given. (The
    absolute step control alone let the step grow to the frame interval, and Heun's error at
    gamma dt = 0.2 made every rate 0.58 % too small.)"""
    gamma = growth_rates(d, beta, kernel, 0.0, k)[k - 1]
    horizon = 2.0 / gamma
    out = solved(mfattn_binary, tmp_path / "rate.h5", "--d", d, "--beta", beta, "--kernel", kernel, "--grid", grid,
                 "--perturbation", f"{k},1e-7", "--horizon", repr(horizon), "--save-every", repr(horizon / 10), *extra)
    density = mfattn_io.load(out)
    amplitude = np.asarray(density.observables["mode_amplitudes"])[:, k - 1]
    measured = np.polyfit(np.asarray(density.times), np.log(amplitude), 1)[0]
    assert abs(measured / gamma - 1) < bound, (measured, gamma)


def test_an_unperturbed_uniform_state_takes_one_step_per_frame(mfattn_binary, tmp_path):
    """The relative-change bound sees rounding for what it is: the uniform state's velocity
    (1e-16) changes by rounding only, which bounds no step. (Where the uniform state is
    unstable fast enough for its rounding to grow past 1e-12 within the run, as at d = 128,
    beta = 30, that growth is followed like any other.)"""
    for args in (["--d", 2, "--beta", 4, "--grid", 512], ["--d", 2, "--noise-kappa", 2, "--grid", 512],
                 ["--d", 8, "--zonal", "--beta", 2, "--grid", 200], ["--d", 3, "--grid", 12]):
        out = solved(mfattn_binary, tmp_path / "uniform.h5", *args, "--horizon", 5, "--save-every", 1, "--overwrite")
        with h5py.File(out, "r") as f:
            assert f["run"].attrs["steps"] == 5, args


# --- Threads -----------------------------------------------------------------------------------

THREADED = """
import sys, concurrent.futures
import numpy as np
sys.path.insert(0, sys.argv[1])
import mfattn
cases = [dict(d=2, beta=2.0 + 0.5 * i, grid=256, perturbation=f"{1 + i % 3},0.01", horizon=0.5, save_every=0.25,
              evaluation="fourier") for i in range(4)]
cases.append(dict(d=2, grid=64, label_points=4, positions="uniform", geometry="rope", perturbation="1,0.05",
                  horizon=0.25, save_every=0.25))
serial = [mfattn.meanfield(**case).values for case in cases]
for round in range(int(sys.argv[2])):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda case: mfattn.meanfield(**case).values, cases * 2))
    for i, values in enumerate(threaded):
        a, b = np.ascontiguousarray(values).view(np.uint64), np.ascontiguousarray(serial[i % len(cases)]).view(np.uint64)
        if not np.array_equal(a, b):
            print(f"round {round}: case {i % len(cases)} differs from its serial solve", file=sys.stderr)
            sys.exit(1)
print("ok")
"""


def test_meanfield_from_a_thread_pool_equals_the_serial_solves_bit_for_bit(mfattn, tmp_path):
    """Circle solves make FFTW plans, whose planner is not thread-safe: from 2-4 Python threads
    the interpreter died (SIGSEGV, a malloc abort) in most trials. In a child process, so that
    a crash is this test's failure, not pytest's; 20 rounds of 10 solves on 4 threads."""
    del mfattn  # the fixture checks the module exists; the child imports it itself
    done = subprocess.run([sys.executable, "-c", THREADED, str(MODULE_DIR), "20"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


# --- Initial densities ---------------------------------------------------------------------------

LABELLED = ["--d", 2, "--grid", 16, "--label-points", 4, "--positions", "uniform", "--geometry", "rope",
            "--horizon", 0.1, "--save-every", 0.1]


def first_frame(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["fields/density/value"][0]


def test_a_file_of_the_grids_values_is_read_in_every_layout(mfattn_binary, tmp_path):
    """One number per line, all on one line, the rows of NumPy's savetxt of the [labels,
    angles] array, a 1-D savetxt: the same density, bit for bit."""
    values = 1.0 + 0.5 * np.cos(np.arange(64).reshape(4, 16) * 0.3)
    layouts = {
        "column.txt": "\n".join(repr(v) for v in values.ravel()),
        "line.txt": " ".join(repr(v) for v in values.ravel()),
        "commas.txt": ", ".join(repr(v) for v in values.ravel()),
    }
    for name, text in layouts.items():
        (tmp_path / name).write_text(text + "\n")
    np.savetxt(tmp_path / "rows.txt", values, fmt="%.17g")
    np.savetxt(tmp_path / "flat.txt", values.ravel(), fmt="%.17g")
    frames = [first_frame(solved(mfattn_binary, tmp_path / f"{name}.h5", *LABELLED, "--init-density", tmp_path / name))
              for name in [*layouts, "rows.txt", "flat.txt"]]
    for frame in frames[1:]:
        np.testing.assert_array_equal(bits(frame), bits(frames[0]))
    weights = h5py.File(tmp_path / "column.txt.h5", "r")["fields/density/weights"][()]
    np.testing.assert_allclose((weights * frames[0]).sum(axis=1), 1.0, rtol=1e-13)


def test_numpy_arrays_are_initial_densities_in_python(mfattn, mfattn_binary, tmp_path):
    """init_density= takes the 1-D array of the grid's values (it was joined by commas and
    looked up as a file name) and the 2-D [labels, angles] array: the command line's bits."""
    values = 1.0 + 0.5 * np.cos(np.arange(64).reshape(4, 16) * 0.3)
    np.savetxt(tmp_path / "rows.txt", values, fmt="%.17g")
    expected = first_frame(solved(mfattn_binary, tmp_path / "cli.h5", *LABELLED, "--init-density", tmp_path / "rows.txt"))
    options = dict(d=2, grid=16, label_points=4, positions="uniform", geometry="rope", horizon=0.1, save_every=0.1)
    for array in (values, values.ravel()):
        density = mfattn.meanfield(init_density=array, threads=1, **options)
        np.testing.assert_array_equal(bits(np.asarray(density.values)[0]), bits(expected))
    circle = mfattn.meanfield(d=2, grid=16, horizon=0.1, save_every=0.1, init_density=values[0], threads=1)
    assert np.asarray(circle.values).shape == (2, 16)
    # Any other 1-D array is a list, as before: perturbation=np.array([k, eps]) is "k,eps".
    perturbed = mfattn.meanfield(d=2, grid=16, horizon=0.1, save_every=0.1, perturbation=np.array([1, 0.01]),
                                 threads=1)
    assert np.asarray(perturbed.values).shape == (2, 16)


def test_resume_of_a_density_file_reaching_outside_is_a_usage_error(mfattn_binary, tmp_path):
    out = solved(mfattn_binary, tmp_path / "d.h5", "--d", 2, "--grid", 16, "--horizon", 0.1)
    with h5py.File(out, "a") as f:
        shape = f["observables/mass/value"].shape
        layout = h5py.VirtualLayout(shape=shape, dtype="f8")
        layout[...] = h5py.VirtualSource(str(tmp_path / "missing.h5"), "x", shape=shape)
        del f["observables/mass/value"]
        f["observables/mass"].create_virtual_dataset("value", layout)
    done = meanfield(mfattn_binary, out, "--d", 2, "--grid", 16, "--horizon", 0.2, "--resume")
    assert done.returncode == 2 and "is a virtual dataset" in done.stderr, done.stderr


def test_ragged_rows_and_a_wrong_count_name_the_grids_shape(mfattn_binary, tmp_path):
    (tmp_path / "ragged.txt").write_text("1 1 1 1\n1 1 1\n")
    (tmp_path / "short.txt").write_text(" ".join(["1"] * 63) + "\n")
    np.savetxt(tmp_path / "transposed.txt", np.ones((4, 16)).T)  # rows of 4: read scrambled before
    for name, said in (("ragged.txt", "as on the first row"), ("short.txt", "holds 63 numbers"),
                       ("transposed.txt", "rows of 4 numbers")):
        done = meanfield(mfattn_binary, tmp_path / "x.h5", *LABELLED, "--init-density", tmp_path / name)
        assert done.returncode == 2 and said in done.stderr and "[4, 16]" in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and not (tmp_path / "x.h5").exists()


def test_values_near_the_largest_double_are_a_density(mfattn_binary, tmp_path):
    """The file's scale is free: 1e308 everywhere is the uniform density, not "no mass"."""
    (tmp_path / "huge.txt").write_text("\n".join(["1e308"] * 64) + "\n")
    (tmp_path / "one.txt").write_text("\n".join(["1"] * 64) + "\n")
    huge = first_frame(solved(mfattn_binary, tmp_path / "huge.h5", *LABELLED, "--init-density", tmp_path / "huge.txt"))
    one = first_frame(solved(mfattn_binary, tmp_path / "one.h5", *LABELLED, "--init-density", tmp_path / "one.txt"))
    np.testing.assert_array_equal(bits(huge), bits(one))


def test_a_label_row_without_mass_is_named(mfattn_binary, tmp_path):
    values = np.ones((4, 16))
    values[2] = 0.0
    np.savetxt(tmp_path / "row.txt", values)
    done = meanfield(mfattn_binary, tmp_path / "x.h5", *LABELLED, "--init-density", tmp_path / "row.txt")
    assert done.returncode == 2 and "no mass in row 2" in done.stderr, done.stderr


# --- Options taken silently ----------------------------------------------------------------------

@pytest.mark.parametrize("args, said", [
    (["--d", 2, "--grid", 0], "--grid 0"),
    (["--d", 2, "--perturbation", ""], "--perturbation '': is empty"),
    (["--d", 2, "--compare", ""], "--compare '': is empty"),
    (["--d", 2, "--grid", 64, "--perturbation", "33,0.01"], "[1, 32]"),
    (["--d", 3, "--grid", 8, "--perturbation", "9,0.01"], "[1, 8]"),
    (["--d", 5, "--zonal", "--grid", 40, "--perturbation", "21,0.01"], "[1, 20]"),
    (["--d", 2, "--perturbation", "1,0.01", "--perturbation-coordinate", "gauge"], "--perturbation-coordinate gauge"),
])
def test_options_once_taken_silently_are_refused(mfattn_binary, tmp_path, args, said):
    done = meanfield(mfattn_binary, tmp_path / "x.h5", *args, "--horizon", 0.1)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and not list(tmp_path.iterdir())


def test_a_far_horizon_is_not_blamed_on_the_grid(mfattn_binary, tmp_path):
    """--horizon 1e300: the step floor is relative to the clock. It was 1e-13 of the horizon
    (1e287), which the first step fell below: exit 3, "the grid does not resolve the
    solution", before the progress line that the first step prints. Now the solve steps on
    (until it is stopped)."""
    out = tmp_path / "far.h5"
    command = [str(mfattn_binary), "meanfield", "--d", "2", "--grid", "64", "--perturbation", "1,0.01", "--horizon",
               "1e300", "--threads", "1", "--out", str(out)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    first = process.stderr.readline()  # the first step's line, or the failure
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=120)
    stderr = first + rest
    assert re.match(r"mfattn meanfield: t = \S+ / 1e\+300, step 1,", first), stderr
    assert process.returncode == 128 + signal.SIGTERM and "resolve" not in stderr, stderr


def test_a_field_that_never_changes_bounds_no_step(mfattn_binary, tmp_path):
    """V = 0 (and pure diffusion): the velocity and its change are both 0, a ratio of 0 / 0
    that refused every step ("found no step", exit 3)."""
    np.savetxt(tmp_path / "zero2.txt", np.zeros((2, 2)))
    for args in (["--d", 2, "--grid", 64, "--perturbation", "1,0.01"], ["--d", 2, "--grid", 64, "--noise-kappa", 2,
                 "--perturbation", "1,0.01"]):
        out = solved(mfattn_binary, tmp_path / "still.h5", *args, "--v", tmp_path / "zero2.txt", "--horizon", 1,
                     "--overwrite")
        with h5py.File(out, "r") as f:
            assert f["run"].attrs["status"] == "complete"
    np.savetxt(tmp_path / "zero8.txt", np.zeros((8, 8)))
    solved(mfattn_binary, tmp_path / "zonal.h5", "--d", 8, "--zonal", "--grid", 64, "--v", "identity", "--beta", 0,
           "--perturbation", "1,0.01", "--horizon", 1)


def test_a_dangling_symlink_as_out_is_refused_up_front(mfattn_binary, tmp_path):
    link = tmp_path / "link.h5"
    link.symlink_to(tmp_path / "missing" / "x.h5")
    for command in (["meanfield", "--d", 2, "--horizon", 0.1], ["run", "--n", 4, "--horizon", 0.1]):
        done = subprocess.run([str(mfattn_binary), *map(str, command), "--quiet", "--out", str(link)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "symbolic link to a missing file" in done.stderr, done.stderr
        assert link.is_symlink() and [p.name for p in tmp_path.iterdir()] == ["link.h5"]


def test_info_and_analyze_speak_of_a_density_file_as_one(mfattn_binary, tmp_path):
    out = solved(mfattn_binary, tmp_path / "den.h5", "--d", 2, "--grid", 32, "--horizon", 0.1)
    info = subprocess.run([str(mfattn_binary), "info", str(out)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0
    listed = set(re.findall(r"^  (\S+) = ", info.stdout, re.M))
    assert {"d", "beta", "kernel", "grid", "horizon"} <= listed, info.stdout
    assert not listed & {"n", "integrator", "dt", "replicas", "init", "prefix", "weights"}, listed
    analyze = subprocess.run([str(mfattn_binary), "analyze", str(out)], capture_output=True, text=True, timeout=60)
    assert analyze.returncode == 2 and "is a density file of mfattn meanfield" in analyze.stderr, analyze.stderr


# --- The last line ---------------------------------------------------------------------------

# About 3 s to t = 0.1 and 4 s more to the horizon on two cores (the clusters form early).
SLOW = ["--d", 2, "--beta", 5, "--init-density", "vmf", "--grid", 2048, "--rtol", "1e-9", "--horizon", 1,
        "--save-every", 0.01]


def said_time(stderr: str) -> float:
    said = re.search(r"keeps every frame up to t = (\S+)", stderr)
    assert said, stderr
    return float(said.group(1))


def test_after_sigterm_the_last_line_names_the_files_last_frame(mfattn_binary, tmp_path):
    """With frames staged (--flush-interval 1000), the interruption's flush writes them all;
    the line named the last interval's flush instead (t = 1.3 for a file ending at 2.22). The
    signal goes once the progress line of t = 0.1 says ten frames are staged (the solve's
    other nine tenths take longer than its first)."""
    out = tmp_path / "term.h5"
    command = [str(mfattn_binary), "meanfield", *map(str, SLOW), "--flush-interval", "1000", "--threads", "1",
               "--out", str(out)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        progress = re.search(r"t = (\S+) / ", line)
        if progress and float(progress.group(1)) >= 0.1:
            break
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=120)[1], None
    stderr = "".join(lines) + (rest or "")
    assert process.returncode == 128 + signal.SIGTERM, stderr
    with h5py.File(out, "r", locking=False) as f:
        last = f["fields/density/time"][-1]
        assert f["run"].attrs["status"] == "interrupted: SIGTERM"
    assert last >= 0.1 and said_time(stderr) == last, (stderr, last)


def test_a_full_disk_names_the_last_frame_the_density_file_keeps(mfattn_binary, tmpfs):  # noqa: F811
    """A frame is kept whole or not at all; the last line names the last one kept (there was
    no such line after a failed write)."""
    disk = tmpfs("3m")
    out = disk / "full.h5"
    done = meanfield(mfattn_binary, out, "--d", 2, "--grid", 8192, "--horizon", 100, "--save-every", 0.01,
                     "--flush-interval", 0, timeout=300)
    assert done.returncode == 4, done.stderr
    with h5py.File(out, "r", locking=False) as f:
        times = f["fields/density/time"][()]
        status = f["run"].attrs["status"]
    assert len(times) > 1 and status.startswith("failed: I/O")
    assert said_time(done.stderr) == times[-1], (done.stderr, times[-1])
