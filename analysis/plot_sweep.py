#!/usr/bin/env python3
"""Phase diagram and outcome table of a sweep: a folder of mfattn runs.

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_sweep.py DIR [--out DIR2] [--skip-bad]

reads every *.h5 under DIR (recursively) and, when present, DIR/manifest.csv, and writes into
DIR2 (default DIR), printing each path, with NAME the name of DIR:

    NAME_phase_diagram.png  beta x t phase diagram: colour = fraction of pairs with
                            <x_i, x_j> > 1 - 1e-3, averaged over every run and replica with
                            the same beta (as in the reference code of arXiv:2312.10794,
                            Geshkovski et al.); only when the runs span several beta values.
    NAME_outcomes.md        one row per case (file, and replica when a file holds several):
    NAME_outcomes.csv       case, file, status, the parameters that differ between the runs,
                            final time, final cluster count, collapsed (final min_inner >=
                            1 - 1e-4), final min_inner, marginal spread (1 - largest
                            eigenvalue of the second moment) and, when some file stores it,
                            conditional spread.

Observables come from the files when stored, else are recomputed from the positions
(plotting_common). The manifest (a CSV written by a sweep driver) is optional; its columns are
found by name, case-insensitively: case id (case_id, case, id, name), file (file, path, out,
output; relative to DIR or absolute) and status; the other columns are parameters. Cases it
lists whose file is missing get a row with their manifest status and empty outcomes; files it
does not list get a row too. A file that is not an mfattn file is an error (exit 1) unless
--skip-bad, which reports it on stderr and gives it the status "unreadable".

From Python: ``plot_sweep(folder, out_dir=None, skip_bad=False) -> [Path, ...]``,
``collect(folder, skip_bad=False) -> Sweep`` (rows and columns of the table).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plotting_common import (COLLAPSE_DELTA, PAIR_DELTA, cli, final_value, find_h5, format_value,
                             load_runs, observable, pyplot, save_figure, varied_parameters)

MANIFEST_COLUMNS = {
    "case": ("case_id", "case id", "case", "id", "name"),
    "file": ("file", "path", "out", "output"),
    "status": ("status",),
}
OUTCOME_COLUMNS = ("t_final", "final_clusters", "collapsed", "final_min_inner", "marginal_spread")


@dataclass
class Sweep:
    """What a sweep folder holds: ``rows`` (dicts keyed by ``columns``) for the table and
    ``series`` (beta, times, clustered pair fraction) of every readable run and replica for
    the phase diagram."""

    folder: Path
    columns: list[str]
    rows: list[dict[str, Any]]
    series: list[tuple[float, np.ndarray, np.ndarray]]
    log_time: bool

    @property
    def name(self) -> str:
        """The folder's name as given ("." becomes the working folder's name; a symlinked
        folder keeps its link's name)."""
        return Path(os.path.abspath(self.folder)).name


def read_manifest(folder: Path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Rows of folder/manifest.csv (empty when absent) and the mapping role -> column name
    for the roles case, file and status that it has."""
    path = folder / "manifest.csv"
    if not path.is_file():
        return [], {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = [dict(row) for row in reader]
        header = reader.fieldnames or []
    lower = {name.strip().lower(): name for name in header}
    roles = {}
    for role, candidates in MANIFEST_COLUMNS.items():
        for candidate in candidates:
            if candidate in lower:
                roles[role] = lower[candidate]
                break
    if "file" not in roles:
        print(f"plot_sweep: {path} has no file column ({', '.join(MANIFEST_COLUMNS['file'])});"
              " its rows are listed without outcomes", file=sys.stderr)
    return rows, roles


def _match(value: str, folder: Path, files: list[Path]) -> Path | None:
    """The file of ``files`` that a manifest file entry names (relative to the folder or the
    working directory, absolute, or failing that the same relative path or base name)."""
    if not value:
        return None
    given = Path(value)
    by_resolved = {p.resolve(): p for p in files}
    for candidate in ((given,) if given.is_absolute() else (folder / given, given)):
        if candidate.resolve() in by_resolved:
            return by_resolved[candidate.resolve()]
    for p in files:
        if p.relative_to(folder).as_posix() == given.as_posix():
            return p
    same_name = [p for p in files if p.name == given.name]
    return same_name[0] if len(same_name) == 1 else None


def _outcomes(run) -> dict[str, Any]:
    min_inner = final_value(run, "min_inner")
    outcome = {
        "t_final": run.t_final,
        "final_clusters": final_value(run, "n_clusters"),
        "collapsed": bool(min_inner >= 1.0 - COLLAPSE_DELTA) if np.isfinite(min_inner) else None,
        "final_min_inner": min_inner,
        "marginal_spread": final_value(run, "marginal_spread"),
    }
    if "conditional_spread" in run.observables:
        outcome["conditional_spread"] = final_value(run, "conditional_spread")
    if np.isfinite(outcome["final_clusters"]):
        outcome["final_clusters"] = int(outcome["final_clusters"])
    return outcome


def collect(folder: str | Path, skip_bad: bool = False) -> Sweep:
    """Reads the sweep in ``folder`` (see the module docstring). ValueError when the folder
    is missing or holds neither .h5 files nor a manifest, or (without ``skip_bad``) when a
    file cannot be read."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder")
    files = find_h5(folder)
    manifest, roles = read_manifest(folder)
    if not files and not manifest:
        raise ValueError(f"{folder}: no .h5 files (and no manifest.csv) under it")

    # (file or None, manifest row or None) in manifest order, then the unlisted files.
    entries: list[tuple[Path | None, dict[str, str] | None]] = []
    listed: set[Path] = set()
    for row in manifest:
        path = _match(row.get(roles["file"]) or "", folder, files) if "file" in roles else None
        entries.append((path, row))
        if path is not None:
            listed.add(path)
    entries += [(p, None) for p in files if p not in listed]

    records = []  # (base columns, parameters, outcomes)
    series = []
    log_time = True
    for path, row in entries:
        case = (row or {}).get(roles.get("case", ""), "") or (path.stem if path else "")
        base = {"case": case,
                "file": path.relative_to(folder).as_posix() if path else
                (row or {}).get(roles.get("file", ""), "")}
        manifest_params = {k: v for k, v in (row or {}).items() if k not in roles.values()}
        if path is None:
            base["status"] = (row or {}).get(roles.get("status", ""), "") or "missing"
            records.append((base, manifest_params, {}))
            continue
        try:
            runs = load_runs(path)
        except (OSError, ValueError, KeyError) as error:
            if not skip_bad:
                raise ValueError(f"{error} (use --skip-bad to list it as unreadable)") from error
            print(f"plot_sweep: skipping {path}: {error}", file=sys.stderr)
            records.append((dict(base, status="unreadable"), manifest_params, {}))
            continue
        for run in runs:
            parameters = dict(manifest_params, **run.parameters)
            record = dict(base, status=run.status or (row or {}).get(roles.get("status", ""), ""))
            if run.replicas > 1:
                record["replica"] = run.replica
            records.append((record, parameters, _outcomes(run)))
            times, fraction = observable(run, "clustered_pair_fraction")
            series.append((float(run.param("beta", float("nan"))), times, fraction))
            log_time = log_time and float(run.param("save-log", 0) or 0) > 0

    varied = varied_parameters([params for _, params, outcome in records if outcome] or
                               [params for _, params, _ in records])
    extra = [c for c in ("conditional_spread",) if any(c in o for _, _, o in records)]
    replica = ["replica"] if any("replica" in base for base, _, _ in records) else []
    columns = ["case", "file", "status"] + replica + varied + list(OUTCOME_COLUMNS) + extra
    rows = []
    for base, params, outcome in records:
        merged = {**{k: params.get(k) for k in varied}, **base, **outcome}
        rows.append({c: merged.get(c) for c in columns})
    return Sweep(folder=folder, columns=columns, rows=rows, series=series,
                 log_time=log_time and bool(series))


def write_tables(sweep: Sweep, out_dir: Path) -> list[Path]:
    """NAME_outcomes.md (numbers with %g, min_inner with 10 digits) and NAME_outcomes.csv
    (full precision: repr of every float)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / f"{sweep.name}_outcomes.md"
    csv_path = out_dir / f"{sweep.name}_outcomes.csv"

    def md(column: str, value: Any) -> str:
        if column == "final_min_inner" and isinstance(value, float) and np.isfinite(value):
            return f"{value:.10g}"
        return format_value(value).replace("|", "\\|")

    def raw(value: Any) -> str:
        if isinstance(value, float):
            return "" if np.isnan(value) else repr(value)
        return format_value(value)

    lines = [f"# Sweep {sweep.name}: outcomes", "",
             f"collapsed: final min_inner >= 1 - {COLLAPSE_DELTA:g}; clusters: connected components "
             "of <x_i, x_j> > 1 - 1e-4; marginal spread: 1 - largest eigenvalue of (1/n) sum x x^T.", "",
             "| " + " | ".join(sweep.columns) + " |", "|" + "---|" * len(sweep.columns)]
    lines += ["| " + " | ".join(md(c, row[c]) for c in sweep.columns) + " |" for row in sweep.rows]
    md_path.write_text("\n".join(lines) + "\n")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(sweep.columns)
        writer.writerows([raw(row[c]) for c in sweep.columns] for row in sweep.rows)
    return [md_path, csv_path]


def _edges(centres: np.ndarray) -> np.ndarray:
    """Cell edges around sorted frame times (midpoints; the end cells mirror their
    neighbours)."""
    if centres.size == 1:
        return np.array([centres[0] - 0.5, centres[0] + 0.5])
    mid = (centres[1:] + centres[:-1]) / 2
    return np.r_[2 * centres[0] - mid[0], mid, 2 * centres[-1] - mid[-1]]


def phase_matrix(sweep: Sweep) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(betas [B], times [T], mean fraction [B, T], runs per beta [B]). Runs that share their
    frame times are averaged frame by frame; otherwise every series is interpolated onto the
    union of frame times up to the shortest run's final time."""
    series = [(b, t, f) for b, t, f in sweep.series if np.isfinite(b) and len(t)]
    if not series:
        raise ValueError(f"{sweep.folder}: no readable run with a beta")
    first = series[0][1]
    if all(len(t) == len(first) and np.allclose(t, first) for _, t, _ in series):
        grid = first
        values = [f for _, _, f in series]
    else:
        end = min(t[-1] for _, t, _ in series)
        grid = np.unique(np.concatenate([t[t <= end] for _, t, _ in series]))
        values = [np.interp(grid, t, f) for _, t, f in series]
    betas = np.unique([b for b, _, _ in series])
    matrix = np.empty((betas.size, grid.size))
    counts = np.zeros(betas.size, dtype=int)
    for row, beta in enumerate(betas):
        members = [v for (b, _, _), v in zip(series, values) if b == beta]
        matrix[row] = np.nanmean(members, axis=0)
        counts[row] = len(members)
    return betas, grid, matrix, counts


def phase_diagram(sweep: Sweep, path: Path) -> Path | None:
    """NAME_phase_diagram.png, or None (with a note on stdout) when the sweep has fewer than
    two beta values."""
    betas, times, matrix, counts = phase_matrix(sweep)
    if betas.size < 2:
        print(f"note: {sweep.folder}: one beta value only ({betas[0]:g}); no phase diagram")
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    if sweep.log_time:  # log-spaced frames (--save-log): t = 0 cannot sit on a log axis
        keep = times > 0
        times, matrix = times[keep], matrix[:, keep]
        ax.set_xscale("log")
        t_edges = np.exp(_edges(np.log(times)))
    else:
        t_edges = _edges(times)
        t_edges[0] = max(t_edges[0], times[0])  # the diagram starts at the first frame
    # One row of equal height per beta, as imshow in the reference code: sweeps often space
    # beta unevenly (0.5, 1, 4, 16), and cells sized by the gaps would hide the small ones.
    rows = np.arange(betas.size)
    mesh = ax.pcolormesh(t_edges, np.arange(betas.size + 1) - 0.5, matrix, cmap="viridis",
                         vmin=0.0, vmax=1.0, shading="flat")
    fig.colorbar(mesh, ax=ax, label=f"fraction of pairs with <x_i, x_j> > 1 - {PAIR_DELTA:g}")
    ax.set_xlabel("t")
    ax.set_ylabel("beta")
    labelled = rows[::max(1, -(-betas.size // 12))]
    ax.set_yticks(labelled)
    ax.set_yticklabels([f"{betas[r]:g}" for r in labelled])
    per_beta = f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()}-{counts.max()}"
    ax.set_title(f"{sweep.name}: clustered pair fraction, mean over {per_beta} run(s) per beta",
                 fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_sweep(folder: str | Path, out_dir: str | Path | None = None,
               skip_bad: bool = False) -> list[Path]:
    """Outcome tables and (several beta values) the phase diagram of the sweep in ``folder``
    into ``out_dir`` (default ``folder``); returns the files written."""
    sweep = collect(folder, skip_bad=skip_bad)
    out_dir = Path(out_dir) if out_dir is not None else Path(folder)
    written = write_tables(sweep, out_dir)
    if sweep.series:
        diagram = phase_diagram(sweep, out_dir / f"{sweep.name}_phase_diagram.png")
        if diagram is not None:
            written.insert(0, diagram)
    return written


@cli("plot_sweep.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="sweep folder (*.h5 under it, optional manifest.csv)")
    parser.add_argument("--out", type=Path,
                        help="folder for the figure and tables (default: the sweep folder)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="list unreadable .h5 files as 'unreadable' instead of failing")
    args = parser.parse_args(argv)
    for written in plot_sweep(args.folder, args.out, args.skip_bad):
        print(written)


if __name__ == "__main__":
    raise SystemExit(main())
