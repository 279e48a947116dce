"""A trajectory viewer in one self-contained HTML file: no server, no network, no library (the
data and a small script of its own inside the page), to copy from a cluster and open in any
browser.

    /usr/bin/python3 analysis/view.py RUN.h5 --out run.html [--replica R] [--max-mb 6] [--gauge]

The page shows one replica of a particle run:
- d = 3: the sphere, turned with the mouse (drag), its far side dimmed; d = 2: the circle;
  d > 3: the projection on the top two eigenvectors of the second moment pooled over the frames
  in the page, with their share of the variance (analysis/animate.py's projection);
- a time slider and a play button; the URL's #frame=K opens frame K;
- tokens coloured by index (position order for index positions) or by prompt, prefix tokens
  as stars;
- the observables energy, n_clusters and min_inner against t beside it (or under it, in a window
  narrower than about 1000 pixels), with a cursor at the current time and their values there
  (#readout-NAME): counts (an observable whose values are all integers, as n_clusters's are) as
  integers, real values to six significant digits.
The frames are thinned (evenly, the first and the last kept) so that the positions (float32 in
base64) stay under --max-mb megabytes; the page says how many of the file's frames it holds. The page
names its token count (#tokens), the current time (#time) and the cursor's time (#cursor-time),
and records script errors in #errors; body[data-ready="1"] once it has drawn.

--gauge shows each token in its gauge's coordinates, y_i = G(xi_i) x_i with G(xi) = exp(sum_a
xi_a Omega_a) from the file's gauge_generators and aux_position (a --geometry run;
analysis/animate.py's gauge_coordinates), prefix tokens in theirs: where a RoPE run collapses
conditionally (each prompt on one orbit x_i = G(xi_i)^T u), the tokens meet at +-u, which the
plain page shows as circles and curves. The title says "gauge coordinates"; a run without a
gauge is refused.

Nothing from the file becomes markup: the title (the file's name and /parameters values) is
HTML-escaped in the page's <title> and heading, the data is JSON with <, > and & written as \\u
escapes (so neither "</script>" nor "<!--" can end or stall its script element), each template
placeholder is filled exactly once (a name holding "@DATA@" stays text), and the page's script
sets what it shows from the data through textContent.

Non-finite positions (NaN or inf) stay so in the page, whose canvas leaves those tokens out, and
a note says from which time (the projection for d > 3 is of the finite ones).

The HTML is written under a temporary name and renamed when complete. Exit 2 with one line on
stderr for a missing or foreign file, a density file, a run without positions or with no finite
one, a replica out of range, an output name that does not end in .html, a bad --max-mb, or
--gauge for a run without a gauge.

From Python: ``view(path, out, replica=0, max_mb=6.0, gauge=False) -> Path`` and
``page_data(path, ...)``.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import math
import os
import re
from pathlib import Path

import numpy as np

from .animate import (AnimationError, file_title, finite_tokens, frame_indices, gauge_coordinates, load_file, model_title,
                      non_finite_note, second_moment_basis, token_colours)
from .cli import script

OBSERVABLES = ("energy", "n_clusters", "min_inner")
PAGE = Path(__file__).with_name("view_page.html")
PLACEHOLDER = re.compile(r"@(TITLE|DATA)@")
DATA_ELEMENT = '<script id="mfattn-data" type="application/json">'


def _float32(values: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii")


def _colors(loaded, active: np.ndarray) -> tuple[list[str], str]:
    """animate.py's token colours as hex strings for the page."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.colors import to_hex
    colours, note = token_colours(loaded.labels, active)
    return [to_hex(c) for c in colours], note


def _prefix_gauge_coordinates(path: Path, prefix: dict) -> np.ndarray:
    """The prefix tokens in their gauges' coordinates, G(xi_p) x_p (gauge_coordinates's for the
    tokens), from the file's gauge_generators and the prefix's aux_position."""
    import h5py
    from scipy.linalg import expm
    with h5py.File(path, "r") as f:
        omega = np.asarray(f["particles/tokens/gauge_generators"][()])
    if "aux_position" not in prefix:
        raise AnimationError(f"--gauge: {path}: its prefix tokens have no aux_position (their gauge)")
    x = np.asarray(prefix["position"], dtype=float)
    xi = np.asarray(prefix["aux_position"], dtype=float).reshape(len(x), -1)
    return np.stack([expm(np.tensordot(xi[p], omega, axes=1)) @ x[p] for p in range(len(x))])


def page_data(path: str | os.PathLike, replica: int = 0, max_mb: float = 6.0, gauge: bool = False) -> dict:
    """What the page embeds (and tests read back): frames, times, dims, positions (base64
    float32, [frames, tokens, dims]; with `gauge`, in the tokens' gauge coordinates), colours,
    observables (each with "integer": whether its values are all integers), prefix, notes."""
    if not (max_mb > 0 and np.isfinite(max_mb)):
        raise AnimationError(f"--max-mb {max_mb}: must be a number > 0")
    path = Path(path)
    loaded = load_file(path, replica)
    if not hasattr(loaded, "positions"):
        raise AnimationError(f"{path}: a density file; the viewer shows particle runs (analysis/animate.py "
                             "animates densities)")
    if gauge:
        # animate.py's refusal (exit 2, one line) for a run without a gauge.
        loaded.positions = gauge_coordinates(path, loaded)
    # Imported states off the sphere are drawn as their directions (docs/import.md).
    positions = np.asarray(loaded.directions)
    active = np.asarray(loaded.labels.get("presence", np.ones(positions.shape[1]))) > 0
    x = positions[:, active]
    d, m = x.shape[-1], x.shape[1]
    # Non-finite positions stay NaN in the page, where the canvas leaves them out.
    finite = finite_tokens(path, x, np.asarray(loaded.position_times))
    dims = 3 if d == 3 else 2
    frames_total = x.shape[0]
    # float32 in base64: 4 bytes a number, times 4/3.
    limit = max(2, int(max_mb * 1e6 * 3 / 4 // (4 * m * dims)))
    kept = frame_indices(frames_total, limit)
    notes = []
    if len(kept) < frames_total:
        notes.append(f"showing {len(kept)} of the file's {frames_total} frames (thinned evenly to keep the page "
                     f"under {max_mb:g} MB)")
    if d == 2:
        projected = x[kept][..., :2]
    elif d == 3:
        projected = x[kept]
    else:
        pooled = x[kept][finite[kept]]
        values, vectors = second_moment_basis(pooled if len(pooled) else x[finite])
        projected = x[kept] @ vectors[:, :2]
        notes.append(f"projection on e1, e2 of the second moment over the frames shown "
                     f"({values[:2].sum() / values.sum():.0%} of its variance)")
    if not finite.all():
        notes.append(non_finite_note(finite, np.asarray(loaded.position_times)))
    colors, colour_note = _colors(loaded, active)
    notes.insert(0, colour_note)
    prefix = loaded.prefix.get("position") if loaded.prefix else None
    if gauge and prefix is not None and len(prefix):
        # The stars in the same coordinates as the tokens, each in its own gauge.
        prefix = _prefix_gauge_coordinates(path, loaded.prefix)
    if gauge:
        notes.append("gauge coordinates G(xi_i) x_i, where a RoPE run's conditional collapse is one point "
                     "(up to sign)")
    prefix_points = []
    if prefix is not None and len(prefix):
        prefix = np.asarray(prefix)
        prefix_points = (prefix if d == 3 else prefix[:, :2] if d == 2 else prefix @ vectors[:, :2]).tolist()
        notes.append("stars: prefix tokens")
    observables = {}
    for name in OBSERVABLES:
        if name in loaded.observables:
            values = np.asarray(loaded.observables[name], dtype=float)
            if values.ndim > 1:
                values = values[:, 0]
            times = np.asarray(loaded.observable_times.get(name, loaded.times[:len(values)]), dtype=float)
            finite = np.isfinite(values)
            values = values[finite]
            # A count (n_clusters, or any observable whose values are all integers) is shown as
            # an integer, not as 3.00000.
            integer = bool(len(values)) and bool(np.all(values == np.round(values)))
            observables[name] = {"t": times[finite].tolist(), "v": values.tolist(), "integer": integer}
    title = (f"{file_title(path)}: {model_title(loaded, m, d)}"
             + (f", replica {replica}" if loaded.replicas > 1 else "")
             + (", gauge coordinates G(xi_i) x_i" if gauge else ""))
    return {"title": title, "d": d, "dims": dims, "tokens": m, "frames": len(kept), "file_frames": frames_total,
            "frame_indices": kept.tolist(), "times": np.asarray(loaded.position_times)[kept].tolist(),
            "positions": _float32(projected), "colors": colors, "prefix": prefix_points,
            "observables": observables, "notes": notes, "gauge": bool(gauge)}


def _finite_or_null(value):
    """`value` with every non-finite float (in nested dicts and lists) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(item) for item in value]
    return value


def script_json(data: dict) -> str:
    """`data` as JSON to sit inside a <script> element: <, > and & occur only inside its strings
    (file names, parameters), and there as \\u003c, \\u003e and \\u0026, which JSON reads back
    as the characters, so no "</script>" (the element's end) or "<!--" (after which a "<script>"
    keeps the element open past its end) can be in it."""
    # JSON has no NaN or infinity (the browser's JSON.parse refuses the page): a non-finite
    # number (a frame time another program wrote) is written as null.
    text = json.dumps(_finite_or_null(data), separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def view(path: str | os.PathLike, out: str | os.PathLike, replica: int = 0, max_mb: float = 6.0,
         gauge: bool = False) -> Path:
    """Writes the viewer page of `path` to `out` (see the module docstring; with `gauge`, in the
    tokens' gauge coordinates) and returns it."""
    out = Path(out)
    if out.suffix.lower() != ".html":
        raise AnimationError(f"--out {out}: accepted: a name ending in .html")
    data = page_data(path, replica, max_mb, gauge=gauge)
    fills = {"TITLE": html.escape(data["title"]), "DATA": script_json(data)}
    # One pass over the template: a placeholder inside a fill (a file named "@DATA@<img ...>.h5")
    # is the file's text, not the page's, and is left as it is.
    text = PLACEHOLDER.sub(lambda placeholder: fills[placeholder.group(1)], PAGE.read_text(encoding="utf-8"))
    partial = out.with_name(f".{out.stem}.partial.html")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, out)
    finally:
        if partial.exists():
            partial.unlink()
    return out


def read_page_data(page: str | os.PathLike) -> dict:
    """The data a page embeds, with positions decoded to float32 [frames, tokens, dims]."""
    text = Path(page).read_text(encoding="utf-8")
    start = text.index(DATA_ELEMENT) + len(DATA_ELEMENT)
    # Pages before the \u escapes wrote "</" as "<\/"; json.loads reads the \u escapes itself.
    data = json.loads(text[start:text.index("</script>", start)].replace("<\\/", "</"))
    data["positions"] = np.frombuffer(base64.b64decode(data["positions"]), dtype="<f4").reshape(
        data["frames"], data["tokens"], data["dims"])
    return data


@script("view.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="view.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--out", required=True, help="run.html")
    parser.add_argument("--replica", type=int, default=0)
    parser.add_argument("--max-mb", type=float, default=6.0, help="the positions' share of the page, in MB")
    parser.add_argument("--gauge", action="store_true", help="each token in its gauge's coordinates, G(xi_i) x_i")
    args = parser.parse_args(argv)
    print(view(args.file, args.out, replica=args.replica, max_mb=args.max_mb, gauge=args.gauge))


if __name__ == "__main__":
    raise SystemExit(main())
