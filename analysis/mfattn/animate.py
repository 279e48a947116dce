"""An animation of one mfattn run or density file: MP4 (matplotlib with Debian's ffmpeg) or
GIF (Pillow), both installed by the set-up scripts.

    MPLBACKEND=Agg /usr/bin/python3 analysis/animate.py FILE.h5 --out run.mp4|run.gif
        [--replica R] [--fps 20] [--frames 240] [--trail K] [--view ELEV,AZIM] [--poster LAST.png]
        [--gauge]

Particle runs (`mfattn run`), one replica:
- d = 2: the unit circle; d = 3: the sphere, seen from the direction of the final state's mean
  (or, where the tokens spread out so that the mean is short, of the final second moment's top
  eigenvector) tilted by 30 degrees so that the sphere's depth shows, or from --view ELEV,AZIM
  in degrees; d > 3: the projection on the top two
  eigenvectors e1, e2 of the second moment (1/N) sum x x^T over the tokens of every drawn frame
  (the final frame's alone is degenerate once the tokens collapse), with their share of the
  variance under the figure.
- Tokens (presence > 0) are coloured by token index, which is position order for index
  positions (viridis, from the first token to the last), or by prompt where the run has
  several (tab10); frozen prefix tokens are stars, as in plot_run.py's figures. The corner says
  the time, the energy and the number of clusters of the frame (from /observables).
- --frames N: at most N frames, evenly spaced over the file's frames, the first and the last
  always included (a 2001-frame run becomes N video frames); --trail K draws each token's path
  over the last K drawn frames; --poster LAST.png also writes the last frame as a still.

Density files (`mfattn meanfield`): the circle's density (its theta-marginal with labels) as a
polar curve 1 + rho(theta) / max rho; zonal densities as rho(theta) against the angle from e_1;
S^2 as the sphere's grid points coloured by the density (one colour scale over all frames).

Tokens whose position is not finite (NaN or inf: a file another program wrote, or a damaged
one) are left out of the frames they are in, and their trails of the frames around; the corner
says how many, and the line under the figure from which time. The title is the file's name as
it is: never read as mathtext ("$...$"), bytes that are not UTF-8 shown as U+FFFD.

The file is written under a temporary name beside --out and renamed once complete, so a failed
or interrupted animation leaves nothing. Exit 2 with one line on stderr for a missing or foreign
file, a run without positions (--save-positions none) or with no finite position in any frame,
a replica out of range, an output name that is neither .mp4 nor .gif, or a bad option value.

--gauge draws each token in its gauge's coordinates, y_i = G(xi_i) x_i with G(xi) = exp(sum_a xi_a
Omega_a) from the file's gauge_generators and aux_position (a --geometry run): where a RoPE run
collapses conditionally (each prompt on one orbit x_i = G(xi_i)^T u), the y_i collapse to +-u,
which the plain view shows as circles and curves.

From Python: ``animate(path, out, replica=0, fps=20, frames=240, trail=0, view=None, poster=None, gauge=False)
-> Path``; ``Animation(path, ...)`` draws frame k with ``draw(k)`` (tests read its artists back);
``mfattn.load(path).animate(out, ...)`` (a Trajectory's or Density's method) calls animate()
for the file it was read from.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from .cli import script
from .io import Density, _is_density, _open, load

DEFAULT_FRAMES = 240
DEFAULT_FPS = 20
# For matplotlib Text drawn from a file (its name, its parameters): the characters as they are,
# not mathtext ("$\frac{$.h5" would raise when drawn) nor TeX (under text.usetex).
PLAIN_TEXT = {"parse_math": False, "usetex": False}


class AnimationError(ValueError):
    """Bad input: one line for the user, exit 2."""


def file_title(path: str | os.PathLike) -> str:
    """The file's name without its suffix, to show: bytes that are not UTF-8 (which Python holds
    as surrogates, and neither a font nor a UTF-8 page can show) become U+FFFD."""
    return os.fsencode(Path(path).stem).decode("utf-8", "replace")


def shown_number(value) -> str:
    """A parameter's value in a title: a number as %g, anything else (a file written by
    another program may hold any text there) as its text."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


def model_title(trajectory, tokens: int, d: int) -> str:
    """What a title says of the model behind a file: "SA, n = 64, d = 3, beta = 4" for a run;
    states imported from another model have no kernel or beta (docs/import.md)."""
    p = trajectory.parameters
    beta = "" if p.get("command") == "import" else f", beta = {shown_number(p.get('beta', float('nan')))}"
    return f"{trajectory.model_words}, n = {tokens}, d = {d}{beta}"


def finite_tokens(path: Path, x: np.ndarray, times: np.ndarray) -> np.ndarray:
    """[frames, tokens]: whether each token's position x[frame, token] is finite (not NaN or
    inf: a file another program wrote, or a damaged one); AnimationError for a file with none."""
    finite = np.isfinite(x).all(axis=-1)
    if not finite.any():
        raise AnimationError(f"{path}: no finite position in any frame (non-finite from frame 0, t = {times[0]:g}): "
                             "nothing to draw")
    return finite


def non_finite_note(finite: np.ndarray, times: np.ndarray) -> str:
    """From when tokens are left out (finite_tokens's [frames, tokens]); "" where none is."""
    if finite.all():
        return ""
    first = int(np.flatnonzero(~finite.all(axis=1))[0])
    return (f"non-finite positions from t = {times[first]:.4g} (the file's frame {first}): those tokens are left "
            "out of their frames")


def frame_indices(count: int, limit: int) -> np.ndarray:
    """At most `limit` indices evenly spread over [0, count), the first and last included."""
    if count <= limit:
        return np.arange(count)
    return np.unique(np.round(np.linspace(0, count - 1, limit)).astype(np.int64))


def second_moment_basis(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (decreasing) and eigenvectors (columns) of (1/n) sum x x^T."""
    values, vectors = np.linalg.eigh(x.T @ x / max(len(x), 1))
    return values[::-1], vectors[:, ::-1]


def facing_view(final: np.ndarray) -> tuple[float, float]:
    """(elevation, azimuth) in degrees of a viewer facing the final tokens: their mean
    direction, or the second moment's top eigenvector (turned towards most tokens) where the
    mean is shorter than 0.2, tilted 30 degrees towards the view's equator."""
    mean = final.mean(axis=0)
    if np.linalg.norm(mean) >= 0.2:
        direction = mean / np.linalg.norm(mean)
    else:
        direction = second_moment_basis(final)[1][:, 0]
        if np.sum(final @ direction > 0) < len(final) / 2:
            direction = -direction
    elevation = float(np.degrees(np.arcsin(np.clip(direction[2], -1, 1))))
    # 30 degrees towards the equator of the view: the sphere's depth shows (a latitude circle
    # seen from its pole would be a flat ring), and the tokens stay in front.
    elevation += -30.0 if elevation > 0 else 30.0
    return elevation, float(np.degrees(np.arctan2(direction[1], direction[0])))


def token_colours(labels: dict, active: np.ndarray) -> tuple[np.ndarray, str]:
    """RGBA colours of the active tokens, and what they mean: their prompt's (tab10) where the
    run has several prompts, else viridis in token order (position order for index positions)."""
    from matplotlib import colormaps
    prompts = labels.get("prompt_id")
    prompts = None if prompts is None else np.asarray(prompts)[active]
    if prompts is not None and np.unique(prompts).size > 1:
        return colormaps["tab10"](prompts % 10), "colour: prompt"
    m = int(active.sum())
    return colormaps["viridis"](np.linspace(0.0, 1.0, max(m, 1)))[:m], \
        "colour: token index (first dark, last yellow)"


def load_file(path: Path, replica: int = 0):
    """The run (its one replica) or density file at `path`, with the checks of the module
    docstring: AnimationError for a missing or foreign file, a replica out of range, a density
    file with a replica other than 0, or a run without positions."""
    path = Path(path)
    if not path.is_file():
        raise AnimationError(f"{path}: no such file")
    try:
        with _open(path) as f:
            is_density = _is_density(f)
        if is_density and replica != 0:
            raise AnimationError(f"--replica {replica}: a density file has no replicas (accepted: 0)")
        loaded = load(path) if is_density else load(path, replica=replica)
    except (OSError, KeyError) as error:
        raise AnimationError(f"{path}: not an mfattn run or density file ({error})") from None
    except AnimationError:
        raise
    except ValueError as error:
        raise AnimationError(str(error).splitlines()[0]) from None
    if not is_density and np.asarray(loaded.positions).shape[0] == 0:
        raise AnimationError(f"{path}: the run has no positions (--save-positions {loaded.save_positions}): "
                             "nothing to draw")
    return loaded


def gauge_coordinates(path: Path, tr) -> np.ndarray:
    """The positions in each token's gauge coordinates, y_i = G(xi_i) x_i, G(xi) = exp(sum_a
    xi_a Omega_a) from /particles/tokens/gauge_generators [k, d, d] and aux_position [n, k]."""
    import h5py
    from scipy.linalg import expm
    with h5py.File(path, "r") as f:
        tokens = f["particles/tokens"]
        if "gauge_generators" not in tokens:
            raise AnimationError(f"--gauge: {path} has no gauge (gauge_generators): a run with --geometry has one")
        omega = np.asarray(tokens["gauge_generators"][()])
        xi = np.asarray(tokens["aux_position"][()])
    positions = np.asarray(tr.positions)
    gauges = np.stack([expm(np.tensordot(xi[i], omega, axes=1)) for i in range(positions.shape[-2])])
    return np.einsum("iab,...ib->...ia", gauges, positions)


class Animation:
    """The figure and artists of one animation; draw(k) shows drawn frame k."""

    def __init__(self, path: str | os.PathLike, replica: int = 0, frames: int = DEFAULT_FRAMES, trail: int = 0,
                 view: tuple[float, float] | None = None, gauge: bool = False):
        if frames < 2:
            raise AnimationError(f"--frames {frames}: must be an integer >= 2")
        if trail < 0:
            raise AnimationError(f"--trail {trail}: must be an integer >= 0")
        self.path = Path(path)
        loaded = load_file(self.path, replica)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        self.plt = plt
        self.trail = trail
        if isinstance(loaded, Density):
            if gauge:
                raise AnimationError(f"--gauge: {self.path} is a density file; the gauge view is of particle runs")
            self._density(loaded, frames)
        else:
            if gauge:
                loaded.positions = gauge_coordinates(self.path, loaded)
            self.gauge = gauge
            self._particles(loaded, frames, view)

    # --- particle runs ---------------------------------------------------------------------

    def _particles(self, tr, frames: int, view) -> None:
        # Imported states off the sphere are drawn as their directions (docs/import.md).
        positions = np.asarray(tr.directions)
        presence = np.asarray(tr.labels.get("presence", np.ones(positions.shape[1])))
        self.active = presence > 0
        self.times = np.asarray(tr.position_times)
        self.indices = frame_indices(len(self.times), frames)
        self.x = positions[:, self.active]
        self.d = self.x.shape[-1]
        # What can be drawn; a file with nothing is refused here, before a figure is made.
        self.finite = finite_tokens(self.path, self.x, self.times)
        with_finite = np.flatnonzero(self.finite.any(axis=1))
        self.energy = self._observable(tr, "energy")
        self.clusters = self._observable(tr, "n_clusters")
        m = int(self.active.sum())
        self.colors, colour_note = token_colours(tr.labels, self.active)
        prefix = tr.prefix.get("position") if tr.prefix else None
        # The last finite tokens (those of a run's last frame unless the file went non-finite).
        final = self.x[with_finite[-1]][self.finite[with_finite[-1]]]
        self.fig = self.plt.figure(figsize=(6.4, 6.4), dpi=100)
        title = f"{file_title(self.path)}: {model_title(tr, m, self.d)}"
        if getattr(self, "gauge", False):
            title += ", gauge coordinates G(xi_i) x_i"
        if self.d == 3:
            self.ax = self.fig.add_subplot(projection="3d")
            u, v = np.mgrid[0:2 * np.pi:30j, 0:np.pi:15j]
            self.ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85",
                                   linewidth=0.3)
            elevation, azimuth = view if view is not None else facing_view(final)
            self.ax.view_init(elev=elevation, azim=azimuth)
            self.ax.set_xlim(-1, 1), self.ax.set_ylim(-1, 1), self.ax.set_zlim(-1, 1)
            self.ax.set_box_aspect((1, 1, 1), zoom=1.25)
            self.ax.set_axis_off()
            self.project = lambda y: y
            shown = self.finite[0]
            self.points = self.ax.scatter(*self.x[0][shown].T, s=14, c=self.colors[shown], depthshade=False)
            if prefix is not None and len(prefix):
                self.ax.scatter(*np.asarray(prefix)[:, :3].T, marker="*", s=130, c="red", edgecolors="black",
                                depthshade=False)
            from mpl_toolkits.mplot3d.art3d import Line3DCollection
            self.trails = Line3DCollection([], colors=self.colors, linewidths=0.7, alpha=0.5)
            self.ax.add_collection3d(self.trails)
            view_note = f"view: elevation {elevation:.0f}, azimuth {azimuth:.0f} degrees"
        else:
            self.ax = self.fig.add_subplot()
            angle = np.linspace(0, 2 * np.pi, 361)
            self.ax.plot(np.cos(angle), np.sin(angle), color="0.7", linewidth=0.8)
            if self.d == 2:
                self.project = lambda y: y[..., :2]
                view_note = ""
            else:
                # The second moment pooled over the drawn frames: the final one alone is
                # degenerate once the tokens have collapsed. Their finite tokens (or, where
                # the drawn frames have none, every frame's).
                drawn = self.x[self.indices][self.finite[self.indices]]
                if len(drawn) == 0:
                    drawn = self.x[self.finite]
                values, vectors = second_moment_basis(drawn)
                basis = vectors[:, :2]
                self.project = lambda y: y @ basis
                share = values[:2].sum() / values.sum()
                view_note = (f"projection on e1, e2 of the second moment over the drawn frames "
                             f"({share:.0%} of its variance)")
                self.ax.set_xlabel(f"e1 (eigenvalue {values[0]:.3f})")
                self.ax.set_ylabel(f"e2 (eigenvalue {values[1]:.3f})")
            shown = self.finite[0]
            first = self.project(self.x[0][shown])
            self.points = self.ax.scatter(first[:, 0], first[:, 1], s=14, c=self.colors[shown], zorder=4)
            if prefix is not None and len(prefix):
                p = self.project(np.asarray(prefix))
                self.ax.scatter(p[:, 0], p[:, 1], marker="*", s=130, c="red", edgecolors="black", zorder=5)
            from matplotlib.collections import LineCollection
            self.trails = LineCollection([], colors=self.colors, linewidths=0.7, alpha=0.5)
            self.ax.add_collection(self.trails)
            self.ax.set_xlim(-1.08, 1.08), self.ax.set_ylim(-1.08, 1.08)
            self.ax.set_aspect("equal")
        self.fig.suptitle(title, fontsize=10, **PLAIN_TEXT)
        notes = "; ".join(n for n in (colour_note, view_note) if n)
        if prefix is not None and len(prefix):
            notes += "; stars: prefix tokens"
        self.fig.text(0.5, 0.015, notes, ha="center", fontsize=7, color="0.3", **PLAIN_TEXT)
        if not self.finite.all():
            self.fig.text(0.5, 0.04, non_finite_note(self.finite, self.times), ha="center", fontsize=7, color="#b00",
                          **PLAIN_TEXT)
        self.label = self.fig.text(0.02, 0.95, "", fontsize=9, family="monospace", va="top")
        self.draw = self._draw_particles

    def _observable(self, tr, name: str):
        if name not in tr.observables:
            return None
        values = np.asarray(tr.observables[name])
        if values.ndim > 1:
            values = values[:, 0]
        times = np.asarray(tr.observable_times.get(name, tr.times[:len(values)]))
        return times, values

    def _value_at(self, series, time: float) -> float | None:
        if series is None or len(series[0]) == 0:
            return None
        k = int(np.argmin(np.abs(series[0] - time)))
        return float(series[1][k])

    def drawn(self, k: int) -> np.ndarray:
        """The coordinates drawn at animation frame k: the file's frame indices[k], its finite
        tokens, projected."""
        frame = self.indices[k]
        return self.project(self.x[frame][self.finite[frame]])

    def _draw_particles(self, k: int):
        frame = self.indices[k]
        shown = self.finite[frame]
        y = self.drawn(k)
        if self.d == 3:
            self.points._offsets3d = (y[:, 0], y[:, 1], y[:, 2])
        else:
            self.points.set_offsets(y[:, :2])
        # The colours follow the tokens drawn (a frame may leave non-finite ones out).
        self.points.set_facecolor(self.colors[shown])
        if self.trail > 0:
            window = self.indices[max(0, k - self.trail):k + 1]
            # The trails of the tokens finite over the whole window: no NaN in matplotlib's
            # paths, and the colours follow the tokens kept.
            whole = self.finite[window].all(axis=0)
            path = self.project(self.x[window][:, whole])  # [K, tokens, dims]
            self.trails.set_segments([path[:, i] for i in range(path.shape[1])])
            self.trails.set_color(self.colors[whole])
        time = float(self.times[frame])
        parts = [f"t = {time:.4g}"]
        if not shown.all():
            parts.append(f"{int((~shown).sum())} of {len(shown)} tokens not finite (not drawn)")
        energy, clusters = self._value_at(self.energy, time), self._value_at(self.clusters, time)
        if energy is not None:
            parts.append(f"energy = {energy:.6g}")
        if clusters is not None:
            parts.append(f"clusters = {clusters:.0f}")
        self.label.set_text("\n".join(parts))
        return self.points, self.label

    # --- density files ---------------------------------------------------------------------

    def _density(self, density: Density, frames: int) -> None:
        self.times = np.asarray(density.times)
        self.indices = frame_indices(len(self.times), frames)
        self.fig = self.plt.figure(figsize=(6.4, 6.4), dpi=100)
        self.fig.suptitle(f"{file_title(self.path)}: density ({density.kind}), d = {density.d}, "
                          f"beta = {shown_number(density.parameters.get('beta', float('nan')))}", fontsize=10, **PLAIN_TEXT)
        self.label = self.fig.text(0.02, 0.95, "", fontsize=9, family="monospace", va="top")
        self.density = density
        if density.kind == "sphere":
            values = np.asarray(density.values)
            if density.labels is not None:
                values = values.mean(axis=1)
            theta, phi = np.meshgrid(density.theta, density.phi, indexing="ij")
            grid = np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], -1)
            self.ax = self.fig.add_subplot(projection="3d")
            self.sphere_values = values.reshape(len(values), -1)
            self.points = self.ax.scatter(*grid.reshape(-1, 3).T, c=self.sphere_values[0], s=10, cmap="magma",
                                          vmin=0.0, vmax=float(self.sphere_values.max()), depthshade=False)
            self.fig.colorbar(self.points, ax=self.ax, shrink=0.6, label="density")
            self.ax.set_box_aspect((1, 1, 1), zoom=1.25)
            self.ax.set_axis_off()
        else:
            self.curves = density.marginal()
            top = float(self.curves.max()) or 1.0
            if density.kind == "circle":
                self.ax = self.fig.add_subplot(projection="polar")
                angle = np.append(density.theta, density.theta[0])
                self.ax.plot(np.linspace(0, 2 * np.pi, 361), np.ones(361), color="0.7", linewidth=0.8)
                (self.line,) = self.ax.plot(angle, 1 + np.append(self.curves[0], self.curves[0][0]) / top)
                self.ax.set_ylim(0, 2.05)
                self.ax.set_yticks([])
                self.fig.text(0.5, 0.015, "radius 1 + rho(theta) / max rho (the unit circle in grey)", ha="center",
                              fontsize=7, color="0.3")
            else:
                self.ax = self.fig.add_subplot()
                (self.line,) = self.ax.plot(density.theta, self.curves[0])
                self.ax.set_ylim(0, 1.05 * top)
                self.ax.set_xlabel("angle from e_1")
                self.ax.set_ylabel("density")
        self.draw = self._draw_density

    def _draw_density(self, k: int):
        frame = self.indices[k]
        if self.density.kind == "sphere":
            self.points.set_array(self.sphere_values[frame])
            artist = self.points
        else:
            curve = self.curves[frame]
            top = float(self.curves.max()) or 1.0
            if self.density.kind == "circle":
                self.line.set_ydata(1 + np.append(curve, curve[0]) / top)
            else:
                self.line.set_ydata(curve)
            artist = self.line
        self.label.set_text(f"t = {float(self.times[frame]):.4g}")
        return artist, self.label

    def save_poster(self, out: str | os.PathLike) -> Path:
        """The last drawn frame as a still image (PNG), written under a temporary name and
        renamed."""
        out = Path(out)
        self.draw(len(self.indices) - 1)
        partial = out.with_name(f".{out.stem}.partial{out.suffix}")
        try:
            self.fig.savefig(partial, dpi=self.fig.dpi, format=out.suffix.lstrip(".") or "png")
            os.replace(partial, out)
        finally:
            if partial.exists():
                partial.unlink()
        return out

    def save(self, out: str | os.PathLike, fps: int = DEFAULT_FPS) -> Path:
        from matplotlib import animation
        out = Path(out)
        suffix = out.suffix.lower()
        if suffix == ".mp4":
            if not animation.writers.is_available("ffmpeg"):
                raise AnimationError(f"--out {out}: MP4 needs ffmpeg (tests/install_deps.sh installs it); "
                                     "or write a .gif")
            writer = animation.FFMpegWriter(fps=fps, codec="libx264", extra_args=["-pix_fmt", "yuv420p"])
        else:
            writer = animation.PillowWriter(fps=fps)
        partial = out.with_name(f".{out.stem}.partial{suffix}")
        try:
            movie = animation.FuncAnimation(self.fig, self.draw, frames=len(self.indices), blit=False)
            movie.save(str(partial), writer=writer, dpi=self.fig.dpi)
            os.replace(partial, out)
        finally:
            if partial.exists():
                partial.unlink()
            self.plt.close(self.fig)
        return out


def animate(path: str | os.PathLike, out: str | os.PathLike, replica: int = 0, fps: int = DEFAULT_FPS,
            frames: int = DEFAULT_FRAMES, trail: int = 0, view: tuple[float, float] | None = None,
            poster: str | os.PathLike | None = None, gauge: bool = False) -> Path:
    """Writes the animation of `path` (see the module docstring) to `out` (and its last frame
    to `poster`, a PNG, when given) and returns `out`."""
    out = Path(out)
    if out.suffix.lower() not in (".mp4", ".gif"):
        raise AnimationError(f"--out {out}: accepted: a name ending in .mp4 or .gif")
    if poster is not None and Path(poster).suffix.lower() != ".png":
        raise AnimationError(f"--poster {poster}: accepted: a name ending in .png")
    if fps < 1 or fps > 120:
        raise AnimationError(f"--fps {fps}: must be an integer in [1, 120]")
    movie = Animation(path, replica=replica, frames=frames, trail=trail, view=view, gauge=gauge)
    if poster is not None:
        movie.save_poster(poster)
    return movie.save(out, fps=fps)


def _view(text: str) -> tuple[float, float]:
    try:
        elevation, azimuth = (float(part) for part in text.split(","))
    except ValueError:
        raise AnimationError(f"--view {text}: accepted: ELEV,AZIM in degrees (e.g. 20,-60)") from None
    return elevation, azimuth


@script("animate.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="animate.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--out", required=True, help="run.mp4 or run.gif")
    parser.add_argument("--replica", type=int, default=0)
    parser.add_argument("--fps", type=int, default=DEFAULT_FPS)
    parser.add_argument("--frames", type=int, default=DEFAULT_FRAMES, help="at most this many video frames")
    parser.add_argument("--trail", type=int, default=0, help="each token's path over this many drawn frames")
    parser.add_argument("--view", default=None, help="ELEV,AZIM in degrees (d = 3)")
    parser.add_argument("--poster", default=None, help="also the last frame as a PNG")
    parser.add_argument("--gauge", action="store_true", help="each token in its gauge's coordinates, G(xi_i) x_i")
    args = parser.parse_args(argv)
    print(animate(args.file, args.out, replica=args.replica, fps=args.fps, frames=args.frames, trail=args.trail,
                  view=_view(args.view) if args.view else None, poster=args.poster, gauge=args.gauge))


if __name__ == "__main__":
    raise SystemExit(main())
