"""Figures and outcome table of a sweep: a folder of mfattn runs.

    MPLBACKEND=Agg /usr/bin/python3 analysis/plot_sweep.py DIR [--out DIR2] [--skip-bad]

reads every *.h5 under DIR (recursively) and, when present, DIR/manifest.csv, and writes into
DIR2 (default DIR), printing each path, with NAME the name of DIR:

    NAME_phase_diagram.png  beta x t phase diagram: colour = fraction of pairs with
                            <x_i, x_j> > 1 - 1e-3, averaged over every run and replica with
                            the same beta (as in the reference code of arXiv:2312.10794,
                            Geshkovski et al.), in the project's one phase-diagram style
                            (mfattn.plotting.phase_map); only when the runs span several betas.
    NAME_outcomes.png       for each axis of the sweep (every varied parameter but the seed),
                            the final cluster count and 1 - final min_inner of every run and
                            replica against the axis value: numeric axes on a number line
                            (log when the values are evenly spaced in log), categorical axes
                            (kernel, geometry, ...) one slot per value; points coloured by the
                            values of the other axes, their mean joined by a line.
    NAME_final_states.png   a grid of final states, one panel per case (replica 0; the
                            circle, the sphere or the projection on the final second moment's
                            leading eigenvectors), titled with its axis values and cluster
                            count, in the order of the axis values (the first 48 cases).
    NAME_outcomes.md        one row per case (file, and replica when a file holds several):
    NAME_outcomes.csv       case, file, status, replica, the parameters that differ between
                            the runs, final time, final cluster count, collapsed (final
                            min_inner >= 1 - 1e-4), final min_inner, marginal spread (1 -
                            largest eigenvalue of the second moment) and, when some file
                            stores it, conditional spread. The Markdown table gives numbers
                            with 6 significant digits (min_inner with 10), the CSV in full.

Observables come from the files when stored, else are recomputed from the positions
(mfattn.plotting). The manifest (a CSV written by a sweep driver; `mfattn sweep` writes one)
is optional; its columns are found by name, case-insensitively: case id (case_id, case, id,
name), file (file, path, out, output; relative to DIR or absolute) and status. Its other
columns are parameters: the axes and derived values listed in manifest.json when
`mfattn sweep` wrote it, otherwise every column but index, final_time and the observables'
final values (those come from the files). Cases it lists whose file is missing get a row with
their manifest status and empty outcomes; files it does not list get a row too. A file that
is not an mfattn file is an error (exit 2, mfattn.cli) unless --skip-bad, which reports it on stderr and
gives it the status "unreadable".

From Python: ``plot_sweep(folder, out_dir=None, skip_bad=False) -> [Path, ...]``,
``collect(folder, skip_bad=False) -> Sweep`` (rows and columns of the table).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .cli import script
from .plotting import (COLLAPSE_DELTA, RECOMPUTE, evenly_spaced, final_value, find_h5, format_value, load_runs,
                       observable, phase_map, pyplot, save_figure, varied_parameters)

MANIFEST_COLUMNS = {
    "case": ("case_id", "case id", "case", "id", "name"),
    "file": ("file", "path", "out", "output"),
    "status": ("status",),
}
# Manifest columns that are results or bookkeeping, not parameters (mfattn sweep's manifest
# also carries every observable's final value: those come from the files).
MANIFEST_RESULTS = frozenset({"index", "final_time", "t_final"})
OUTCOME_COLUMNS = ("t_final", "final_clusters", "collapsed", "final_min_inner", "marginal_spread")
REPETITION_AXES = ("seed",)  # varied parameters that repeat an experiment rather than change it
MAX_STATE_PANELS = 48
MAX_GROUP_COLOURS = 8


@dataclass
class Case:
    """One readable run (one replica of one file): its parameters, outcomes and, for the
    final-state grid, the run with its final frame only (None for replicas after the first)."""

    parameters: dict[str, Any]
    outcomes: dict[str, Any]
    final_run: Any


@dataclass
class Sweep:
    """What a sweep folder holds: ``rows`` (dicts keyed by ``columns``) for the table,
    ``series`` (beta, times, clustered pair fraction) of every readable run and replica for
    the phase diagram, ``cases`` for the outcome and final-state figures and ``axes`` (the
    varied parameters but the seed)."""

    folder: Path
    columns: list[str]
    rows: list[dict[str, Any]]
    series: list[tuple[float, np.ndarray, np.ndarray]]
    log_time: bool
    cases: list[Case] = dataclasses.field(default_factory=list)
    axes: list[str] = dataclasses.field(default_factory=list)
    repetitions: list[str] = dataclasses.field(default_factory=list)  # varied REPETITION_AXES

    @property
    def name(self) -> str:
        """The folder's name as given ("." becomes the working folder's name; a symlinked
        folder keeps its link's name)."""
        return Path(os.path.abspath(self.folder)).name


def _number(text: str) -> Any:
    """A manifest cell as a number when it reads as one ("64" -> 64, "0.5" -> 0.5), else the
    text: the files' parameters are numbers, and a table of both must not mix them."""
    for kind in (int, float):
        try:
            return kind(text)
        except (TypeError, ValueError):
            pass
    return text


def read_manifest(folder: Path) -> tuple[list[dict[str, Any]], dict[str, str], set[str] | None]:
    """Rows of folder/manifest.csv (empty when absent), the mapping role -> column name for
    the roles case, file and status that it has, and the names of its parameter columns when
    manifest.json (mfattn sweep) lists them (its axes and derived values), else None."""
    path = folder / "manifest.csv"
    if not path.is_file():
        return [], {}, None
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
    parameters = None
    try:
        described = json.loads((folder / "manifest.json").read_text())
        parameters = set(described.get("axes", {})) | set(described.get("derived", {}))
    except (OSError, ValueError, AttributeError):
        pass
    return rows, roles, parameters


def _manifest_parameters(row: dict[str, str] | None, roles: dict[str, str],
                         names: set[str] | None, observables: set[str]) -> dict[str, Any]:
    """The parameter columns of a manifest row, as numbers where they read as numbers: the
    ``names`` manifest.json lists, or without it every column but the roles, MANIFEST_RESULTS
    and the ``observables`` (with their components, "moment_eigenvalues[0]")."""
    if not row:
        return {}
    kept = {}
    for key, value in row.items():
        if key in roles.values() or key is None:
            continue
        if names is not None:
            if key not in names:
                continue
        elif key.strip().lower() in MANIFEST_RESULTS or \
                key.split("[")[0].strip() in observables:
            continue
        kept[key] = _number(value)
    return kept


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


def _final_frame_only(run):
    """``run`` holding its last positions only (the final-state grid needs no more; a sweep
    of long runs would otherwise keep every trajectory in memory), or None without positions."""
    if not run.has_positions:
        return None
    return dataclasses.replace(run, positions=run.positions[-1:].copy(),
                               position_times=run.position_times[-1:].copy(), _cache={})


def collect(folder: str | Path, skip_bad: bool = False) -> Sweep:
    """Reads the sweep in ``folder`` (see the module docstring). ValueError when the folder
    is missing or holds neither .h5 files nor a manifest, or (without ``skip_bad``) when a
    file cannot be read."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder")
    files = find_h5(folder)
    manifest, roles, manifest_names = read_manifest(folder)
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

    records = []  # (base columns, manifest row, the file's parameters, outcomes)
    series = []
    observed = set(RECOMPUTE)  # observables named by some file (a foreign manifest may list them)
    log_time = True
    for path, row in entries:
        case = (row or {}).get(roles.get("case", ""), "") or (path.stem if path else "")
        base = {"case": case,
                "file": path.relative_to(folder).as_posix() if path else
                (row or {}).get(roles.get("file", ""), "")}
        if path is None:
            base["status"] = (row or {}).get(roles.get("status", ""), "") or "missing"
            records.append((base, row, {}, {}))
            continue
        try:
            runs = load_runs(path)
        except (OSError, ValueError, KeyError) as error:
            if not skip_bad:
                raise ValueError(f"{error} (use --skip-bad to list it as unreadable)") from error
            print(f"plot_sweep: skipping {path}: {error}", file=sys.stderr)
            records.append((dict(base, status="unreadable"), row, {}, {}))
            continue
        for run in runs:
            record = dict(base, status=run.status or (row or {}).get(roles.get("status", ""), ""))
            if run.replicas > 1:
                record["replica"] = run.replica
            observed |= set(run.observables)
            records.append((record, row, run.parameters, _outcomes(run),
                            _final_frame_only(run) if run.replica == 0 else None))
            times, fraction = observable(run, "clustered_pair_fraction")
            series.append((float(run.param("beta", float("nan"))), times, fraction))
            log_time = log_time and float(run.param("save-log", 0) or 0) > 0

    # The file's /parameters win over the manifest's copy of the same option.
    records = [(base, dict(_manifest_parameters(row, roles, manifest_names, observed), **params),
                outcome, *final) for base, row, params, outcome, *final in records]
    varied = varied_parameters([params for _, params, outcome, *_ in records if outcome] or
                               [params for _, params, *_ in records])
    extra = [c for c in ("conditional_spread",) if any(c in o for _, _, o, *_ in records)]
    replica = ["replica"] if any("replica" in base for base, *_ in records) else []
    columns = ["case", "file", "status"] + replica + varied + list(OUTCOME_COLUMNS) + extra
    rows = []
    cases = []
    for base, params, outcome, *final in records:
        merged = {**{k: params.get(k) for k in varied}, **base, **outcome}
        rows.append({c: merged.get(c) for c in columns})
        if outcome:
            cases.append(Case(params, outcome, final[0]))
    return Sweep(folder=folder, columns=columns, rows=rows, series=series,
                 log_time=log_time and bool(series), cases=cases,
                 axes=_independent_axes([name for name in varied if name not in REPETITION_AXES],
                                        cases),
                 repetitions=[name for name in REPETITION_AXES if name in varied])


def _independent_axes(names: list[str], cases: list[Case]) -> list[str]:
    """``names`` without those that only relabel an earlier one: a value that follows from
    another parameter's value and determines it in turn (a [derived] dt zipped with beta, or
    files that differ in beta and a dt computed from it) is the same axis drawn twice."""
    kept: list[str] = []
    for name in names:
        def mapping(a: str, b: str) -> bool:
            seen: dict[str, str] = {}
            for case in cases:
                key = format_value(case.parameters.get(a))
                value = format_value(case.parameters.get(b))
                if seen.setdefault(key, value) != value:
                    return False
            return True
        if not any(mapping(k, name) and mapping(name, k) for k in kept):
            kept.append(name)
    return kept


def write_tables(sweep: Sweep, out_dir: Path) -> list[Path]:
    """NAME_outcomes.md (numbers with 6 significant digits, min_inner with 10) and
    NAME_outcomes.csv (full precision: repr of every float)."""
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
    phase_map(ax, betas, times, matrix, log_time=sweep.log_time)
    per_beta = f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()}-{counts.max()}"
    ax.set_title(f"{sweep.name}: clustered pair fraction, mean over {per_beta} systems per beta "
                 "(runs x replicas)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def _is_numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
               for v in values)


def _axis_values(sweep: Sweep, axis: str) -> list[Any]:
    """The distinct values of ``axis`` among the readable cases: sorted numbers, or text in
    order of first appearance."""
    seen = []
    for case in sweep.cases:
        value = case.parameters.get(axis)
        if not any(format_value(value) == format_value(v) for v in seen):
            seen.append(value)
    return sorted(seen, key=float) if _is_numeric(seen) else seen


def _group_label(case: Case, others: list[str]) -> str:
    return ", ".join(f"{name}={format_value(case.parameters.get(name))}" for name in others)


def outcomes_figure(sweep: Sweep, path: Path) -> Path | None:
    """NAME_outcomes.png (see the module docstring), or None when the sweep has no axis (only
    seeds or nothing varied) or no readable case."""
    axes_names = [a for a in sweep.axes if len(_axis_values(sweep, a)) > 1][:6]
    if not axes_names or not sweep.cases:
        return None
    plt = pyplot()
    fig, grid = plt.subplots(len(axes_names), 2, figsize=(10.0, 0.6 + 3.2 * len(axes_names)), squeeze=False)
    floor = 1e-17  # collapsed to rounding: 1 - min_inner is 0 or a few ulps
    for (ax_clusters, ax_inner), axis in zip(grid, axes_names):
        values = _axis_values(sweep, axis)
        numeric = _is_numeric(values)
        # Log x for ratios (n = 64 128 256) and for positive values over a decade or more
        # that are not evenly spaced (beta = 0.1 0.2 0.4 ... 9), where a linear axis piles the
        # small values on one another.
        log_x = numeric and len(values) > 2 and values[0] > 0 and not evenly_spaced(values) \
            and (evenly_spaced(values, log=True) or values[-1] >= 10 * values[0])
        others = [a for a in sweep.axes if a != axis]
        groups = sorted({_group_label(c, others) for c in sweep.cases})
        coloured = 1 < len(groups) <= MAX_GROUP_COLOURS
        if not coloured:
            groups = [""]
        colours = pyplot().get_cmap("tab10")(np.arange(len(groups)) % 10)

        def position(value: Any, group: int) -> float:
            """x of a point: the value (numbers) or its slot (text), shifted per group so that
            the groups sit side by side (by a share of the slot, or of the log step)."""
            shift = (group - (len(groups) - 1) / 2) * (0.5 / max(len(groups), 1))
            if not numeric:
                return [format_value(v) for v in values].index(format_value(value)) + shift
            if log_x:
                step = np.log(values[1] / values[0])
                return float(value) * np.exp(shift * step)
            step = min(np.diff(values)) if len(values) > 1 else 1.0
            return float(value) + shift * step

        for g, (label, colour) in enumerate(zip(groups, colours)):
            members = [c for c in sweep.cases if not coloured or _group_label(c, others) == label]
            for ax, key in ((ax_clusters, "final_clusters"), (ax_inner, "final_min_inner")):
                xs, ys = [], []
                for c in members:
                    y = c.outcomes.get(key)
                    if y is None or not np.isfinite(y):
                        continue
                    xs.append(position(c.parameters.get(axis), g))
                    ys.append(max(1.0 - y, floor) if key == "final_min_inner" else y)
                ax.scatter(xs, ys, s=16, color=colour, alpha=0.7, label=label or None)
                means = []
                for v in values:
                    here = [y for x, y in zip(xs, ys) if np.isclose(x, position(v, g))]
                    if here:
                        means.append((position(v, g), np.exp(np.mean(np.log(here))) if
                                      key == "final_min_inner" else np.mean(here)))
                if means:
                    mx, my = zip(*means)
                    ax.plot(mx, my, color=colour, linewidth=1.0, marker="_", markersize=14)
        for ax in (ax_clusters, ax_inner):
            ax.set_xlabel(axis)
            if numeric:
                if log_x:
                    ax.set_xscale("log")
                # Ticks at the values when they are few and short (n = 64 128 256, beta = 0.5
                # 1 4); otherwise the axis's own round numbers (linspace(0.1, 9, 10) would
                # label 1.08889).
                if len(values) <= 12 and all(len(f"{v:g}") <= 4 for v in values):
                    ax.set_xticks([float(v) for v in values])
                    ax.set_xticklabels([f"{v:g}" for v in values])
                    ax.minorticks_off()
            else:
                ax.set_xticks(range(len(values)))
                ax.set_xticklabels([format_value(v) for v in values])
                ax.set_xlim(-0.6, len(values) - 0.4)
            ax.grid(alpha=0.3)
        ax_clusters.set_ylabel("final clusters")
        ax_clusters.yaxis.get_major_locator().set_params(integer=True)
        ax_inner.set_yscale("log")
        ax_inner.axhline(COLLAPSE_DELTA, color="0.4", linestyle="--", linewidth=0.8)
        ax_inner.set_ylabel("1 - final min_inner\n(below the dashed line: collapsed)")
        if coloured:
            ax_clusters.legend(fontsize=7, title=", ".join(others), title_fontsize=7)
    fig.suptitle(f"{sweep.name}: final outcomes, one point per run and replica"
                 + (f" ({', '.join(sweep.repetitions)} pooled)" if sweep.repetitions else "")
                 + "; lines join the means (geometric for 1 - min_inner)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def final_states_grid(sweep: Sweep, path: Path) -> Path | None:
    """NAME_final_states.png (see the module docstring), or None when no case has positions."""
    from .plot_run import final_states_figure
    drawn = [c for c in sweep.cases if c.final_run is not None]
    if not drawn:
        return None
    order = sweep.axes + sweep.repetitions
    ranks = {name: [format_value(v) for v in _axis_values(sweep, name)] for name in order}
    drawn.sort(key=lambda c: [ranks[name].index(format_value(c.parameters.get(name)))
                              for name in order])
    if len(drawn) > MAX_STATE_PANELS:
        print(f"note: {sweep.folder}: final states of the first {MAX_STATE_PANELS} of "
              f"{len(drawn)} cases")
        drawn = drawn[:MAX_STATE_PANELS]
    # A row per value of the leading axes: the trailing axes' values across, up to 6 columns.
    columns = 1
    for name in reversed(order):
        if columns * len(ranks[name]) > 6:
            break
        columns *= len(ranks[name])
    if columns < 2:
        columns = min(4, len(drawn))
    titles = []
    for c in drawn:
        values = " ".join(f"{name}={format_value(c.parameters.get(name))}" for name in order)
        clusters = c.outcomes.get("final_clusters")
        titles.append(f"{values}\nt={c.final_run.t_final:g}: "
                      f"{format_value(clusters)} cluster{'s' if clusters != 1 else ''}")
    return final_states_figure([c.final_run for c in drawn], path, columns=columns, titles=titles)


def plot_sweep(folder: str | Path, out_dir: str | Path | None = None,
               skip_bad: bool = False) -> list[Path]:
    """Figures and outcome tables of the sweep in ``folder`` into ``out_dir`` (default
    ``folder``); returns the files written."""
    sweep = collect(folder, skip_bad=skip_bad)
    out_dir = Path(out_dir) if out_dir is not None else Path(folder)
    figures = []
    if sweep.series:
        figures.append(phase_diagram(sweep, out_dir / f"{sweep.name}_phase_diagram.png"))
    figures.append(outcomes_figure(sweep, out_dir / f"{sweep.name}_outcomes.png"))
    figures.append(final_states_grid(sweep, out_dir / f"{sweep.name}_final_states.png"))
    return [f for f in figures if f is not None] + write_tables(sweep, out_dir)


@script("plot_sweep.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="sweep folder (*.h5 under it, optional manifest.csv)")
    parser.add_argument("--out", type=Path,
                        help="folder for the figures and tables (default: the sweep folder)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="list unreadable .h5 files as 'unreadable' instead of failing")
    args = parser.parse_args(argv)
    for written in plot_sweep(args.folder, args.out, args.skip_bad):
        print(written)


if __name__ == "__main__":
    raise SystemExit(main())
