"""Tests of `mfattn run --save-positions all|ends|none` (docs/output.md, "What
--save-positions writes"): what each mode writes, bit for bit against an `all` run; the
checkpoint that `--resume` and `--init-file FILE.h5` read after a SIGKILL; the size of a
phase-diagram file (512 replicas); the readers (loader, `mfattn info`, `mfattn analyze`, the
plotting scripts) on files without every frame's positions; and the refusal of bad values.

Runs are small (one thread) except the size test, which writes the 512-replica case it bounds.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mfattn import collapse_summary
from mfattn import plotting as plotting_common
from mfattn.io import load
from mfattn.plot_run import plot_run
from mfattn.plot_sweep import collect

DEADLINE = 120.0
REPLICAS = 3
SMALL = ("--n", 8, "--d", 2, "--replicas", REPLICAS, "--beta", 2, "--horizon", 3,
         "--save-every", 0.25, "--seed", 5)
GROUPS = ["tokens"] + [f"tokens_r{r}" for r in range(1, REPLICAS)]


def command(binary: Path, out: Path, *args) -> list[str]:
    return [str(binary), "run", *map(str, args), "--threads", "1", "--quiet", "--out", str(out)]


def run(binary: Path, out: Path, *args, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(command(binary, out, *args), capture_output=True, text=True,
                          timeout=timeout)


def ok(binary: Path, out: Path, *args) -> Path:
    done = run(binary, out, *args)
    assert done.returncode == 0, done.stderr
    return out


def observables(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r", locking=False) as f:
        return {name: f["observables"][name]["value"][()] for name in f["observables"]}


def clock(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every frame's (step, time), read through an observable as any H5MD reader would."""
    with h5py.File(path, "r", locking=False) as f:
        return f["observables/energy/step"][()], f["observables/energy/time"][()]


def final_state(path: Path) -> np.ndarray:
    """All replicas' state at the last flushed frame [R, n, d]: the last position row of an
    `all` file, the latest complete /run/checkpoint slot otherwise."""
    with h5py.File(path, "r", locking=False) as f:
        if "checkpoint" not in f["run"]:
            return np.stack([f[f"particles/{g}/position/value"][-1] for g in GROUPS])
        marks = f["run/checkpoint/frame"][()]
        return f["run/checkpoint/x"][int(np.argmax(marks))]


def clock_frames(path: Path) -> int:
    try:
        with h5py.File(path, "r", locking=False) as f:
            return int(min(f["observables/energy/time"].shape[0], f["run/step_size"].shape[0]))
    except (OSError, KeyError):
        return 0


@pytest.fixture(scope="module")
def modes(mfattn_binary, tmp_path_factory) -> dict[str, Path]:
    """The same small run written with each mode (velocities with all and ends)."""
    folder = tmp_path_factory.mktemp("modes")
    files = {}
    for mode in ("all", "ends", "none"):
        velocity = ("--save-velocity",) if mode != "none" else ()
        files[mode] = ok(mfattn_binary, folder / f"{mode}.h5", *SMALL, "--save-positions", mode,
                         *velocity)
    return files


# --- what each mode writes ------------------------------------------------------------------


def test_every_mode_writes_every_observable_of_every_replica_at_every_frame_bitwise(modes):
    reference = observables(modes["all"])
    assert reference["energy"].shape == (13, REPLICAS)
    reference_clock = clock(modes["all"])
    for mode in ("ends", "none"):
        stored = observables(modes[mode])
        assert stored.keys() == reference.keys()
        for name, value in reference.items():
            assert stored[name].shape == value.shape, (mode, name)
            assert np.array_equal(stored[name], value), (mode, name)
        for mine, theirs in zip(clock(modes[mode]), reference_clock):
            assert np.array_equal(mine, theirs), mode
        with h5py.File(modes[mode], "r") as f, h5py.File(modes["all"], "r") as a:
            assert np.array_equal(f["run/step_size"][()], a["run/step_size"][()])


def test_all_keeps_the_layout_of_before_the_option(modes):
    with h5py.File(modes["all"], "r") as f:
        assert "checkpoint" not in f["run"]
        assert f.attrs.get("save-positions") is None and f["parameters"].attrs["save-positions"] == "all"
        time_dataset = f["particles/tokens/position/time"]
        for name in f["observables"]:
            assert f["observables"][name]["time"].id == time_dataset.id  # one dataset, hard links
        for group in GROUPS:
            assert f[f"particles/{group}/position/value"].shape == (13, 8, 2)
            assert f[f"particles/{group}/velocity/value"].shape == (13, 8, 2)


def test_ends_holds_exactly_the_first_and_last_frames_of_the_all_run(modes):
    with h5py.File(modes["ends"], "r") as e, h5py.File(modes["all"], "r") as a:
        position = e["particles/tokens/position"]
        assert np.array_equal(position["time"][()], [0.0, 3.0])
        assert np.array_equal(position["step"][()], a["particles/tokens/position/step"][()][[0, -1]])
        # Its own step and time, not the frames' clock.
        assert position["time"].id != e["observables/energy/time"].id
        for group in GROUPS:
            for element in ("position", "velocity"):
                kept = e[f"particles/{group}/{element}/value"][()]
                every = a[f"particles/{group}/{element}/value"][()]
                assert kept.shape == (2, 8, 2)
                assert np.array_equal(kept, every[[0, -1]]), (group, element)
            assert e[f"particles/{group}/velocity/time"].id == position["time"].id


def test_none_keeps_labels_and_empty_position_elements(modes):
    with h5py.File(modes["none"], "r") as f, h5py.File(modes["all"], "r") as a:
        for group in GROUPS:
            g = f[f"particles/{group}"]
            assert g["position/value"].shape == (0, 8, 2)
            assert g["position/step"].shape == g["position/time"].shape == (0,)
            assert "velocity" not in g
            for label in ("aux_position", "prompt_id", "presence", "id"):
                assert np.array_equal(g[label][()], a[f"particles/{group}/{label}"][()]), label
            assert int(g["box"].attrs["dimension"]) == 2


def test_the_checkpoint_holds_the_final_state_of_every_replica(modes):
    reference = final_state(modes["all"])
    for mode in ("ends", "none"):
        with h5py.File(modes[mode], "r") as f:
            checkpoint = f["run/checkpoint"]
            marks = checkpoint["frame"][()]
            latest = int(np.argmax(marks))
            # A finished run holds its last frame in both slots (whatever --flush-interval).
            assert list(marks) == [12, 12]
            assert checkpoint["time"][latest] == 3.0
            assert checkpoint["step"][latest] == f["observables/energy/step"][-1]
            assert checkpoint["step_size"][latest] == f["run/step_size"][-1]
        assert np.array_equal(final_state(modes[mode]), reference), mode


def test_save_velocity_with_none_is_refused(mfattn_binary, tmp_path):
    out = tmp_path / "v.h5"
    done = run(mfattn_binary, out, "--n", 8, "--save-positions", "none", "--save-velocity")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "--save-positions none" in done.stderr and "--save-velocity" in done.stderr
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("value", ["bogus", "All", ""])
def test_a_bad_value_is_refused_naming_the_option_the_value_and_the_names(
        mfattn_binary, tmp_path, value):
    out = tmp_path / "bad.h5"
    done = run(mfattn_binary, out, "--n", 8, "--save-positions", value)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--save-positions" in done.stderr
    # An empty value is refused as such (every option's rule: leaving it out gives the default).
    assert ("all, ends, none" in done.stderr and value in done.stderr) if value else "is empty" in done.stderr
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_resume_refuses_another_save_positions(mfattn_binary, modes, tmp_path):
    copy = tmp_path / "none.h5"
    copy.write_bytes(modes["none"].read_bytes())
    done = run(mfattn_binary, copy, *SMALL, "--save-positions", "ends", "--resume")
    assert done.returncode == 2, done.stderr
    assert "--save-positions is ends but the file was made with none" in done.stderr


# --- killed and resumed ---------------------------------------------------------------------


def killed_run(binary: Path, out: Path, args: list) -> list:
    """Starts `args` and SIGKILLs it after three flushed frames; a run that finishes first is
    repeated with a longer horizon. Returns the arguments of the run that was killed."""
    args = list(args)
    for horizon in (1, 4, 16, 64):
        out.unlink(missing_ok=True)
        args[args.index("--horizon") + 1] = horizon
        process = subprocess.Popen(command(binary, out, *args), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            end = time.monotonic() + DEADLINE
            while clock_frames(out) < 3 and process.poll() is None and time.monotonic() < end:
                time.sleep(0.005)
            process.send_signal(signal.SIGKILL)
            process.communicate(timeout=DEADLINE)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        if process.returncode == -signal.SIGKILL and run_status(out) == "running":
            return args  # killed mid-run (not between its last flush and its exit)
    pytest.fail("every run finished before it could be killed")


def run_status(path: Path) -> str:
    with h5py.File(path, "r", locking=False) as f:
        status = f["run"].attrs["status"]
    return status.decode() if isinstance(status, bytes) else str(status)


@pytest.mark.parametrize("mode", ["ends", "none"])
def test_sigkill_then_resume_gives_the_bits_of_an_uninterrupted_run(mfattn_binary, tmp_path, mode):
    out, reference = tmp_path / "killed.h5", tmp_path / "reference.h5"
    args = killed_run(mfattn_binary, out, ["--n", 48, "--d", 2, "--replicas", 2, "--dt", 1e-4,
                                           "--horizon", 1, "--save-every", 0.01,
                                           "--save-positions", mode])
    horizon = float(args[args.index("--horizon") + 1])
    with h5py.File(out, "r", locking=False) as f:
        assert f["run"].attrs["status"] in ("running", b"running")
        assert f["run/checkpoint/frame"][()].max() >= 0
    done = run(mfattn_binary, out, *args, "--resume")
    assert done.returncode == 0, done.stderr
    ok(mfattn_binary, reference, *args)
    for name, value in observables(reference).items():
        assert np.array_equal(observables(out)[name], value), name
    for mine, theirs in zip(clock(out), clock(reference)):
        assert np.array_equal(mine, theirs)
    assert np.array_equal(final_state(out), final_state(reference))
    with h5py.File(out, "r") as f, h5py.File(reference, "r") as g:
        assert f["run"].attrs["status"] == g["run"].attrs["status"]
        kept, expected = f["particles/tokens_r1/position/value"][()], g["particles/tokens_r1/position/value"][()]
        assert np.array_equal(kept, expected)
        assert np.array_equal(f["particles/tokens/position/time"][()],
                              [0.0, horizon] if mode == "ends" else [])


def test_ends_resumed_to_a_longer_horizon_adds_the_new_horizon_and_keeps_the_old(
        mfattn_binary, tmp_path):
    args = ["--n", 8, "--d", 2, "--beta", 2, "--horizon", 2, "--save-every", 0.25,
            "--save-positions", "ends"]
    out = ok(mfattn_binary, tmp_path / "grown.h5", *args)
    args[args.index("--horizon") + 1] = 4
    done = run(mfattn_binary, out, *args, "--resume")
    assert done.returncode == 0, done.stderr
    reference = ok(mfattn_binary, tmp_path / "straight.h5", *args)
    for name, value in observables(reference).items():
        assert np.array_equal(observables(out)[name], value), name
    with h5py.File(out, "r") as f, h5py.File(reference, "r") as g:
        assert np.array_equal(f["particles/tokens/position/time"][()], [0.0, 2.0, 4.0])
        assert np.array_equal(f["particles/tokens/position/value"][[0, 2]],
                              g["particles/tokens/position/value"][()])


def test_init_file_of_a_none_file_starts_from_its_checkpoint(mfattn_binary, modes, tmp_path):
    follow = ok(mfattn_binary, tmp_path / "follow.h5", "--n", 8, "--d", 2, "--init", "file",
                "--init-file", modes["none"], "--horizon", 0.5)
    with h5py.File(follow, "r") as f:
        assert np.array_equal(f["particles/tokens/position/value"][0], final_state(modes["all"])[0])


# --- file size --------------------------------------------------------------------------------


PHASE_CASE = ("--n", 32, "--d", 2, "--replicas", 512, "--horizon", 1, "--seed", 1)


@pytest.mark.parametrize("mode, frames, deflate, bound_mb", [
    ("none", 200, False, 11.0), ("none", 200, True, 8.0), ("ends", 2, False, 3.0),
    ("none", 2, False, 1.6)])
def test_a_512_replica_file_stays_small(mfattn_binary, tmp_path, mode, frames, deflate, bound_mb):
    spacing = ("--save-times", 0) if frames == 2 else ("--save-every", 1 / (frames - 1))
    out = ok(mfattn_binary, tmp_path / "phase.h5", *PHASE_CASE, *spacing, "--save-positions", mode,
             *(("--deflate",) if deflate else ()))
    size = out.stat().st_size
    assert load(out).frames == frames
    # For scale: every frame's positions alone are 512 * frames * 32 * 2 * 8 bytes (52 MB at
    # 200 frames); the observables of 200 frames are 9 MB before compression.
    assert size <= bound_mb * 1e6, f"{mode}, {frames} frames: {size / 1e6:.2f} MB"


def test_deflate_compresses_observables_only_without_every_frames_positions(mfattn_binary, tmp_path):
    for mode, expected in (("all", None), ("none", "gzip")):
        out = ok(mfattn_binary, tmp_path / f"{mode}.h5", "--n", 8, "--horizon", 1, "--deflate",
                 "--save-positions", mode)
        with h5py.File(out, "r") as f:
            for name in f["observables"]:
                assert f["observables"][name]["value"].compression == expected, (mode, name)


# --- readers ----------------------------------------------------------------------------------


def test_the_loader_reads_each_mode(modes):
    every = load(modes["all"])
    assert every.save_positions == "all" and np.array_equal(every.position_times, every.times)
    ends, none = load(modes["ends"]), load(modes["none"])
    assert ends.save_positions == "ends" and none.save_positions == "none"
    for tr in (ends, none):
        assert np.array_equal(tr.times, every.times) and np.array_equal(tr.steps, every.steps)
        for name, value in every.observables.items():
            assert np.array_equal(tr.observables[name], value)
            assert np.array_equal(tr.observable_times[name], every.times)
        assert tr.stacked and tr.replicas == REPLICAS and tr.n == 8 and tr.d == 2
        assert np.array_equal(tr.labels["presence"], every.labels["presence"])
    assert ends.positions.shape == (2, REPLICAS, 8, 2)
    assert np.array_equal(ends.positions, every.positions[[0, -1]])
    assert np.array_equal(ends.position_times, [0.0, 3.0])
    assert none.positions.shape == (0, REPLICAS, 8, 2) and none.position_times.size == 0
    one = load(modes["none"], replica=2)
    assert one.positions.shape == (0, 8, 2)
    assert np.array_equal(one.observables["min_inner"], every.observables["min_inner"][:, 2])


def test_info_and_analyze_read_each_mode(mfattn_binary, modes):
    for mode, expected in (("all", "every frame"), ("ends", "2 frames: t = 0 and the horizon"),
                           ("none", "none (--save-positions none)")):
        info = subprocess.run([str(mfattn_binary), "info", str(modes[mode])], capture_output=True,
                              text=True, timeout=60)
        assert info.returncode == 0, info.stderr
        assert "frames     13, t = 0 .. 3" in info.stdout
        assert f"positions  {expected}" in info.stdout, info.stdout
    reports = []
    for mode in ("all", "ends", "none"):
        done = subprocess.run([str(mfattn_binary), "analyze", str(modes[mode]), "--replica", "1",
                               "--json"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        report.pop("file")
        reports.append(report)
    assert reports[0] == reports[1] == reports[2]


def test_plot_run_draws_what_each_mode_allows(modes, tmp_path, capsys):
    for mode in ("ends", "none"):
        written = plot_run(modes[mode], tmp_path / mode, replica=1)
        names = sorted(p.name for p in written)
        for path in written:
            assert path.is_file() and path.stat().st_size > 1000
        if mode == "ends":
            assert names == [f"{mode}_r1_energy_clusters.png", f"{mode}_r1_gram.png",
                             f"{mode}_r1_sphere.png"]
        else:
            assert names == [f"{mode}_r1_energy_clusters.png"]
            assert "has no positions (--save-positions none)" in capsys.readouterr().err
    run = plotting_common.load_run(modes["none"])
    with pytest.raises(ValueError, match="no positions"):
        run.final
    assert plotting_common.observable(run, "n_clusters") is not None


def test_collapse_summary_and_plot_sweep_work_from_observables(mfattn_binary, tmp_path):
    folder = tmp_path / "sweep"
    folder.mkdir()
    for mode in ("all", "ends", "none"):
        # collapse_summary reads one-replica files.
        ok(mfattn_binary, folder / f"{mode}.h5", "--n", 8, "--d", 2, "--beta", 2, "--horizon", 3,
           "--save-every", 0.25, "--save-positions", mode)
    rows = {r["file"]: r for r in collapse_summary.summarize_folder(folder)}
    every, ends, none = rows["all.h5"], rows["ends.h5"], rows["none.h5"]
    for key in ("min_inner", "mean_inner", "energy", "t_final", "clusters", "collapsed"):
        assert ends[key] == every[key] == none[key], key
    assert ends["flatness"] == every["flatness"] and np.isnan(none["flatness"])
    assert none["final"] is None and np.array_equal(ends["final"], every["final"])
    outcomes = {row["file"]: row for row in collect(folder).rows}
    for column in ("final_clusters", "final_min_inner", "marginal_spread", "t_final"):
        assert outcomes["none.h5"][column] == outcomes["all.h5"][column] == outcomes["ends.h5"][column]
