"""Fault injection for the files mfattn reads back: crafted and damaged files given to
`mfattn info`, `mfattn analyze` and `mfattn run --resume`, the file a full disk leaves, and a
--threads beyond the process limit.
Real processes; the files are copies of a real small run's file, changed with h5py.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from test_faults_run import run, run_attrs, tmpfs  # noqa: F401 (tmpfs is a fixture)

POSITION = "particles/tokens/position/"
SMALL = ("--n", 8, "--d", 3, "--horizon", 1)


def replace(f: h5py.File, name: str, data) -> None:
    del f[name]
    f[name] = data


def set_last_time(value):
    def damage(f: h5py.File) -> None:
        times = f[POSITION + "time"][()]
        times[-1] = value
        f[POSITION + "time"][...] = times
    return damage


def times_going_back(f: h5py.File) -> None:
    times = f[POSITION + "time"][()]
    times[50:] -= 0.6
    f[POSITION + "time"][...] = times


DAMAGES = {
    "d0": lambda f: replace(f, POSITION + "value", np.zeros((101, 8, 0))),
    "d6": lambda f: replace(f, POSITION + "value", np.tile(f[POSITION + "value"][()], (1, 1, 2))),
    "complex": lambda f: replace(f, POSITION + "value", f[POSITION + "value"][()].astype(complex)),
    "int32": lambda f: replace(f, POSITION + "value", f[POSITION + "value"][()].astype(np.int32)),
    "float32 positions": lambda f: replace(f, POSITION + "value",
                                           f[POSITION + "value"][()].astype(np.float32)),
    "float32 observable": lambda f: replace(f, "observables/energy/value",
                                            f["observables/energy/value"][()].astype(np.float32)),
    "float32 step size": lambda f: replace(f, "run/step_size",
                                           f["run/step_size"][()].astype(np.float32)),
    "NaN time": set_last_time(np.nan),
    "decreasing times": times_going_back,
}


@pytest.fixture(scope="module")
def small_run(mfattn_binary, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("small") / "small.h5"
    done = run(mfattn_binary, out, *SMALL)
    assert done.returncode == 0, done.stderr
    return out


def refused_in_one_line(done: subprocess.CompletedProcess, path: Path) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(path) in done.stderr or path.name in done.stderr, done.stderr
    assert "HDF5" not in done.stderr, done.stderr


def refused_by_every_reader(binary, bad):
    """info, analyze and --resume each refuse `bad` in one line."""
    for command in (["info"], ["analyze"]):
        done = subprocess.run([str(binary), *command, str(bad)], capture_output=True,
                              text=True, timeout=60)
        refused_in_one_line(done, bad)
    resumed = run(binary, bad, *SMALL[:-1], 2, resume=True, timeout=60)
    refused_in_one_line(resumed, bad)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_crafted_file_is_refused_by_info_analyze_and_resume_and_left_untouched(
        mfattn_binary, small_run, tmp_path, damage):
    bad = tmp_path / "bad.h5"
    shutil.copy(small_run, bad)
    with h5py.File(bad, "r+") as f:
        DAMAGES[damage](f)
    before = bad.read_bytes()
    refused_by_every_reader(mfattn_binary, bad)
    assert bad.read_bytes() == before


def test_a_damaged_object_header_is_refused_in_one_line_without_hdf5_noise(
        mfattn_binary, small_run, tmp_path):
    # /h5md/creator's object header (version 1: a 16-byte prefix) starts with a continuation
    # message (type 0x10: an 8-byte address, then an 8-byte length); its length made huge,
    # HDF5 cannot load the header, and the object it half-opened kept the file open until
    # HDF5's exit handler printed "infinite loop closing library".
    with h5py.File(small_run, "r") as f:
        header = h5py.h5o.get_info(f["h5md/creator"].id).addr
    data = bytearray(small_run.read_bytes())
    assert data[header] == 1 and int.from_bytes(data[header + 16:header + 18], "little") == 0x10
    data[header + 39] = 0x18
    bad = tmp_path / "bad.h5"
    bad.write_bytes(bytes(data))
    refused_by_every_reader(mfattn_binary, bad)
    assert bad.read_bytes() == bytes(data)


def test_a_full_disk_names_the_last_frame_kept_and_counts_only_its_steps(
        mfattn_binary, tmpfs):  # noqa: F811
    disk = tmpfs("2m")
    out = disk / "o.h5"
    # Frames staged for long (a large --flush-interval): the flush that meets the full disk
    # keeps the whole frames that still fit.
    done = run(mfattn_binary, out, "--n", 64, "--horizon", 20, "--save-every", 0.002,
               "--flush-interval", 1000)
    assert done.returncode == 4, done.stderr
    with h5py.File(out, "r", locking=False) as f:
        times = f[POSITION + "time"][()]
        steps = f[POSITION + "step"][()]
    assert len(times) > 1
    said = re.search(r"keeps every frame up to t = (\S+)", done.stderr)
    assert said, done.stderr
    assert float(said.group(1)) == pytest.approx(times[-1], rel=1e-5), done.stderr
    attrs = run_attrs(out)
    assert attrs["status"].startswith("failed: I/O:")
    assert attrs["steps"] == steps[-1]


def processes_of(uid: int) -> int:
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        if re.search(rf"^Uid:\s+{uid}\s", text, re.M):
            count += 1
    return count


def under_a_process_limit(command: list[str], spare: int = 32) -> list[str]:
    """`command` under a limit on processes (RLIMIT_NPROC, which counts threads) `spare` above
    what its user runs now. The limit is not enforced for root: as root the command goes to
    an unprivileged uid (setpriv), otherwise it keeps the caller's."""
    uid = os.geteuid()
    if uid == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is needed to run as an unprivileged user")
        uid = 65534
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit is needed to set a process limit")
    return ["prlimit", f"--nproc={processes_of(uid) + spare}", *command]


def test_threads_beyond_the_process_limit_are_refused_before_any_file(mfattn_binary):
    folder = Path(tempfile.mkdtemp(prefix="mfattn-threads-"))
    try:
        folder.chmod(0o777)
        out = folder / "t.h5"
        done = subprocess.run(under_a_process_limit([str(mfattn_binary), "run", "--n", "2000",
                                                     "--horizon", "0.01", "--threads", "4096",
                                                     "--quiet", "--out", str(out)]),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, (done.returncode, done.stderr)
        assert done.stderr.count("\n") == 1 and "--threads 4096" in done.stderr, done.stderr
        assert list(folder.iterdir()) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("mode", ["ends", "none"])
def test_the_checkpoint_of_a_finished_run_does_not_depend_on_flush_timing(mfattn_binary, tmp_path,
                                                                          mode):
    checkpoints = []
    for interval in (0, 86400):
        out = tmp_path / f"flush{interval}.h5"
        done = run(mfattn_binary, out, "--n", 16, "--d", 3, "--replicas", 2, "--horizon", 2,
                   "--save-every", 0.05, "--save-positions", mode, "--flush-interval", interval)
        assert done.returncode == 0, done.stderr
        with h5py.File(out, "r") as f:
            checkpoints.append({name: f["run/checkpoint"][name][()]
                                for name in ("x", "step", "time", "step_size", "frame")})
    per_frame, batched = checkpoints
    for name in per_frame:
        assert np.array_equal(per_frame[name], batched[name]), name


def test_a_resume_at_a_layer_start_records_that_frame_as_the_uninterrupted_run(mfattn_binary,
                                                                                tmp_path):
    # The first part ends at t = 0.5, the start of layer 1: its final frame is recorded with
    # layer 1's matrices, as the uninterrupted run records it.
    args = ("--n", 16, "--d", 3, "--regen-period", 0.5, "--q", "gaussian", "--k", "gaussian",
            "--v", "gaussian", "--save-every", 0.1)
    part, whole = tmp_path / "part.h5", tmp_path / "whole.h5"
    assert run(mfattn_binary, part, *args, "--horizon", 0.5).returncode == 0
    resumed = run(mfattn_binary, part, *args, "--horizon", 1, resume=True)
    assert resumed.returncode == 0, resumed.stderr
    assert run(mfattn_binary, whole, *args, "--horizon", 1).returncode == 0
    with h5py.File(part, "r") as a, h5py.File(whole, "r") as b:
        for name in b["observables"]:
            assert np.array_equal(a[f"observables/{name}/value"][()],
                                  b[f"observables/{name}/value"][()]), name
        assert np.array_equal(a[POSITION + "value"][()], b[POSITION + "value"][()])


@pytest.mark.parametrize("integrator", ["rk4", "euler"])
def test_positions_at_a_time_do_not_depend_on_save_every(mfattn_binary, tmp_path, integrator):
    # Frames on the step grid (dt 0.01): the step that lands on a frame is dt itself, not the
    # remainder that accumulated time leaves (a few ulps off dt).
    files = {}
    for every in (0.02, 0.1, 0.5):
        out = tmp_path / f"every{every}.h5"
        done = run(mfattn_binary, out, "--n", 16, "--d", 3, "--horizon", 2, "--dt", 0.01,
                   "--integrator", integrator, "--save-every", every)
        assert done.returncode == 0, done.stderr
        with h5py.File(out, "r") as f:
            files[every] = dict(zip(f[POSITION + "time"][()], f[POSITION + "value"][()]))
    for every in (0.02, 0.1):
        for time, x in files[0.5].items():
            assert np.array_equal(files[every][time], x), (every, time)
