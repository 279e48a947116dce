"""Figures of one mfattn run (one replica of one H5MD file).

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_run.py FILE.h5 --out DIR [--replica R]
        [--no-trails] [--times T1,T2,...]

writes into DIR, and prints, with STEM the file stem (plus _r<R> when the file holds several
replicas):

    STEM_sphere.png          the tokens on the sphere with their trajectories: d = 2 the unit
                             circle plus the angle of every token against time; d = 3 a 3-D
                             sphere (wireframe, faint trajectories, final points); d > 3 the
                             trajectories and final state projected on the top eigenvectors
                             of the final second moment (1/n) sum x x^T (planes e1-e2, e1-e3).
                             Frozen prefix tokens, when the file has them, are stars; with
                             several prompts tokens and stars take their prompt's colour.
    STEM_energy_clusters.png energy and number of clusters against log time (shared axis), so
                             that metastable plateaus show as steps.
    STEM_gram.png            histogram of the final <x_i, x_j>, i < j.
    STEM_snapshots.png       with --times: the state at each of those times (the kept frame
                             nearest to it), one panel each.
    STEM_density.png         for more than 1000 tokens, whose trajectories and overlapping
                             points say nothing: the final tokens' density (d = 2 a histogram of
                             the angle, d = 3 over longitude and sin(latitude), d > 3 over the
                             e1-e2 projection); the state figure then has no trajectories.
    STEM_positions.png       only when the positions xi enter the model (geometry, auxiliary
                             factor, causal or window mask) and vary: every coordinate of the
                             final x against xi (RoPE's latitude circle, the wavy curves of
                             generalised RoPE).

Under the state figures a line says what the colours mean. Trajectories between frames follow
the sphere (arcs, not chords, where frames are sparse); --no-trails leaves them out (256 trails
cover the sphere and hide a RoPE latitude circle). With log-spaced frames (--save-log) the d = 2
angle panel has a log time axis.

Observables come from the file when stored and are otherwise recomputed from the positions
(mfattn.plotting). Only tokens with presence > 0 are drawn. A file written with
--save-positions ends has the first and last frames only: its sphere figure shows the final
state without trajectories (and, d = 2, without the angle panel). One written with
--save-positions none has no positions: only STEM_energy_clusters.png is drawn, and a note on
stderr says why. Exit status 2 with one line on stderr for a missing or foreign file or a
replica out of range (mfattn.cli).

From Python: ``plot_run(path, out_dir, replica=0) -> [Path, ...]``; the panel functions
(state_axes, energy_clusters_axes, ...) are reused by make_figures.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .animate import token_colours
from .cli import BadInput, script
from .plotting import (CLUSTER_DELTA, PAIR_DELTA, Run, final_value, load_run, observable, pair_values, pyplot,
                       save_figure, second_moment, time_axis, uses_positions)

MAX_DRAWN_FRAMES = 400  # trajectories are thinned to about this many frames (lines only)


def _prompts(run: Run) -> np.ndarray | None:
    """Prompt id of every active token, or None when the run has a single prompt."""
    prompts = run.labels.get("prompt_id")
    if prompts is None or np.unique(prompts[run.active]).size < 2:
        return None
    return np.asarray(prompts)[run.active]


def token_colors(run: Run) -> np.ndarray:
    """One colour per active token, by the rule the animation and the viewer page use
    (animate.token_colours): its prompt's (tab10) when the run has several prompts,
    otherwise viridis in token order (which is position order for index positions)."""
    return token_colours(run.labels, run.active)[0]


def colour_note(run: Run) -> str:
    """What the tokens' colours mean (written under the state figures)."""
    if _prompts(run) is not None:
        return "colour: prompt (tab10: blue, orange, green, ...)"
    return "colour: token index, first dark blue to last yellow (position order for index positions)"


def log_spaced(run: Run) -> bool:
    """Whether the run saved log-spaced frames (--save-log): its times go on log axes."""
    return float(run.param("save-log", 0) or 0) > 0


# Many tokens: trajectories and overlapping points say nothing; the state figure then draws the
# final points small and adds a density of them (STEM_density.png).
MANY_TOKENS = 1000


def along_sphere(x: np.ndarray, substeps: int = 8) -> np.ndarray:
    """Trajectories x [T, m, d] with `substeps` points between consecutive frames along the
    sphere (normalised linear interpolation), so that sparse frames draw arcs, not chords."""
    if len(x) < 2:
        return x
    s = np.linspace(0.0, 1.0, substeps, endpoint=False)[None, :, None, None]
    between = (1 - s) * x[:-1, None] + s * x[1:, None]  # [T-1, substeps, m, d]
    norms = np.linalg.norm(between, axis=-1, keepdims=True)
    between = np.divide(between, norms, out=between.copy(), where=norms > 0)
    between[:, 0] = x[:-1]  # the frames themselves, as stored
    return np.concatenate([between.reshape(-1, *x.shape[1:]), x[-1:]])


def prefix_style(run: Run) -> dict:
    """Scatter style of the frozen prefix tokens: large stars with a black edge, coloured by
    prompt when the run has several prompts, red otherwise."""
    color = "red"
    if _prompts(run) is not None and "prompt_id" in run.prefix:
        color = pyplot().get_cmap("tab10")(np.asarray(run.prefix["prompt_id"]) % 10)
    return dict(marker="*", s=130, c=color, edgecolors="black", linewidths=0.6, zorder=5,
                label="prefix")


def drawn_frames(run: Run) -> np.ndarray:
    """Indices of the frames used for lines: about MAX_DRAWN_FRAMES of them, the last frame
    always included (points are always the last frame itself)."""
    frames = run.positions.shape[0]
    step = max(1, int(np.ceil(frames / MAX_DRAWN_FRAMES)))
    return np.unique(np.r_[np.arange(0, frames, step), frames - 1])


def projection_basis(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (decreasing) and eigenvectors (columns) of the final second moment."""
    values, vectors = np.linalg.eigh(second_moment(run.final))
    return values[::-1], vectors[:, ::-1]


def _prefix_points(run: Run) -> np.ndarray | None:
    if run.prefix is None:
        return None
    return run.prefix["position"]


def draw_sphere(ax, run: Run, trajectories: bool = True) -> None:
    """d = 3: wireframe sphere, faint trajectories, final points, prefix stars (3-D ``ax``)."""
    from mpl_toolkits.mplot3d.art3d import Line3DCollection
    u, v = np.mgrid[0:2 * np.pi:30j, 0:np.pi:15j]
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v),
                      color="0.85", linewidth=0.3)
    colors = token_colors(run)
    many = run.final.shape[0] > MANY_TOKENS
    if trajectories and not many:
        x = along_sphere(run.x[drawn_frames(run)])
        ax.add_collection3d(Line3DCollection([x[:, i] for i in range(x.shape[1])],
                                             colors=colors, linewidths=0.6, alpha=0.3))
    ax.scatter(*run.final.T, s=2 if many else 12, c=colors, depthshade=False)
    prefix = _prefix_points(run)
    if prefix is not None:
        ax.scatter(*prefix[:, :3].T, depthshade=False, **prefix_style(run))
        ax.legend(loc="upper right", fontsize=7)
    ax.set_xlim(-1, 1), ax.set_ylim(-1, 1), ax.set_zlim(-1, 1)
    ax.set_box_aspect((1, 1, 1), zoom=1.3)  # an axis-free sphere otherwise leaves wide margins
    ax.set_axis_off()


def draw_plane(ax, run: Run, basis: np.ndarray | None = None, trajectories: bool = True) -> None:
    """Tokens in a plane: the coordinates (x1, x2) for d = 2 (basis None), or the projection
    on the two columns of ``basis`` for d > 3; the unit circle is the sphere's outline."""
    def project(y: np.ndarray) -> np.ndarray:
        return y[..., :2] if basis is None else y @ basis

    from matplotlib.collections import LineCollection
    angle = np.linspace(0, 2 * np.pi, 361)
    ax.plot(np.cos(angle), np.sin(angle), color="0.7", linewidth=0.8)
    colors = token_colors(run)
    many = run.final.shape[0] > MANY_TOKENS
    if trajectories and not many:
        frames = run.x[drawn_frames(run)]
        # On the circle itself (d = 2) the path between frames is an arc, not a chord.
        x = project(along_sphere(frames) if basis is None else frames)
        ax.add_collection(LineCollection([x[:, i] for i in range(x.shape[1])], colors=colors,
                                         linewidths=0.6, alpha=0.3))
    final = project(run.final)
    ax.scatter(final[:, 0], final[:, 1], s=2 if many else 14, c=colors, zorder=4)
    prefix = _prefix_points(run)
    if prefix is not None:
        p = project(prefix)
        ax.scatter(p[:, 0], p[:, 1], **prefix_style(run))
        ax.legend(loc="upper right", fontsize=7)
    ax.set_xlim(-1.08, 1.08), ax.set_ylim(-1.08, 1.08)
    ax.set_aspect("equal")


def draw_angles(ax, run: Run) -> None:
    """d = 2: the angle of every token against time, continuous in time, each token on the
    2 pi branch that puts its final angle within pi of the final mean direction (so a
    cluster that straddles +-pi is drawn as one); prefix tokens, which never move, as
    dotted horizontal lines in their star colour."""
    from matplotlib.collections import LineCollection
    keep = drawn_frames(run)
    x, t = run.x[keep], run.position_times[keep]
    mean = run.final.mean(axis=0)
    centre = np.arctan2(mean[1], mean[0]) if np.linalg.norm(mean) > 1e-12 else 0.0

    def branch(angle: np.ndarray, reference: np.ndarray) -> np.ndarray:
        return angle - 2 * np.pi * np.round((reference - centre) / (2 * np.pi))

    theta = np.unwrap(np.arctan2(x[..., 1], x[..., 0]), axis=0)
    theta = branch(theta, theta[-1])
    colors = token_colors(run)
    ax.add_collection(LineCollection([np.column_stack([t, theta[:, i]]) for i in range(theta.shape[1])],
                                     colors=colors, linewidths=0.8))
    ax.scatter(np.full(theta.shape[1], t[-1]), theta[-1], s=10, c=colors, zorder=4)
    prefix = _prefix_points(run)
    low, high = theta.min(), theta.max()
    if prefix is not None:
        angles = np.arctan2(prefix[:, 1], prefix[:, 0])
        angles = branch(angles, angles)
        color = prefix_style(run)["c"]
        for k, a in enumerate(angles):
            ax.axhline(a, color=color if isinstance(color, str) else color[k], linestyle=":",
                       linewidth=1.2)
        low, high = min(low, angles.min()), max(high, angles.max())
    if log_spaced(run) and (t > 0).sum() > 1:
        # Log-spaced frames: on a linear axis everything before the last decade is one pixel.
        ax.set_xscale("log")
        ax.set_xlim(t[t > 0][0], t[-1])
        ax.set_xlabel("t (log scale)")
    else:
        ax.set_xlim(t[0], t[-1] if t[-1] > t[0] else t[0] + 1)
        ax.set_xlabel("t")
    ax.set_ylim(low - 0.2, high + 0.2)
    ax.set_ylabel("angle (continuous in t)")


def state_axes(fig, spec, run: Run, trajectories: bool = True):
    """Adds one axes at ``spec`` (a subplot spec or a (rows, cols, index) tuple) showing the
    state of ``run``: circle (d = 2), sphere (d = 3) or the e1-e2 projection (d > 3)."""
    spec = spec if isinstance(spec, tuple) else (spec,)
    if run.d == 3:
        ax = fig.add_subplot(*spec, projection="3d")
        draw_sphere(ax, run, trajectories)
    else:
        ax = fig.add_subplot(*spec)
        if run.d == 2:
            draw_plane(ax, run, None, trajectories)
            ax.set_xlabel("x1"), ax.set_ylabel("x2")
        else:
            values, vectors = projection_basis(run)
            draw_plane(ax, run, vectors[:, :2], trajectories)
            ax.set_xlabel(f"e1 (eigenvalue {values[0]:.3f})")
            ax.set_ylabel(f"e2 (eigenvalue {values[1]:.3f})")
    return ax


def sphere_figure(run: Run, out_dir: Path, trails: bool = True) -> Path:
    """STEM_sphere.png (see the module docstring); trails=False draws the final state alone."""
    plt = pyplot()
    if not run.keeps_every_frame:
        # --save-positions ends: two frames make no trajectory; the final state only.
        fig = plt.figure(figsize=(5.5, 5.8))
        state_axes(fig, (1, 1, 1), run, trajectories=False)
    elif run.d == 3:
        fig = plt.figure(figsize=(5.5, 5.8))
        state_axes(fig, (1, 1, 1), run, trails)
    elif run.d == 2:
        fig = plt.figure(figsize=(10.5, 4.9))
        state_axes(fig, (1, 2, 1), run, trails)
        draw_angles(fig.add_subplot(1, 2, 2), run)
    else:
        fig = plt.figure(figsize=(10.5, 5.3))
        values, vectors = projection_basis(run)
        for slot, other in enumerate((1, 2)):
            ax = fig.add_subplot(1, 2, slot + 1)
            draw_plane(ax, run, vectors[:, [0, other]], trails)
            ax.set_xlabel(f"e1 (eigenvalue {values[0]:.3f})")
            ax.set_ylabel(f"e{other + 1} (eigenvalue {values[other]:.3f})")
    title = run.title()
    if run.d > 3:
        title += "\nprojection on the top eigenvectors of the final (1/n) sum x x^T"
    if not run.keeps_every_frame:
        title += f"\nfinal state (--save-positions {run.save_positions}: no trajectories)"
    elif run.final.shape[0] > MANY_TOKENS:
        title += f"\n{run.final.shape[0]} tokens: no trajectories (their density: {run.stem}_density.png)"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.text(0.5, 0.012, colour_note(run), ha="center", fontsize=7, color="0.3")
    return save_figure(fig, out_dir / f"{run.stem}_sphere.png")


def snapshots_figure(run: Run, out_dir: Path, times: list[float]) -> Path:
    """STEM_snapshots.png: the state at each requested time (the kept frame nearest to it),
    one panel each, no trajectories."""
    plt = pyplot()
    import dataclasses
    stored = np.asarray(run.position_times)
    columns = min(len(times), 4)
    rows = -(-len(times) // columns)
    fig = plt.figure(figsize=(3.8 * columns, 4.0 * rows + 0.4))
    for k, wanted in enumerate(times):
        frame = int(np.argmin(np.abs(stored - wanted)))
        at = dataclasses.replace(run, positions=run.positions[:frame + 1], position_times=stored[:frame + 1],
                                 times=run.times)
        ax = state_axes(fig, (rows, columns, k + 1), at, trajectories=False)
        ax.set_title(f"t = {stored[frame]:.4g}" + (f" (nearest to {wanted:g})" if stored[frame] != wanted else ""),
                     fontsize=8)
    fig.suptitle(run.title(), fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.text(0.5, 0.012, colour_note(run), ha="center", fontsize=7, color="0.3")
    return save_figure(fig, out_dir / f"{run.stem}_snapshots.png")


def density_figure(run: Run, out_dir: Path) -> Path:
    """STEM_density.png, for runs of many tokens: the final tokens' density: d = 2 a histogram
    of their angle, d = 3 a 2-D histogram over longitude and sin(latitude) (equal areas), d > 3
    over the e1-e2 projection."""
    plt = pyplot()
    x = run.final
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    if run.d == 2:
        ax.hist(np.arctan2(x[:, 1], x[:, 0]), bins=180, range=(-np.pi, np.pi), color="C0")
        ax.set_xlabel("angle of the final tokens")
        ax.set_ylabel("tokens")
    else:
        if run.d == 3:
            u, v = np.arctan2(x[:, 1], x[:, 0]), np.clip(x[:, 2], -1, 1)
            extent = ((-np.pi, np.pi), (-1, 1))
            ax.set_xlabel("longitude atan2(x2, x1)")
            ax.set_ylabel("sin(latitude) = x3")
        else:
            basis = projection_basis(run)[1][:, :2]
            u, v = (x @ basis).T
            extent = ((-1, 1), (-1, 1))
            ax.set_xlabel("e1"), ax.set_ylabel("e2")
        counts = ax.hist2d(u, v, bins=(120, 60), range=extent, cmap="magma", cmin=1)[3]
        fig.colorbar(counts, ax=ax, label="tokens per cell")
    ax.set_title(f"{run.title()}\ndensity of the final tokens", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_dir / f"{run.stem}_density.png")


def energy_clusters_axes(ax_energy, ax_clusters, run: Run, **style) -> None:
    """Draws the energy (line) and the cluster count (steps) of ``run`` against log time on
    two axes that share x; ``style`` (color, label, alpha, ...) goes to both lines."""
    # Imported states' frames are layers (docs/import.md): a linear axis, layer 0 included.
    linear = run.param("command") == "import"
    series = observable(run, "energy")
    if series is not None and np.isfinite(series[1]).any():
        t, e = series
        keep = time_axis(ax_energy, t, linear)
        ax_energy.plot(t[keep], e[keep], **style)
    else:
        ax_energy.text(0.5, 0.5, "no energy (undefined for beta = 0, or not in the file)",
                       transform=ax_energy.transAxes, ha="center", va="center", fontsize=8)
    t, k = observable(run, "n_clusters")
    keep = time_axis(ax_clusters, t, linear)
    ax_clusters.plot(t[keep], k[keep], drawstyle="steps-post", **style)


def energy_clusters_figure(run: Run, out_dir: Path) -> Path:
    """STEM_energy_clusters.png (see the module docstring)."""
    plt = pyplot()
    fig, (ax_e, ax_c) = plt.subplots(2, 1, sharex=True, figsize=(6.4, 5.6))
    energy_clusters_axes(ax_e, ax_c, run, color="C0")
    ax_e.set_ylabel("energy E")
    ax_c.set_ylabel(f"clusters (<x_i, x_j> > 1 - {CLUSTER_DELTA:g})")
    ax_c.set_xlabel("t (log scale)" if ax_c.get_xscale() == "log" else "t")
    clusters = observable(run, "n_clusters")[1]
    if np.nanmax(clusters) >= 10 * max(np.nanmin(clusters), 1):
        ax_c.set_yscale("log")  # n tokens down to a few clusters: plateaus stay readable
    else:
        ax_c.yaxis.get_major_locator().set_params(integer=True)
    for ax in (ax_e, ax_c):
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(run.title(), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out_dir / f"{run.stem}_energy_clusters.png")


def gram_figure(run: Run, out_dir: Path) -> Path:
    """STEM_gram.png: histogram of the final <x_i, x_j> over pairs i < j of active tokens."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    pairs = np.clip(pair_values(run.final), -1.0, 1.0)
    # One filled outline instead of 80 bar patches: the same picture, drawn much faster.
    ax.hist(pairs, bins=np.linspace(-1.0, 1.0, 81), histtype="stepfilled", color="C0",
            edgecolor="C0")
    ax.axvline(1.0 - PAIR_DELTA, color="C3", linestyle="--", linewidth=0.8,
               label=f"1 - {PAIR_DELTA:g} (clustered pair)")
    ax.set_yscale("log")
    ax.set_xlim(-1.02, 1.02)
    ax.set_xlabel("final <x_i, x_j>, i < j")
    ax.set_ylabel("pairs")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"{run.title()}\nfinal: {final_value(run, 'n_clusters'):g} clusters, clustered pair "
                 f"fraction {final_value(run, 'clustered_pair_fraction'):.3g}, "
                 f"min inner {final_value(run, 'min_inner'):.6g}", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_dir / f"{run.stem}_gram.png")


def positions_figure(run: Run, out_dir: Path) -> Path:
    """STEM_positions.png: each coordinate of the final x against the position xi (k = 1: a
    curve over xi; k >= 2: against xi_1, coloured by xi_2); prefix tokens as stars."""
    plt = pyplot()
    d = run.d
    xi = np.asarray(run.labels["aux_position"], dtype=float)
    xi = xi.reshape(xi.shape[0], -1)[run.active]
    x = run.final
    columns = min(d, 4)
    rows = -(-d // columns)
    fig, axes = plt.subplots(rows, columns, sharex=True, sharey=True, squeeze=False,
                             figsize=(3.0 * columns + 0.8, 2.5 * rows + 0.8), layout="constrained")
    prefix = run.prefix
    prefix_xi = None
    if prefix is not None and "aux_position" in prefix:
        prefix_xi = np.asarray(prefix["aux_position"], dtype=float).reshape(len(prefix["position"]), -1)
    order = np.argsort(xi[:, 0], kind="stable")
    for c, ax in enumerate(axes.flat):
        if c >= d:
            ax.set_visible(False)
            continue
        if xi.shape[1] == 1:
            ax.plot(xi[order, 0], x[order, c], color="0.6", linewidth=0.8)
            ax.scatter(xi[:, 0], x[:, c], s=8, c=token_colors(run), zorder=3)
        else:
            points = ax.scatter(xi[:, 0], x[:, c], s=8, c=xi[:, 1], cmap="plasma", zorder=3)
        if prefix_xi is not None:
            ax.scatter(prefix_xi[:, 0], prefix["position"][:, c], **prefix_style(run))
        ax.set_ylim(-1.08, 1.08)
        ax.set_title(f"x{c + 1}", fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("position xi" if xi.shape[1] == 1 else "position xi_1")
    if xi.shape[1] > 1:
        fig.colorbar(points, ax=axes, label="xi_2", shrink=0.8)
    fig.suptitle(f"{run.title()} (final frame)", fontsize=9)
    return save_figure(fig, out_dir / f"{run.stem}_positions.png")


def final_states_figure(runs: list[Run], path: str | Path, columns: int = 3,
                        titles: list[str] | None = None) -> Path:
    """One panel per run with its final state (no trajectories): the combined final-state
    figure of a set of cases (circle, sphere or e1-e2 projection by d), each titled with
    ``titles`` or else the run's own title line."""
    plt = pyplot()
    if not runs:
        raise ValueError("final_states_figure: no run to draw")
    columns = min(columns, len(runs))
    rows = -(-len(runs) // columns)
    fig = plt.figure(figsize=(3.6 * columns, 3.8 * rows))
    for k, run in enumerate(runs):
        if not run.has_positions:
            ax = fig.add_subplot(rows, columns, k + 1)
            ax.text(0.5, 0.5, f"no positions in the file\n(--save-positions {run.save_positions})",
                    ha="center", va="center", fontsize=8, transform=ax.transAxes)
            ax.set_axis_off()
        else:
            ax = state_axes(fig, (rows, columns, k + 1), run, trajectories=False)
        ax.set_title(titles[k] if titles else run.title().replace(": ", ":\n", 1), fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_run(path: str | Path, out_dir: str | Path, replica: int = 0, trails: bool = True,
             times: list[float] | None = None) -> list[Path]:
    """Every figure of one replica of ``path`` into ``out_dir``; returns the files written.
    trails=False leaves the trajectories out of the state figure; times adds the snapshots
    figure. FileNotFoundError / ValueError for a missing or foreign file or a bad replica."""
    run = load_run(path, replica)
    out_dir = Path(out_dir)
    if not run.has_positions:
        print(f"plot_run.py: note: {run.no_positions_note()}: drawing "
              f"{run.stem}_energy_clusters.png only", file=sys.stderr)
        return [energy_clusters_figure(run, out_dir)]
    written = [sphere_figure(run, out_dir, trails), energy_clusters_figure(run, out_dir),
               gram_figure(run, out_dir)]
    if uses_positions(run):
        written.append(positions_figure(run, out_dir))
    if run.final.shape[0] > MANY_TOKENS:
        written.append(density_figure(run, out_dir))
    if times:
        written.append(snapshots_figure(run, out_dir, times))
    return written


@script("plot_run.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="an mfattn .h5 file")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNG files")
    parser.add_argument("--replica", type=int, default=0, help="replica to draw (default 0)")
    parser.add_argument("--no-trails", action="store_true", help="the state figure without trajectories")
    parser.add_argument("--times", default=None,
                        help="T1,T2,...: also STEM_snapshots.png, the state at each (nearest kept frame)")
    args = parser.parse_args(argv)
    times = None
    if args.times:
        try:
            times = [float(t) for t in args.times.split(",")]
        except ValueError:
            raise BadInput(f"--times {args.times}: accepted: times separated by commas (e.g. 0,5,20)") from None
    for written in plot_run(args.file, args.out, args.replica, trails=not args.no_trails, times=times):
        print(written)


if __name__ == "__main__":
    raise SystemExit(main())
