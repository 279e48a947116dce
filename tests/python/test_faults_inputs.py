"""Input files and the option rules every command shares (docs/cli.md, "Input files" and
"Option rules"): a file that mfattn reads must be a regular file, checked without blocking and
read with a size bound, or the command ends with exit 2 and one line naming the option, the
path and the reason; an option given twice and a bare '--' are refused by every command.

Real processes against real FIFOs, devices and unreadable files. Every process runs under an
address-space limit and a short timeout: a binary that blocks on a FIFO or reads /dev/zero
without end fails the test instead of hanging it.
"""
from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

MEMORY_LIMIT = 4 << 30
TIMEOUT = 20
NOT_REGULAR = "is not a regular file"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(binary: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([*prefix, str(binary), *args], capture_output=True, text=True,
                          timeout=TIMEOUT, preexec_fn=_limit_memory, env=env)


def shown(value) -> str:
    """A value as messages quote it: longer than 80 characters, its first 77 and "..."
    (src/app/option_rules.hpp), as a path in a deep temporary folder is."""
    value = str(value)
    return value if len(value) <= 80 else value[:77] + "..."


def assert_refused(done: subprocess.CompletedProcess, named: list[str], code: int = 2) -> None:
    described = f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == code, described
    lines = done.stderr.splitlines()
    assert len(lines) == 1, described
    for word in named:
        # A tuple: alternatives (a path quoted whole, or shortened when longer than 80).
        alternatives = word if isinstance(word, tuple) else (word,)
        assert any(w in lines[0] for w in alternatives), f"{word!r} not named\n{described}"


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def small_run(binary: Path, tmp_path: Path) -> Path:
    out = tmp_path / "small.h5"
    done = run(binary, "run", "--n", "4", "--horizon", "0.1", "--quiet", "--threads", "1",
               "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


# 1. A FIFO (no writer: opening it for reading would wait for ever) is refused at once.
@pytest.mark.parametrize("command, named", [
    (["info", "{f}"], ["{f}"]),
    (["analyze", "{f}"], ["{f}"]),
    (["run", "--resume", "--quiet", "--out", "{f}"], ["--out {f}", "not a regular file"]),
    (["run", "--init", "file", "--init-file", "{f}", "--out", "{o}"], ["--init-file {f}"]),
    (["run", "--q", "{f}", "--out", "{o}"], ["--q {f}"]),
    (["run", "--k", "{f}", "--out", "{o}"], ["--k {f}"]),
    (["run", "--v", "{f}", "--out", "{o}"], ["--v {f}"]),
    (["run", "--positions", "{f}", "--out", "{o}"], ["--positions {f}"]),
    (["run", "--geometry", "lie", "--generators", "{f}", "--out", "{o}"], ["--generators {f}"]),
    (["run", "--prefix", "1", "--prefix-init", "{f}", "--out", "{o}"], ["--prefix-init {f}"]),
    (["bench", "--q", "{f}"], ["--q {f}"]),
    (["realize", "--mechanism", "rope", "--target", "{f}", "--out", "{o}"], ["--target {f}"]),
])
def test_fifo_is_refused_without_blocking(mfattn_binary, tmp_path, fifo, command, named):
    out = tmp_path / "out.h5"
    fill = lambda word: word.format(f=fifo, o=out)  # noqa: E731
    done = run(mfattn_binary, *map(fill, command))
    assert_refused(done, [*map(fill, named), NOT_REGULAR, "FIFO"])
    assert not out.exists()


# 2. A device that never ends is refused before a byte is read (it used to be read until the
#    memory ran out, deaf to SIGTERM meanwhile).
@pytest.mark.parametrize("option", [
    ["--init", "file", "--init-file"], ["--q"], ["--positions"], ["--amplitudes"],
    ["--geometry", "lie", "--generators"], ["--prefix", "1", "--prefix-init"],
])
def test_endless_device_is_refused(mfattn_binary, tmp_path, option):
    out = tmp_path / "out.h5"
    done = run(mfattn_binary, "run", *option, "/dev/zero", "--quiet", "--out", str(out))
    assert_refused(done, [f"{option[-1]} /dev/zero", NOT_REGULAR, "character device"])
    assert not out.exists()


def test_text_file_over_the_bound_is_refused_before_it_is_read(mfattn_binary, tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as sparse:  # 1 GiB + 1 byte of holes: no disk taken
        sparse.truncate((1 << 30) + 1)
    for option in (["--q"], ["--init", "file", "--init-file"]):
        done = run(mfattn_binary, "run", *option, str(big), "--quiet", "--out", str(tmp_path / "o.h5"))
        assert_refused(done, [f"{option[-1]} {big}", "is 1073741825 bytes, more than the 1073741824 accepted"])


def test_realize_target_device_is_named_as_such(mfattn_binary, tmp_path):
    done = run(mfattn_binary, "realize", "--mechanism", "rope", "--target", "/dev/zero",
               "--out", str(tmp_path / "out.h5"))
    assert_refused(done, ["--target /dev/zero", NOT_REGULAR])


def test_hdf5_inputs_refuse_a_device_before_hdf5_opens_it(mfattn_binary):
    for command in (["info", "/dev/zero"], ["analyze", "/dev/zero"]):
        assert_refused(run(mfattn_binary, *command), ["/dev/zero", NOT_REGULAR])


# 3. The reason is the system's: an unreadable file is "permission denied", not missing.
def unreadable_runner(tmp_path: Path) -> tuple[str, ...]:
    """The prefix that runs mfattn without the right to read a mode-000 file: nothing for an
    ordinary user; for root, setpriv without the capabilities that override file modes."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: a mode-000 file stays readable")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search")


@pytest.mark.parametrize("command, named", [
    (["run", "--config", "{f}", "--out", "{o}"], ["--config {f}"]),
    (["run", "--init", "file", "--init-file", "{f}", "--out", "{o}"], ["--init-file {f}"]),
    (["run", "--q", "{f}", "--out", "{o}"], ["--q {f}"]),
    (["run", "--amplitudes", "{f}", "--out", "{o}"], ["--amplitudes {f}"]),
    (["run", "--geometry", "lie", "--generators", "{f}", "--out", "{o}"], ["--generators {f}"]),
    (["sweep", "--config", "{f}"], ["--config {f}"]),
    (["realize", "--mechanism", "rope", "--target", "{f}", "--out", "{o}"], ["--target {f}"]),
])
def test_unreadable_file_says_permission_denied(mfattn_binary, tmp_path, command, named):
    secret = tmp_path / "secret.txt"
    secret.write_text("1 0 0\n0 1 0\n0 0 1\n")
    secret.chmod(0)
    out = tmp_path / "out.h5"
    fill = lambda word: word.format(f=secret, o=out)  # noqa: E731
    done = run(mfattn_binary, *map(fill, command), prefix=unreadable_runner(tmp_path))
    assert_refused(done, [(fill(word), word.format(f=shown(secret))) for word in named] + ["permission denied"])


def test_file_behind_an_unsearchable_folder_is_not_called_missing(mfattn_binary, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    runner = unreadable_runner(tmp_path)
    try:
        for command in (["info", str(locked / "a.h5")],
                        ["run", "--config", str(locked / "a.ini"), "--out", str(tmp_path / "o.h5")],
                        ["run", "--out", str(locked / "sub" / "o.h5")]):
            done = run(mfattn_binary, *command, prefix=runner)
            assert_refused(done, [(str(locked), shown(command[-1] if command[0] == "info" else command[2]))])
            assert "permission denied" in done.stderr.lower(), done.stderr
            assert "no such file" not in done.stderr and "does not exist" not in done.stderr, done.stderr
    finally:
        locked.chmod(stat.S_IRWXU)


def test_manifest_in_place_of_a_folder_is_named(mfattn_binary, tmp_path):
    sweep = tmp_path / "grid.ini"
    sweep.write_text("n = 4\nhorizon = 0.1\n[axes]\nseed = 0 1\n")
    out_dir = tmp_path / "grid"
    (out_dir / "manifest.csv").mkdir(parents=True)
    done = run(mfattn_binary, "sweep", "--config", str(sweep), "--out-dir", str(out_dir))
    assert done.returncode == 4, done.stderr
    assert "manifest.csv: it is a directory" in done.stderr, done.stderr
    assert "Success" not in done.stderr, done.stderr


# 4. One option rule for every command.
@pytest.mark.parametrize("command, option", [
    (["realize", "--mechanism", "rope", "--target", "band", "--target", "cap", "--out", "{o}"], "--target"),
    (["realize", "--mechanism", "rope", "--json", "--json", "--out", "{o}"], "--json"),
    (["oclosure", "--tokens", "2", "--tokens=3"], "--tokens"),
    (["oclosure", "--json", "--json"], "--json"),
    (["analyze", "{h5}", "--replica", "0", "--replica", "0"], "--replica"),
    (["analyze", "{h5}", "--json", "--json"], "--json"),
])
def test_every_command_refuses_an_option_given_twice(mfattn_binary, tmp_path, command, option):
    h5 = small_run(mfattn_binary, tmp_path) if "{h5}" in command else None
    out = tmp_path / "out.h5"
    done = run(mfattn_binary, *(word.format(o=out, h5=h5) for word in command))
    assert_refused(done, [f"{option}: given more than once (give each option once"])
    assert not out.exists()
    # run says the same.
    same = run(mfattn_binary, "run", "--n", "4", "--n", "5", "--out", str(out))
    assert_refused(same, ["--n: given more than once (give each option once"])


@pytest.mark.parametrize("command", [
    ["run", "--horizon", "0.1", "--quiet", "--out", "{o}", "--"],
    ["run", "--horizon", "0.1", "--save-times", "0.05", "--", "0.1", "--quiet", "--out", "{o}"],
    ["bench", "--min-time", "0.01", "--"],
    ["sweep", "--config", "{ini}", "--dry-run", "--"],
])
def test_bare_double_dash_is_refused(mfattn_binary, tmp_path, command):
    sweep = tmp_path / "grid.ini"
    sweep.write_text("n = 4\nhorizon = 0.1\n")
    out = tmp_path / "out.h5"
    done = run(mfattn_binary, *(word.format(o=out, ini=sweep) for word in command))
    assert_refused(done, ["'--' is not accepted"])
    assert not out.exists()


# 5. Config files.
def test_config_key_inside_a_config_file_is_refused(mfattn_binary, tmp_path):
    other = tmp_path / "other.ini"
    other.write_text("n = 5\n")
    config = tmp_path / "run.ini"
    config.write_text(f"n = 4\n[files]\nconfig = {other}\n")
    out = tmp_path / "out.h5"
    done = run(mfattn_binary, "run", "--config", str(config), "--quiet", "--out", str(out))
    assert_refused(done, [f"{config}:3:", "'files.config'", "not accepted"])
    assert not out.exists()


def test_config_file_with_a_byte_order_mark(mfattn_binary, tmp_path):
    config = tmp_path / "bom.ini"
    config.write_bytes(b"\xef\xbb\xbfn = 4\nhorizon = 0.1\n")
    out = tmp_path / "out.h5"
    done = run(mfattn_binary, "run", "--config", str(config), "--quiet", "--threads", "1",
               "--out", str(out))
    assert done.returncode == 0, done.stderr
    info = run(mfattn_binary, "info", str(out))
    assert "n = 4" in info.stdout, info.stdout


def test_sweep_file_with_a_byte_order_mark(mfattn_binary, tmp_path):
    sweep = tmp_path / "grid.ini"
    sweep.write_bytes(b"\xef\xbb\xbfn = 4\nhorizon = 0.1\n[axes]\nseed = 0 1\n")
    done = run(mfattn_binary, "sweep", "--config", str(sweep), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "2 cases" in done.stdout, done.stdout
