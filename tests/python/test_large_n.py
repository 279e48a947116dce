"""Large n (docs/cli.md, "Large n"): a pass over the pairs that lasts seconds says early on what
it costs here, and a stop signal delivered inside it ends the run at once (between the loops'
units, not after the step): before frame 0 nothing is written; later the file keeps every frame
written, the step in progress is dropped, and --resume gives the same bits as a run that was
never stopped."""
from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import bits


def test_a_signal_inside_a_long_pass_ends_the_run_there(mfattn_binary, tmp_path):
    out = tmp_path / "large.h5"
    # n = 10^5: 10^10 pairs a pass, seconds on any machine that runs this suite.
    run = subprocess.Popen([str(mfattn_binary), "run", "--n", "100000", "--d", "3", "--horizon", "0.01", "--dt",
                            "0.01", "--out", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        first = run.stderr.readline()
        if "a pass over the" not in first:
            run.kill()
            pytest.skip(f"no pass of n = 10^5 lasted 2 s on this machine: {first!r}")
        # The estimate: the pass's pairs, a measured rate, where to read on.
        assert re.search(r"a pass over the 1e\+10 pairs takes about .* here \(.*% in .* s: .* pairs/s\)", first)
        assert 'docs/performance.md, "Large n"' in first
        run.send_signal(signal.SIGINT)
        rest = run.communicate(timeout=120)[1]
    finally:
        run.kill()
    assert run.returncode == 128 + signal.SIGINT
    assert "interrupted by SIGINT before frame 0 was complete; nothing was written" in rest
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_stop_inside_a_step_keeps_the_frames_and_resume_gives_the_same_bits(mfattn_binary, tmp_path):
    # n = 2 x 10^4: every pass (4 x 10^8 pairs) is watched.
    args = ["--n", "20000", "--d", "3", "--horizon", "0.02", "--dt", "0.01", "--save-every", "0.01", "--seed", "3"]
    whole = tmp_path / "whole.h5"
    done = subprocess.run([str(mfattn_binary), "run", *args, "--quiet", "--out", str(whole)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    stopped = tmp_path / "stopped.h5"
    run = subprocess.Popen([str(mfattn_binary), "run", *args, "--out", str(stopped)], stderr=subprocess.PIPE,
                           text=True)
    try:
        # Frame 0 is published: the run is in its first step's passes.
        while not stopped.exists() and run.poll() is None:
            time.sleep(0.01)
        run.send_signal(signal.SIGINT)
        log = run.communicate(timeout=120)[1]
    finally:
        run.kill()
    if run.returncode == 0:
        pytest.skip("the run ended before the signal came")
    assert run.returncode == 128 + signal.SIGINT, log
    assert re.search(r"interrupted by SIGINT( inside a pass over the pairs \(.*\))? at t = .*stopped\.h5 keeps "
                     r"every frame up to t = ", log), log
    with h5py.File(stopped) as f:
        assert str(f["run"].attrs["status"]) == "interrupted: SIGINT"
        kept = f["particles/tokens/position/value"].shape[0]
    assert kept < 3
    resumed = subprocess.run([str(mfattn_binary), "run", *args, "--quiet", "--resume", "--out", str(stopped)],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    with h5py.File(whole) as a, h5py.File(stopped) as b:
        for name in ("particles/tokens/position/value", "observables/min_inner/value", "observables/energy/value"):
            assert np.array_equal(bits(a[name][:]), bits(b[name][:])), name
