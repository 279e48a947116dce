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

from mfattn_io import load

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


def start_sweep(binary: Path, sweep: Path, out: Path, tmp_path: Path, *extra: str):
    stdout = open(tmp_path / "sweep.out", "w")
    stderr = open(tmp_path / "sweep.err", "w")
    proc = subprocess.Popen([str(binary), "sweep", "--config", str(sweep), "--out-dir", str(out), *extra],
                            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
    stdout.close()
    stderr.close()
    return proc


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
