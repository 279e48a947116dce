"""analysis/animate.py: animations of runs and density files drawn from the files' own frames
(the first and the last always), MP4 through ffmpeg and GIF through Pillow, the projection for
d > 3, colours by prompt with prefix stars, and bad input refused with exit 2, one line and no
file left behind (not even a partial one). File names are titles as they are (never mathtext),
and non-finite positions are left out of the frames they are in (a file with nothing finite is
refused)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ANALYSIS_DIR

SCRIPT = ANALYSIS_DIR / "animate.py"


def animate_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"})


def positions(path: Path, replica: int = 0) -> np.ndarray:
    group = "particles/tokens" if replica == 0 else f"particles/tokens_r{replica}"
    with h5py.File(path) as f:
        return f[f"{group}/position/value"][:]


@pytest.fixture(scope="module")
def animation_module():
    from mfattn import animate
    return animate


def test_frames_are_the_files_own_first_and_last_included(run_mfattn, animation_module):
    out = run_mfattn("--n", 40, "--d", 3, "--kernel", "sa", "--beta", 4, "--geometry", "rope", "--positions", "index",
                     "--horizon", 5, "--save-every", 0.05)
    x = positions(out)
    assert len(x) == 101
    movie = animation_module.Animation(out, frames=12, trail=3)
    assert len(movie.indices) == 12 and movie.indices[0] == 0 and movie.indices[-1] == 100
    for k in (0, 5, 11):
        movie.draw(k)
        drawn = np.column_stack(movie.points._offsets3d)
        np.testing.assert_array_equal(drawn, x[movie.indices[k]])
    assert movie.label.get_text().startswith("t = 5\n")  # the last frame's time, energy, clusters
    assert "energy = " in movie.label.get_text() and "clusters = " in movie.label.get_text()


def test_gif_and_mp4_are_written(run_mfattn, tmp_path):
    out = run_mfattn("--n", 30, "--d", 2, "--kernel", "sa", "--beta", 2, "--horizon", 3, "--save-every", 0.1)
    done = animate_cli(out, "--out", tmp_path / "a.gif", "--frames", 8, "--trail", 2, "--fps", 10)
    assert done.returncode == 0, done.stderr
    from PIL import Image
    with Image.open(tmp_path / "a.gif") as gif:
        assert gif.n_frames == 8
    done = animate_cli(out, "--out", tmp_path / "a.mp4", "--frames", 8)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.mp4").read_bytes()[4:8] == b"ftyp"  # an MP4 container
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no partial file


def test_projection_for_d_above_three_says_its_share(run_mfattn, animation_module):
    out = run_mfattn("--n", 50, "--d", 8, "--kernel", "sa", "--beta", 1, "--q", "gaussian", "--k", "gaussian",
                     "--horizon", 4, "--save-every", 0.1)
    x = positions(out)
    movie = animation_module.Animation(out, frames=10)
    pooled = x[movie.indices].reshape(-1, 8)
    values, vectors = np.linalg.eigh(pooled.T @ pooled / len(pooled))
    basis = vectors[:, ::-1][:, :2]
    movie.draw(9)
    drawn = movie.points.get_offsets()
    # Eigenvectors are defined up to sign: compare the projections up to a sign per axis.
    expected = x[-1] @ basis
    for axis in range(2):
        assert min(np.abs(drawn[:, axis] - expected[:, axis]).max(),
                   np.abs(drawn[:, axis] + expected[:, axis]).max()) < 1e-12
    share = values[::-1][:2].sum() / values.sum()
    notes = " ".join(t.get_text() for t in movie.fig.texts)
    assert f"({share:.0%} of its variance)" in notes


def test_prompts_colour_the_tokens_and_prefix_tokens_are_stars(run_mfattn, animation_module):
    out = run_mfattn("--n", 24, "--d", 3, "--kernel", "sa", "--prefix", 2, "--prompts", 2, "--mask", "per-prompt",
                     "--horizon", 1, "--save-every", 0.5)
    movie = animation_module.Animation(out)
    notes = " ".join(t.get_text() for t in movie.fig.texts)
    assert "colour: prompt" in notes and "stars: prefix tokens" in notes
    assert len(np.unique(movie.colors, axis=0)) == 2


@pytest.mark.parametrize("grid", [["--d", "2", "--grid", "64"], ["--d", "3", "--grid", "16"],
                                  ["--d", "5", "--zonal", "--grid", "64"]], ids=["circle", "sphere", "zonal"])
def test_density_files_animate(mfattn_binary, tmp_path, grid):
    density = tmp_path / "density.h5"
    done = subprocess.run([str(mfattn_binary), "meanfield", *grid, "--beta", "3",
                           "--perturbation", "1,0.05", "--horizon", "2", "--save-every", "0.5", "--out", str(density),
                           "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = animate_cli(density, "--out", tmp_path / "density.gif")
    assert done.returncode == 0, done.stderr
    from PIL import Image
    with Image.open(tmp_path / "density.gif") as gif:
        assert gif.n_frames == 5


def test_a_failure_while_writing_leaves_nothing(run_mfattn, tmp_path, animation_module):
    out = run_mfattn("--n", 16, "--d", 3, "--horizon", 1, "--save-every", 0.1)
    movie = animation_module.Animation(out)
    drawn = movie.draw

    def failing(k):
        if k == 3:
            raise RuntimeError("interrupted")
        return drawn(k)

    movie.draw = failing
    with pytest.raises(RuntimeError):
        movie.save(tmp_path / "broken.gif")
    assert list(tmp_path.glob("*broken*")) == [] and list(tmp_path.glob(".*")) == []


def test_bad_input_is_refused_with_exit_2_and_no_file(run_mfattn, tmp_path):
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["data"] = np.zeros(3)
    no_positions = run_mfattn("--n", 8, "--horizon", 1, "--save-positions", "none", out="none.h5")
    two = run_mfattn("--n", 8, "--horizon", 1, "--replicas", 2, out="two.h5")
    cases = [
        ([foreign, "--out", tmp_path / "x.gif"], "not an mfattn H5MD file"),
        ([no_positions, "--out", tmp_path / "x.gif"], "no positions (--save-positions none)"),
        ([two, "--out", tmp_path / "x.gif", "--replica", 5], "replica"),
        ([two, "--out", tmp_path / "x.avi"], "--out"),
        ([two, "--out", tmp_path / "x.gif", "--frames", 1], "--frames 1: must be an integer >= 2"),
        ([tmp_path / "missing.h5", "--out", tmp_path / "x.gif"], "no such file"),
    ]
    for args, message in cases:
        done = animate_cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not list(tmp_path.glob("x.*")) and not list(tmp_path.glob(".x*"))


def test_the_module_animates_what_it_loads(run_mfattn, tmp_path, mfattn):
    out = run_mfattn("--n", 20, "--d", 3, "--horizon", 1, "--save-every", 0.1, "--replicas", 2)
    written = mfattn.load(out, replica=1).animate(tmp_path / "r1.gif", frames=4)
    assert written == tmp_path / "r1.gif"
    from PIL import Image
    with Image.open(written) as gif:
        assert gif.n_frames == 4
    # The package's own module, beside its loader (no embedded copy).
    assert Path(mfattn.animate.__file__).parent == Path(mfattn.io.__file__).parent == Path(mfattn.__file__).parent
    with pytest.raises(ValueError, match="--out"):
        mfattn.load(out).animate(tmp_path / "r.avi")


def test_file_names_are_titles_not_mathtext(run_mfattn, mfattn_binary, tmp_path, animation_module):
    # "$...$" is mathtext to matplotlib, and "\\frac{" an error in it (raised when the title is drawn).
    name = "$\\frac{$ & $x_1$"
    run = tmp_path / f"{name}.h5"
    shutil.copyfile(run_mfattn("--n", 8, "--d", 3, "--horizon", 1, "--save-every", 0.5), run)
    density = tmp_path / f"{name} density.h5"
    subprocess.run([str(mfattn_binary), "meanfield", "--d", "2", "--grid", "32", "--horizon", "0.5", "--save-every",
                    "0.5", "--out", str(density), "--quiet"], check=True)
    for path in (run, density):
        done = animate_cli(path, "--out", tmp_path / "a.gif", "--frames", 2, "--poster", tmp_path / "a.png")
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "a.gif").is_file() and (tmp_path / "a.png").is_file()
        movie = animation_module.Animation(path, frames=2)
        title = movie.fig._suptitle
        assert title.get_text().startswith(f"{path.stem}: ")
        movie.fig.canvas.draw()  # the text as it is: drawn without a mathtext parse
        movie.plt.close(movie.fig)


def with_non_finite(path: Path, frames, tokens=slice(None)) -> None:
    """Writes NaN into the positions of `tokens` in `frames` (the rest as the run wrote them)."""
    with h5py.File(path, "r+") as f:
        value = f["particles/tokens/position/value"]
        x = value[:]
        x[frames, tokens] = np.nan
        value[...] = x


@pytest.mark.parametrize("d", [2, 3, 5])
def test_non_finite_tokens_are_left_out_of_their_frames(run_mfattn, tmp_path, animation_module, d):
    out = run_mfattn("--n", 8, "--d", d, "--horizon", 1, "--save-every", 0.1)
    with_non_finite(out, [3], [2, 5])  # two tokens of frame 3
    with_non_finite(out, slice(7, None))  # the run went NaN at frame 7
    x = positions(out)
    from matplotlib.collections import Collection
    movie = animation_module.Animation(out, trail=2)
    assert list(movie.indices) == list(range(11))
    for k in range(11):
        movie.draw(k)
        if d == 3:
            drawn = np.column_stack(movie.points._offsets3d)
        else:
            drawn = movie.points.get_offsets()
        finite = np.isfinite(x[k]).all(axis=1)
        assert len(drawn) == finite.sum() == (8 if k < 7 and k != 3 else 6 if k == 3 else 0)
        assert np.isfinite(drawn).all()
        if d <= 3:
            np.testing.assert_array_equal(drawn, x[k][finite][:, :d])
        # Each token keeps its colour (the colours as set: a 3-D scatter sorts them by depth when drawn).
        np.testing.assert_array_equal(Collection.get_facecolor(movie.points).reshape(-1, 4), movie.colors[finite])
        assert ("not finite" in movie.label.get_text()) == (k == 3 or k >= 7), movie.label.get_text()
    notes = " ".join(t.get_text() for t in movie.fig.texts)
    assert "non-finite positions from t = 0.3" in notes, notes
    movie.plt.close(movie.fig)
    done = animate_cli(out, "--out", tmp_path / "a.gif", "--trail", 2)
    assert done.returncode == 0, done.stderr
    from PIL import Image
    with Image.open(tmp_path / "a.gif") as gif:
        assert gif.n_frames == 11


def test_a_file_with_no_finite_position_is_refused(run_mfattn, tmp_path):
    out = run_mfattn("--n", 8, "--d", 3, "--horizon", 1, "--save-every", 0.5)
    with_non_finite(out, slice(None))
    done = animate_cli(out, "--out", tmp_path / "x.gif")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert str(out) in done.stderr and "frame 0" in done.stderr, done.stderr
    assert not list(tmp_path.glob("x.*")) and not list(tmp_path.glob(".x*"))


def test_a_text_parameter_is_shown_as_text(run_mfattn, tmp_path):
    """A file another program wrote may hold any text as beta: the title formatted it as a
    number (a traceback, exit 1)."""
    run = run_mfattn("--n", 8, "--d", 3, "--horizon", 1, "--save-every", 0.5)
    with h5py.File(run, "r+") as f:
        f["parameters"].attrs["beta"] = "$\\frac{$"
    done = animate_cli(run, "--out", tmp_path / "a.gif", "--frames", 2)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.gif").is_file()


def test_gauge_coordinates_show_the_conditional_collapse_of_a_rope_run(run_mfattn, animation_module, tmp_path):
    """A RoPE run collapses conditionally: its tokens spread over the sphere while G(xi_i) x_i
    meet at one point (up to sign), computed here with scipy from the file's generators."""
    from scipy.linalg import expm
    path = run_mfattn("--n", 24, "--d", 3, "--beta", 4, "--geometry", "rope", "--horizon", 20, "--save-every", 5)
    tr = animation_module.load_file(path, 0)
    y = animation_module.gauge_coordinates(path, tr)
    with h5py.File(path) as f:
        omega, xi = f["particles/tokens/gauge_generators"][()], f["particles/tokens/aux_position"][()]
    x = positions(path)
    expected = np.stack([expm(np.tensordot(xi[i], omega, axes=1)) @ x[-1, i] for i in range(x.shape[1])])
    np.testing.assert_allclose(y[-1], expected, atol=1e-12)
    assert np.abs(x[-1] @ x[-1].T).min() < 0.9  # the plain positions are spread
    assert np.abs(y[-1] @ y[-1].T).min() > 1 - 1e-3  # the gauge coordinates meet (up to sign)
    out = tmp_path / "gauge.gif"
    done = animate_cli(path, "--out", out, "--frames", 3, "--gauge")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:3] == b"GIF"
    plain = run_mfattn("--n", 8, "--d", 3, "--horizon", 0.2, out="plain.h5")
    refused = animate_cli(plain, "--out", tmp_path / "no.gif", "--gauge")
    assert refused.returncode == 2 and "--gauge:" in refused.stderr and "has no gauge" in refused.stderr
    assert refused.stderr.count("\n") == 1 and not (tmp_path / "no.gif").exists()
