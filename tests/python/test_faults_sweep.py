"""Faults around `mfattn sweep`, the info / analyze commands, the Python loader and the
dependency installer: real processes, real signals, real locks.

Nothing here waits a fixed time for something to happen: every test polls for the condition
it needs, with a generous deadline, so a busy machine only makes it slower.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import pytest

from mfattn.io import load

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 120.0  # seconds: far beyond what any condition below needs on an idle machine


def wait_for(condition, what: str, timeout: float = DEADLINE, every: float = 0.02):
    """Polls ``condition()`` until it returns something true; fails after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}", pytrace=False)
        time.sleep(every)


def processes_writing_into(folder: Path) -> list[int]:
    """Pids of the `mfattn run` processes whose command line names a file in ``folder``."""
    needle = str(folder).encode() + b"/"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and b"run" in words and any(w.startswith(needle) for w in words):
            found.append(int(entry))
    return found


def lock_is_free(path: Path) -> bool:
    """True when no process holds a lock on ``path`` (or it does not exist)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.fixture
def no_strays(tmp_path: Path):
    """Kills whatever `mfattn run` a test leaves behind in tmp_path (an old binary's orphans)."""
    yield
    for pid in processes_writing_into(tmp_path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def write_sweep(path: Path, axes: str, base: str = "d = 3\nthreads = 1\nsave-every = 0.5\n") -> Path:
    path.write_text(f"[base]\n{base}[axes]\n{axes}")
    return path


def dry_run_ids(binary: Path, sweep: Path, out: Path) -> list[str]:
    """The case ids of a sweep in grid order (from --dry-run)."""
    done = subprocess.run([str(binary), "sweep", "--dry-run", "--config", str(sweep),
                           "--out-dir", str(out)], capture_output=True, text=True, timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    ids = []
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].isdigit() and re.fullmatch(r"[0-9a-f]{16}", words[1]):
            ids.append(words[1])
    return ids


def manifest_status(out: Path) -> dict[str, str]:
    rows = (out / "manifest.csv").read_text().splitlines()
    header = rows[0].split(",")
    at_id, at_status = header.index("case_id"), header.index("status")
    return {fields[at_id]: fields[at_status] for fields in (row.split(",") for row in rows[1:])}


def default_stop_signals() -> None:
    """In the child before exec: the stop signals at their default disposition. A process keeps
    an ignored signal across exec, so under `nohup pytest` (SIGHUP ignored) the sweep would
    ignore the SIGHUP the test sends, as it should for its user, and the test would wait."""
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def start_sweep(binary: Path, sweep: Path, out: Path, tmp_path: Path, *extra: str):
    stdout = open(tmp_path / "sweep.out", "w")
    stderr = open(tmp_path / "sweep.err", "w")
    proc = subprocess.Popen([str(binary), "sweep", "--config", str(sweep), "--out-dir", str(out), *extra],
                            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                            preexec_fn=default_stop_signals)
    stdout.close()
    stderr.close()
    return proc


# --- A: a killed sweep takes its cases along; a rerun waits for a held case -------------------

def test_sigkilled_sweep_leaves_no_running_case_behind(mfattn_binary, tmp_path, no_strays):
    """SIGKILL to the sweep alone (not its process group): its running case must die with it
    (PR_SET_PDEATHSIG), releasing the case lock, keeping the .part and no final file."""
    sweep = write_sweep(tmp_path / "kill.ini", "n = 24\nhorizon = 1000000\n")
    out = tmp_path / "out"
    (case,) = dry_run_ids(mfattn_binary, sweep, out)
    proc = start_sweep(mfattn_binary, sweep, out, tmp_path)
    try:
        wait_for(lambda: (out / f"{case}.h5.part").exists() and processes_writing_into(out),
                 "the case to start writing")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    # Generous: the case only has to notice its parent's death (and flush, once run does that).
    end = time.monotonic() + 30.0
    while processes_writing_into(out) and time.monotonic() < end:
        time.sleep(0.05)
    orphans = processes_writing_into(out)
    assert not orphans, f"the killed sweep left its case running as an orphan (pids {orphans})"
    assert (out / f"{case}.h5.part").exists()
    assert not (out / f"{case}.h5").exists()
    # Nobody holds the case lock any more (a process that exits closes its files a moment after
    # its command line is gone from /proc: poll).
    wait_for(lambda: lock_is_free(out / f"{case}.lock"), "the case lock to be released", timeout=30.0)


def test_rerun_waits_for_a_case_held_elsewhere_and_completes_everything(mfattn_binary, tmp_path,
                                                                        no_strays):
    """A case whose lock another process holds (a sweep still running, or an orphan of an old
    one) is waited for, not skipped: once the lock is free the sweep runs the case itself and
    exits 0 with every case complete, each run once."""
    sweep = write_sweep(tmp_path / "held.ini", "n = 8 12 16\nhorizon = 1\n")
    out = tmp_path / "out"
    ids = dry_run_ids(mfattn_binary, sweep, out)
    assert len(ids) == 3
    out.mkdir()
    held = ids[1]
    fd = os.open(out / f"{held}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.lockf(fd, fcntl.LOCK_EX)  # a POSIX record lock conflicts with the sweep's OFD lock
    released = False
    proc = start_sweep(mfattn_binary, sweep, out, tmp_path)
    try:
        log = tmp_path / "sweep.out"
        # The sweep has looked at the held case (any verb) and finished the others, or ended.
        wait_for(lambda: proc.poll() is not None or (
            re.search(rf": \w+ {held} ", log.read_text()) and
            all((out / f"{i}.h5").exists() for i in (ids[0], ids[2]))), "the sweep to reach the held case")
        still_running = proc.poll() is None
        os.close(fd)
        released = True
        code = proc.wait(timeout=DEADLINE)
    finally:
        if not released:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "sweep.out").read_text() + (tmp_path / "sweep.err").read_text()
    assert still_running, f"the sweep ended while a case of its share was held elsewhere:\n{text}"
    assert code == 0, text
    assert manifest_status(out) == {i: "complete" for i in ids}, text
    runs = re.findall(r": run ([0-9a-f]{16}) ", text)
    assert sorted(runs) == sorted(ids), text
    assert re.search(rf": wait {held} running elsewhere", text), text
    assert not list(out.glob("*.part")) and not list(out.glob("*.lock")), text


# --- B: SIGTERM / SIGINT / SIGHUP are forwarded; the sweep reports what is undone --------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_stop_signal_is_forwarded_and_the_sweep_reports_undone_cases(mfattn_binary, tmp_path, no_strays,
                                                                     signum):
    sweep = write_sweep(tmp_path / "stop.ini", "n = 24 8\nhorizon = 1000000 1\n")
    out = tmp_path / "out"
    ids = dry_run_ids(mfattn_binary, sweep, out)
    long_case = ids[0]  # n=24, horizon=1e6: runs until stopped; the other three never start
    proc = start_sweep(mfattn_binary, sweep, out, tmp_path, "--jobs", "1")
    try:
        wait_for(lambda: (out / f"{long_case}.h5.part").exists() and processes_writing_into(out),
                 "the first case to start writing")
        os.kill(proc.pid, signum)  # the sweep alone, as a scheduler or `kill` would
        code = proc.wait(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = (tmp_path / "sweep.err").read_text()
    text = (tmp_path / "sweep.out").read_text() + stderr
    assert code == 128 + signum, f"exit {code}, expected {128 + signum}:\n{text}"
    end = time.monotonic() + 30.0
    while processes_writing_into(out) and time.monotonic() < end:
        time.sleep(0.05)
    assert not processes_writing_into(out), "the signal was not passed on to the running case"
    # The running case got the same signal (it died of it, or exited 128 + it after flushing).
    log = (out / f"{long_case}.log").read_text().strip().splitlines()[-1]
    assert log.startswith(f"mfattn sweep: interrupted: {signal.Signals(signum).name}"), log
    assert re.search(rf"killed by signal {int(signum)}\b|exit code {128 + int(signum)}\b", log), log
    # stderr: how many cases are undone, and which.
    assert "4 of 4 cases of this share undone" in stderr, stderr
    for case in ids:
        assert case in stderr, (case, stderr)
    assert (out / f"{long_case}.h5.part").exists(), "the interrupted case's .part must stay"
    status = manifest_status(out)
    assert status[long_case] == f"interrupted: {signal.Signals(signum).name}", status
    assert all(status[i] == "missing" for i in ids[1:]), status


# --- C: a huge dry run says how many cases there are before it expands them -------------------

def test_dry_run_prints_the_case_count_first(mfattn_binary, tmp_path):
    # 10^7 cases: the count is the product of the axis lengths, printed at once.
    seeds = " ".join(str(s) for s in range(10000))
    betas = " ".join(str(b) for b in range(1, 1001))
    huge = write_sweep(tmp_path / "huge.ini", f"seed = {seeds}\nbeta = {betas}\n",
                       base="d = 3\nn = 8\nhorizon = 1\n")
    proc = subprocess.Popen([str(mfattn_binary), "sweep", "--dry-run", "--config", str(huge),
                             "--out-dir", str(tmp_path / "huge"), "--shard", "3/4"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)
    reader.start()
    try:
        # Printing the count needs only the 11000-word file: 30 s is ample. (Before, the first
        # line came once the whole grid was expanded, after tens of seconds and gigabytes.)
        reader.join(timeout=30.0)
        got = list(first)  # before the kill, whose end of file would read as an empty line
    finally:
        proc.kill()
        proc.wait(timeout=DEADLINE)
    assert got and got[0], "the dry run printed nothing within 30 s"
    assert got[0].startswith("mfattn sweep: 10000000 cases, 2500000 in this share (shard 3/4)"), got[0]
    assert not (tmp_path / "huge").exists()

    # The count comes before the cases are expanded and checked: also before the error of a
    # bad value that only expansion finds.
    bad = write_sweep(tmp_path / "bad.ini", "seed = 0 1\nn = 8 12 -3\n", base="d = 3\nhorizon = 1\n")
    done = subprocess.run([str(mfattn_binary), "sweep", "--dry-run", "--config", str(bad),
                           "--out-dir", str(tmp_path / "bad")], capture_output=True, text=True,
                          timeout=DEADLINE)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("mfattn sweep: 6 cases, 6 in this share"), done.stdout + done.stderr
    assert "axis n value -3" in done.stderr


# --- D: one meaning of the exit codes for input files; the loader's exceptions ----------------

def make_bad_files(tmp_path: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, a word its error must contain)."""
    files: dict[str, tuple[Path, str]] = {}
    files["missing"] = (tmp_path / "missing.h5", "no such file")
    (tmp_path / "text.h5").write_text("not hdf5\n")
    files["text"] = (tmp_path / "text.h5", "not an HDF5 file")
    (tmp_path / "folder.h5").mkdir()
    files["folder"] = (tmp_path / "folder.h5", "directory")
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = [1.0, 2.0]
    files["foreign"] = (tmp_path / "foreign.h5", "not an mfattn H5MD file")
    (tmp_path / "truncated.h5").write_bytes(good.read_bytes()[:3000])
    files["truncated"] = (tmp_path / "truncated.h5", "truncated or damaged")
    shutil.copy(good, tmp_path / "nostep.h5")
    with h5py.File(tmp_path / "nostep.h5", "a") as f:
        del f["particles/tokens/position/step"]
    files["nostep"] = (tmp_path / "nostep.h5", "position/step")
    shutil.copy(good, tmp_path / "flat.h5")
    with h5py.File(tmp_path / "flat.h5", "a") as f:
        value = f["particles/tokens/position/value"][()]
        del f["particles/tokens/position/value"]
        f["particles/tokens/position/value"] = value.reshape(value.shape[0], -1)
    files["flat"] = (tmp_path / "flat.h5", "position/")
    return files


def test_unreadable_inputs_mean_the_same_everywhere(mfattn_binary, run_mfattn, tmp_path):
    good = run_mfattn("--n", 8, "--horizon", 1, out="good.h5")
    for name, (path, why) in make_bad_files(tmp_path, good).items():
        for command in ("info", "analyze"):
            done = subprocess.run([str(mfattn_binary), command, str(path)], capture_output=True,
                                  text=True, timeout=DEADLINE)
            assert done.returncode == 2, f"{command} {name}: exit {done.returncode}: {done.stderr}"
            assert why in done.stderr, f"{command} {name}: {done.stderr}"
            assert "opening the file failed" not in done.stderr, f"{command} {name}: {done.stderr}"
        resumed = subprocess.run([str(mfattn_binary), "run", "--n", "8", "--horizon", "2", "--resume",
                                  "--quiet", "--out", str(path)], capture_output=True, text=True,
                                 timeout=DEADLINE)
        assert resumed.returncode == 2, f"run --resume {name}: {resumed.stderr}"
        # The loader: FileNotFoundError for a missing file, ValueError saying why otherwise.
        expected = FileNotFoundError if name == "missing" else ValueError
        with pytest.raises(expected) as caught:
            load(path)
        assert type(caught.value) is expected, f"load {name}: {caught.value!r}"
        assert why.split()[-1] in str(caught.value), f"load {name}: {caught.value}"

    # A real mfattn file whose data cannot be read (a compressed chunk whose bytes are not
    # deflate's): I/O. (Data stored outside the file is refused as such, exit 2:
    # test_faults_layer_inputs.py.)
    broken = tmp_path / "broken.h5"
    shutil.copy(good, broken)
    with h5py.File(broken, "a") as f:
        times = f["particles/tokens/position/time"][()]
        del f["particles/tokens/position/time"]
        f.create_dataset("particles/tokens/position/time", data=times, chunks=times.shape, compression="gzip")
    with h5py.File(broken, "r") as f:
        chunk = f["particles/tokens/position/time"].id.get_chunk_info(0)
    data = bytearray(broken.read_bytes())
    data[chunk.byte_offset:chunk.byte_offset + chunk.size] = bytes(range(256)) * (chunk.size // 256) + bytes(
        chunk.size % 256)
    broken.write_bytes(bytes(data))
    for command in ("info", "analyze"):
        done = subprocess.run([str(mfattn_binary), command, str(broken)], capture_output=True, text=True,
                              timeout=DEADLINE)
        assert done.returncode == 4, f"{command} broken: exit {done.returncode}: {done.stderr}"
        assert "position/time" in done.stderr, done.stderr
    with pytest.raises(OSError):
        load(broken)


# --- E: the installer waits for the dpkg lock -------------------------------------------------

def test_install_deps_waits_for_the_dpkg_lock(tmp_path):
    """Runs install_deps with fake dpkg-query (everything missing), id (root) and apt-get: the
    fake apt-get fails as a held lock makes the real one fail, unless it is told to wait."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "apt-calls.txt"
    (fake / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")
    (fake / "id").write_text("#!/bin/sh\necho 0\n")
    (fake / "apt-get").write_text(
        "#!/bin/sh\n"
        f"echo \"$*\" >> '{calls}'\n"
        "case \" $* \" in\n"
        "  *' -o DPkg::Lock::Timeout=600 '*) exit 0 ;;\n"
        "esac\n"
        "echo 'E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1 (apt-get)' >&2\n"
        "exit 100\n")
    for tool in fake.iterdir():
        tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    env.pop("MFATTN_APT_LOCK_TIMEOUT", None)
    done = subprocess.run(["bash", "-c", f"source '{REPO_ROOT}/tests/install_deps.sh' && install_deps"],
                          capture_output=True, text=True, env=env, timeout=DEADLINE)
    lines = calls.read_text().splitlines() if calls.exists() else []
    assert done.returncode == 0, f"install_deps failed ({done.returncode}): {done.stderr}\ncalls: {lines}"
    assert any(" update" in f" {line}" for line in lines), lines
    assert any(" install " in f" {line} " for line in lines), lines
    for line in lines:
        words = line.split()
        assert words[:2] == ["-o", "DPkg::Lock::Timeout=600"], f"apt-get {line}: does not wait for the lock"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
