"""`mfattn bench` reads --config as `run` does, and refuses a --min-time it could not end."""
from __future__ import annotations

import subprocess

import pytest


def bench(binary, *args, timeout=120):
    return subprocess.run([str(binary), "bench", "--threads", "1", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_bench_honours_config_and_the_command_line_wins(mfattn_binary, tmp_path):
    config = tmp_path / "b.ini"
    config.write_text("[model]\nn = 48\nd = 5\n")
    done = bench(mfattn_binary, "--config", config, "--min-time", 0.01)
    assert done.returncode == 0, done.stderr
    assert " n 48 d 5 " in done.stdout, done.stdout
    done = bench(mfattn_binary, "--config", config, "--n", 40, "--min-time", 0.01)
    assert done.returncode == 0 and " n 40 d 5 " in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("seconds", ["inf", "nan", "0", "-1", "1e300"])
def test_bench_refuses_a_min_time_it_could_not_end(mfattn_binary, seconds):
    done = bench(mfattn_binary, "--n", 8, "--min-time", seconds, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and f"--min-time {seconds}" in done.stderr.replace("1e+300", "1e300")
