"""Tests of analysis/mfattn_io.py against real files written by `mfattn run`.

They check that the loader returns exactly what h5py reads, that replicas are split and
stacked consistently, that the stored observables agree with independent numpy recomputations
from the stored positions, that foreign HDF5 files are rejected, and that MDAnalysis's H5MD
reader opens a d = 3 file and returns the same positions.
"""
from __future__ import annotations

import warnings

import h5py
import numpy as np
import pytest

from mfattn import io as mfattn_io
from mfattn.io import load

OBSERVABLES = ("energy", "mean_inner", "min_inner", "max_speed")


def group_name(r: int) -> str:
    return "tokens" if r == 0 else f"tokens_r{r}"


def plain(value):
    """Independent HDF5 attribute -> Python conversion used as the reference."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def pair_inner_products(x: np.ndarray, presence: np.ndarray) -> np.ndarray:
    """<x_i, x_j> over pairs i != j of tokens with presence > 0, for one frame x [n, d]."""
    keep = presence > 0
    y = x[keep]
    gram = y @ y.T
    return gram[~np.eye(y.shape[0], dtype=bool)]


# --- loader == h5py -------------------------------------------------------------------------


def test_loader_returns_exactly_what_h5py_reads(run_mfattn):
    path = run_mfattn("--n", 16, "--d", 3, "--beta", 1.5, "--kernel", "sa", "--horizon", 1,
                      "--save-every", 0.1, "--seed", 7)
    tr = load(path)

    with h5py.File(path, "r") as f:
        group = f["particles/tokens"]
        np.testing.assert_array_equal(tr.positions, group["position/value"][()])
        np.testing.assert_array_equal(tr.times, group["position/time"][()])
        np.testing.assert_array_equal(tr.steps, group["position/step"][()])
        assert tr.positions.dtype == np.float64 and tr.steps.dtype == np.int64
        for name in ("aux_position", "prompt_id", "presence", "id"):
            np.testing.assert_array_equal(tr.labels[name], group[name][()])
            assert tr.labels[name].dtype == group[name].dtype
        assert set(tr.observables) == set(f["observables"])
        for name in f["observables"]:
            np.testing.assert_array_equal(tr.observables[name], f[f"observables/{name}/value"][()])
            np.testing.assert_array_equal(tr.observable_times[name], f[f"observables/{name}/time"][()])
            np.testing.assert_array_equal(tr.observable_steps[name], f[f"observables/{name}/step"][()])
        params = f["parameters"].attrs
        assert set(tr.parameters) == set(params)
        for key in params:
            assert tr.parameters[key] == plain(params[key]), key
            assert not isinstance(tr.parameters[key], (bytes, np.generic, np.ndarray)), key
        assert set(tr.run) == set(f["run"].attrs)
        for key in f["run"].attrs:
            assert tr.run[key] == plain(f["run"].attrs[key]), key

    # The options as given on the command line, with Python types.
    assert tr.parameters["n"] == 16 and type(tr.parameters["n"]) is int
    assert tr.parameters["d"] == 3 and type(tr.parameters["d"]) is int
    assert tr.parameters["beta"] == 1.5 and type(tr.parameters["beta"]) is float
    assert tr.parameters["kernel"] == "sa" and type(tr.parameters["kernel"]) is str
    assert tr.parameters["seed"] == 7

    assert (tr.n, tr.d, tr.replicas, tr.replica, tr.stacked) == (16, 3, 1, 0, False)
    assert tr.positions.shape == (11, 16, 3)
    assert tr.frames == 11
    np.testing.assert_allclose(tr.times, np.arange(11) * 0.1, rtol=0, atol=1e-12)
    assert tr.steps[0] == 0 and np.all(np.diff(tr.steps) > 0)
    for name in OBSERVABLES:
        assert tr.observables[name].shape == (11,)
        np.testing.assert_array_equal(tr.observable_times[name], tr.times)
    np.testing.assert_allclose(np.linalg.norm(tr.positions, axis=-1), 1.0, atol=1e-12)
    assert tr.run["status"] == "complete" and tr.complete
    assert tr.run["steps"] == tr.steps[-1]
    assert mfattn_io.is_complete(path)
    assert mfattn_io.replicas(path) == 1
    assert tr.creator_version == tr.parameters["version"]


def test_is_complete_follows_run_status(run_mfattn):
    path = run_mfattn("--n", 8, "--d", 3, "--horizon", 0.2, "--save-every", 0.1)
    assert mfattn_io.is_complete(path)
    with h5py.File(path, "r+") as f:
        f["run"].attrs["status"] = "running"
    assert not mfattn_io.is_complete(path)
    assert load(path).run["status"] == "running" and not load(path).complete
    with h5py.File(path, "r+") as f:
        f["run"].attrs["status"] = np.bytes_(b"complete")  # strings stored as bytes decode too
    assert mfattn_io.is_complete(path)


# --- replicas -------------------------------------------------------------------------------


def test_replicas_split_and_stacked_consistently(run_mfattn):
    R, n, d = 3, 10, 3
    path = run_mfattn("--n", n, "--d", d, "--replicas", R, "--horizon", 0.5, "--save-every", 0.1)
    assert mfattn_io.replicas(path) == R

    stacked = load(path)
    assert stacked.stacked and stacked.replica is None and stacked.replicas == R
    T = stacked.frames
    assert stacked.positions.shape == (T, R, n, d)
    for name in OBSERVABLES:
        assert stacked.observables[name].shape == (T, R), name
    explicit = load(path, replica="all")
    np.testing.assert_array_equal(explicit.positions, stacked.positions)

    with h5py.File(path, "r") as f:
        assert sorted(f["particles"]) == [group_name(r) for r in range(R)]
        for r in range(R):
            one = load(path, replica=r)
            assert not one.stacked and one.replica == r
            assert one.positions.shape == (T, n, d)
            raw = f[f"particles/{group_name(r)}/position/value"][()]
            np.testing.assert_array_equal(one.positions, raw)
            np.testing.assert_array_equal(stacked.positions[:, r], raw)
            np.testing.assert_array_equal(one.times, stacked.times)
            for label in ("aux_position", "prompt_id", "presence", "id"):
                np.testing.assert_array_equal(one.labels[label],
                                              f[f"particles/{group_name(r)}/{label}"][()])
            for name in OBSERVABLES:
                column = f[f"observables/{name}/value"][()][:, r]
                np.testing.assert_array_equal(one.observables[name], column)
                np.testing.assert_array_equal(stacked.observables[name][:, r], column)
        # Negative indices count from the end.
        np.testing.assert_array_equal(load(path, replica=-1).positions, load(path, replica=R - 1).positions)

    # Replicas are independent initial conditions, not copies.
    assert not np.allclose(stacked.positions[0, 0], stacked.positions[0, 1])
    for bad in (R, -R - 1, "first", 1.0, True):
        with pytest.raises(ValueError):
            load(path, replica=bad)


def test_single_replica_file_with_replica_axis_on_request(run_mfattn):
    path = run_mfattn("--n", 6, "--d", 3, "--horizon", 0.2, "--save-every", 0.1)
    default = load(path)
    all_ = load(path, replica="all")
    assert all_.stacked and all_.positions.shape == (default.frames, 1, 6, 3)
    np.testing.assert_array_equal(all_.positions[:, 0], default.positions)
    for name in OBSERVABLES:
        assert all_.observables[name].shape == (default.frames, 1)
        np.testing.assert_array_equal(all_.observables[name][:, 0], default.observables[name])
    np.testing.assert_array_equal(load(path, replica=0).positions, default.positions)


# --- null tokens ----------------------------------------------------------------------------


def test_null_tokens_have_presence_zero_and_stay_put(run_mfattn):
    n, nulls = 8, 2
    path = run_mfattn("--n", n, "--d", 3, "--null-tokens", nulls, "--horizon", 0.5,
                      "--save-every", 0.1)
    tr = load(path)
    assert tr.n == n + nulls
    presence = tr.labels["presence"]
    assert presence.shape == (n + nulls,)
    np.testing.assert_array_equal(presence[n:], 0.0)
    assert np.all(presence[:n] > 0)
    np.testing.assert_array_equal(tr.labels["id"], np.arange(n + nulls))
    assert tr.parameters["null-tokens"] == nulls
    assert tr.parameters["active_tokens"] == n
    # dx_i/dt = p_i * ... = 0 for a null receiver.
    np.testing.assert_array_equal(tr.positions[:, n:], np.broadcast_to(tr.positions[:1, n:],
                                                                       tr.positions[:, n:].shape))
    assert not np.array_equal(tr.positions[-1, :n], tr.positions[0, :n])


# --- observables recomputed from the stored positions ---------------------------------------


def check_inner_observables(tr):
    """min_inner and mean_inner of every frame and replica against numpy over pairs i != j of
    tokens with presence > 0."""
    presence = tr.labels["presence"]
    m = np.count_nonzero(presence > 0)
    positions = tr.positions if tr.stacked else tr.positions[:, np.newaxis]
    for name in ("min_inner", "mean_inner"):
        assert tr.observables[name].shape == (positions.shape[:2] if tr.stacked else positions.shape[:1])
    min_inner = tr.observables["min_inner"].reshape(positions.shape[:2])
    mean_inner = tr.observables["mean_inner"].reshape(positions.shape[:2])
    for t in range(positions.shape[0]):
        for r in range(positions.shape[1]):
            pairs = pair_inner_products(positions[t, r], presence)
            assert pairs.size == m * (m - 1)
            assert abs(min_inner[t, r] - pairs.min()) <= 1e-12, (t, r)
            assert abs(mean_inner[t, r] - pairs.mean()) <= 1e-12, (t, r)


def test_min_and_mean_inner_match_recomputation(run_mfattn):
    R, n, nulls = 2, 12, 3
    amplitudes = ",".join(["0.5", "1", "2"] * (n // 3))  # one per active token
    path = run_mfattn("--n", n, "--d", 4, "--beta", 2, "--replicas", R, "--null-tokens", nulls,
                      "--amplitudes", amplitudes, "--horizon", 1, "--save-every", 0.1)
    tr = load(path)
    assert np.count_nonzero(tr.labels["presence"] > 0) == n
    check_inner_observables(tr)
    # The dynamics moved the tokens, so the comparison covers distinct states.
    assert np.ptp(tr.observables["mean_inner"][:, 0]) > 1e-3


def test_inner_observables_ignore_null_tokens(run_mfattn, tmp_path):
    """Null tokens placed antipodal to active ones (inner product -1) must not enter
    min_inner or mean_inner."""
    n, nulls, d = 12, 3, 4
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x = np.vstack([x, -x[:nulls]])
    init = tmp_path / "init.txt"
    np.savetxt(init, x, fmt="%.17g")
    path = run_mfattn("--n", n, "--d", d, "--null-tokens", nulls, "--init", "file",
                      "--init-file", init, "--horizon", 1, "--save-every", 0.1)
    tr = load(path)
    np.testing.assert_array_equal(tr.positions[0], x)
    check_inner_observables(tr)
    # Counting the null tokens would give a different answer in every frame.
    everyone = np.ones(n + nulls)
    for t in range(tr.frames):
        pairs = pair_inner_products(tr.positions[t], everyone)
        assert pairs.min() < tr.observables["min_inner"][t] - 1e-3
        assert abs(pairs.mean() - tr.observables["mean_inner"][t]) > 1e-3


def test_energy_matches_recomputation_usa_identity(run_mfattn):
    n, nulls, beta = 10, 2, 2.0
    amplitudes = ",".join(["0.5", "1", "2", "3", "0.25"] * 2)  # one per active token
    path = run_mfattn("--n", n, "--d", 3, "--beta", beta, "--kernel", "usa",
                      "--q", "identity", "--k", "identity", "--v", "identity",
                      "--time-scale", "natural", "--null-tokens", nulls,
                      "--amplitudes", amplitudes, "--horizon", 1, "--save-every", 0.1)
    tr = load(path)
    assert tr.parameters["kernel"] == "usa" and tr.parameters["beta"] == beta
    assert tr.parameters["gradient_flow"] == 1
    p = tr.labels["presence"]
    a = np.array([float(v) for v in amplitudes.split(",")] + [0.0] * nulls)
    np.testing.assert_allclose(p, a**2 / (tr.parameters["tau"] + a**2), rtol=1e-15, atol=0)
    M = p.sum()
    for t in range(tr.frames):
        x = tr.positions[t]
        gram = x @ x.T
        expected = (p[:, None] * p[None, :] * np.exp(beta * gram)).sum() / (2 * beta * M**2)
        got = tr.observables["energy"][t]
        assert abs(got - expected) <= 1e-10 * abs(expected), (t, got, expected)
    # USA with identity matrices is a gradient ascent of E.
    assert np.all(np.diff(tr.observables["energy"]) >= -1e-12)


def test_prefix_tokens_are_loaded_and_enter_the_energy(run_mfattn):
    """The loader returns /particles/prefix, and the stored energy sums over moving and prefix
    tokens with the symmetric per-prompt mask (recomputed here from the stored data)."""
    beta, weight = 1.5, 2.0
    path = run_mfattn("--n", 12, "--d", 3, "--beta", beta, "--prefix", 3, "--prompts", 2,
                      "--prefix-init", "clustered", "--mask", "per-prompt",
                      "--prefix-weight", weight, "--horizon", 2, "--save-every", 0.5)
    tr = load(path)
    with h5py.File(path, "r") as f:
        for name in ("position", "aux_position", "prompt_id", "presence", "id"):
            np.testing.assert_array_equal(tr.prefix[name], f["particles/prefix"][name][()])
    y = tr.prefix["position"]
    assert y.shape == (6, 3)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(tr.prefix["prompt_id"], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(tr.prefix["presence"], [weight] * 6)
    np.testing.assert_array_equal(tr.labels["prompt_id"], [0] * 6 + [1] * 6)
    prompts = np.concatenate([tr.labels["prompt_id"], tr.prefix["prompt_id"]])
    is_prefix = np.arange(18) >= 12
    involves_prefix = is_prefix[:, None] | is_prefix[None, :]
    visible = ~involves_prefix | (prompts[:, None] == prompts[None, :])
    p = np.concatenate([tr.labels["presence"], tr.prefix["presence"]])
    M = p.sum()
    for t in range(tr.frames):
        z = np.concatenate([tr.positions[t], y])
        weights = p[:, None] * p[None, :] * np.exp(beta * z @ z.T) * visible
        expected = weights.sum() / (2 * beta * M**2)
        assert abs(tr.observables["energy"][t] - expected) <= 1e-12 * expected
    assert np.all(np.diff(tr.observables["energy"]) >= -1e-12)


def test_file_without_prefix_has_an_empty_prefix(run_mfattn):
    assert load(run_mfattn("--n", 4, "--horizon", 0.1)).prefix == {}


# --- foreign files --------------------------------------------------------------------------


def test_loader_rejects_foreign_files(tmp_path, run_mfattn):
    # An H5MD-shaped file from another program.
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.create_group("h5md").attrs["version"] = [1, 1]
        f.create_group("h5md/creator").attrs["name"] = "lammps"
        f.create_dataset("particles/trajectory/position/value", data=np.zeros((2, 4, 3)))
    # A plain HDF5 file.
    plain_h5 = tmp_path / "plain.h5"
    with h5py.File(plain_h5, "w") as f:
        f["data"] = np.arange(3)
    # Claims to be mfattn but has no token group.
    broken = tmp_path / "broken.h5"
    with h5py.File(broken, "w") as f:
        f.create_group("h5md/creator").attrs["name"] = "mfattn"
        f.create_dataset("particles/atoms/position/value", data=np.zeros((2, 4, 3)))
    # Not HDF5 at all.
    text = tmp_path / "notes.h5"
    text.write_text("not an hdf5 file\n")

    for path in (other, plain_h5, broken, text):
        for reader in (load, mfattn_io.replicas, mfattn_io.is_complete):
            with pytest.raises(ValueError, match="not an mfattn H5MD file"):
                reader(path)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.h5")

    # A real mfattn file whose replica groups have a gap is rejected too.
    gap = run_mfattn("--n", 4, "--d", 3, "--replicas", 3, "--horizon", 0.1, "--save-every", 0.1)
    with h5py.File(gap, "r+") as f:
        del f["particles/tokens_r1"]
    with pytest.raises(ValueError, match="not numbered"):
        load(gap)


# --- MDAnalysis -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mda():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # xdrlib, imported by MDAnalysis 2.4
        return pytest.importorskip(
            "MDAnalysis", reason="python3-mdanalysis is not installed "
            "(DEBIAN_FRONTEND=noninteractive apt-get install -y python3-mdanalysis)")


@pytest.mark.parametrize("replicas", [1, 3])
def test_mdanalysis_h5md_reader_gives_the_same_positions(run_mfattn, mda, replicas):
    """MDAnalysis reads the first particle group (/particles/tokens, replica 0). It needs a
    topology: a .h5 file yields no minimal topology (see the xfail test below), so the
    trajectory is loaded into an empty Universe, and also read with H5MDReader directly.
    MDAnalysis stores positions as float32."""
    from MDAnalysis.coordinates.H5MD import H5MDReader

    n = 16
    path = run_mfattn("--n", n, "--d", 3, "--replicas", replicas, "--horizon", 1,
                      "--save-every", 0.1)
    tr = load(path, replica=0)
    observables = load(path).observables  # [T] or [T, R]: MDAnalysis gives a frame's row

    u = mda.Universe.empty(n, trajectory=True)
    u.load_new(str(path), format="H5MD", convert_units=False)
    reader = H5MDReader(str(path), convert_units=False)
    try:
        for traj in (u.trajectory, reader):
            assert traj.n_atoms == n
            assert traj.n_frames == tr.frames
            for i, ts in enumerate(traj):
                assert ts.frame == i
                np.testing.assert_array_equal(ts.positions, tr.positions[i].astype(np.float32))
                np.testing.assert_allclose(ts.positions, tr.positions[i], rtol=0, atol=1e-6)
                assert ts.time == pytest.approx(tr.times[i], abs=1e-12)
                assert ts.data["step"] == tr.steps[i]
                assert ts.dimensions is None  # no box edges: open boundaries
                for name in OBSERVABLES:
                    np.testing.assert_array_equal(ts.data[name], observables[name][i])
            assert i == tr.frames - 1
    finally:
        reader.close()


@pytest.mark.xfail(
    raises=KeyError, strict=True,
    reason="MDAnalysis 2.4.2 H5MDReader.parse_n_atoms (MDAnalysis/coordinates/H5MD.py, line 577: "
    "`for group in f['particles/trajectory']`) hard-codes the particle group name "
    "'trajectory'; mfattn writes /particles/tokens, so the MINIMAL topology parser "
    "(mda.Universe(file.h5md) without a topology) raises KeyError \"Unable to open object "
    "(object 'trajectory' doesn't exist)\". The H5MD reader itself uses the first group "
    "under /particles and reads the file (test above).")
def test_mdanalysis_minimal_topology_needs_particles_trajectory(run_mfattn, mda):
    from MDAnalysis.coordinates.H5MD import H5MDReader

    path = run_mfattn("--n", 5, "--d", 3, "--horizon", 0.1, "--save-every", 0.1)
    assert H5MDReader.parse_n_atoms(str(path)) == 5
