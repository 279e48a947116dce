"""Every figure of the experiments present under a data folder.

    MPLBACKEND=Agg /usr/bin/python3 analysis/make_figures.py [--data DIR] [--out DIR]

(defaults data/ and data/figures/). Looks for these subfolders of the data folder and draws,
printing every file written:

    collapse/      the collapse baseline (experiments/run_collapse.sh): collapse_min_inner.png,
                   drawn by collapse_summary.py's own figure function.
    seed003/       the seed 003 cases (experiments/seed003/*.ini): seed003_min_inner.png and
                   seed003_final.png (collapse_summary.py, as run_collapse.sh draws them),
                   seed003_final_states.png (every case at its largest n, any d: circle,
                   sphere or projection), and plot_run.py's figures of every file in
                   OUT/seed003/.
    metastability/ (any *.h5 under it) metastability_beta<b>.png for each beta: energy
                   staircase and cluster count against log time for every run and replica,
                   with the predicted plateau k* = argmax_k k^2 I_k(beta) (the fastest mode
                   of the uniform state on the circle, d = 2) as a dashed line;
                   metastability.png overlays all betas.
    sweeps/        each subfolder (or sweeps/ itself when it holds the .h5 files directly)
                   through plot_sweep.py into OUT/sweeps/.

A missing subfolder is skipped with a note on stdout; when none is present (or the data
folder does not exist) the script exits with status 2 and a message. A file that cannot be
read is an error (exit 2, one line on stderr: mfattn.cli).

From Python: ``make_figures(data_dir, out_dir) -> [Path, ...]`` and the per-experiment
functions collapse_figures, seed003_figures, metastability_figures, sweep_figures.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from . import collapse_summary
from .cli import BadInput, script
from .plot_run import energy_clusters_axes, final_states_figure, plot_run
from .plot_sweep import plot_sweep
from .plotting import CLUSTER_DELTA, find_h5, load_run, load_runs, predicted_clusters, pyplot, save_figure

EXPERIMENTS = ("collapse", "seed003", "metastability", "sweeps")


def collapse_figures(folder: Path, out_dir: Path) -> list[Path]:
    """collapse_min_inner.png of the baseline runs directly in ``folder``."""
    rows = collapse_summary.summarize_folder(folder)
    return [collapse_summary.min_inner_figure(rows, out_dir / "collapse_min_inner.png")]


def seed003_figures(folder: Path, out_dir: Path) -> list[Path]:
    """The seed 003 figures (see the module docstring) of the runs directly in ``folder``."""
    rows = collapse_summary.summarize_folder(folder)
    written = [collapse_summary.min_inner_figure(rows, out_dir / "seed003_min_inner.png", cases=True)]
    final = collapse_summary.final_state_figure(rows, out_dir / "seed003_final.png")
    if final is None:
        print(f"note: {folder} has no d = 3, n = 256 run with positions; seed003_final.png not drawn")
    else:
        written.append(final)
    largest = {}
    for row in rows:  # rows are sorted by case, kernel and n: the last of a case is its largest n
        largest[row["case"]] = row["file"]
    runs = [load_run(folder / name) for name in largest.values()]
    written.append(final_states_figure(runs, out_dir / "seed003_final_states.png"))
    for row in rows:
        written += plot_run(folder / row["file"], out_dir / "seed003")
    return written


def _beta_label(beta: float) -> str:
    return f"{beta:g}".replace(".", "p").replace("-", "m")


def metastability_figures(folder: Path, out_dir: Path) -> list[Path]:
    """metastability_beta<b>.png per beta and the overlay metastability.png."""
    plt = pyplot()
    files = find_h5(folder)
    if not files:
        raise ValueError(f"{folder}: no .h5 files under it")
    by_beta: dict[float, list] = {}
    for path in files:
        for run in load_runs(path):
            by_beta.setdefault(float(run.param("beta", float("nan"))), []).append(run)
    betas = sorted(by_beta)
    colors = {beta: plt.get_cmap("plasma")(x) for beta, x in zip(betas, np.linspace(0.0, 0.85, len(betas)))}

    def finish(fig, ax_e, ax_c, title: str):
        ax_e.set_ylabel("energy E")
        ax_c.set_ylabel(f"clusters (<x_i, x_j> > 1 - {CLUSTER_DELTA:g})")
        ax_c.set_xlabel("t (log scale)" if ax_c.get_xscale() == "log" else "t")
        ax_c.set_yscale("log")  # from n tokens down to a few clusters: every plateau readable
        for ax in (ax_e, ax_c):
            ax.grid(True, which="major", alpha=0.3)
        ax_c.legend(fontsize=7, loc="lower left")
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()

    written = []
    overview, (ov_e, ov_c) = plt.subplots(2, 1, sharex=True, figsize=(7.0, 6.0))
    for beta in betas:
        runs = by_beta[beta]
        k_star = predicted_clusters(beta)
        fig, (ax_e, ax_c) = plt.subplots(2, 1, sharex=True, figsize=(7.0, 6.0))
        for i, run in enumerate(runs):
            energy_clusters_axes(ax_e, ax_c, run, color=f"C{i % 10}", linewidth=1.0,
                                 label=run.stem if len(runs) <= 8 else None)
            energy_clusters_axes(ov_e, ov_c, run, color=colors[beta], linewidth=0.8, alpha=0.7,
                                 label=f"beta = {beta:g}" if i == 0 else None)
        ax_c.axhline(k_star, color="black", linestyle="--", linewidth=1.0,
                     label=f"k* = argmax k^2 I_k(beta) = {k_star}")
        ov_c.axhline(k_star, color=colors[beta], linestyle="--", linewidth=1.0)
        finish(fig, ax_e, ax_c, f"metastability, beta = {beta:g}: {len(runs)} run(s); "
               "dashed: predicted plateau k* (circle, d = 2)")
        written.append(save_figure(fig, out_dir / f"metastability_beta{_beta_label(beta)}.png"))
    finish(overview, ov_e, ov_c, "metastability: energy staircase and clusters; dashed: k* of each beta")
    written.append(save_figure(overview, out_dir / "metastability.png"))
    return written


def sweep_figures(folder: Path, out_dir: Path) -> list[Path]:
    """plot_sweep of every sweep in ``folder`` (its subfolders, or itself when it holds the
    .h5 files directly) into out_dir/sweeps."""
    # A sweep's by-parameters folder links to its own cases: not a sweep of its own.
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "by-parameters" and find_h5(p))
    loose = sorted(folder.glob("*.h5"))
    if subfolders and loose:
        print(f"note: {folder} has sweep subfolders; its own {len(loose)} .h5 file(s) are left out")
    sweeps = subfolders or ([folder] if loose else [])
    if not sweeps:
        raise ValueError(f"{folder}: no .h5 files under it")
    written = []
    for sweep in sweeps:
        written += plot_sweep(sweep, out_dir / "sweeps")
    return written


DRAW = {"collapse": collapse_figures, "seed003": seed003_figures,
        "metastability": metastability_figures, "sweeps": sweep_figures}
# collapse_summary reads the files directly in its folder; the others search recursively.
DIRECT = ("collapse", "seed003")
RUN_FILES = {name: (lambda folder: sorted(folder.glob("*.h5"))) if name in DIRECT else find_h5
             for name in EXPERIMENTS}


def make_figures(data_dir: str | Path = "data", out_dir: str | Path = "data/figures") -> list[Path]:
    """Draws every experiment present under ``data_dir`` into ``out_dir``, printing notes for
    the missing ones and every file written; returns the files. ValueError when none is
    present."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    if not data_dir.is_dir():
        raise BadInput(f"{data_dir}: no such data folder")
    written = []
    present = 0
    for name in EXPERIMENTS:
        folder = data_dir / name
        if not folder.is_dir():
            print(f"note: {folder} not present; skipped")
            continue
        if not RUN_FILES[name](folder):
            print(f"note: {folder} holds no .h5 file{' directly' if name in DIRECT else ''}; skipped")
            continue
        present += 1
        files = DRAW[name](folder, out_dir)
        for path in files:
            print(path)
        written += files
    if not present:
        raise BadInput(f"{data_dir}: no experiment data (looked for {', '.join(EXPERIMENTS)} "
                         "with .h5 files); run experiments/run_collapse.sh first")
    return written


@script("make_figures.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("data"), help="data folder (default data)")
    parser.add_argument("--out", type=Path, default=None, help="figure folder (default DATA/figures)")
    args = parser.parse_args(argv)
    make_figures(args.data, args.out if args.out is not None else args.data / "figures")


if __name__ == "__main__":
    raise SystemExit(main())
