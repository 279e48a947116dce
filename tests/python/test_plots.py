"""Tests of the plotting scripts: analysis/plot_run.py, plot_sweep.py, make_figures.py and
their shared helpers (plotting_common.py), on small real files written by `mfattn run`.

Every figure is rendered and must be a readable, non-blank PNG (matplotlib.image.imread,
pixel standard deviation and several distinct colours); the sweep outcome table is checked
against the files with independent numpy recomputations; observables stored in a file must be
used in preference to recomputation; make_figures runs on a small data tree; missing, foreign
and garbage inputs give one clear line on stderr and exit status 1 (scripts run with
/usr/bin/python3 through subprocess). Runs are tiny (n <= 48, one thread, short horizons).
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
from pathlib import Path

import h5py
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402

from mfattn import plotting as plotting_common  # noqa: E402  (conftest puts the package on sys.path)
from mfattn.make_figures import make_figures  # noqa: E402
from mfattn.plot_run import plot_run, positions_figure, sphere_figure  # noqa: E402
from mfattn.plot_sweep import collect, phase_matrix, plot_sweep  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
ANALYSIS_DIR = REPO_ROOT / "analysis"
PYTHON = "/usr/bin/python3"
SHORT = ("--horizon", 4, "--save-every", 0.25)
SWEEP = ("--horizon", 10, "--save-every", 0.5)  # long enough for beta = 0.5 to collapse at n = 12


def assert_png(path) -> np.ndarray:
    """``path`` is a PNG that matplotlib reads back, with content: pixel standard deviation
    above 0.02 and more than a few distinct colours."""
    path = Path(path)
    assert path.is_file() and path.suffix == ".png", path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, (path, image.shape)
    rgb = image[..., :3]
    assert rgb.std() > 0.02, f"{path} looks blank (pixel std {rgb.std():.4f})"
    # Pack each pixel into one integer: np.unique on rows (axis=0) is far slower.
    packed = np.round(rgb * 255).astype(np.uint32) @ np.array([65536, 256, 1], dtype=np.uint32)
    colours = np.unique(packed).size
    assert colours > 5, f"{path} has only {colours} distinct colours"
    return image


def script(name: str, *args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([PYTHON, str(ANALYSIS_DIR / name), *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd or REPO_ROOT)


def assert_clear_error(done: subprocess.CompletedProcess, prog: str, *words: str) -> None:
    """Exit status 2 and one line "<prog>: ..." naming ``words`` (mfattn.cli, every script's
    convention); no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: ") and not lines[0].startswith(f"{prog}: error:"), \
        done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def clusters_by_search(x: np.ndarray, delta: float) -> int:
    """Connected components of <x_i, x_j> > 1 - delta by depth-first search (independent of
    the scipy graph routine the scripts use)."""
    adjacent = x @ x.T > 1.0 - delta
    seen = np.zeros(len(x), dtype=bool)
    count = 0
    for start in range(len(x)):
        if seen[start]:
            continue
        count += 1
        stack = [start]
        seen[start] = True
        while stack:
            i = stack.pop()
            for j in np.flatnonzero(adjacent[i] & ~seen):
                seen[j] = True
                stack.append(j)
    return count


def pair_fraction(x: np.ndarray, delta: float = 1e-3) -> float:
    m = len(x)
    g = x @ x.T
    return float(sum(g[i, j] > 1 - delta for i in range(m) for j in range(i + 1, m)) / (m * (m - 1) / 2))


# --- plot_run ---------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [2, 3, 8])
def test_plot_run_draws_every_dimension(run_mfattn, tmp_path, d):
    path = run_mfattn("--n", 16, "--d", d, "--beta", 1, *SHORT, out=f"dim{d}.h5")
    written = plot_run(path, tmp_path / "figs")
    # No geometry, factor or mask: the positions do not enter the model, so no positions plot.
    assert [p.name for p in written] == [f"dim{d}_sphere.png", f"dim{d}_energy_clusters.png",
                                         f"dim{d}_gram.png"]
    for p in written:
        assert p.parent == tmp_path / "figs"
        assert_png(p)


def test_plot_run_draws_positions_for_rope(run_mfattn, tmp_path):
    # k = 1 here; the 2-D grid positions of rope-mixed (k = 2) are drawn in the make_figures test.
    path = run_mfattn("--n", 16, "--d", 3, "--geometry", "rope", *SHORT, out="rope.h5")
    run = plotting_common.load_run(path)
    assert run.labels["aux_position"].shape == (16, 1)
    assert plotting_common.uses_positions(run)
    written = plot_run(path, tmp_path / "figs")
    assert [p.name for p in written] == ["rope_sphere.png", "rope_energy_clusters.png",
                                         "rope_gram.png", "rope_positions.png"]
    for p in written:
        assert_png(p)


def test_plot_run_draws_each_replica_and_cli_prints_the_files(run_mfattn, tmp_path):
    path = run_mfattn("--n", 12, "--d", 3, "--replicas", 2, *SHORT, out="two.h5")
    first = plot_run(path, tmp_path / "figs", replica=0)
    assert [p.name for p in first] == ["two_r0_sphere.png", "two_r0_energy_clusters.png", "two_r0_gram.png"]
    done = script("plot_run.py", path, "--out", tmp_path / "figs", "--replica", 1)
    assert done.returncode == 0, done.stderr
    second = [Path(line) for line in done.stdout.split()]
    assert second == [tmp_path / "figs" / f"two_r1_{kind}.png"
                      for kind in ("sphere", "energy_clusters", "gram")]
    images = [assert_png(p) for p in first + second]
    # Independent initial states: the sphere figures of the two replicas differ.
    assert images[0].shape != images[3].shape or not np.array_equal(images[0], images[3])
    with pytest.raises(ValueError, match="replica 2 out of range"):
        plot_run(path, tmp_path / "figs", replica=2)


def test_plot_run_cli_rejects_bad_input(run_mfattn, tmp_path):
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"\x89HDF\r\n not really hdf5\n" * 10)
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["data"] = np.arange(3)
    out = tmp_path / "out"
    assert_clear_error(script("plot_run.py", tmp_path / "missing.h5", "--out", out),
                       "plot_run.py", "missing.h5", "no such file")
    assert_clear_error(script("plot_run.py", garbage, "--out", out),
                       "plot_run.py", "garbage.h5", "not an mfattn H5MD file")
    assert_clear_error(script("plot_run.py", foreign, "--out", out),
                       "plot_run.py", "foreign.h5", "not an mfattn H5MD file")
    real = run_mfattn("--n", 6, "--d", 3, "--horizon", 0.5, "--save-every", 0.25)
    assert_clear_error(script("plot_run.py", real, "--out", out, "--replica", 3),
                       "plot_run.py", "replica 3 out of range")
    assert not out.exists()  # nothing was drawn for any of them


# --- observables: stored ones win, missing ones are recomputed ---------------------------------


NEW_OBSERVABLES = ("n_clusters", "clustered_pair_fraction", "moment_eigenvalues", "marginal_spread")


def replace_observable(f: h5py.File, name: str, value: np.ndarray | None) -> None:
    """Deletes observable ``name`` from an open file and, unless ``value`` is None, stores
    ``value`` in its place (step and time linked to the positions', as the writer does)."""
    if name in f["observables"]:
        del f["observables"][name]
    if value is not None:
        group = f["observables"].create_group(name)
        group["step"] = f["particles/tokens/position/step"]
        group["time"] = f["particles/tokens/position/time"]
        group["value"] = value


def test_observables_are_recomputed_when_missing_and_read_when_stored(run_mfattn):
    n = 16
    path = run_mfattn("--n", n, "--d", 3, "--null-tokens", 2, "--beta", 1, *SHORT)
    run = plotting_common.load_run(path)
    x = run.x
    assert x.shape[1] == n  # null tokens (presence 0) are left out
    # Once the writer stores these observables, they must agree with the recomputation rule.
    if "n_clusters" in run.observables:
        assert list(run.observables["n_clusters"][1]) == [clusters_by_search(f, 1e-4) for f in x]
    if "clustered_pair_fraction" in run.observables:
        np.testing.assert_allclose(run.observables["clustered_pair_fraction"][1],
                                   [pair_fraction(f) for f in x], atol=1e-15)

    # Without them in the file, they are recomputed from the positions of every frame.
    with h5py.File(path, "r+") as f:
        for name in NEW_OBSERVABLES:
            replace_observable(f, name, None)
    run = plotting_common.load_run(path)
    t, k = plotting_common.observable(run, "n_clusters")
    np.testing.assert_array_equal(t, run.times)
    assert list(k) == [clusters_by_search(f, 1e-4) for f in x]
    assert k[0] == n and k[-1] < n
    _, frac = plotting_common.observable(run, "clustered_pair_fraction")
    np.testing.assert_allclose(frac, [pair_fraction(f) for f in x], atol=1e-15)
    largest = np.linalg.eigvalsh(run.final.T @ run.final / n).max()
    assert plotting_common.final_value(run, "marginal_spread") == pytest.approx(1 - largest, abs=1e-14)
    # The stored min_inner agrees with the recomputation over active tokens.
    _, stored = plotting_common.observable(run, "min_inner")
    assert stored[-1] == pytest.approx(plotting_common.RECOMPUTE["min_inner"](run.final), abs=1e-12)

    # A stored observable is used as it is, never recomputed; marginal_spread falls back on
    # stored moment eigenvalues before the positions.
    T = run.times.size
    with h5py.File(path, "r+") as f:
        replace_observable(f, "n_clusters", np.full(T, 7.0))
        replace_observable(f, "moment_eigenvalues", np.tile([0.5, 0.3, 0.2], (T, 1)))
    run = plotting_common.load_run(path)
    np.testing.assert_array_equal(plotting_common.observable(run, "n_clusters")[1], np.full(T, 7.0))
    assert plotting_common.final_value(run, "n_clusters") == 7
    assert plotting_common.final_value(run, "marginal_spread") == 0.5
    with h5py.File(path, "r+") as f:
        replace_observable(f, "marginal_spread", np.full(T, 0.25))
    assert plotting_common.final_value(plotting_common.load_run(path), "marginal_spread") == 0.25


def test_predicted_clusters_is_the_argmax_of_k2_ik():
    from scipy.special import iv
    for beta in (0.5, 1, 2, 4, 9, 16, 30, 60):
        k = np.arange(1, 200)
        assert plotting_common.predicted_clusters(beta) == k[np.argmax(k**2 * iv(k, beta))], beta
    assert plotting_common.predicted_clusters(1) == 1
    assert plotting_common.predicted_clusters(2000) > plotting_common.predicted_clusters(200) > 1


@pytest.mark.parametrize("d, extra", [
    (2, ("--prompts", 2, "--prefix-init", "clustered", "--mask", "per-prompt")),
    (3, ("--geometry", "rope")),
    (5, ()),
])
def test_prefix_tokens_are_read_and_drawn(run_mfattn, tmp_path, d, extra):
    path = run_mfattn("--n", 12, "--d", d, "--prefix", 2, *extra, *SHORT, out="prefix.h5")
    run = plotting_common.load_run(path)
    with h5py.File(path, "r") as f:
        for name in ("position", "aux_position", "prompt_id", "presence", "id"):
            np.testing.assert_array_equal(run.prefix[name], f[f"particles/prefix/{name}"][()])
    prompts = 2 if "--prompts" in extra else 1
    assert run.prefix["position"].shape == (2 * prompts, d)
    # Observables and plots are over the moving tokens; the prefix is drawn on top of them.
    assert run.x.shape[1] == 12
    # The per-prompt mask uses prompt ids, not positions: only RoPE gets a positions figure.
    assert plotting_common.uses_positions(run) == ("--geometry" in extra)
    written = [sphere_figure(run, tmp_path / "figs")]
    if plotting_common.uses_positions(run):
        written.append(positions_figure(run, tmp_path / "figs"))
    for p in written:
        assert_png(p)
    assert plotting_common.load_run(run_mfattn("--n", 4, "--d", d, "--horizon", 0.1,
                                               out="none.h5")).prefix is None


# --- plot_sweep -------------------------------------------------------------------------------


@pytest.fixture
def sweep_dir(run_mfattn, tmp_path):
    """A small sweep: beta in {0.5, 4} x seed in {0, 1}, one file with two replicas, in two
    subfolders, and a manifest that also lists a case whose run failed (no file)."""
    folder = tmp_path / "mysweep"
    for beta in (0.5, 4):
        for seed in (0, 1):
            path = run_mfattn("--n", 12, "--d", 3, "--beta", beta, "--seed", seed, *SWEEP,
                              out=f"b{beta}_s{seed}.h5")
            target = folder / f"beta{beta}" / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, target)
    path = run_mfattn("--n", 12, "--d", 3, "--beta", 4, "--seed", 2, "--replicas", 2, *SWEEP,
                      out="b4_rep.h5")
    shutil.move(path, folder / "b4_rep.h5")
    (folder / "manifest.csv").write_text(
        "case_id,file,status,beta,seed\n"
        "low-0,beta0.5/b0.5_s0.h5,complete,0.5,0\n"
        "low-1,beta0.5/b0.5_s1.h5,complete,0.5,1\n"
        "huge,beta9/b9_s0.h5,failed,9,0\n")
    return folder


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_sweep_table_and_phase_diagram_match_the_files(sweep_dir, tmp_path):
    out = tmp_path / "out"
    written = plot_sweep(sweep_dir, out)
    assert [p.name for p in written] == ["mysweep_phase_diagram.png", "mysweep_outcomes.png",
                                         "mysweep_final_states.png", "mysweep_outcomes.md",
                                         "mysweep_outcomes.csv"]
    for figure in written[:3]:
        assert_png(figure)
    rows = read_csv(written[4])
    columns = list(rows[0])
    assert columns == ["case", "file", "status", "replica", "beta", "seed", "replicas", "t_final",
                       "final_clusters", "collapsed", "final_min_inner", "marginal_spread"]
    # Manifest order first (with its case ids), then the unlisted files in path order.
    assert [(r["case"], r["file"], r["replica"]) for r in rows] == [
        ("low-0", "beta0.5/b0.5_s0.h5", ""), ("low-1", "beta0.5/b0.5_s1.h5", ""),
        ("huge", "beta9/b9_s0.h5", ""),
        ("b4_rep", "b4_rep.h5", "0"), ("b4_rep", "b4_rep.h5", "1"),
        ("b4_s0", "beta4/b4_s0.h5", ""), ("b4_s1", "beta4/b4_s1.h5", "")]
    failed = rows[2]
    assert failed["status"] == "failed" and failed["beta"] == "9"
    assert all(failed[c] == "" for c in ("t_final", "final_clusters", "collapsed", "final_min_inner"))

    for row in rows:
        if row["case"] == "huge":
            continue
        with h5py.File(sweep_dir / row["file"], "r") as f:
            r = int(row["replica"] or 0)
            group = "tokens" if r == 0 else f"tokens_r{r}"
            x = f[f"particles/{group}/position/value"][-1]
            min_inner = f["observables/min_inner/value"][()]
            min_inner = min_inner[-1] if min_inner.ndim == 1 else min_inner[-1, r]
            params = f["parameters"].attrs
            assert row["status"] == "complete"
            assert float(row["beta"]) == params["beta"] and int(row["seed"]) == params["seed"]
            assert float(row["t_final"]) == f[f"particles/{group}/position/time"][-1]
        assert float(row["final_min_inner"]) == min_inner  # full precision in the CSV
        assert row["collapsed"] == ("yes" if min_inner >= 1 - 1e-4 else "no")
        assert int(row["final_clusters"]) == clusters_by_search(x, 1e-4)
        largest = np.linalg.eigvalsh(x.T @ x / len(x)).max()
        assert float(row["marginal_spread"]) == pytest.approx(1 - largest, abs=1e-12)
    # Small beta collapses in this time, large beta keeps several clusters (n = 12, t = 10).
    outcome = {(r["beta"], r["seed"], r["replica"]): r for r in rows}
    assert outcome[("0.5", "0", "")]["collapsed"] == "yes"
    assert any(r["collapsed"] == "no" for r in rows if r["beta"] == "4.0")

    markdown = written[3].read_text().splitlines()
    table = [line for line in markdown if line.startswith("|")]
    assert table[0] == "| " + " | ".join(columns) + " |"
    assert len(table) == 2 + len(rows)

    # The diagram's rows are the mean clustered pair fraction of every run with that beta.
    betas, times, matrix, counts = phase_matrix(collect(sweep_dir))
    np.testing.assert_array_equal(betas, [0.5, 4.0])
    assert list(counts) == [2, 4]
    with h5py.File(sweep_dir / "beta4/b4_s1.h5", "r") as f:
        np.testing.assert_array_equal(times, f["particles/tokens/position/time"][()])
    expected = []
    for path, replica in (("beta4/b4_s0.h5", 0), ("beta4/b4_s1.h5", 0), ("b4_rep.h5", 0), ("b4_rep.h5", 1)):
        with h5py.File(sweep_dir / path, "r") as f:
            group = "tokens" if replica == 0 else f"tokens_r{replica}"
            frames = f[f"particles/{group}/position/value"][()]
        expected.append([pair_fraction(frame) for frame in frames])
    np.testing.assert_allclose(matrix[1], np.mean(expected, axis=0), atol=1e-15)


def test_sweep_uses_stored_observables_and_tolerates_no_manifest(run_mfattn, tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    for seed in (0, 1):
        shutil.move(run_mfattn("--n", 10, "--d", 3, "--beta", 1, "--seed", seed, *SHORT,
                               out=f"s{seed}.h5"), folder / f"s{seed}.h5")
    with h5py.File(folder / "s1.h5", "r+") as f:
        replace_observable(f, "n_clusters", np.full(f["particles/tokens/position/time"].shape[0], 5.0))
    written = plot_sweep(folder, tmp_path / "out")
    # One beta only and no axis but the seed: no phase diagram, no outcome figure.
    assert [p.name for p in written] == ["plain_final_states.png", "plain_outcomes.md",
                                         "plain_outcomes.csv"]
    rows = read_csv(written[2])
    assert [r["case"] for r in rows] == ["s0", "s1"]
    assert list(rows[0])[:4] == ["case", "file", "status", "seed"]
    assert rows[1]["final_clusters"] == "5"


def test_sweep_cli_and_bad_files(sweep_dir, tmp_path):
    done = script("plot_sweep.py", sweep_dir, "--out", tmp_path / "cli")
    assert done.returncode == 0, done.stderr
    printed = [Path(line) for line in done.stdout.split()]
    assert [p.name for p in printed] == ["mysweep_phase_diagram.png", "mysweep_outcomes.png",
                                         "mysweep_final_states.png", "mysweep_outcomes.md",
                                         "mysweep_outcomes.csv"]
    assert all(p.is_file() for p in printed)

    (sweep_dir / "beta4" / "broken.h5").write_text("not hdf5\n")
    assert_clear_error(script("plot_sweep.py", sweep_dir, "--out", tmp_path / "bad"),
                       "plot_sweep.py", "broken.h5", "not an mfattn H5MD file", "--skip-bad")
    sweep = collect(sweep_dir, skip_bad=True)
    broken = [r for r in sweep.rows if r["file"] == "beta4/broken.h5"]
    assert len(broken) == 1 and broken[0]["status"] == "unreadable"

    empty = tmp_path / "empty"
    empty.mkdir()
    assert_clear_error(script("plot_sweep.py", empty), "plot_sweep.py", "no .h5 files")
    assert_clear_error(script("plot_sweep.py", tmp_path / "nowhere"), "plot_sweep.py", "not a folder")


def test_a_categorical_sweep_gets_its_figures_and_a_table_without_repeated_columns(mfattn_binary, tmp_path):
    """The sweep a researcher runs first: kernel x geometry x seed through `mfattn sweep`, whose
    manifest also carries every observable's final value. The table has each column once,
    short numbers in Markdown, and the figures: outcomes per axis value and the final states
    drawn from the files' last frames."""
    config = tmp_path / "grid.ini"
    config.write_text("[model]\nd = 3\nn = 10\nbeta = 1\n[stepping]\nhorizon = 2\nsave-every = 0.5\n"
                      "threads = 1\n[axes]\nkernel = usa sa\ngeometry = none rope\nseed = 0 1\n")
    done = subprocess.run([str(mfattn_binary), "sweep", "--config", str(config)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    folder = tmp_path / "grid"
    written = plot_sweep(folder, tmp_path / "out")
    assert [p.name for p in written] == ["grid_outcomes.png", "grid_final_states.png",
                                         "grid_outcomes.md", "grid_outcomes.csv"]
    for figure in written[:2]:
        assert_png(figure)
    rows = read_csv(written[3])
    # conditional_spread: the RoPE runs store it (an auxiliary geometry).
    assert list(rows[0]) == ["case", "file", "status", "kernel", "geometry", "seed", "t_final",
                             "final_clusters", "collapsed", "final_min_inner", "marginal_spread",
                             "conditional_spread"]
    manifest = read_csv(folder / "manifest.csv")
    assert [r["case"] for r in rows] == [m["case_id"] for m in manifest]
    assert [(r["kernel"], r["geometry"], r["seed"]) for r in rows] == \
        [(m["kernel"], m["geometry"], m["seed"]) for m in manifest]
    # Markdown: numbers of at most 6 significant digits, min_inner with up to 10.
    table = [line.split("|")[1:-1] for line in written[2].read_text().splitlines() if line.startswith("| ")]
    header = [c.strip() for c in table[0]]
    for line in table[1:]:
        for name, cell in zip(header, (c.strip() for c in line)):
            digits = len(cell.lstrip("-").replace(".", "").split("e")[0].lstrip("0"))
            limit = 10 if name == "final_min_inner" else 6
            assert digits <= limit or not cell.replace(".", "").replace("-", "").isdigit(), (name, cell)

    sweep = collect(folder)
    assert sweep.axes == ["kernel", "geometry"]
    assert len(sweep.cases) == 8
    for case, row in zip(sweep.cases, rows):
        assert case.parameters["kernel"] == row["kernel"] and case.parameters["seed"] == int(row["seed"])
        with h5py.File(folder / row["file"], "r") as f:
            last = f["particles/tokens/position/value"][-1]
        np.testing.assert_array_equal(case.final_run.final, last)
        assert case.final_run.positions.shape[0] == 1  # the grid keeps the final frame only


def test_an_axis_that_only_relabels_another_is_not_drawn_twice():
    """A [derived] dt zipped with beta is the beta axis again; kernel x n are two axes even
    where each value of one meets every value of the other."""
    from mfattn.plot_sweep import Case, _independent_axes
    zipped = [Case({"beta": b, "dt": 0.1 / b, "kernel": k, "n": n}, {}, None)
              for b in (0.5, 1.0, 4.0) for k in ("sa", "usa") for n in (32, 64)]
    assert _independent_axes(["kernel", "n", "beta", "dt"], zipped) == ["kernel", "n", "beta"]
    # dt the same for two betas: it no longer names the beta, so it is an axis of its own.
    zipped[0].parameters["dt"] = zipped[4].parameters["dt"]
    assert _independent_axes(["beta", "dt"], zipped) == ["beta", "dt"]


def test_the_phase_diagram_style(tmp_path):
    """plotting_common.phase_map: t across and beta up, RdBu_r from 0 to 1 (a symmetric scale
    for a difference), both axes from the first value to the last, numbers on a linear or log
    axis when the betas are evenly spaced (in log), equal rows labelled by value otherwise,
    and grey cells where a run failed."""
    plt = plotting_common.pyplot()
    times = np.linspace(0.0, 30.0, 61)
    cases = [(np.linspace(0.1, 9.0, 90), "linear", None),
             (2.0 ** np.arange(-2, 5), "log", None),
             (np.array([0.1, 0.2, 0.4, 0.7, 1, 9]), "linear", "rows")]
    for betas, scale, rows in cases:
        values = np.random.default_rng(0).random((betas.size, times.size))
        fig, ax = plt.subplots()
        mesh = plotting_common.phase_map(ax, betas, times, values)
        assert ax.get_xlim() == (0.0, 30.0) and ax.get_xlabel() == "t" and ax.get_ylabel() == "beta"
        assert mesh.get_cmap().name == "RdBu_r" and mesh.get_clim() == (0.0, 1.0)
        assert ax.get_yscale() == scale
        if rows:
            assert ax.get_ylim() == (-0.5, betas.size - 0.5)
            assert [t.get_text() for t in ax.get_yticklabels()] == ["0.1", "0.2", "0.4", "0.7", "1", "9"]
        else:
            assert ax.get_ylim() == pytest.approx((betas[0], betas[-1]), rel=1e-12)
        plt.close(fig)
    fig, ax = plt.subplots()
    difference = np.full((3, times.size), 0.25)
    difference[1, 10:] = np.nan
    mesh = plotting_common.phase_map(ax, [1, 2, 3], times, difference * -1, difference=True, label="diff")
    assert mesh.get_clim() == (-0.25, 0.25)
    assert ax.get_facecolor()[:3] == pytest.approx((0.7, 0.7, 0.7))
    assert "failed numerically" in fig.axes[-1].get_ylabel()
    plt.close(fig)
    fig, ax = plt.subplots()
    plotting_common.phase_map(ax, [1, 2], np.r_[0.0, np.geomspace(0.01, 100, 9)], np.zeros((2, 10)),
                              log_time=True)
    assert ax.get_xscale() == "log" and ax.get_xlim() == pytest.approx((0.01, 100))
    plt.close(fig)


def test_every_phase_diagram_route_draws_in_the_one_style(monkeypatch, mfattn, sweep_dir, tmp_path):
    """plot_sweep.py, plot_reference.py and examples/phase_diagram.py all draw their maps with
    mfattn.plotting.phase_map (whose style the test above fixes), with t across and beta up."""
    import runpy
    from mfattn import plot_reference
    from mfattn import plot_sweep as plot_sweep_module
    calls = []
    real = plotting_common.phase_map

    def spy(ax, betas, times, values, **options):
        calls.append((np.asarray(betas, dtype=float), np.asarray(times, dtype=float), np.shape(values)))
        return real(ax, betas, times, values, **options)

    monkeypatch.setattr(plotting_common, "phase_map", spy)
    monkeypatch.setattr(plot_sweep_module, "phase_map", spy)
    monkeypatch.setattr(plot_reference, "phase_map", spy)

    plot_sweep(sweep_dir, tmp_path / "sweep")
    assert len(calls) == 1 and list(calls[0][0]) == [0.5, 4.0] and calls[0][2] == (2, calls[0][1].size)

    data = tmp_path / "reference" / "phase_diagram"
    data.mkdir(parents=True)
    for integrator in ("reference", "rk4"):
        np.savez(data / f"sa_identity_{integrator}.npz", betas=np.linspace(0.1, 9, 4),
                 checkpoints=np.linspace(0, 30, 11), mean=np.full((4, 11), 0.5),
                 settings='{"n": 32, "d": 2, "batch": 8}')
    plot_reference.phase_figures(data, tmp_path / "reference" / "figures")
    assert len(calls) == 4 and all(c[2] == (4, 11) for c in calls[1:])

    example = REPO_ROOT / "examples" / "phase_diagram.py"
    monkeypatch.setattr("sys.argv", [str(example), "--systems", "4", "--betas", "3", "--horizon", "2",
                                     "--checkpoints", "4", "--out", str(tmp_path / "example")])
    monkeypatch.syspath_prepend(str(example.parent))  # as running the script puts its folder first
    runpy.run_path(str(example), run_name="__main__")
    assert len(calls) == 5 and calls[4][2] == (3, 5)
    assert_png(tmp_path / "example" / "phase_diagram.png")


# --- make_figures -----------------------------------------------------------------------------


def test_make_figures_draws_every_experiment_present(run_mfattn, tmp_path, capsys):
    data = tmp_path / "data"

    def put(subfolder: str, name: str, *args) -> None:
        target = data / subfolder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(run_mfattn(*args, out=name), target)

    quick = ("--horizon", 2, "--save-every", 0.5)
    for kernel in ("usa", "sa"):
        put("collapse", f"baseline_{kernel}_n16.h5", "--n", 16, "--d", 3, "--kernel", kernel, *quick)
    # n = 128 is the size seed003_min_inner.png shows (collapse_summary's choice).
    put("seed003", "baseline_usa_n128.h5", "--config", REPO_ROOT / "experiments/seed003/baseline_usa.ini",
        "--n", 128, *quick)
    put("seed003", "rope_mixed_d4_n16.h5", "--config", REPO_ROOT / "experiments/seed003/rope_mixed_d4.ini",
        "--n", 16, *quick)
    for beta in (4, 9):
        put("metastability", f"circle_beta{beta}.h5", "--n", 24, "--d", 2, "--beta", beta,
            "--time-scale", "rescaled", "--horizon", 200, "--save-log", 30)
    for beta in (0.5, 4):
        put("sweeps/tiny", f"b{beta}.h5", "--n", 10, "--d", 3, "--beta", beta, *SHORT)

    written = make_figures(data, data / "figures")
    printed = capsys.readouterr().out
    names = sorted(p.relative_to(data / "figures").as_posix() for p in written)
    assert names == sorted([
        "collapse_min_inner.png", "seed003_min_inner.png", "seed003_final_states.png",
        *[f"seed003/{stem}_{kind}.png" for stem in ("baseline_usa_n128", "rope_mixed_d4_n16")
          for kind in ("sphere", "energy_clusters", "gram")],
        "seed003/rope_mixed_d4_n16_positions.png",
        "metastability_beta4.png", "metastability_beta9.png", "metastability.png",
        "sweeps/tiny_phase_diagram.png", "sweeps/tiny_outcomes.png", "sweeps/tiny_final_states.png",
        "sweeps/tiny_outcomes.md", "sweeps/tiny_outcomes.csv"])
    for p in written:
        assert str(p) in printed.splitlines()
        if p.suffix == ".png":
            assert_png(p)
    # No d = 3, n = 256 seed003 run: collapse_summary's seed003_final.png is skipped, with a note.
    assert "seed003_final.png not drawn" in printed
    assert "not present" not in printed


def test_make_figures_cli_skips_missing_and_fails_on_nothing(run_mfattn, tmp_path):
    data = tmp_path / "data"
    (data / "sweeps" / "one").mkdir(parents=True)
    (data / "collapse").mkdir()  # present but empty: skipped with a note
    shutil.move(run_mfattn("--n", 8, "--d", 3, "--beta", 2, *SHORT, out="a.h5"), data / "sweeps/one/a.h5")
    done = script("make_figures.py", "--data", data)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"note: {data / 'collapse'} holds no .h5 file directly; skipped" in lines
    assert f"note: {data / 'seed003'} not present; skipped" in lines
    assert f"note: {data / 'metastability'} not present; skipped" in lines
    outputs = [Path(line) for line in lines if not line.startswith("note:")]
    assert [p.name for p in outputs] == ["one_final_states.png", "one_outcomes.md", "one_outcomes.csv"]
    assert all(p.parent == data / "figures" / "sweeps" and p.is_file() for p in outputs)

    empty = tmp_path / "empty"
    empty.mkdir()
    assert_clear_error(script("make_figures.py", "--data", empty), "make_figures.py", "no experiment data")
    assert_clear_error(script("make_figures.py", "--data", tmp_path / "nowhere"), "make_figures.py",
                       "no such data folder")
    (data / "sweeps/one/junk.h5").write_text("junk\n")
    assert_clear_error(script("make_figures.py", "--data", data), "make_figures.py", "junk.h5")


def test_make_figures_follows_symlinked_run_folders(run_mfattn, tmp_path):
    """Runs linked in from elsewhere (scratch space) are drawn; a link cycle is read once."""
    scratch = tmp_path / "scratch" / "sweep"
    scratch.mkdir(parents=True)
    shutil.move(run_mfattn("--n", 8, "--d", 3, "--beta", 2, *SHORT, out="a.h5"), scratch / "a.h5")
    (scratch / "loop").symlink_to(scratch)  # a cycle
    data = tmp_path / "data"
    (data / "sweeps").mkdir(parents=True)
    (data / "sweeps" / "linked").symlink_to(scratch)
    done = script("make_figures.py", "--data", data)
    assert done.returncode == 0, done.stderr
    outputs = [Path(line).name for line in done.stdout.splitlines() if not line.startswith("note:")]
    assert outputs == ["linked_final_states.png", "linked_outcomes.md", "linked_outcomes.csv"]


# --- plot_run as a researcher uses it: snapshots, trails, colours, log time, many tokens ------


def test_trajectories_follow_the_sphere_between_frames():
    from mfattn.plot_run import along_sphere
    angle = np.array([0.0, 2.0, 3.0])  # frames far apart on the circle: a chord would cut across
    x = np.stack([np.cos(angle), np.sin(angle)], axis=-1)[:, None, :]  # [3 frames, 1 token, 2]
    path = along_sphere(x, substeps=8)
    assert path.shape == (17, 1, 2)
    np.testing.assert_allclose(np.linalg.norm(path, axis=-1), 1.0, rtol=0, atol=1e-15)
    for k, frame in ((0, 0), (8, 1), (16, 2)):  # the frames themselves, to the bit
        np.testing.assert_array_equal(path[k], x[frame])


def test_snapshots_no_trails_and_the_colour_note(run_mfattn, tmp_path):
    out = run_mfattn("--n", 24, "--d", 3, "--beta", 4, "--kernel", "sa", "--geometry", "rope", "--positions", "index",
                     "--prefix", 2, "--prompts", 2, "--mask", "per-prompt", *SHORT)
    done = script("plot_run.py", out, "--out", tmp_path, "--no-trails", "--times", "0,1.3,4")
    assert done.returncode == 0, done.stderr
    assert_png(tmp_path / "run_snapshots.png")
    run = plotting_common.load_run(out)
    from mfattn.plot_run import colour_note, state_axes
    assert colour_note(run).startswith("colour: prompt")
    import matplotlib.pyplot as plt  # (imported here: which tests ran before it in this worker varies)
    figure = plt.figure()

    def line_collections(trajectories: bool) -> int:  # the wireframe is one, the trails another
        ax = state_axes(figure, (1, 1, 1), run, trajectories=trajectories)
        return sum(type(c).__name__ == "Line3DCollection" for c in ax.collections)

    assert line_collections(True) == line_collections(False) + 1
    bad = script("plot_run.py", out, "--out", tmp_path, "--times", "soon")
    assert bad.returncode == 2 and "--times soon" in bad.stderr


def test_log_spaced_runs_get_a_log_time_axis(run_mfattn):
    out = run_mfattn("--n", 12, "--d", 2, "--beta", 4, "--kernel", "sa", "--horizon", 100, "--save-log", 40)
    run = plotting_common.load_run(out)
    import matplotlib.pyplot as plt  # (not through `matplotlib`: alone, no other test has imported it)
    from mfattn.plot_run import draw_angles
    ax = plt.figure().add_subplot()
    draw_angles(ax, run)
    assert ax.get_xscale() == "log"


def test_many_tokens_draw_a_density_instead_of_trajectories(run_mfattn, tmp_path):
    out = run_mfattn("--n", 1100, "--d", 3, "--horizon", 0.2, "--save-every", 0.1, "--threads", 2)
    written = plot_run(out, tmp_path)
    assert tmp_path / "run_density.png" in written
    assert_png(tmp_path / "run_density.png")


def test_a_sweep_folder_with_its_by_parameters_links_is_one_sweep(mfattn_binary, tmp_path):
    """`mfattn sweep` links every case by its parameters under by-parameters/: the sweep's
    figures read each case once, and that folder is no sweep of its own."""
    from mfattn.make_figures import sweep_figures
    config = tmp_path / "grid.ini"
    config.write_text("[model]\nd = 3\nn = 8\n[stepping]\nhorizon = 1\nsave-every = 0.5\nthreads = 1\n"
                      "[axes]\nbeta = 1 2\n")
    done = subprocess.run([str(mfattn_binary), "sweep", "--config", str(config)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    folder = tmp_path / "grid"
    assert len(list((folder / "by-parameters").iterdir())) == 2
    assert len(plotting_common.find_h5(folder)) == 2
    assert all(not p.is_symlink() for p in plotting_common.find_h5(folder))
    written = sweep_figures(folder, tmp_path / "out")
    assert written and all("by-parameters" not in p.name for p in written)
    assert any(p.name.startswith("grid_") for p in written), [p.name for p in written]
