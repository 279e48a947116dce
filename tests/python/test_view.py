"""analysis/view.py: the viewer page embeds the file's own positions (read back here), thins
long runs and says so, refuses bad input with exit 2 and no file, and, in Debian's chromium
(headless; skipped with a message only where it is not installed), loads without a script
error, names the file's token count, shows the frame's time at the cursor, and moves the
tokens (and only them) between two frames. Non-finite positions stay NaN in the page (which
draws without them) and a file with no finite one is refused. Hostile file names (and file text)
stay text: the page keeps its own elements only, reads back, and draws with no injected handler
run. The last observables strip lies inside a 1100 x 900 window, counts read as integers, and
--gauge embeds each token's gauge coordinates (checked against scipy's expm) or refuses a run
without a gauge."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ANALYSIS_DIR

SCRIPT = ANALYSIS_DIR / "view.py"
CHROMIUM = shutil.which("chromium")


def view_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def view_module():
    from mfattn import view
    return view


def file_positions(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with h5py.File(path) as f:
        return f["particles/tokens/position/value"][:], f["particles/tokens/position/time"][:]


def test_the_page_embeds_the_files_positions(run_mfattn, tmp_path, view_module):
    out = run_mfattn("--n", 30, "--d", 3, "--kernel", "sa", "--beta", 3, "--geometry", "rope", "--positions",
                     "index", "--horizon", 4, "--save-every", 0.1)
    x, times = file_positions(out)
    done = view_cli(out, "--out", tmp_path / "run.html")
    assert done.returncode == 0, done.stderr
    data = view_module.read_page_data(tmp_path / "run.html")
    assert data["tokens"] == 30 and data["frames"] == len(x) == 41
    np.testing.assert_allclose(data["positions"], x, rtol=0, atol=1e-7)  # float32
    np.testing.assert_array_equal(data["times"], times)
    assert set(data["observables"]) == {"energy", "n_clusters", "min_inner"}


def test_long_runs_are_thinned_and_the_page_says_so(run_mfattn, tmp_path, view_module):
    out = run_mfattn("--n", 50, "--d", 6, "--horizon", 2, "--save-every", 0.01, "--q", "gaussian")
    x, _ = file_positions(out)
    # 50 tokens x 2 coordinates x 4 bytes x 4/3 (base64): 93 frames in 0.05 MB
    data = view_module.page_data(out, max_mb=0.05)
    assert data["frames"] == 93 and data["frame_indices"][0] == 0 and data["frame_indices"][-1] == len(x) - 1
    assert f"showing 93 of the file's {len(x)} frames" in "; ".join(data["notes"])
    assert "of its variance" in "; ".join(data["notes"])  # d > 3: the projection says its share
    positions = np.frombuffer(__import__("base64").b64decode(data["positions"]), dtype="<f4").reshape(93, 50, 2)
    pooled = x[data["frame_indices"]].reshape(-1, 6)
    vectors = np.linalg.eigh(pooled.T @ pooled / len(pooled))[1][:, ::-1][:, :2]
    expected = x[-1] @ vectors
    for axis in range(2):  # eigenvectors up to sign
        assert min(np.abs(positions[-1][:, axis] - expected[:, axis]).max(),
                   np.abs(positions[-1][:, axis] + expected[:, axis]).max()) < 1e-6


def test_bad_input_is_refused_with_exit_2_and_no_file(run_mfattn, mfattn_binary, tmp_path):
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["data"] = np.zeros(3)
    no_positions = run_mfattn("--n", 8, "--horizon", 1, "--save-positions", "none", out="none.h5")
    density = tmp_path / "density.h5"
    subprocess.run([str(mfattn_binary), "meanfield", "--d", "2", "--grid", "32", "--horizon", "0.5", "--out",
                    str(density), "--quiet"], check=True)
    cases = [([foreign], "not an mfattn H5MD file"), ([no_positions], "no positions"),
             ([density], "a density file"), ([no_positions, "--replica", 3], "replica"),
             ([no_positions, "--max-mb", 0], "--max-mb 0")]
    for args, message in cases:
        done = view_cli(*args, "--out", tmp_path / "x.html")
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
    done = view_cli(no_positions, "--out", tmp_path / "x.htm")
    assert done.returncode == 2 and "--out" in done.stderr
    assert not list(tmp_path.glob("x.*")) and not list(tmp_path.glob(".x*"))


def chromium(*args, window: str = "700,1000", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=5000", f"--window-size={window}", *args],
                          capture_output=True, text=True, timeout=timeout)


def dom_value(dom: str, element: str) -> str:
    found = re.search(rf'id="{element}">([^<]*)<', dom)
    assert found, f"no #{element} in the page"
    return found.group(1)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tests/install_deps.sh installs it)")
def test_the_page_in_a_real_browser(run_mfattn, tmp_path):
    out = run_mfattn("--n", 64, "--d", 3, "--kernel", "sa", "--beta", 4, "--geometry", "rope", "--positions",
                     "index", "--horizon", 10, "--save-every", 0.5)
    _, times = file_positions(out)
    page = tmp_path / "run.html"
    assert view_cli(out, "--out", page).returncode == 0
    for frame in (0, 7, len(times) - 1):
        done = chromium("--dump-dom", f"file://{page}#frame={frame}")
        dom = done.stdout
        assert 'data-ready="1"' in dom, done.stderr[-2000:]
        assert dom_value(dom, "errors") == ""  # no script error
        assert dom_value(dom, "tokens") == "64"
        assert float(dom_value(dom, "time")) == times[frame]
        assert float(dom_value(dom, "cursor-time")) == times[frame]
    assert "Uncaught" not in chromium("--enable-logging=stderr", "--v=0", "--dump-dom", f"file://{page}").stderr
    shots = []
    for frame in (0, len(times) - 1):
        shot = tmp_path / f"frame{frame}.png"
        chromium(f"--screenshot={shot}", f"file://{page}#frame={frame}")
        from PIL import Image
        with Image.open(shot) as image:
            shots.append(np.asarray(image.convert("RGB"), dtype=int))
    sphere = (slice(40, 600), slice(12, 572))  # the sphere's canvas
    differ = np.any(shots[0][sphere] != shots[1][sphere], axis=-1)
    assert differ.sum() > 500  # the tokens moved
    assert differ.mean() < 0.2  # the sphere's drawing stays where it was


def test_non_finite_positions_are_left_out_of_the_page(run_mfattn, tmp_path, view_module):
    out = run_mfattn("--n", 8, "--d", 5, "--horizon", 1, "--save-every", 0.5)
    with h5py.File(out, "r+") as f:
        value = f["particles/tokens/position/value"]
        x = value[:]
        x[2, [1, 6]] = np.nan  # two tokens of the last frame
        value[...] = x
    page = tmp_path / "run.html"
    done = view_cli(out, "--out", page)
    assert done.returncode == 0, done.stderr
    data = view_module.read_page_data(page)
    assert data["frames"] == 3
    finite = np.isfinite(data["positions"]).all(axis=-1)
    np.testing.assert_array_equal(finite, np.isfinite(x).all(axis=-1))  # NaN where the file has it
    assert "non-finite positions from t = 1 (the file's frame 2)" in "; ".join(data["notes"])
    if CHROMIUM is not None:
        dom = chromium("--dump-dom", f"file://{page}#frame=2").stdout
        assert 'data-ready="1"' in dom and dom_value(dom, "errors") == ""
    with h5py.File(out, "r+") as f:
        f["particles/tokens/position/value"][...] = np.nan
    done = view_cli(out, "--out", tmp_path / "none.html")
    assert done.returncode == 2 and "no finite position in any frame (non-finite from frame 0" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not list(tmp_path.glob("*none*"))


# File names (and a /parameters string, which the title also quotes) written to break out of
# the page: a placeholder of the page's own template, markup, a comment that would swallow the
# data's closing tag, the characters HTML escapes, and a byte that is not UTF-8 (Python holds it
# as a surrogate, which no UTF-8 page can hold) with a newline. "/" cannot be in a file name, so
# the closing tag comes in through the kernel attribute. The handlers mark the body if they run.
HOSTILE_NAMES = ["@DATA@<img src=x onerror=document.body.dataset.injected=1>", "<!--<script>",
                 "@TITLE@<b onmouseover=x>@DATA@", 'a&b"\'', "not utf-8 \udcff\nline"]
HOSTILE_KERNEL = "</script><script>document.body.dataset.injected=1</script><!--"


def hostile_runs(run_mfattn, folder: Path) -> list[Path]:
    """A small run copied to each hostile name, and one whose kernel attribute is hostile."""
    out = run_mfattn("--n", 8, "--d", 3, "--horizon", 1, "--save-every", 0.5)
    copies = []
    for name in HOSTILE_NAMES:
        copies.append(folder / f"{name}.h5")
        shutil.copyfile(out, copies[-1])
    copies.append(folder / "kernel.h5")
    shutil.copyfile(out, copies[-1])
    with h5py.File(copies[-1], "r+") as f:
        f["parameters"].attrs["kernel"] = HOSTILE_KERNEL
    return copies


def markup_counts(text: str) -> dict[str, int]:
    lower = text.lower()
    return {tag: lower.count(tag) for tag in ("<script", "</script", "<!--", "<img", "<b ")}


def test_hostile_file_names_stay_text_in_the_page(run_mfattn, tmp_path, view_module):
    runs = hostile_runs(run_mfattn, tmp_path)
    x, times = file_positions(runs[0])
    template = markup_counts(view_module.PAGE.read_text())
    for run in runs:
        page = tmp_path / f"page{runs.index(run)}.html"
        done = view_cli(run, "--out", page)
        assert done.returncode == 0, done.stderr
        text = page.read_text(encoding="utf-8")
        # The template's two script elements (the data and the code) and its one comment:
        # nothing of the file's name as markup.
        assert markup_counts(text) == template, run.name
        assert text.count(view_module.DATA_ELEMENT) == 1
        data = view_module.read_page_data(page)
        # A placeholder in the name is text, in the three places the title is (<title>, the
        # heading and the data), not filled in.
        for placeholder in ("@DATA@", "@TITLE@"):
            assert text.count(placeholder) == 3 * data["title"].count(placeholder), run.name
        assert data["title"].startswith(f"{os.fsencode(run.stem).decode('utf-8', 'replace')}: "), data["title"]
        np.testing.assert_allclose(data["positions"], x, rtol=0, atol=1e-7)
        np.testing.assert_array_equal(data["times"], times)
        escaped = html.escape(data["title"])
        assert f"<title>{escaped}</title>" in text and f'<h1 id="title">{escaped}</h1>' in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tests/install_deps.sh installs it)")
def test_hostile_file_names_run_nothing_in_a_real_browser(run_mfattn, tmp_path, view_module):
    for run in hostile_runs(run_mfattn, tmp_path):
        page = tmp_path / "page.html"
        assert view_cli(run, "--out", page).returncode == 0
        done = chromium("--dump-dom", f"file://{page}")
        dom = done.stdout
        assert 'data-ready="1"' in dom, (run.name, done.stderr[-2000:])
        assert dom_value(dom, "errors") == "", run.name
        assert dom_value(dom, "tokens") == "8", run.name
        assert "data-injected" not in dom, run.name  # no injected handler ran
        # The heading is the title as text (the DOM serialises <, > and & as entities).
        title = view_module.read_page_data(page)["title"]
        assert f'<h1 id="title">{html.escape(title, quote=False)}</h1>' in dom, run.name


def test_non_numeric_parameters_and_non_finite_times_still_make_a_page(run_mfattn, tmp_path, view_module):
    """A file another program wrote: a text beta (the title formatted it as a number: a
    traceback) and a NaN frame time (JSON has no NaN: the browser refused the page's data)."""
    run = run_mfattn("--n", 8, "--d", 3, "--horizon", 1, "--save-every", 0.25)
    with h5py.File(run, "r+") as f:
        f["parameters"].attrs["beta"] = "$\\frac{$"
        f["particles/tokens/position/time"][2] = np.nan
    page = tmp_path / "page.html"
    done = view_cli(run, "--out", page)
    assert done.returncode == 0, done.stderr
    text = page.read_text(encoding="utf-8")
    start = text.index(view_module.DATA_ELEMENT) + len(view_module.DATA_ELEMENT)

    def no_constant(name):
        raise ValueError(f"the page's JSON holds {name}")

    data = json.loads(text[start:text.index("</script>", start)], parse_constant=no_constant)
    assert data["times"][2] is None and "beta = $\\frac{$" in data["title"]


# Appended to a copy of a page, after the page's own script: once the page has loaded, where
# its observables' canvas lies in the window (the last strip ends at the canvas's bottom edge),
# with the window's size and any scroll, as JSON in #layout-probe for --dump-dom.
LAYOUT_PROBE = """<script>
window.addEventListener("load", () => {
  const box = document.getElementById("observables").getBoundingClientRect();
  const probe = document.createElement("pre");
  probe.id = "layout-probe";
  probe.textContent = JSON.stringify({ top: box.top, bottom: box.bottom, left: box.left, right: box.right,
    width: window.innerWidth, height: window.innerHeight, scroll: [window.scrollX, window.scrollY] });
  document.body.appendChild(probe);
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tests/install_deps.sh installs it)")
def test_every_observables_strip_is_inside_the_window(run_mfattn, tmp_path):
    """In a 1100 x 900 window (and a larger one) the observables' three strips, the last one
    included, lie inside the page's viewport as it opens: the page put them under a 560-pixel
    sphere, and the last strip ended below the viewport's bottom edge (at 908 of 813 pixels)."""
    out = run_mfattn("--n", 16, "--d", 3, "--horizon", 1, "--save-every", 0.25)
    page = tmp_path / "run.html"
    assert view_cli(out, "--out", page).returncode == 0
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", LAYOUT_PROBE + "\n</body>"),
                      encoding="utf-8")
    for width, height in ((1100, 900), (1600, 1200)):
        done = chromium("--dump-dom", f"file://{probed}", window=f"{width},{height}")
        dom = done.stdout
        assert 'data-ready="1"' in dom and dom_value(dom, "errors") == "", done.stderr[-2000:]
        box = json.loads(html.unescape(dom_value(dom, "layout-probe")))
        # The page's viewport: the window less what chromium keeps of it for a browser's own
        # bars (87 pixels of the 900, as a desktop browser's tabs and address bar take).
        assert box["width"] == width and height - 120 <= box["height"] <= height and box["scroll"] == [0, 0], box
        assert 0 <= box["left"] and box["right"] <= box["width"], box
        assert 0 <= box["top"] and box["bottom"] <= box["height"], box  # the last strip's bottom edge
        assert box["bottom"] - box["top"] >= 3 * 60, box  # three strips, none squeezed flat


def test_integer_observables_are_shown_as_integers(run_mfattn, tmp_path, view_module):
    """A count (n_clusters, and any observable whose values are all integers: here an energy
    rewritten as integers) reads as an integer at the cursor, not as 3.00000; a real value
    (min_inner) keeps its six significant digits."""
    out = run_mfattn("--n", 16, "--d", 3, "--beta", 2, "--horizon", 1, "--save-every", 0.25)
    with h5py.File(out, "r+") as f:
        energy = f["observables/energy/value"]
        energy[...] = np.arange(len(energy)) - 2.0
        clusters, min_inner = f["observables/n_clusters/value"][()], f["observables/min_inner/value"][()]
    assert not np.all(min_inner == np.round(min_inner))
    data = view_module.page_data(out)
    assert {name: data["observables"][name]["integer"] for name in data["observables"]} == \
        {"energy": True, "n_clusters": True, "min_inner": False}
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (tests/install_deps.sh installs it)")
    page = tmp_path / "run.html"
    assert view_cli(out, "--out", page).returncode == 0
    last = len(clusters) - 1
    dom = chromium("--dump-dom", f"file://{page}#frame={last}").stdout
    assert 'data-ready="1"' in dom and dom_value(dom, "errors") == ""
    assert dom_value(dom, "readout-n_clusters") == str(int(clusters[last]))
    assert dom_value(dom, "readout-energy") == str(last - 2)
    shown = dom_value(dom, "readout-min_inner")
    assert re.fullmatch(r"-?\d\.\d{5}(e[+-]\d+)?|-?0\.\d{6,}", shown) and float(shown) == pytest.approx(
        min_inner[last], rel=1e-5), shown


def test_the_gauge_page_shows_each_token_in_its_gauge_coordinates(run_mfattn, tmp_path, view_module):
    """--gauge embeds y_i = G(xi_i) x_i (computed here with scipy from the file's generators) to
    float32 precision, prefix stars in their own gauges: a RoPE run spread over the sphere
    meets at one point (up to sign) there, and the page says it shows gauge coordinates."""
    from scipy.linalg import expm
    path = run_mfattn("--n", 24, "--d", 3, "--beta", 4, "--geometry", "rope", "--horizon", 20, "--save-every", 5)
    page = tmp_path / "gauge.html"
    done = view_cli(path, "--out", page, "--gauge")
    assert done.returncode == 0, done.stderr
    data = view_module.read_page_data(page)
    x, times = file_positions(path)
    with h5py.File(path) as f:
        omega, xi = f["particles/tokens/gauge_generators"][()], f["particles/tokens/aux_position"][()]
    gauges = np.stack([expm(np.tensordot(xi[i], omega, axes=1)) for i in range(x.shape[1])])
    expected = np.einsum("iab,fib->fia", gauges, x)
    assert data["gauge"] and data["frames"] == len(times) == 5
    np.testing.assert_allclose(data["positions"], expected, rtol=0, atol=1e-7)  # float32
    y = data["positions"][-1].astype(float)
    assert np.abs(x[-1] @ x[-1].T).min() < 0.9  # the plain positions are spread
    assert np.abs(y @ y.T).min() > 1 - 1e-3  # the gauge coordinates meet (up to sign)
    assert data["title"].endswith(", gauge coordinates G(xi_i) x_i") and "gauge coordinates" in data["notes"][1]
    plain = view_module.read_page_data(view_module.view(path, tmp_path / "plain.html"))
    assert not plain["gauge"] and "gauge" not in plain["title"]
    np.testing.assert_allclose(plain["positions"], x, rtol=0, atol=1e-7)
    # The Python entry point's keyword, and the prefix's stars each in its own gauge.
    with_prefix = run_mfattn("--n", 12, "--d", 3, "--beta", 4, "--geometry", "rope", "--prefix", 2, "--horizon", 1,
                             "--save-every", 0.5, out="prefix.h5")
    written = view_module.view(with_prefix, tmp_path / "prefix.html", gauge=True)
    data = view_module.read_page_data(written)
    with h5py.File(with_prefix) as f:
        omega = f["particles/tokens/gauge_generators"][()]
        star, star_xi = f["particles/prefix/position"][()], f["particles/prefix/aux_position"][()]
    expected = np.stack([expm(np.tensordot(star_xi[p], omega, axes=1)) @ star[p] for p in range(len(star))])
    np.testing.assert_allclose(data["prefix"], expected, rtol=0, atol=1e-12)
    assert np.abs(np.asarray(data["prefix"]) - star).max() > 0.1  # not the plain positions
    if CHROMIUM is not None:
        dom = chromium("--dump-dom", f"file://{page}").stdout
        assert 'data-ready="1"' in dom and dom_value(dom, "errors") == ""
        assert dom_value(dom, "title").endswith("gauge coordinates G(xi_i) x_i")


def test_gauge_is_refused_for_a_run_without_a_gauge(run_mfattn, tmp_path, view_module):
    """As animate.py's --gauge: exit 2, one line naming --gauge and the file, no page."""
    plain = run_mfattn("--n", 8, "--d", 3, "--horizon", 0.2)
    done = view_cli(plain, "--out", tmp_path / "no.html", "--gauge")
    assert done.returncode == 2 and "--gauge:" in done.stderr and "has no gauge" in done.stderr, done.stderr
    assert str(plain) in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "no.html").exists() and not list(tmp_path.glob(".no*"))
    with pytest.raises(ValueError, match="--gauge: .* has no gauge"):
        view_module.view(plain, tmp_path / "no.html", gauge=True)
    assert not (tmp_path / "no.html").exists()
