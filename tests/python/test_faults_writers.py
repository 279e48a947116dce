"""Writers of one output exclude each other by mfattn's own lock, whatever HDF5 is told
(HDF5_USE_FILE_LOCKING=FALSE, as on NFS and Lustre); a resume marks its file `running` before
its first new frame; concurrent `mfattn.run` calls of one process never share a temporary
file; --overwrite replaces regular files only (docs/failure-model.md).

No test depends on how fast anything runs: the run that must be running while another is
refused does not end by itself, and conditions are polled with a generous deadline."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import pytest

from test_faults_run import (DEADLINE, frames_in, no_run_outlives_its_test,  # noqa: F401
                             run, run_attrs, start, temporary_files, wait_for)

LOCKING_OFF = {**os.environ, "HDF5_USE_FILE_LOCKING": "FALSE"}
# A run that does not end by itself within any test's lifetime (1e8 steps), with few enough
# frames (1e5) that every process of the loop below starts at once, each flushed at once.
ENDLESS_FEW_FRAMES = ("--n", 32, "--dt", 1e-5, "--horizon", 1000, "--save-every", 0.01,
                      "--flush-interval", 0)


def info(binary: Path, path: Path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), "info", str(path)], capture_output=True, text=True,
                          timeout=DEADLINE, env=env)


def test_with_hdf5_locking_off_a_running_file_refuses_resume_and_overwrite_20_of_20(
        mfattn_binary, tmp_path):
    for trial in range(20):
        out = tmp_path / f"w{trial}.h5"
        writer = start(mfattn_binary, out, *ENDLESS_FEW_FRAMES, env=LOCKING_OFF)
        try:
            wait_for(lambda: frames_in(out) >= 2, "the writer's frames", process=writer)
            for how in ({"resume": True}, {"overwrite": True}):
                second = run(mfattn_binary, out, *ENDLESS_FEW_FRAMES, env=LOCKING_OFF, timeout=DEADLINE, **how)
                assert second.returncode == 4, (trial, how, second.returncode, second.stderr)
                assert second.stderr.count("\n") == 1 and "another mfattn run" in second.stderr, second.stderr
            # Readers keep working beside the writer, which carries on.
            assert info(mfattn_binary, out, env=LOCKING_OFF).returncode == 0
            before = frames_in(out)
            wait_for(lambda: frames_in(out) > before, "frames after the refusals", process=writer)
        finally:
            writer.send_signal(signal.SIGTERM)
            writer.communicate(timeout=DEADLINE)
        assert writer.returncode == 128 + signal.SIGTERM, writer.stderr
        assert run_attrs(out)["status"] == "interrupted: SIGTERM"
        assert frames_in(out) >= 2
    assert not temporary_files(tmp_path)
    assert not list(tmp_path.glob(".*.lock")), "a writer that ended left its lock file"


def test_with_hdf5_locking_off_two_new_runs_of_one_output_give_one_file(mfattn_binary, tmp_path):
    out = tmp_path / "n.h5"
    first = start(mfattn_binary, out, *ENDLESS_FEW_FRAMES, env=LOCKING_OFF)
    try:
        wait_for(lambda: frames_in(out) >= 1, "the first run's frame 0", process=first)
        second = run(mfattn_binary, out, *ENDLESS_FEW_FRAMES, env=LOCKING_OFF, timeout=DEADLINE)
        assert second.returncode == 2, second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=DEADLINE)
    assert first.returncode == 128 + signal.SIGTERM


def test_a_killed_resume_says_running_not_complete(mfattn_binary, tmp_path):
    out = tmp_path / "r.h5"
    args = ("--n", 64, "--dt", 1e-4, "--save-every", 0.1)
    assert run(mfattn_binary, out, *args, "--horizon", 5).returncode == 0
    assert run_attrs(out)["status"] == "complete"
    before = frames_in(out)
    resumed = start(mfattn_binary, out, *args, "--horizon", 1e6, "--flush-interval", 0, resume=True)
    wait_for(lambda: frames_in(out) > before + 1, "the resume's new frames", process=resumed)
    resumed.kill()
    resumed.communicate()
    assert run_attrs(out)["status"] == "running"
    shown = info(mfattn_binary, out)
    assert shown.returncode == 0 and "complete" not in shown.stdout, shown.stdout


MODULE_SCRIPT = r"""
import sys, threading
sys.path.insert(0, sys.argv[1])
import mfattn
out, trials = sys.argv[2], int(sys.argv[3])
import os
for trial in range(trials):
    path = f"{out}.{trial}.h5"
    barrier = threading.Barrier(2)
    outcomes = [None, None]
    def call(k):
        barrier.wait()
        try:
            t = mfattn.run(out=path, n=64, d=3, horizon=3, dt=1e-3, save_every=0.1, threads=1)
            outcomes[k] = ("ok", t.run["status"], len(t.times))
        except BaseException as e:
            outcomes[k] = (type(e).__name__, str(e))
    threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(repr(outcomes))
"""


def test_two_run_calls_with_one_output_in_one_process_one_completes_one_is_refused(
        tmp_path):
    from conftest import MODULE_DIR  # the build's package folder
    done = subprocess.run([sys.executable, "-c", MODULE_SCRIPT, str(MODULE_DIR), str(tmp_path / "p"), "5"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        outcomes = eval(line)  # noqa: S307 - our own repr of tuples of str and int
        kinds = sorted(o[0] for o in outcomes)
        assert kinds == ["ValueError", "ok"], outcomes
        ok = next(o for o in outcomes if o[0] == "ok")
        assert ok[1] == "complete" and ok[2] == 31, outcomes
        refused = next(o for o in outcomes if o[0] == "ValueError")
        assert "exists" in refused[1] or "being written by another run" in refused[1], refused
    assert len(done.stdout.splitlines()) == 5
    assert not temporary_files(tmp_path) and not list(tmp_path.glob(".*.lock"))


def special_files(folder: Path):
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    made = [fifo]
    try:
        device = folder / "null"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        made.append(device)
    except PermissionError:
        pass  # not root: the FIFO alone
    return made


def test_overwrite_refuses_a_device_or_fifo_and_leaves_it(mfattn_binary, tmp_path):
    for path in special_files(tmp_path):
        kind = stat.S_IFMT(path.lstat().st_mode)
        for extra in ((), ("--overwrite",)):
            done = subprocess.run([str(mfattn_binary), "run", "--n", "8", "--horizon", "1", "--quiet",
                                   "--threads", "1", "--out", str(path), *extra],
                                  capture_output=True, text=True, timeout=DEADLINE)
            assert done.returncode == 2, (path, extra, done.returncode, done.stderr)
            assert done.stderr.count("\n") == 1 and "--out" in done.stderr and "regular file" in done.stderr
            assert stat.S_IFMT(path.lstat().st_mode) == kind, f"{path} was replaced"
    assert not temporary_files(tmp_path) and not list(tmp_path.glob(".*.lock"))
