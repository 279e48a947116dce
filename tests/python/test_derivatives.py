"""The derivatives of the field (docs/model.md section 2e) against an oracle written here from
the formulas of docs/model.md sections 2, 2b, 2c and 3 in PyTorch float64 autograd (not
mfattn's code), against central finite differences of model.velocity, and against the
adjoint identity; null tokens change no bit of the others' derivatives, and thread counts
change none."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

BACKENDS = ["reference", "cpu"]
ON_SPHERE = ("post", "ngpt")


# ---- the oracle: docs/model.md written in PyTorch ----

def rope(y, positions, dim, base=10000.0, transpose=False):
    """G(xi) y of section 3's rope family in dimension dim: block b turns coordinates (2b, 2b+1)
    (0-based) by xi * base^(-2b/dim); G^T turns back."""
    out = y.clone()
    for b in range(dim // 2):
        angle = positions * base ** (-2.0 * b / dim)
        if transpose:
            angle = -angle
        c, s = torch.cos(angle), torch.sin(angle)
        out[:, 2 * b] = c * y[:, 2 * b] - s * y[:, 2 * b + 1]
        out[:, 2 * b + 1] = s * y[:, 2 * b] + c * y[:, 2 * b + 1]
    return out


def factor_terms(kind, delta, numbers):
    """(log-term, multiplier) of section 2's auxiliary factor at delta = xi_i - xi_j."""
    distance = delta.abs()
    one = torch.ones_like(delta)
    if kind == "none":
        return 0 * delta, one
    if kind == "distance":
        return -numbers["aux_lambda"] * distance, one
    if kind == "gaussian":
        return -distance ** 2 / (2 * numbers["aux_sigma"] ** 2), one
    if kind == "power":
        return -numbers["aux_power"] * torch.log1p(numbers["aux_power_scale"] * distance), one
    if kind == "cauchy":
        return -torch.log1p(distance ** 2 / numbers["aux_gamma"] ** 2), one
    if kind == "cosine":
        return 0 * delta, torch.cos(numbers["aux_omega"] * delta)
    if kind == "toeplitz":
        a, omega = numbers["toeplitz_coefficients"], numbers["toeplitz_frequencies"]
        return 0 * delta, sum(a[k] * torch.cos(omega[k] * delta) for k in range(len(a)))
    raise ValueError(kind)


def sinkhorn_plan(logits, source_presence, sweeps):
    """Section 2d's plan P_ij = exp(f_i + a_ij + rb_j) after `sweeps` sweeps from g = 0 (every
    receiver present, every source seen): rows f = -LSE_j (a + rb), rb = log p, then each
    sweep's columns rb = log c - LSE_i (f + a), c_j = R p_j / M, and rows again."""
    log_p = torch.log(source_presence)
    bias = log_p
    rows = -torch.logsumexp(logits + bias[None, :], dim=1)
    log_target = math.log(logits.shape[0]) + log_p - torch.log(source_presence.sum())
    for _ in range(sweeps):
        bias = log_target - torch.logsumexp(rows[:, None] + logits, dim=0)
        rows = -torch.logsumexp(logits + bias[None, :], dim=1)
    return torch.exp(rows[:, None] + logits + bias[None, :])


def direction(y):
    return y / y.norm(dim=1, keepdim=True)


class Oracle:
    """The field of one replica as docs/model.md defines it, from the numbers in `numbers`
    (the vjp's keys) and the labels of `spec`."""

    def __init__(self, spec):
        self.spec = spec

    def layer_output(self, y, numbers, replica=None):
        spec = self.spec
        n, d = y.shape
        pick = (lambda a: a[replica]) if replica is not None else (lambda a: a)
        prefix = numbers.get("prefix_init", torch.zeros((0, d), dtype=torch.float64))
        P = prefix.shape[0]
        sources = torch.cat([y, prefix])
        presence = numbers["presence"]
        source_presence = torch.cat([presence, torch.full((P,), spec.get("prefix_weight", 1.0), dtype=torch.float64)])
        positions = torch.arange(n, dtype=torch.float64)
        source_positions = torch.cat([positions, torch.arange(P, dtype=torch.float64) - P])
        delta = positions[:, None] - source_positions[None, :]
        log_term, multiplier = factor_terms(spec.get("aux_factor", "none"), delta, numbers)
        visible = torch.ones_like(delta, dtype=torch.bool)
        if spec.get("mask") == "causal":
            visible = source_positions[None, :] <= positions[:, None]
        if spec.get("mask") == "window":
            visible = delta.abs() <= spec["window"]
        shift = numbers["beta"] if spec.get("time_scale") == "rescaled" else 0.0
        gauge = spec.get("geometry") == "rope"
        transported = gauge and spec.get("values", "transported") == "transported"
        query, key = pick(numbers["attention/query"]), pick(numbers["attention/key"])
        value, output = pick(numbers["attention/value"]), pick(numbers["attention/output"])
        H, r, _ = query.shape
        rv = value.shape[1]
        field = torch.zeros((n, d), dtype=torch.float64)
        for h in range(H):
            q = sources @ query[h].T
            k = sources @ key[h].T
            if gauge:
                q, k = rope(q, source_positions, r), rope(k, source_positions, r)
            scores = numbers["beta"] * (q[:n] @ k.T)
            if spec.get("kernel") == "sinkhorn":
                weight = sinkhorn_plan(scores + log_term, source_presence, spec["sinkhorn_iterations"])
            else:
                weight = torch.where(visible, source_presence[None, :] * multiplier *
                                     torch.exp(scores - shift + log_term), torch.zeros_like(scores))
            o = output[:, h * rv:(h + 1) * rv]
            if transported:
                z = rope(sources, source_positions, d)
            else:
                z = sources @ value[h].T
            numerator = weight @ z
            if spec.get("kernel") == "sinkhorn":
                u_pre = numerator  # the plan's rows sum to 1
            elif spec.get("kernel") == "usa":
                u_pre = numerator / source_presence.sum()
            else:
                u_pre = numerator / (spec.get("eps_den", 0.0) + weight.sum(dim=1, keepdim=True))
            if transported:
                field = field + rope(u_pre, positions, d, transpose=True) @ (o @ value[h]).T
            else:
                field = field + u_pre @ o.T
        if "mlp/w1" in numbers:
            act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "tanh": torch.tanh}[spec.get("mlp_activation", "relu")]
            hidden = act(y @ pick(numbers["mlp/w1"]).T + pick(numbers["mlp/b1"]))
            field = field + hidden @ pick(numbers["mlp/w2"]).T + pick(numbers["mlp/b2"])
        return presence[:, None] * field

    def velocity(self, x, numbers, replica=None):
        placement = self.spec.get("normalization", "post")
        read = direction(x) if placement in ("pre", "peri") else x
        pu = self.layer_output(read, numbers, replica)
        p = numbers["presence"][:, None]
        if placement in ("pre", "none"):
            return pu
        if placement == "post":
            return pu - (x * pu).sum(dim=1, keepdim=True) * x
        safe = torch.where(pu.norm(dim=1, keepdim=True) > 0, pu, torch.ones_like(pu))
        unit = torch.where(pu.norm(dim=1, keepdim=True) > 0, direction(safe), torch.zeros_like(pu))
        if placement == "peri":
            return p * unit
        alpha = self.spec.get("ngpt_alpha", 1.0)
        return alpha * p * (unit - (x * unit).sum(dim=1, keepdim=True) * x)

    def field(self, x, numbers, replicas):
        if x.dim() == 2:
            return self.velocity(x, numbers)
        per_replica = self.spec.get("matrices") == "per-replica"
        return torch.stack([self.velocity(x[r], numbers, r if per_replica else None) for r in range(replicas)])


# ---- the cases: every term of docs/model.md section 2e's list ----

def presence_of(amplitudes, nulls, tau=1.0):
    a = np.asarray(amplitudes, dtype=float)
    return np.concatenate([a * a / (tau + a * a), np.zeros(nulls)])


CASES = {
    "sa-identity": dict(n=9, d=3, kernel="sa", beta=2.0),
    "usa-rope-prefix-causal-rescaled": dict(n=8, d=4, kernel="usa", beta=1.5, q="gaussian", k="gaussian", v="gaussian",
                                            geometry="rope", prefix=2, mask="causal", time_scale="rescaled"),
    "sa-layer-plain-distance-nulls": dict(n=8, d=4, kernel="sa", heads=2, head_dim=2, mlp=3, mlp_activation="gelu",
                                          q="gaussian", k="gaussian", v="gaussian", values="plain", geometry="rope",
                                          aux_factor="distance", aux_lambda=0.3, null_tokens=2,
                                          amplitudes=[1.0, 2.0, 0.5, 1.5, 1.0, 3.0, 0.7, 1.2]),
    "usa-toeplitz-per-replica": dict(n=7, d=3, kernel="usa", q="gaussian", k="gaussian", v="gaussian", values="plain",
                                     aux_factor="toeplitz", toeplitz_coefficients=[1.0, 0.4],
                                     toeplitz_frequencies=[0.3, 0.8], matrices="per-replica", replicas=2),
    "sa-gaussian-window-peri": dict(n=8, d=4, kernel="sa", q="gaussian", k="gaussian", v="gaussian",
                                    aux_factor="gaussian", aux_sigma=2.0, mask="window", window=4.0,
                                    normalization="peri", eps_den=1e-3),
    "sa-ngpt-power-tanh": dict(n=8, d=4, kernel="sa", heads=2, mlp=4, mlp_activation="tanh", q="gaussian",
                               k="gaussian", v="gaussian", aux_factor="power", aux_power=0.7, aux_power_scale=1.3,
                               normalization="ngpt", ngpt_alpha=0.6),
    "sa-pre-cauchy-relu-transported": dict(n=8, d=4, kernel="sa", heads=2, head_dim=2, mlp=3, q="gaussian",
                                           k="gaussian", v="gaussian", geometry="rope", aux_factor="cauchy",
                                           aux_gamma=1.7, normalization="pre", prefix=1),
    "sinkhorn-prefix-rope-gaussian": dict(n=8, d=4, kernel="sinkhorn", sinkhorn_iterations=4, sinkhorn_tol=0,
                                          q="gaussian", k="gaussian", v="gaussian", geometry="rope", prefix=2,
                                          aux_factor="gaussian", aux_sigma=3.0,
                                          amplitudes=[1.0, 2.0, 0.5, 1.5, 1.0, 3.0, 0.7, 1.2]),
    "sinkhorn-layer-pre": dict(n=7, d=4, kernel="sinkhorn", sinkhorn_iterations=3, sinkhorn_tol=0, heads=2,
                               head_dim=2, mlp=3, q="gaussian", k="gaussian", v="gaussian", beta=2.0,
                               normalization="pre"),
    # od = 6: the CPU lanes' wide path (their value sums as small GEMMs).
    "sa-wide-heads-prefix-causal": dict(n=9, d=6, kernel="sa", heads=2, head_dim=3, q="gaussian", k="gaussian",
                                        v="gaussian", values="plain", prefix=2, mask="causal",
                                        aux_factor="gaussian", aux_sigma=2.0),
    "usa-none-cosine": dict(n=8, d=3, kernel="usa", beta=0.5, q="gaussian", k="gaussian", v="plus-qk",
                            aux_factor="cosine", aux_omega=0.4, normalization="none"),
    # n > 256: the layer adds its heads' contents' cotangents and output tangents 256 rows at a
    # time, so the moving rows split and the prefix rows come in the second block (values that
    # are the contents; transported values).
    "sa-identity-prefix-two-row-blocks": dict(n=300, d=3, kernel="sa", beta=2.0, prefix=2),
    "sa-transported-heads-prefix-two-row-blocks": dict(n=300, d=4, kernel="sa", heads=2, head_dim=2,
                                                       q="gaussian", k="gaussian", v="gaussian",
                                                       geometry="rope", prefix=2),
}


def state(model, spec, seed):
    rng = np.random.default_rng(seed)
    shape = (spec["replicas"], model.n, model.d) if spec.get("replicas", 1) > 1 else (model.n, model.d)
    x = rng.standard_normal(shape)
    if spec.get("normalization", "post") in ON_SPHERE:
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return x, rng


def tangent_on(x, t, spec):
    if spec.get("normalization", "post") in ON_SPHERE:
        return t - np.sum(t * x, axis=-1, keepdims=True) * x
    return t


def oracle_numbers(model, spec, gradient):
    """The model's numbers as tensors under the vjp's keys: weights from model.weights(), the
    others from the options (the prefix is drawn by mfattn and given back as a file here)."""
    numbers = {k: torch.tensor(v, dtype=torch.float64) for k, v in model.weights().items()}
    numbers["beta"] = torch.tensor(float(spec.get("beta", 1.0)), dtype=torch.float64)
    nulls = spec.get("null_tokens", 0)
    # Without amplitudes every token weighs 1 (docs/model.md section 1); a_i gives a_i^2 / (tau + a_i^2).
    presence = presence_of(spec["amplitudes"], nulls) if "amplitudes" in spec else np.r_[np.ones(model.n - nulls), np.zeros(nulls)]
    numbers["presence"] = torch.tensor(presence)
    for key in gradient:
        if key.startswith("aux_") or key.startswith("toeplitz_"):
            numbers[key] = torch.tensor(np.asarray(spec[key], dtype=float), dtype=torch.float64)
    if "prefix_init" in gradient:
        numbers["prefix_init"] = torch.tensor(spec["prefix_init"], dtype=torch.float64)
    return numbers


def build(mfattn, name, backend):
    spec = dict(CASES[name])
    if spec.get("prefix"):
        rng = np.random.default_rng(7)
        y = rng.standard_normal((spec["prefix"], spec["d"]))
        spec["prefix_init"] = y / np.linalg.norm(y, axis=1, keepdims=True)
    options = {k: v for k, v in spec.items() if k not in ("replicas",)}
    if spec.get("replicas", 1) > 1:
        options["replicas"] = spec["replicas"]
    return mfattn.Model(backend=backend, threads=1, **options), spec


def relative(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    scale = np.linalg.norm(b)
    return np.linalg.norm(a - b) / scale if scale > 0 else np.linalg.norm(a)


def expect_autograd_gradients(gradient, objective, state, leaves, tolerance):
    """Asserts that mfattn's `gradient` (a dict) is autograd's of `objective` with respect to
    state = (its key, tensor) and every leaf (a null token's presence, a label, has none), each
    within `tolerance` norm-wise relative; returns autograd's."""
    key, tensor = state
    keys = sorted(leaves)
    grads = torch.autograd.grad(objective, [tensor] + [leaves[k] for k in keys], allow_unused=True)
    expected = {key: grads[0].numpy()}
    for k, g in zip(keys, grads[1:]):
        expected[k] = np.zeros(tuple(leaves[k].shape)) if g is None else g.numpy()
    expected["presence"][leaves["presence"].detach().numpy() == 0] = 0
    assert sorted(gradient) == sorted(expected)
    for k in expected:
        assert relative(gradient[k], expected[k]) < tolerance, k
    return expected


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_vjp_and_jvp_are_autograd_of_the_formula(mfattn, name, backend):
    model, spec = build(mfattn, name, backend)
    x, rng = state(model, spec, 1)
    w = rng.standard_normal(x.shape)
    gradient = model.vjp(x, w)
    numbers = oracle_numbers(model, spec, gradient)
    oracle = Oracle(spec)
    replicas = x.shape[0] if x.ndim == 3 else 1
    xt = torch.tensor(x, requires_grad=True)
    leaves = {k: v.clone().requires_grad_(True) for k, v in numbers.items()}
    v = oracle.field(xt, leaves, replicas)
    # The oracle is the field: its forward values are mfattn's velocity.
    assert relative(model.velocity(x), v.detach().numpy()) < 1e-12
    keys = sorted(leaves)
    expected = expect_autograd_gradients(gradient, (v * torch.tensor(w)).sum(), ("x", xt), leaves, 1e-12)
    # The JVP along x's tangent and every number's, against autograd's (double backward).
    t = tangent_on(x, rng.standard_normal(x.shape), spec)
    tangents = {k: rng.standard_normal(np.shape(expected[k])) for k in keys}
    jvp = model.jvp(x, t, {k: tangents[k] for k in keys})
    _, expected_jvp = torch.autograd.functional.jvp(
        lambda xx, *vals: oracle.field(xx, dict(zip(keys, vals)), replicas),
        (torch.tensor(x),) + tuple(numbers[k] for k in keys),
        (torch.tensor(t),) + tuple(torch.tensor(np.where(numbers["presence"].numpy() == 0, 0, tangents[k])
                                                if k == "presence" else tangents[k]) for k in keys))
    assert relative(jvp, expected_jvp.numpy()) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_model_that_took_derivatives_elsewhere_gives_the_same_bits(mfattn, name, backend):
    """A model keeps its derivatives' arrays from call to call (the forward pass refills them):
    after a VJP and a JVP at one state, those at another are a fresh model's to the bit."""
    model, spec = build(mfattn, name, backend)
    x1, rng = state(model, spec, 11)
    x2, _ = state(model, spec, 12)
    w1, w2 = rng.standard_normal(x1.shape), rng.standard_normal(x1.shape)
    t1, t2 = tangent_on(x1, rng.standard_normal(x1.shape), spec), tangent_on(x2, rng.standard_normal(x2.shape), spec)
    model.vjp(x1, w1)
    gradient = model.vjp(x2, w2)
    model.jvp(x1, t1)
    tangents = {k: rng.standard_normal(np.shape(v)) for k, v in gradient.items() if k != "x"}
    jvp = model.jvp(x2, t2, tangents)
    fresh, _ = build(mfattn, name, backend)
    expected = fresh.vjp(x2, w2)
    for key in expected:
        assert np.array_equal(np.asarray(gradient[key]), np.asarray(expected[key])), key
    fresh, _ = build(mfattn, name, backend)
    assert np.array_equal(jvp, fresh.jvp(x2, t2, tangents))


def test_replica_counts_in_turn_give_a_fresh_models_bits(mfattn):
    """Stacked states of 2 replicas, then one state, then 3: each VJP a fresh model's."""
    options = dict(n=40, d=4, kernel="sa", heads=2, q="gaussian", k="gaussian", v="gaussian", prefix=1)
    model = mfattn.Model(**options)
    rng = np.random.default_rng(13)
    for shape in [(2, 40, 4), (40, 4), (3, 40, 4), (40, 4)]:
        x = rng.standard_normal(shape)
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        w = rng.standard_normal(shape)
        got, expected = model.vjp(x, w), mfattn.Model(**options).vjp(x, w)
        for key in expected:
            assert np.array_equal(np.asarray(got[key]), np.asarray(expected[key])), (shape, key)


@pytest.mark.parametrize("name", sorted(CASES))
def test_jvp_is_the_central_difference_of_velocity(mfattn, name):
    model, spec = build(mfattn, name, "cpu")
    x, rng = state(model, spec, 2)
    t = tangent_on(x, rng.standard_normal(x.shape), spec)
    h = 1e-5
    if spec.get("normalization", "post") in ON_SPHERE:
        moved = lambda s: (x + s * t) / np.linalg.norm(x + s * t, axis=-1, keepdims=True)
    else:
        moved = lambda s: x + s * t
    difference = (model.velocity(moved(h)) - model.velocity(moved(-h))) / (2 * h)
    assert relative(model.jvp(x, t), difference) < 1e-7


@pytest.mark.parametrize("name", sorted(CASES))
def test_adjoint_identity(mfattn, name):
    model, spec = build(mfattn, name, "cpu")
    x, rng = state(model, spec, 3)
    t, w = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    jt = model.jvp(x, t)
    jtw = model.vjp(x, w)["x"]
    assert abs(np.sum(w * jt) - np.sum(jtw * t)) <= 1e-13 * np.linalg.norm(w) * np.linalg.norm(jt)


def test_null_tokens_and_threads_change_no_bit(mfattn):
    # eps_den given: its default (auto) turns on with null tokens.
    options = dict(d=4, kernel="sa", heads=2, mlp=3, q="gaussian", k="gaussian", v="gaussian", geometry="rope",
                   eps_den=1e-12)
    x, _ = state(mfattn.Model(n=8, **options), dict(n=8), 4)
    w = np.random.default_rng(5).standard_normal(x.shape)
    alone = mfattn.Model(n=8, **options).vjp(x, w)
    padded_model = mfattn.Model(n=8, null_tokens=3, **options)
    rng = np.random.default_rng(6)
    extra = rng.standard_normal((3, 4))
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    padded = padded_model.vjp(np.vstack([x, extra]), np.vstack([w, rng.standard_normal((3, 4))]))
    assert np.array_equal(padded["x"][:8], alone["x"])
    assert np.array_equal(padded["x"][8:], np.zeros((3, 4)))
    for key in alone:
        if key not in ("x", "presence"):
            assert np.array_equal(np.asarray(padded[key]), np.asarray(alone[key])), key
    assert np.array_equal(padded["presence"][:8], alone["presence"])
    one = mfattn.Model(n=8, **options).vjp(x, w, threads=1)
    two = mfattn.Model(n=8, **options).vjp(x, w, threads=2)
    for key in one:
        assert np.array_equal(np.asarray(one[key]), np.asarray(two[key])), key


def test_null_tokens_past_a_tile_and_a_team_change_no_bit(mfattn):
    """At n = 600 the CPU lanes take a team and several source tiles; 70 null tokens more fill
    the last tile further and add receivers: no bit of the others' VJP or JVP moves."""
    options = dict(d=3, kernel="usa", q="gaussian", k="gaussian", v="gaussian", beta=2.0, prefix=2)
    n, extra = 600, 70
    rng = np.random.default_rng(8)
    x = rng.standard_normal((n + extra, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w, t = rng.standard_normal((n + extra, 3)), rng.standard_normal((n + extra, 3))
    alone, padded = mfattn.Model(n=n, **options), mfattn.Model(n=n, null_tokens=extra, **options)
    a, b = alone.vjp(x[:n], w[:n]), padded.vjp(x, w)
    assert np.array_equal(b["x"][:n], a["x"]) and np.array_equal(b["presence"][:n], a["presence"])
    for key in a:
        if key not in ("x", "presence"):
            assert np.array_equal(np.asarray(b[key]), np.asarray(a[key])), key
    assert np.array_equal(padded.jvp(x, t)[:n], alone.jvp(x[:n], t[:n]))


def test_bad_input_is_named(mfattn):
    model = mfattn.Model(n=5, d=3, kernel="sa")
    x, _ = state(model, dict(n=5), 8)
    with pytest.raises(ValueError, match="cotangent: shape"):
        model.vjp(x, np.zeros((5, 4)))
    with pytest.raises(ValueError, match="tangent: element 2 is not finite"):
        bad = np.zeros_like(x)
        bad.flat[2] = np.nan
        model.jvp(x, bad)
    with pytest.raises(TypeError, match="cotangent"):
        model.vjp(x, np.zeros(x.shape, dtype=complex))
    with pytest.raises(ValueError, match=r"weight_tangents: unknown key 'attention/bias'"):
        model.jvp(x, x * 0, {"attention/bias": np.zeros(3)})
    with pytest.raises(ValueError, match=r'weight_tangents\["attention/query"\]: shape \(3, 3\); expected \(1, 3, 3\)'):
        model.jvp(x, x * 0, {"attention/query": np.zeros((3, 3))})
    # The registry's refusals (cuda: none; tests/unit/test_capabilities.cpp) reach Python as
    # ValueError: the mean-field quadrature's unit-speed receivers are refused by every backend.
    with pytest.raises(ValueError, match="layer: 1"):
        model.vjp(x, x, layer=1)


def test_weights_are_the_layout_of_the_weights_file(mfattn):
    model = mfattn.Model(n=6, d=4, heads=2, head_dim=2, mlp=3, q="gaussian", k="gaussian", v="gaussian")
    weights = model.weights()
    assert weights["attention/query"].shape == (2, 2, 4)
    assert weights["attention/value"].shape == (2, 4, 4)  # the presets keep a d x d value, output I
    assert np.array_equal(weights["attention/output"], np.hstack([np.eye(4), np.eye(4)]))
    assert weights["mlp/w1"].shape == (3, 4) and weights["mlp/b2"].shape == (4,)
    square = mfattn.Model(n=6, d=3, v="gaussian").weights()
    assert np.array_equal(square["attention/query"][0], np.eye(3))
    assert np.array_equal(square["attention/output"], np.eye(3))
    assert not np.array_equal(square["attention/value"][0], np.eye(3))


def test_weights_dict_makes_the_same_model(mfattn):
    options = dict(n=8, d=4, heads=2, head_dim=2, mlp=3, mlp_activation="gelu", geometry="rope")
    model = mfattn.Model(q="gaussian", k="gaussian", v="gaussian", **options)
    again = mfattn.Model(weights=model.weights(), **options)
    x, _ = state(model, dict(n=8), 9)
    assert relative(again.velocity(x), model.velocity(x)) < 1e-15
    assert "weights=<dict of 8>" in repr(again)
    square = mfattn.Model(n=8, d=4, v="gaussian")
    assert relative(mfattn.Model(n=8, d=4, weights=square.weights()).velocity(x), square.velocity(x)) < 1e-15
    weights = model.weights()
    with pytest.raises(ValueError, match="weights: unknown key 'attention/bias'"):
        mfattn.Model(weights=dict(weights, **{"attention/bias": np.zeros(3)}), **options)
    with pytest.raises(ValueError, match="/attention/value is missing"):
        mfattn.Model(weights={k: v for k, v in weights.items() if k != "attention/value"}, **options)
    with pytest.raises(ValueError, match=r"/mlp/w1 is \[3, 5\]; expected \[3, 4\]"):
        mfattn.Model(weights=dict(weights, **{"mlp/w1": np.zeros((3, 5))}), **options)
    with pytest.raises(ValueError, match=r'weights\["mlp/b1"\]: element 1 is not finite'):
        mfattn.Model(weights=dict(weights, **{"mlp/b1": np.array([0, np.inf, 0])}), **options)


def test_torch_velocity_passes_gradcheck(mfattn):
    import mfattn.torch as mt
    model = mfattn.Model(n=5, d=3, kernel="sa", heads=1, mlp=2, mlp_activation="tanh", q="gaussian", k="gaussian",
                         v="gaussian", normalization="pre", backend="reference")
    x = torch.tensor(np.random.default_rng(10).standard_normal((5, 3)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda xx: mt.velocity(xx, model), (x,), eps=1e-6, atol=1e-8)
    weights = {k: torch.tensor(v, requires_grad=True) for k, v in model.weights().items() if k in ("attention/query", "mlp/w2")}
    keys = sorted(weights)
    assert torch.autograd.gradcheck(lambda xx, *w: mt.velocity(xx, model, dict(zip(keys, w))),
                                    (x,) + tuple(weights[k] for k in keys), eps=1e-6, atol=1e-8)
    # On the sphere (post) the field's ambient derivative, moved off the sphere by less than
    # velocity's 1e-6 check.
    on_sphere = mfattn.Model(n=5, d=3, kernel="usa", q="gaussian", k="gaussian", v="gaussian", geometry="rope")
    y = np.random.default_rng(11).standard_normal((5, 3))
    y = torch.tensor(y / np.linalg.norm(y, axis=1, keepdims=True), requires_grad=True)
    assert torch.autograd.gradcheck(lambda yy: mt.velocity(yy, on_sphere), (y,), eps=1e-7, atol=1e-7)
    with pytest.raises(ValueError, match="weights: unknown key 'attention/bias'"):
        mt.velocity(x, model, {"attention/bias": torch.zeros(3)})


def test_layer_picks_the_weights_in_force(mfattn):
    options = dict(n=6, d=4, heads=2, head_dim=2, kernel="sa")
    rng = np.random.default_rng(12)
    layers = {"attention/query": rng.standard_normal((2, 2, 2, 4)), "attention/key": rng.standard_normal((2, 2, 2, 4)),
              "attention/value": rng.standard_normal((2, 2, 2, 4)), "attention/output": rng.standard_normal((2, 4, 4))}
    layered = mfattn.Model(weights=layers, layer_time=1.0, horizon=2.0, **options)
    assert {k: v.shape for k, v in layered.weights().items()} == {k: v.shape for k, v in layers.items()}
    second = mfattn.Model(weights={k: v[1] for k, v in layers.items()}, **options)
    x, _ = state(second, dict(n=6), 13)
    w = rng.standard_normal(x.shape)
    ours, theirs = layered.vjp(x, w, layer=1), second.vjp(x, w)
    for key in theirs:
        assert np.array_equal(np.asarray(ours[key]), np.asarray(theirs[key])), key
    assert np.array_equal(layered.weights(layer=1)["attention/key"], layers["attention/key"][1])
    with pytest.raises(ValueError, match=r"layer: 2 \(this model has 2 layers: 0 to 1\)"):
        layered.jvp(x, x, layer=2)


def test_sa_at_a_large_beta_is_finite_and_the_same_in_either_time_scale(mfattn):
    # SA does not depend on the time scale (no eps_den): neither do its derivatives, also where
    # exp(beta s) overflows double in natural time (beta = 800). The cpu backend: the reference
    # backend's own forward sums exp(beta s) literally and overflows there.
    options = dict(n=7, d=3, kernel="sa", beta=800.0, q="gaussian", k="gaussian", v="gaussian", backend="cpu")
    natural, rescaled = mfattn.Model(**options), mfattn.Model(time_scale="rescaled", **options)
    x, rng = state(natural, dict(n=7), 14)
    w, t = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    a, b = natural.vjp(x, w), rescaled.vjp(x, w)
    for key in a:
        assert np.all(np.isfinite(a[key])), key
        assert relative(a[key], b[key]) < 1e-9, key
    assert relative(natural.jvp(x, t), rescaled.jvp(x, t)) < 1e-9


def test_sa_at_a_large_beta_with_a_factor_is_the_difference_of_velocity(mfattn):
    # The offset holds the factor's log-term: a pair of high score and very negative log-term
    # must not become inf * 0.
    options = dict(n=12, d=3, kernel="sa", beta=800.0, q="gaussian", k="gaussian", v="gaussian",
                   aux_factor="gaussian", aux_sigma=0.2, seed=3)
    for time_scale in ("natural", "rescaled"):
        model = mfattn.Model(time_scale=time_scale, **options)
        x, rng = state(model, dict(n=12), 3)
        t = tangent_on(x, rng.standard_normal(x.shape), {})
        h = 1e-7
        moved = lambda s: (x + s * t) / np.linalg.norm(x + s * t, axis=-1, keepdims=True)  # noqa: E731
        difference = (model.velocity(moved(h)) - model.velocity(moved(-h))) / (2 * h)
        assert relative(model.jvp(x, t), difference) < 1e-6, time_scale


def test_beta_derivative_in_rescaled_time_holds_at_beta_zero(mfattn):
    # l = beta (s - 1) in rescaled time: d/dbeta is s - 1 at beta = 0 too.
    options = dict(n=6, d=3, kernel="usa", time_scale="rescaled", q="gaussian", k="gaussian", v="gaussian")
    model = mfattn.Model(beta=0.0, **options)
    x, rng = state(model, dict(n=6), 15)
    h = 1e-4
    f = [mfattn.Model(beta=b, **options).velocity(x) for b in (0.0, h, 2 * h)]
    difference = (-3 * f[0] + 4 * f[1] - f[2]) / (2 * h)
    assert relative(model.jvp(x, np.zeros_like(x), {"beta": 1.0}), difference) < 1e-6
    w = rng.standard_normal(x.shape)
    assert model.vjp(x, w)["beta"] == pytest.approx(np.sum(w * difference), rel=1e-6)


def test_torch_velocity_refuses_weights_of_a_layered_model(mfattn):
    import mfattn.torch as mt
    rng = np.random.default_rng(16)
    layers = {k: rng.standard_normal(s) for k, s in (("attention/query", (2, 1, 3, 3)), ("attention/key", (2, 1, 3, 3)),
                                                      ("attention/value", (2, 1, 3, 3)), ("attention/output", (2, 3, 3)))}
    model = mfattn.Model(n=4, d=3, weights=layers, layer_time=1.0, horizon=2.0)
    x = torch.tensor(state(model, dict(n=4), 17)[0])
    with pytest.raises(ValueError, match="weights: a model of several layers"):
        mt.velocity(x, model, {"attention/query": torch.zeros(2, 1, 3, 3)})
