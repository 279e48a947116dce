"""Fault injection for `mfattn run`: concurrent writers, full disks, signals, kills before
frame 0, resumes. Real processes, real signals and, where this process may mount one, a real
full filesystem (tmpfs); without that permission those tests skip and say why.

No test depends on how fast anything runs: processes are polled for a condition with a
generous deadline, and runs that are meant to be interrupted are made long enough that the
interruption lands first, whatever the machine's speed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

DEADLINE = 120.0  # seconds a condition may take on a busy machine


def wait_for(condition, what: str, deadline: float = DEADLINE, process=None):
    """Polls condition() until it is true; fails after `deadline` seconds or when `process`
    ends first."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if condition():
            return
        if process is not None and process.poll() is not None:
            pytest.fail(f"the run ended (exit {process.returncode}) before {what}")
        time.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


def frames_in(path: Path) -> int:
    """Complete frames of an mfattn file that may be open in a writer (no file locking)."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            return int(min(f["particles/tokens/position/value"].shape[0],
                           f["particles/tokens/position/time"].shape[0]))
    except (OSError, KeyError):
        return 0


def flushed_frames(path: Path) -> int:
    """frames_in, where /run's step count is that of the last frame (0 otherwise)."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            frames = int(min(f["particles/tokens/position/value"].shape[0],
                             f["particles/tokens/position/time"].shape[0]))
            if frames == 0 or int(f["run"].attrs["steps"]) != int(f["particles/tokens/position/step"][frames - 1]):
                return 0
            return frames
    except (OSError, KeyError):
        return 0


def run_attrs(path: Path) -> dict:
    with h5py.File(path, "r", locking=False) as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["run"].attrs.items()}


def positions(path: Path) -> np.ndarray:
    with h5py.File(path, "r", locking=False) as f:
        return f["particles/tokens/position/value"][()]


_started: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_run_outlives_its_test():
    """Kills every run a test started and left running (a test that failed half-way)."""
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.kill()
            process.communicate()


def start(binary: Path, out: Path, *args, overwrite=False, resume=False, **popen) -> subprocess.Popen:
    command = [str(binary), "run", *map(str, args), "--threads", "1", "--quiet", "--out", str(out)]
    if overwrite:
        command.append("--overwrite")
    if resume:
        command.append("--resume")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               **popen)
    _started.append(process)
    return process


def run(binary: Path, out: Path, *args, timeout=300.0, **kw) -> subprocess.CompletedProcess:
    process = start(binary, out, *args, **kw)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()  # a run that does not end must not outlive its test
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def temporary_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


# A run that does not end by itself within any test's lifetime (1e8 steps at n = 64).
ENDLESS = ("--n", 64, "--dt", 1e-5, "--horizon", 1000, "--save-every", 1e-4)


@pytest.fixture
def tmpfs(tmp_path: Path):
    """Mounts a fresh tmpfs of the size asked for: tmpfs("2m") -> its folder."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): "
                        + (done.stderr.strip() or f"mount exited {done.returncode}"))
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_overwrite_of_a_file_being_written_is_refused_and_the_writer_keeps_its_file(
        mfattn_binary, tmp_path):
    out = tmp_path / "s.h5"
    first = start(mfattn_binary, out, *ENDLESS)
    try:
        wait_for(lambda: frames_in(out) >= 2, "the first run's frames", process=first)
        second = run(mfattn_binary, out, "--n", 8, "--horizon", 1, overwrite=True, timeout=120)
        assert second.returncode == 4, second.stderr
        assert second.stderr.count("\n") == 1 and "another process" in second.stderr
        # The first run's file was not truncated: it still opens and keeps growing.
        before = frames_in(out)
        assert before >= 2
        wait_for(lambda: frames_in(out) > before, "frames after the refused overwrite",
                 process=first)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=DEADLINE)
    assert first.returncode == 128 + signal.SIGTERM
    assert positions(out).shape[1:] == (64, 3)
    assert not temporary_files(tmp_path)


def test_full_disk_mid_run_keeps_whole_frames_records_the_failure_and_resumes_exactly(
        mfattn_binary, tmp_path, tmpfs):
    disk = tmpfs("2m")
    args = ("--n", 64, "--horizon", 20, "--save-every", 0.002)
    done = run(mfattn_binary, disk / "o.h5", *args)
    assert done.returncode == 4, done.stderr
    assert "No space left on device" in done.stderr
    status = run_attrs(disk / "o.h5")["status"]
    assert status.startswith("failed: I/O:") and "No space left on device" in status
    kept = positions(disk / "o.h5")
    assert kept.shape[0] >= 2
    # Every frame in the file is whole: unit vectors, no frame of zeros.
    np.testing.assert_allclose(np.linalg.norm(kept, axis=-1), 1.0, atol=1e-12)
    # Moved to a disk with space, the file continues to the same bits as an uninterrupted run.
    moved = tmp_path / "o.h5"
    moved.write_bytes((disk / "o.h5").read_bytes())
    (disk / "o.h5").unlink()
    resumed = run(mfattn_binary, moved, *args, resume=True)
    assert resumed.returncode == 0, resumed.stderr
    reference = run(mfattn_binary, tmp_path / "ref.h5", *args)
    assert reference.returncode == 0, reference.stderr
    assert np.array_equal(positions(moved), positions(tmp_path / "ref.h5"))
    assert run_attrs(moved)["status"] == "complete"
    assert run_attrs(moved)["steps"] == run_attrs(tmp_path / "ref.h5")["steps"] == 10000


def test_full_disk_before_frame_zero_exits_4_and_leaves_nothing(mfattn_binary, tmpfs):
    disk = tmpfs("256k")
    # Leave a few KiB: room for HDF5 to start a file, not for a frame.
    (disk / "filler").write_bytes(b"\0" * (256 - 12) * 1024)
    done = run(mfattn_binary, disk / "o.h5", "--n", 8, "--horizon", 1)
    assert done.returncode == 4, (done.returncode, done.stderr)
    assert "No space left on device" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_resume_refuses_a_beta_that_differs_past_the_twelfth_digit(mfattn_binary, tmp_path):
    out = tmp_path / "r.h5"
    assert run(mfattn_binary, out, "--n", 8, "--horizon", 1, "--beta", 1).returncode == 0
    before = out.read_bytes()
    done = run(mfattn_binary, out, "--n", 8, "--horizon", 2, "--beta", "1.0000000000001",
               resume=True)
    assert done.returncode == 2, done.stderr
    assert "--beta" in done.stderr and "1.0000000000001" in done.stderr
    assert out.read_bytes() == before
    done = run(mfattn_binary, out, "--n", 8, "--horizon", 2, "--dt", "0.010000000000000002",
               resume=True)
    assert done.returncode == 2 and "--dt" in done.stderr, done.stderr


def test_a_file_from_a_build_without_an_option_resumes_while_the_option_keeps_its_default(
        mfattn_binary, tmp_path):
    # A file written before --toeplitz-* existed has no such parameter: it was made with the
    # default, so it resumes with the default and is refused with another value.
    out = tmp_path / "old.h5"
    assert run(mfattn_binary, out, "--n", 8, "--horizon", 1).returncode == 0
    with h5py.File(out, "r+") as f:
        for name in ("toeplitz-coefficients", "toeplitz-frequencies"):
            del f["parameters"].attrs[name]
    before = out.read_bytes()
    refused = run(mfattn_binary, out, "--n", 8, "--horizon", 2, "--toeplitz-coefficients", "2",
                  resume=True)
    assert refused.returncode == 2, refused.stderr
    assert "--toeplitz-coefficients is 2 but the file was made with no such option" in refused.stderr
    assert out.read_bytes() == before
    done = run(mfattn_binary, out, "--n", 8, "--horizon", 2, resume=True)
    assert done.returncode == 0, done.stderr
    assert frames_in(out) > 0 and positions(out).shape[0] == frames_in(out)


def test_a_run_killed_before_frame_zero_leaves_no_file_under_its_name(mfattn_binary, tmp_path):
    out = tmp_path / "early.h5"
    # Frame 0's observables at n = 12000, d = 64 take seconds on one thread: the kill lands
    # between the file's creation and frame 0.
    process = start(mfattn_binary, out, "--n", 12000, "--d", 64, "--horizon", 1)
    wait_for(lambda: temporary_files(tmp_path) or out.exists(), "the output file's creation",
             process=process)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=DEADLINE)
    assert not out.exists(), "a file without frame 0 appeared under the output name"
    # A plain rerun (no --overwrite) is accepted.
    done = run(mfattn_binary, out, "--n", 8, "--horizon", 1)
    assert done.returncode == 0, done.stderr
    assert frames_in(out) == 101


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_flushes_records_interrupted_and_resumes_exactly(mfattn_binary, tmp_path, sig):
    out = tmp_path / "sig.h5"
    args = ("--n", 64, "--dt", 1e-4, "--horizon", 100, "--save-every", 0.01)
    process = start(mfattn_binary, out, *args)
    wait_for(lambda: frames_in(out) >= 3, "three frames", process=process)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=DEADLINE)
    assert process.returncode == 128 + sig, stderr
    name = signal.Signals(sig).name
    assert f"interrupted by {name}" in stderr and "--resume" in stderr
    attrs = run_attrs(out)
    assert attrs["status"] == f"interrupted: {name}"
    kept = frames_in(out)
    assert kept >= 3
    with h5py.File(out, "r") as f:  # closed cleanly: a locking reader opens it
        assert int(f["particles/tokens/position/step"][kept - 1]) * 1e-4 == pytest.approx(
            float(f["particles/tokens/position/time"][kept - 1]))
    # Continued (and interrupted once more), the frames are those of an uninterrupted run.
    resumed = start(mfattn_binary, out, *args, resume=True)
    wait_for(lambda: frames_in(out) >= kept + 2, "resumed frames", process=resumed)
    resumed.send_signal(signal.SIGTERM)
    resumed.communicate(timeout=DEADLINE)
    total = frames_in(out)
    reference_args = list(args)
    reference_args[reference_args.index("--horizon") + 1] = (total - 1) * 0.01
    reference = run(mfattn_binary, tmp_path / "ref.h5", *reference_args)
    assert reference.returncode == 0, reference.stderr
    assert np.array_equal(positions(out)[:total], positions(tmp_path / "ref.h5")[:total])


def test_progress_moves_between_frames_on_a_terminal(mfattn_binary, tmp_path):
    import pty
    import re
    leader, follower = pty.openpty()
    out = tmp_path / "p.h5"
    command = [str(mfattn_binary), "run", "--n", 64, "--dt", 1e-5, "--horizon", 1000,
               "--save-every", 1000, "--threads", 1, "--out", out]
    process = subprocess.Popen([str(c) for c in command], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=follower)
    _started.append(process)
    os.close(follower)
    os.set_blocking(leader, False)
    seen = b""
    moving = re.compile(rb"\] ([0-9]+\.[0-9])%")

    def advanced() -> bool:
        nonlocal seen
        try:
            seen += os.read(leader, 65536)
        except (BlockingIOError, OSError):
            pass
        return any(float(m) > 0.0 for m in moving.findall(seen))

    try:
        wait_for(advanced, "a progress bar past 0.0% before the first frame after t = 0",
                 deadline=60, process=process)
        assert b"steps/s" in seen
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=DEADLINE)
        os.close(leader)


def test_a_step_count_that_cannot_finish_is_refused(mfattn_binary, tmp_path):
    done = run(mfattn_binary, tmp_path / "never.h5", "--dt", 1e-300, "--horizon", 1, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--dt" in done.stderr and "1e+300" in done.stderr.replace("1e300", "1e+300")
    assert not (tmp_path / "never.h5").exists()


def test_steps_and_wall_time_count_every_part_of_a_killed_and_resumed_run(mfattn_binary, tmp_path):
    out = tmp_path / "k.h5"
    args = ["--n", 64, "--dt", 1e-4, "--horizon", 1, "--save-every", 0.01]
    # Kill after a few frames; a run that won the race is repeated with a longer horizon.
    for horizon in (1, 4, 16, 64):
        out.unlink(missing_ok=True)
        args[args.index("--horizon") + 1] = horizon
        process = start(mfattn_binary, out, *args)
        # Killed between two flushes: once the file shows three frames and /run's counts as of
        # the last (one flush writes both, in HDF5's order, so a kill inside a flush can find
        # the frames there before the counts).
        wait_for(lambda: flushed_frames(out) >= 3 or process.poll() is not None, "three flushed frames")
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=DEADLINE)
        if process.returncode != -signal.SIGKILL:
            continue
        # A kill after the last step races the end of the run: a longer one is tried.
        with h5py.File(out, "r", locking=False) as f:
            if float(f["particles/tokens/position/time"][-1]) < horizon:
                break
    else:
        pytest.fail("every run finished before it could be killed")
    with h5py.File(out, "r", locking=False) as f:
        last_step = int(f["particles/tokens/position/step"][-1])
        first_wall = float(f["run"].attrs["wall_time_s"])
        assert int(f["run"].attrs["steps"]) == last_step > 0
    assert first_wall > 0
    done = run(mfattn_binary, out, *args, resume=True)
    assert done.returncode == 0, done.stderr
    attrs = run_attrs(out)
    assert attrs["status"] == "complete"
    assert attrs["steps"] == round(horizon / 1e-4)
    assert attrs["wall_time_s"] > first_wall


def test_info_and_resume_on_a_malformed_file_say_so_instead_of_aborting(mfattn_binary, tmp_path):
    bad = tmp_path / "bad.h5"
    good = tmp_path / "good.h5"
    assert run(mfattn_binary, good, "--n", 8, "--horizon", 1).returncode == 0
    bad.write_bytes(good.read_bytes())
    with h5py.File(bad, "r+") as f:
        del f["particles/tokens/position/value"]
        f["particles/tokens/position/value"] = np.zeros((101, 24))
    info = subprocess.run([str(mfattn_binary), "info", str(bad)], capture_output=True, text=True,
                          timeout=60)
    assert info.returncode in (2, 4), (info.returncode, info.stderr)
    assert "bad.h5" in info.stderr and info.stderr.count("\n") == 1
    resumed = run(mfattn_binary, bad, "--n", 8, "--horizon", 2, resume=True, timeout=60)
    assert resumed.returncode in (2, 4), (resumed.returncode, resumed.stderr)
    assert "bad.h5" in resumed.stderr and resumed.stderr.count("\n") == 1


def test_a_signal_delivered_twice_at_once_still_ends_the_run_cleanly(mfattn_binary, tmp_path):
    """A scheduler that signals every process of a job reaches a sweep's case directly and
    through the sweep: two SIGTERMs within a moment are one request, and the run flushes."""
    out = tmp_path / "twice.h5"
    process = start(mfattn_binary, out, *ENDLESS)
    wait_for(lambda: frames_in(out) >= 2, "two frames", process=process)
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=DEADLINE)
    assert process.returncode == 128 + signal.SIGTERM
    assert run_attrs(out)["status"] == "interrupted: SIGTERM"


def test_a_reader_holding_the_file_does_not_block_overwrite_and_is_named_by_resume(
        mfattn_binary, tmp_path):
    out = tmp_path / "read.h5"
    assert run(mfattn_binary, out, "--n", 8, "--horizon", 1).returncode == 0
    with h5py.File(out, "r"):  # h5py's default: a shared file lock, held until closed
        # Writing in place needs HDF5's exclusive lock: refused, saying what holds the file.
        before = out.read_bytes()
        resumed = run(mfattn_binary, out, "--n", 8, "--horizon", 2, resume=True)
        assert resumed.returncode == 4, resumed.stderr
        assert "locking=False" in resumed.stderr and resumed.stderr.count("\n") == 1
        assert out.read_bytes() == before
        # A replacement is a new file renamed over the old one: a reader does not block it.
        replaced = run(mfattn_binary, out, "--n", 8, "--horizon", 3, overwrite=True)
        assert replaced.returncode == 0, replaced.stderr
    assert frames_in(out) == 101
    with h5py.File(out, "r") as f:
        assert float(f["particles/tokens/position/time"][-1]) == 3.0
