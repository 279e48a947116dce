"""Bad command lines and config files of `mfattn run` (and the top level of the other
commands): every one is refused with exit 2 (or 4 for a resource failure) and one line on
stderr naming the option and the value, never an abort, and no output file is made.

Every process runs under an address-space limit (ulimit -v 4 GiB) and a timeout, so that a
binary which tries to allocate or read without bound fails fast instead of taking the
machine's memory.
"""
from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest

MEMORY_LIMIT = 4 << 30
TIMEOUT = 60


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(binary: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=TIMEOUT,
                          preexec_fn=_limit_memory, env=env, cwd=cwd)


def assert_refused(done: subprocess.CompletedProcess, named: list[str], out: Path | None,
                   code: int = 2) -> None:
    described = f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == code, described
    lines = done.stderr.splitlines()
    assert len(lines) == 1, described
    assert "terminate called" not in done.stderr, described
    for word in named:
        assert word in lines[0], f"{word!r} not named\n{described}"
    if out is not None:
        assert not out.exists(), f"{out} was created\n{described}"


def run_refused(binary: Path, tmp_path: Path, args: list[str], named: list[str], code: int = 2,
                out_name: str = "out.h5") -> None:
    out = tmp_path / out_name
    done = run(binary, "run", *args, "--quiet", "--threads", "1", "--out", str(out))
    assert_refused(done, named, out, code)


# 1. Sizes that used to abort with an uncaught exception (or read/allocate without bound).
@pytest.mark.parametrize("args, named", [
    (["--n", "4611686018427387904"], ["--n", "4611686018427387904"]),
    (["--d", "100000000", "--n", "4"], ["--d 100000000", "memory"]),
    (["--replicas", "1000000000"], ["--replicas 1000000000", "memory"]),
    (["--null-tokens", "1000000000000"], ["--null-tokens", "1000000000000"]),
    (["--prefix", "1000000000000"], ["--prefix", "1000000000000"]),
    (["--save-every", "1e-12"], ["--save-every", "1e-12", "frames"]),
    (["--save-log", "100000000000"], ["--save-log", "100000000000"]),
    (["--config", "/dev/zero"], ["--config", "/dev/zero"]),
    (["--n", "100000", "--replicas", "100000"], ["--replicas 100000", "memory"]),
])
def test_sizes_are_refused_up_front(mfattn_binary, tmp_path, args, named):
    run_refused(mfattn_binary, tmp_path, args, named)


def test_huge_config_file_is_refused(mfattn_binary, tmp_path):
    big = tmp_path / "big.ini"
    big.write_text("# padding\n" * 200000)  # 2 MB
    run_refused(mfattn_binary, tmp_path, ["--config", str(big)], ["--config", str(big)])


def test_out_name_too_long_or_folder_missing(mfattn_binary, tmp_path):
    long_name = "a" * 300 + ".h5"
    done = run(mfattn_binary, "run", "--quiet", "--out", str(tmp_path / long_name))
    assert_refused(done, ["--out"], None)
    assert list(tmp_path.iterdir()) == []
    missing = tmp_path / "no-such-folder" / "x.h5"
    done = run(mfattn_binary, "run", "--quiet", "--out", str(missing))
    assert_refused(done, ["--out", "does not exist"], missing)


def test_bench_and_sweep_refuse_sizes_too(mfattn_binary, tmp_path):
    done = run(mfattn_binary, "bench", "--replicas", "1000000000", "--min-time", "0.01")
    assert_refused(done, ["--replicas 1000000000"], None)
    done = run(mfattn_binary, "sweep", "--config", "/dev/zero", "--out-dir", str(tmp_path / "s"))
    assert_refused(done, ["--config", "/dev/zero"], tmp_path / "s")


# 2. prompts * prefix overflowing int64 used to run with no prefix at all.
def test_prefix_times_prompts_overflow_is_refused(mfattn_binary, tmp_path):
    run_refused(mfattn_binary, tmp_path, ["--prefix", "4611686018427387904", "--prompts", "4"],
                ["--prefix", "4611686018427387904"])


# 3. Extra values after an option: lists are taken, anything else is refused.
@pytest.mark.parametrize("args, named", [
    (["--kernel", "sa", "usa"], ["--kernel", "usa"]),
    (["--n", "8", "16"], ["--n", "16"]),
    (["stray", "--n", "8"], ["stray"]),
    (["--n", "8", "--quiet", "yes"], ["--quiet", "yes"]),
])
def test_stray_values_are_refused(mfattn_binary, tmp_path, args, named):
    run_refused(mfattn_binary, tmp_path, args, named)


@pytest.mark.parametrize("times", [["0.5", "1", "1.5"], ["0.5,1,1.5"]])
def test_save_times_takes_a_list(mfattn_binary, tmp_path, times):
    out = tmp_path / "list.h5"
    done = run(mfattn_binary, "run", "--n", "8", "--horizon", "2", "--save-times", *times,
               "--quiet", "--threads", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    info = run(mfattn_binary, "info", str(out))
    assert "frames     5" in info.stdout, info.stdout  # 0, 0.5, 1, 1.5, 2


# 4. A folder given as a config file (run and sweep).
def test_folder_as_config_is_refused(mfattn_binary, tmp_path):
    folder = tmp_path / "conf.d"
    folder.mkdir()
    run_refused(mfattn_binary, tmp_path, ["--config", str(folder)], ["--config", str(folder), "folder"])
    out_dir = tmp_path / "sweep-out"
    done = run(mfattn_binary, "sweep", "--config", str(folder), "--out-dir", str(out_dir))
    assert_refused(done, ["--config", str(folder), "folder"], out_dir)


# 5. Option names in full only.
@pytest.mark.parametrize("args, named", [
    (["--kern", "sa"], ["--kern: no such option (the closest: --kernel)"]),
    (["--hor", "5", "--horizon", "3"], ["--hor: no such option (the closest: --horizon)"]),
])
def test_prefixes_of_option_names_are_refused(mfattn_binary, tmp_path, args, named):
    run_refused(mfattn_binary, tmp_path, args, named + ["--help lists every option"])


def test_an_option_twice_is_refused(mfattn_binary, tmp_path):
    run_refused(mfattn_binary, tmp_path, ["--horizon", "5", "--horizon", "3"], ["--horizon", "more than once"])


# 6. Values that cannot work are usage errors (exit 2), not numerical failures (exit 3).
@pytest.mark.parametrize("args, named", [
    (["--amplitudes", "1e308"], ["--amplitudes", "1e308", "square"]),
    (["--init", "clustered", "--init-spread", "1e308"], ["--init-spread", "1e+308"]),
    (["--kernel", "usa", "--beta", "800"], ["--beta 800", "--time-scale rescaled"]),
    (["--pos-scale", "1e308", "--geometry", "rope"], ["--pos-scale"]),
    (["--flush-interval", "-1"], ["--flush-interval -1", "[0, 86400]"]),
    (["--flush-interval", "1e6"], ["--flush-interval 1e+06", "[0, 86400]"]),
])
def test_impossible_values_are_usage_errors(mfattn_binary, tmp_path, args, named):
    run_refused(mfattn_binary, tmp_path, args, named)


def test_large_beta_runs_in_rescaled_time(mfattn_binary, tmp_path):
    out = tmp_path / "rescaled.h5"
    done = run(mfattn_binary, "run", "--kernel", "usa", "--beta", "800", "--time-scale", "rescaled",
               "--n", "8", "--horizon", "0.5", "--quiet", "--threads", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.is_file()


# 7. Config errors name the file and the line; type errors say what is accepted.
@pytest.mark.parametrize("text, named", [
    ("[model]\nn = 8\nthis line has no equals sign\n", [":3:", "key = value"]),
    ("[model]\nn = 8\n[stepping\n", [":3:", "[stepping"]),
    ("n = 8\n\nbetta = 2\n", [":3:", "betta"]),
    ("n = 1e3\n", [":1:", "--n 1e3", "must be an integer >= 1"]),
    ("n = 8\nn = 9\n", [":2:", "--n", "line 1"]),
    ("deflate = maybe\n", [":1:", "--deflate maybe", "true"]),
    ("[model]\nn = 8\nmodel. = 3\n", [":3:", "unknown key 'model.model.'"]),
])
def test_config_errors_name_file_and_line(mfattn_binary, tmp_path, text, named):
    ini = tmp_path / "bad.ini"
    ini.write_text(text)
    run_refused(mfattn_binary, tmp_path, ["--config", str(ini)], [str(ini)] + named)


@pytest.mark.parametrize("args, named", [
    (["--n", "1e3"], ["--n 1e3", "must be an integer >= 1"]),
    (["--beta", "hot"], ["--beta hot", "must be a number"]),
    (["--pair-delta", "x"], ["--pair-delta x", "must be a number in (0, 2)"]),
])
def test_type_errors_say_what_is_accepted(mfattn_binary, tmp_path, args, named):
    run_refused(mfattn_binary, tmp_path, args, named)


# 8. Help and version forms, shortest defaults, documented ranges, eps-den auto.
@pytest.mark.parametrize("args", [["help", "run"], ["run", "--help"]])
def test_help_forms(mfattn_binary, args):
    done = run(mfattn_binary, *args)
    assert done.returncode == 0, done.stderr
    assert "usage: mfattn run" in done.stdout
    assert "0.050000000000000003" not in done.stdout
    assert "(=0.05)" in done.stdout
    text = " ".join(done.stdout.split())
    for documented in ["frame every this many time units, > 0", "frame times in [0, horizon]",
                       "cosine factor omega, any finite number", "after the n active ones, >= 0",
                       "worker threads in [0, 4096] (0 = auto", "epsilon >= 0, or auto"]:
        assert documented in text, documented


@pytest.mark.parametrize("args", [["-V"], ["--version"], ["run", "--version"], ["sweep", "-V"]])
def test_version_forms(mfattn_binary, args):
    done = run(mfattn_binary, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mfattn "), done.stdout


def test_help_of_unknown_command_is_refused(mfattn_binary):
    done = run(mfattn_binary, "help", "nope")
    assert_refused(done, ["nope"], None)


def test_eps_den_auto_and_no_negatives(mfattn_binary, tmp_path):
    out = tmp_path / "auto.h5"
    done = run(mfattn_binary, "run", "--kernel", "sa", "--eps-den", "auto", "--n", "8", "--horizon", "0.5",
               "--quiet", "--threads", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    run_refused(mfattn_binary, tmp_path, ["--eps-den", "-1"], ["--eps-den -1", "auto"])


# Found by fuzz/fuzz_options.cpp: Boost's message for a bad option never returned when the
# name or value held its own placeholder (the process hung); now a message is made here.
@pytest.mark.parametrize("args", [
    ["run", "--%canonical_option%"],
    ["run", "--n", "%value%"],
    ["sweep", "--%canonical_option%"],
    ["bench", "--%canonical_option%"],
])
def test_placeholders_in_options_do_not_hang(mfattn_binary, tmp_path, args):
    try:
        done = subprocess.run([str(mfattn_binary), *args, "--out", str(tmp_path / "x.h5")],
                              capture_output=True, text=True, timeout=10, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mfattn {' '.join(args)} hung")
    assert_refused(done, ["%"], tmp_path / "x.h5")


def test_placeholder_in_config_value_does_not_hang(mfattn_binary, tmp_path):
    ini = tmp_path / "v.ini"
    ini.write_text("n = %value%\n")
    try:
        done = subprocess.run([str(mfattn_binary), "run", "--config", str(ini), "--out", str(tmp_path / "x.h5")],
                              capture_output=True, text=True, timeout=10, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail("mfattn run --config hung")
    assert_refused(done, [f"{ini}:1:", "--n %value%"], tmp_path / "x.h5")
