"""Inputs of a layer run and every HDF5 reader under hostile conditions (docs/failure-model.md,
"Inputs"): layer and regeneration times below what frames can resolve, HDF5 files that reach
outside themselves (external links to a FIFO, virtual datasets with missing sources, external
storage), fixed-length string attributes, the options that were taken silently, and a run at a
large d (its boundary attribute and the cost of its frames)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import bits

from mfattn import io as mfattn_io  # noqa: E402  (conftest puts the package on sys.path)

D = 3


def cli(binary: Path, *args, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def refused(done: subprocess.CompletedProcess, *said: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    for words in said:
        assert words in done.stderr, done.stderr


def weights_file(path: Path, layers: int | None = None, mlp: bool = False, activation=None) -> Path:
    """A layer of one head (r = d = 3), with a leading layer axis when `layers` is given, and
    a feed-forward term of width 4 with `mlp` (activation: the attribute's value, None: none)."""
    rng = np.random.default_rng(3)
    lead = () if layers is None else (layers,)
    with h5py.File(path, "w") as f:
        for name in ("query", "key", "value"):
            f[f"attention/{name}"] = rng.standard_normal(lead + (1, D, D)) * 0.5
        f["attention/output"] = rng.standard_normal(lead + (D, D)) * 0.5
        if mlp:
            f["mlp/w1"] = rng.standard_normal(lead + (4, D))
            f["mlp/b1"] = rng.standard_normal(lead + (4,))
            f["mlp/w2"] = rng.standard_normal(lead + (D, 4))
            f["mlp/b2"] = rng.standard_normal(lead + (D,))
            if activation is not None:
                f["mlp"].attrs["activation"] = activation
    return path


def nothing_left(folder: Path, *keep: str) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(keep)


# --- Times frames cannot resolve ----------------------------------------------------------------

def test_a_layer_time_below_the_time_resolution_is_refused_at_once(mfattn_binary, tmp_path):
    """--layer-time 1e-200 was a loop over 1e188 layer starts before frame 0 (12 minutes at
    100 % CPU, the first SIGTERM ignored, a temporary file and a lock left)."""
    two = weights_file(tmp_path / "two.h5", layers=2)
    started = time.monotonic()
    done = cli(mfattn_binary, "run", "--n", 8, "--d", D, "--weights", two, "--layer-time", "1e-200",
                  "--horizon", "2e-200", "--out", tmp_path / "o.h5", timeout=120)
    refused(done, "--horizon 2e-200", "must be at least 1e-09")
    done = cli(mfattn_binary, "run", "--n", 8, "--d", D, "--weights", two, "--layer-time", "1e-200",
                  "--horizon", 1, "--out", tmp_path / "o.h5", timeout=120)
    refused(done, "--layer-time 1e-200", "must be 0 or at least 1e-09")
    done = cli(mfattn_binary, "run", "--n", 8, "--d", D, "--q", "gaussian", "--regen-period", "1e-200",
                  "--horizon", "1e-10", "--out", tmp_path / "o.h5", timeout=120)
    refused(done, "--regen-period 1e-200", "must be 0 or at least 1e-09")
    assert time.monotonic() - started < 110  # (bounded by the subprocess timeouts: no hang)
    nothing_left(tmp_path, "two.h5")


def test_a_horizon_below_the_time_resolution_is_refused(mfattn_binary, tmp_path):
    """--horizon 1e-200 gave a file of one frame at t = 1e-200 (frame 0 merged into it)."""
    refused(cli(mfattn_binary, "run", "--n", 4, "--horizon", "1e-200", "--out", tmp_path / "o.h5"),
            "--horizon 1e-200")
    nothing_left(tmp_path)


# --- Files that reach outside themselves ---------------------------------------------------------

@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    import os
    os.mkfifo(path)
    return path


def readers_of(binary: Path, path: Path, tmp_path: Path) -> dict[str, list]:
    """Every command that reads an mfattn file, with the file as its input."""
    return {
        "info": ["info", path],
        "analyze": ["analyze", path],
        "init-file": ["run", "--n", 8, "--d", D, "--init", "file", "--init-file", path, "--out", tmp_path / "i.h5"],
        "compare": ["meanfield", "--d", 2, "--grid", 16, "--horizon", 0.1, "--compare", path, "--out",
                    tmp_path / "c.h5"],
    }


def test_an_external_link_to_a_fifo_is_refused_by_every_reader_without_waiting(mfattn_binary, tmp_path, fifo):
    """cli.md promises that nothing waits on a FIFO; the regular-file check saw the named file
    only, and HDF5 opened an external link's target (a FIFO: for ever)."""
    weights = weights_file(tmp_path / "w.h5")
    with h5py.File(weights, "a") as f:
        del f["attention/output"]
        f["attention/output"] = h5py.ExternalLink(str(fifo), "/x")
    refused(cli(mfattn_binary, "run", "--n", 8, "--d", D, "--weights", weights, "--out", tmp_path / "o.h5"),
            "/attention/output is an external link")
    run = tmp_path / "run.h5"
    assert cli(mfattn_binary, "run", "--n", 8, "--d", D, "--horizon", 0.1, "--quiet", "--out", run).returncode == 0
    with h5py.File(run, "a") as f:
        f["observables/extra"] = h5py.ExternalLink(str(fifo), "/x")
    for name, command in readers_of(mfattn_binary, run, tmp_path).items():
        refused(cli(mfattn_binary, *command), "/observables/extra is an external link")
    resumed = cli(mfattn_binary, "run", "--n", 8, "--d", D, "--horizon", 0.2, "--quiet", "--resume", "--out", run)
    refused(resumed, "/observables/extra is an external link")
    with pytest.raises(ValueError, match="/observables/extra is an external link"):
        mfattn_io.load(run)  # the Python loader refuses the same
    nothing_left(tmp_path, "fifo", "w.h5", "run.h5")


def test_a_virtual_dataset_reading_a_fifo_is_refused_by_every_reader_without_waiting(mfattn_binary, tmp_path, fifo):
    run = tmp_path / "run.h5"
    assert cli(mfattn_binary, "run", "--n", 8, "--d", D, "--horizon", 0.1, "--quiet", "--out", run).returncode == 0
    with h5py.File(run, "a") as f:
        times = f["particles/tokens/position/time"]
        layout = h5py.VirtualLayout(shape=times.shape, dtype="f8")
        layout[:] = h5py.VirtualSource(str(fifo), "x", shape=times.shape)
        del f["particles/tokens/position/time"]
        f["particles/tokens/position"].create_virtual_dataset("time", layout)
    for name, command in readers_of(mfattn_binary, run, tmp_path).items():
        refused(cli(mfattn_binary, *command), "/particles/tokens/position/time is a virtual dataset")
    with pytest.raises(ValueError, match="is a virtual dataset"):
        mfattn_io.load(run)


@pytest.mark.parametrize("where", ["particles/tokens/position/value", "fields/density/value"])
def test_the_loader_refuses_a_virtual_dataset_where_it_reads_the_bulk(mfattn_binary, tmp_path, where):
    """The positions of a run and the values of a density file: a missing source loaded as
    silent zeros, a FIFO source hung the loader."""
    out = tmp_path / "file.h5"
    command = (["run", "--n", 8, "--d", D] if where.startswith("particles") else ["meanfield", "--d", 2, "--grid", 16])
    assert cli(mfattn_binary, *command, "--horizon", 0.1, "--save-every", 0.1, "--quiet", "--out", out).returncode == 0
    with h5py.File(out, "a") as f:
        shape, dtype = f[where].shape, f[where].dtype
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[...] = h5py.VirtualSource(str(tmp_path / "missing.h5"), "x", shape=shape)
        parent, name = where.rsplit("/", 1)
        del f[where]
        f[parent].create_virtual_dataset(name, layout)
    with pytest.raises(ValueError, match=f"/{where} is a virtual dataset"):
        mfattn_io.load(out)
    refused(cli(mfattn_binary, "info", out), "is a virtual dataset")


def test_a_virtual_dataset_or_external_storage_is_refused(mfattn_binary, tmp_path):
    """A virtual dataset whose source is missing read silently as its fill value (zeros)."""
    weights = weights_file(tmp_path / "vds.h5")
    layout = h5py.VirtualLayout(shape=(D, D), dtype="f8")
    layout[:] = h5py.VirtualSource(str(tmp_path / "missing.h5"), "data", shape=(D, D))
    with h5py.File(weights, "a") as f:
        del f["attention/output"]
        f["attention"].create_virtual_dataset("output", layout, fillvalue=0.0)
    refused(cli(mfattn_binary, "run", "--n", 8, "--d", D, "--weights", weights, "--out", tmp_path / "o.h5"),
            "/attention/output is a virtual dataset")
    stored = weights_file(tmp_path / "external.h5")
    (tmp_path / "raw.bin").write_bytes(np.eye(D).tobytes())
    with h5py.File(stored, "a") as f:
        del f["attention/output"]
        f["attention"].create_dataset("output", shape=(D, D), dtype="f8", external=[(str(tmp_path / "raw.bin"), 0, 72)])
    refused(cli(mfattn_binary, "run", "--n", 8, "--d", D, "--weights", stored, "--out", tmp_path / "o.h5"),
            "/attention/output stores its data in external files")


# --- Attributes and options ------------------------------------------------------------------

def test_a_fixed_length_activation_attribute_is_read_whole(mfattn_binary, tmp_path):
    """NumPy's S4 "relu" (no terminator, as C, MATLAB and h5py's bytes write it) was read as
    "rel"; a space-padded one keeps no spaces. Each runs as the variable-length string does."""
    variable = weights_file(tmp_path / "variable.h5", mlp=True, activation="gelu")
    outputs = {}
    for name, attribute in (("variable", None), ("fixed", np.bytes_("gelu")), ("spaced", "space")):
        path = variable if attribute is None else weights_file(tmp_path / f"{name}.h5", mlp=True, activation="gelu")
        if attribute is not None:
            with h5py.File(path, "a") as f:
                del f["mlp"].attrs["activation"]
                if name == "fixed":
                    f["mlp"].attrs["activation"] = attribute  # S4: four bytes, no terminator
                else:
                    kind = h5py.h5t.C_S1.copy()
                    kind.set_size(8)
                    kind.set_strpad(h5py.h5t.STR_SPACEPAD)
                    space = h5py.h5s.create(h5py.h5s.SCALAR)
                    h5py.h5a.create(f["mlp"].id, b"activation", kind, space).write(np.array(b"gelu    ", "S8"))
        out = tmp_path / f"{name}.run.h5"
        done = cli(mfattn_binary, "run", "--n", 8, "--d", D, "--weights", path, "--mlp", 4, "--mlp-activation",
                      "gelu", "--horizon", 0.2, "--quiet", "--threads", 1, "--out", out)
        assert done.returncode == 0, (name, done.stderr)
        outputs[name] = h5py.File(out, "r")["particles/tokens/position/value"][()]
    for name in ("fixed", "spaced"):
        np.testing.assert_array_equal(bits(outputs[name]), bits(outputs["variable"]))


@pytest.mark.parametrize("case, said", [
    ("no activation", "/mlp has no activation attribute"),
    ("empty weights", "--weights '': is empty"),
    ("activation without mlp", "--mlp-activation gelu: there is no feed-forward term"),
    ("default activation given without mlp", "--mlp-activation relu: there is no feed-forward term"),
    ("one layer of a leading axis", "no leading layer axis, or one of length 1"),
])
def test_layer_options_once_taken_silently_are_refused(mfattn_binary, tmp_path, case, said):
    if case == "no activation":
        args = ["--weights", weights_file(tmp_path / "w.h5", mlp=True), "--mlp", 4]
    elif case == "empty weights":
        args = ["--weights", ""]
    elif case == "activation without mlp":
        args = ["--mlp-activation", "gelu"]
    elif case == "default activation given without mlp":
        args = ["--mlp-activation", "relu"]
    else:
        args = ["--weights", weights_file(tmp_path / "w.h5", layers=1), "--layer-time", 1]
    done = cli(mfattn_binary, "run", "--n", 8, "--d", D, *args, "--out", tmp_path / "o.h5")
    refused(done, said)
    assert not (tmp_path / "o.h5").exists()


def test_a_switch_value_for_an_option_with_a_value_names_the_option(mfattn):
    """Model(heads=True) read the call's own out= as heads' value ("heads=out=...")."""
    with pytest.raises(ValueError) as raised:
        mfattn.Model(heads=True)
    assert str(raised.value).startswith("heads=True: takes a value") and "out" not in str(raised.value)
    assert mfattn.Model(n=4, d=3, normalize_init=True) is not None  # a real switch still takes True


# --- A large d -----------------------------------------------------------------------------------

def test_a_run_at_d_4096_writes_its_boundary_and_a_small_file(mfattn_binary, tmp_path):
    """HDF5's oldest format keeps an attribute within 64 KiB: the box's boundary of d = 4096
    strings failed with exit 4 ("object header message is too large"). The identity Q, K, V
    (3 x 128 MiB) are stored compressed: the file of two tokens is small."""
    out = tmp_path / "wide.h5"
    done = cli(mfattn_binary, "run", "--n", 2, "--d", 4096, "--horizon", 0.02, "--save-every", 0.01, "--quiet",
                  "--threads", 1, "--out", out, timeout=300)
    assert done.returncode == 0, done.stderr
    with h5py.File(out, "r") as f:
        boundary = f["particles/tokens/box"].attrs["boundary"]
        assert len(boundary) == 4096 and set(np.asarray(boundary).astype(str)) == {"none"}
        assert f["particles/tokens/position/value"].shape == (3, 2, 4096)
        q = f["particles/tokens/attention_matrices/query"]
        np.testing.assert_array_equal(q[0, :3, :3], np.eye(3))
    assert out.stat().st_size < 20 * 2**20


def test_second_moment_eigenvalues_of_few_tokens_in_many_dimensions(mfattn_binary, tmp_path):
    """With fewer tokens than dimensions the eigenvalues come from the m x m Gram matrix (the
    d x d solver cost O(d^3) a frame: 39 steps in 60 s at d = 2048): NumPy's eigenvalues of
    the d x d second moment, and d - m exact zeros."""
    out = tmp_path / "few.h5"
    done = cli(mfattn_binary, "run", "--n", 5, "--d", 300, "--horizon", 0.1, "--save-every", 0.05, "--quiet",
                  "--threads", 1, "--out", out, timeout=300)
    assert done.returncode == 0, done.stderr
    with h5py.File(out, "r") as f:
        x = f["particles/tokens/position/value"][()]
        eigenvalues = f["observables/moment_eigenvalues/value"][()]
    for frame in range(len(x)):
        moment = x[frame].T @ x[frame] / len(x[frame])
        expected = np.sort(np.linalg.eigvalsh(moment))[::-1]
        np.testing.assert_allclose(eigenvalues[frame][:5], expected[:5], atol=1e-14)
        assert np.all(eigenvalues[frame][5:] == 0.0) or np.sum(eigenvalues[frame] != 0.0) <= 5
        assert np.all(np.diff(eigenvalues[frame]) <= 0.0)  # descending, as documented
