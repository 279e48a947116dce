"""Where the normalization sits (docs/model.md, section 2c): every placement against a NumPy
implementation written here from the table of section 2c (not from the project's code), on a
short rk4 trajectory (n = 24, d = 4, 200 steps), SA, USA and Sinkhorn attention (section 2d,
its scaling written here from that section), with and without a RoPE gauge, prefix tokens and
null tokens; the exact facts (unit norms of post and ngpt, the radius of pre,
null tokens changing no bit) and the refusals.

The NumPy side takes from the run's file only its inputs: the initial positions, the token
positions and presences, the prefix contents and the gauge's generators (G(xi) = expm(xi Omega)).
mfattn's rk4 (docs/model.md section 5) takes the four stages at the unprojected stage states and
normalises the step's result only on the sphere (post, ngpt); the projection P_x y = y - <x, y> x
is taken at those states as they are. The NumPy stepper does the same."""
from __future__ import annotations

import subprocess

import h5py
import numpy as np
import pytest
from scipy.linalg import expm

N, D, STEPS, DT, BETA = 24, 4, 200, 0.01, 1.5
PLACEMENTS = ["post", "pre", "peri", "ngpt", "none"]


def log_sum_exp(a: np.ndarray, axis: int) -> np.ndarray:
    """log sum exp over an axis; -inf for a line of -inf."""
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)), axis)


def sinkhorn_plan(logits: np.ndarray, source_presence: np.ndarray, receivers: np.ndarray, sweeps: int,
                  tol: float) -> np.ndarray:
    """docs/model.md section 2d: P = diag(a) W diag(b) in log space, W_ij = exp(logits_ij)
    (log p_j included, -inf hidden). From g = 0: rows; then per sweep the columns' error
    against their shares c_j = R p_j / M_J (stop once <= tol > 0, or after `sweeps`), the
    columns, the rows. Receivers that are not present (p_i = 0) have empty rows."""
    neg_inf = -np.inf
    logits = np.where(receivers[:, None], logits, neg_inf)

    def rows(g):
        with np.errstate(invalid="ignore"):
            f = -log_sum_exp(logits + g[None, :], 1)
        return np.where(receivers & np.isfinite(f), f, neg_inf)

    g = np.zeros(logits.shape[1])
    f = rows(g)
    columns = log_sum_exp(f[:, None] + logits, 0)
    seen = np.isfinite(columns)
    share = np.zeros_like(g)
    share[seen] = np.isfinite(f).sum() * source_presence[seen] / source_presence[seen].sum()
    with np.errstate(divide="ignore"):
        log_share = np.log(share)
    for _ in range(sweeps):
        error = np.max(np.abs(np.where(seen, np.exp(columns + g), 0.0) - share))
        if tol > 0 and error <= tol:
            break
        with np.errstate(invalid="ignore"):
            g = np.where(seen, log_share - columns, neg_inf)
        f = rows(g)
        columns = log_sum_exp(f[:, None] + logits, 0)
    with np.errstate(invalid="ignore"):
        plan = np.exp(f[:, None] + logits + g[None, :])
    return np.nan_to_num(plan, nan=0.0)


def direction(y: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(y, axis=-1, keepdims=True)
    return np.divide(y, norm, out=np.zeros_like(y), where=norm > 0)


class Layer:
    """F_i(states) of docs/model.md section 2 for Q = K = V = I, from the run's labels."""

    def __init__(self, path, kernel: str, eps: float, beta: float = BETA, sweeps: int = 100, tol: float = 1e-12):
        with h5py.File(path) as f:
            tokens = f["particles/tokens"]
            self.x0 = tokens["position/value"][0]
            self.p = tokens["presence"][:]
            positions = tokens["aux_position"][:, 0]
            generators = tokens["gauge_generators"][:] if "gauge_generators" in tokens else None
            if "particles/prefix" in f:
                self.prefix = f["particles/prefix/position"][:]
                prefix_positions = f["particles/prefix/aux_position"][:, 0]
                self.prefix_weight = f["particles/prefix/presence"][:]
            else:
                self.prefix = np.zeros((0, D))
                prefix_positions = np.zeros(0)
                self.prefix_weight = np.zeros(0)
        all_positions = np.concatenate([positions, prefix_positions])
        if generators is None:
            self.G = np.broadcast_to(np.eye(D), (len(all_positions), D, D))
        else:
            self.G = np.stack([expm(xi * generators[0]) for xi in all_positions])
        self.kernel, self.eps, self.beta = kernel, eps, beta
        self.sweeps, self.tol = sweeps, tol

    def output(self, states: np.ndarray) -> np.ndarray:
        """p_i F_i: the attention output of section 2 (transported values), times p_i."""
        sources = np.concatenate([states, self.prefix])
        weight = np.concatenate([self.p, self.prefix_weight])
        gauged = np.einsum("jab,jb->ja", self.G, sources)       # G_j y_j
        n = len(states)
        scores = self.beta * gauged[:n] @ gauged.T                    # beta <G_i x_i, G_j y_j>
        if self.kernel == "sinkhorn":
            with np.errstate(divide="ignore"):
                logits = scores + np.log(weight)[None, :]
            plan = sinkhorn_plan(logits, weight, self.p > 0, self.sweeps, self.tol)
            return self.p[:, None] * np.einsum("iba,ib->ia", self.G[:n], plan @ gauged)
        w = weight[None, :] * np.exp(scores)
        summed = w @ gauged                                        # sum_j w_ij G_j y_j
        values = np.einsum("iba,ib->ia", self.G[:n], summed)       # G_i^T (...)
        if self.kernel == "usa":
            u = values / weight.sum()
        else:
            u = values / (self.eps + w.sum(axis=1))[:, None]
        return self.p[:, None] * u

    def field(self, x: np.ndarray, placement: str, alpha: float = 1.0) -> np.ndarray:
        read = direction(x) if placement in ("pre", "peri") else x
        pu = self.output(read)
        if placement in ("pre", "none"):
            return pu
        if placement == "post":
            return pu - np.sum(x * pu, axis=1, keepdims=True) * x
        v = self.p[:, None] * direction(pu)
        if placement == "peri":
            return v
        v = alpha * v
        return v - np.sum(x * v, axis=1, keepdims=True) * x


def rk4(layer: Layer, placement: str, steps: int = STEPS, alpha: float = 1.0, dt: float = DT) -> np.ndarray:
    x = layer.x0.copy()
    for _ in range(steps):
        k1 = layer.field(x, placement, alpha)
        k2 = layer.field(x + dt / 2 * k1, placement, alpha)
        k3 = layer.field(x + dt / 2 * k2, placement, alpha)
        k4 = layer.field(x + dt * k3, placement, alpha)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        if placement in ("post", "ngpt"):
            moving = layer.p > 0
            x[moving] = direction(x[moving])
    return x


def run(binary, tmp_path, name, *args, beta: float = BETA, dt: float = DT) -> "Path":
    out = tmp_path / name
    command = [str(binary), "run", "--n", str(N), "--d", str(D), "--beta", str(beta), "--integrator", "rk4",
               "--dt", str(dt), "--horizon", str(STEPS * dt), "--save-every", str(STEPS * dt / 2), "--threads", "1",
               "--quiet", "--out", str(out), *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, (command, done.stderr)
    return out


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("kernel", ["sa", "usa", "sinkhorn"])
@pytest.mark.parametrize("labels", ["plain", "rope prefix nulls"])
def test_every_placement_is_the_numpy_flow(mfattn_binary, tmp_path, placement, kernel, labels):
    extra = ["--geometry", "rope", "--prefix", "3", "--prefix-weight", "1.5", "--null-tokens", "2",
             "--amplitudes", "0.9"] if labels != "plain" else []
    # USA without a normalization grows the norms, and its weights exp(beta <x_i, x_j>) with
    # them, to a blow-up in finite time: a smaller start, beta and horizon (t = 1) keep it finite.
    slow = (placement, kernel) == ("none", "usa")
    beta, dt = (0.5, DT / 2) if slow else (BETA, DT)
    if placement in ("pre", "peri", "none"):
        extra += ["--init-radius", "0.8" if slow else "1.3"]
    out = run(mfattn_binary, tmp_path, "run.h5", "--kernel", kernel, "--normalization", placement, *extra, beta=beta,
              dt=dt)
    eps = 1e-12 if extra and "--null-tokens" in extra else 0.0
    layer = Layer(out, kernel, eps, beta)
    expected = rk4(layer, placement, dt=dt)
    with h5py.File(out) as f:
        x = f["particles/tokens/position/value"][-1]
        radii = np.linalg.norm(f["particles/tokens/position/value"][:], axis=-1)
        if placement in ("pre", "peri", "none"):
            moving = layer.p > 0
            assert f["observables/mean_radius/value"][-1] == pytest.approx(radii[-1][moving].mean(), rel=1e-14)
            assert f["observables/max_radius/value"][-1] == pytest.approx(radii[-1][moving].max(), rel=1e-14)
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-10)
    assert np.abs(x - layer.x0).max() > 1e-3  # it moved
    if placement in ("post", "ngpt"):
        assert np.abs(radii[:, layer.p > 0] - 1).max() <= 1e-14
    np.testing.assert_array_equal(x[layer.p == 0], layer.x0[layer.p == 0])  # null tokens stay


def test_pre_radius_follows_its_ode(mfattn_binary, tmp_path):
    """d|x_i|/dt = p_i <N(x_i), F_i(N(x))>: the radius integrated along the NumPy trajectory
    (its own rk4 on the augmented state) against mfattn's |x_i|."""
    out = run(mfattn_binary, tmp_path, "pre.h5", "--kernel", "sa", "--normalization", "pre", "--init-radius", "0.7")
    layer = Layer(out, "sa", 0.0)
    x, rho = layer.x0.copy(), np.linalg.norm(layer.x0, axis=1)

    def rates(x):
        v = layer.field(x, "pre")
        return v, np.sum(direction(x) * v, axis=1)

    for _ in range(STEPS):
        k1, r1 = rates(x)
        k2, r2 = rates(x + DT / 2 * k1)
        k3, r3 = rates(x + DT / 2 * k2)
        k4, r4 = rates(x + DT * k3)
        x = x + DT / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        rho = rho + DT / 6 * (r1 + 2 * r2 + 2 * r3 + r4)
    with h5py.File(out) as f:
        radius = np.linalg.norm(f["particles/tokens/position/value"][-1], axis=1)
    assert np.abs(rho - np.linalg.norm(layer.x0, axis=1)).max() > 0.05  # the radius changed
    np.testing.assert_allclose(radius, rho, rtol=0, atol=1e-9)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_null_tokens_change_no_bit(mfattn_binary, tmp_path, placement):
    common = ["--kernel", "sa", "--normalization", placement, "--geometry", "rope", "--eps-den", "1e-12"]
    a = run(mfattn_binary, tmp_path, "a.h5", *common)
    b = run(mfattn_binary, tmp_path, "b.h5", *common, "--null-tokens", "7")
    with h5py.File(a) as f, h5py.File(b) as g:
        x, y = f["particles/tokens/position/value"][:], g["particles/tokens/position/value"][:, :N]
    assert np.array_equal(x.view(np.uint64), y.view(np.uint64))


def test_usa_without_normalization_overflows_with_exit_3(mfattn_binary, tmp_path):
    done = subprocess.run([str(mfattn_binary), "run", "--n", "24", "--d", "4", "--kernel", "usa", "--beta", "1.5",
                           "--normalization", "none", "--init-radius", "1.3", "--horizon", "2", "--out",
                           str(tmp_path / "x.h5"), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert "USA weights overflow" in done.stderr and "use --time-scale rescaled" in done.stderr
    assert ", t = " in done.stderr  # when it happened


@pytest.mark.parametrize("args, message", [
    (["--normalization", "pre", "--integrator", "euler"],
     "--integrator euler: moves on the sphere, and --normalization pre keeps the states in R^d "
     "(accepted: heun, rk4, dopri5)"),
    (["--normalization", "none", "--integrator", "lie-rk4"], "--integrator lie-rk4: moves on the sphere"),
    (["--normalization", "ngpt", "--integrator", "euler-unprojected"], "--integrator euler-unprojected: steps the post field"),
    (["--normalization", "post", "--init-radius", "2"], "--init-radius 2: scales states in R^d"),
    (["--normalization", "sideways"], "--normalization sideways: accepted: post, pre, peri, ngpt, none"),
    (["--normalization", "ngpt", "--ngpt-alpha", "0"], "--ngpt-alpha 0: must be > 0"),
])
def test_bad_placements_are_refused(mfattn_binary, tmp_path, args, message):
    done = subprocess.run([str(mfattn_binary), "run", "--n", "8", *args, "--out", str(tmp_path / "x.h5")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "x.h5").exists()


def test_ngpt_alpha_scales_the_step(mfattn_binary, tmp_path):
    out = run(mfattn_binary, tmp_path, "ngpt.h5", "--kernel", "sa", "--normalization", "ngpt", "--ngpt-alpha", "2.5",
              "--geometry", "rope")
    layer = Layer(out, "sa", 0.0)
    with h5py.File(out) as f:
        x = f["particles/tokens/position/value"][-1]
    np.testing.assert_allclose(x, rk4(layer, "ngpt", alpha=2.5), rtol=0, atol=1e-10)
    assert np.abs(x - rk4(layer, "ngpt", alpha=1.0)).max() > 1e-3  # alpha matters


def test_the_module_takes_the_placements(mfattn, mfattn_binary, tmp_path):
    """Model(normalization=...).velocity(x) is the run's field: the NumPy table at a state in R^d."""
    x = np.random.default_rng(3).standard_normal((N, D)) * 1.7
    out = run(mfattn_binary, tmp_path, "m.h5", "--kernel", "sa", "--normalization", "pre")
    layer = Layer(out, "sa", 0.0)
    for placement in PLACEMENTS:
        model = mfattn.Model(n=N, d=D, beta=BETA, kernel="sa", normalization=placement)
        state = direction(x) if placement in ("post", "ngpt") else x
        np.testing.assert_allclose(model.velocity(state), layer.field(state, placement), rtol=0, atol=1e-13)
