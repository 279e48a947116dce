"""Model.attention (docs/python.md): the normalised plans against NumPy written here from the
formula (softmax of beta <Q x_i, K y_j> + log p_j over the visible sources; Sinkhorn's plan
scaled to convergence), through heads, a causal mask, prefix tokens, a null token and the pre
placement; USA's plan is SA's; the statistics of the returned plans are the observables'; and
the refusals."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp


def numpy_plan(x, sources, presence, query, key, beta, visible, sinkhorn=False):
    logits = beta * (x @ query.T) @ (sources @ key.T).T
    logits = np.where(visible & (presence > 0)[None, :], logits + np.log(np.where(presence > 0, presence, 1.0)),
                      -np.inf)
    if sinkhorn:
        rows = np.isfinite(logits).any(axis=1)
        columns = np.isfinite(logits[rows]).any(axis=0)
        log_target = np.log(rows.sum() * presence[columns] / presence[columns].sum())
        g = np.full(logits.shape[1], -np.inf)
        g[columns] = 0.0
        for _ in range(20000):
            f = -logsumexp(logits[rows] + g[None, :], axis=1)
            new = g.copy()
            new[columns] = log_target - logsumexp(f[:, None] + logits[rows][:, columns], axis=0)
            if np.array_equal(new, g):
                break
            g = new
        logits = logits + g[None, :]
    plan = np.zeros_like(logits)
    seen = np.isfinite(logits).any(axis=1)
    shifted = np.exp(logits[seen] - logits[seen].max(axis=1, keepdims=True))
    plan[seen] = shifted / shifted.sum(axis=1, keepdims=True)
    return plan


CASES = {
    "sa-heads-causal-prefix-null": dict(n=9, d=4, kernel="sa", heads=2, head_dim=2, q="gaussian", k="gaussian",
                                        v="gaussian", beta=1.7, mask="causal", prefix=2, null_tokens=1),
    "sa-pre-placement": dict(n=8, d=3, kernel="sa", normalization="pre", q="gaussian", k="gaussian", beta=-0.8),
    "sinkhorn-heads": dict(n=10, d=4, kernel="sinkhorn", heads=2, head_dim=2, q="gaussian", k="gaussian", beta=1.2,
                           sinkhorn_iterations=5000, sinkhorn_tol=0),
    "usa-causal-strict-distance": dict(n=7, d=3, kernel="usa", beta=2.0, mask="causal-strict",
                                       aux_factor="distance", aux_lambda=0.3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_plans_are_the_formula_in_numpy(mfattn, tmp_path, name):
    options = dict(CASES[name], seed=4)
    model = mfattn.Model(**options)
    x = model.initial_state()
    if options.get("normalization") == "pre":
        x = 1.7 * x
    plans = model.attention(x)
    weights = model.weights()
    queries = weights.get("attention/query", np.eye(model.d)[None]).reshape(-1, *weights.get(
        "attention/query", np.eye(model.d)[None]).shape[-2:])
    keys = weights.get("attention/key", np.eye(model.d)[None]).reshape(queries.shape[0], -1, model.d)
    n = options["n"] + options.get("null_tokens", 0)
    prefix_count = options.get("prefix", 0)
    assert plans.shape == (queries.shape[0], n, n + prefix_count)
    read = x / np.linalg.norm(x, axis=1, keepdims=True)
    presence = np.r_[np.ones(options["n"]), np.zeros(options.get("null_tokens", 0))]
    prefix = np.zeros((0, model.d))
    if prefix_count:
        run = mfattn.run(out=str(tmp_path / "run.h5"), horizon=0.01, dt=0.01, **options)
        prefix = np.asarray(run.prefix["position"])
    sources = np.r_[read, prefix]
    source_presence = np.r_[presence, np.ones(prefix_count)]
    visible = np.ones((n, n + prefix_count), dtype=bool)
    positions = np.arange(n)
    if options.get("mask") == "causal":
        visible[:, :n] = positions[None, :] <= positions[:, None]
    if options.get("mask") == "causal-strict":
        visible[:, :n] = positions[None, :] < positions[:, None]
    log_factor = np.zeros((n, n + prefix_count))
    if options.get("aux_factor") == "distance":
        log_factor[:, :n] = -options["aux_lambda"] * np.abs(positions[:, None] - positions[None, :])
    for h in range(queries.shape[0]):
        expected = numpy_plan(read, sources, source_presence, queries[h], keys[h], options["beta"], visible,
                              sinkhorn=options["kernel"] == "sinkhorn") if not log_factor.any() else None
        if expected is None:  # the factor enters the logits as log c_ij
            logits = options["beta"] * read @ read.T + log_factor
            logits = np.where(visible, logits, -np.inf)
            expected = np.zeros_like(logits)
            seen = np.isfinite(logits).any(axis=1)
            e = np.exp(logits[seen] - logits[seen].max(axis=1, keepdims=True))
            expected[seen] = e / e.sum(axis=1, keepdims=True)
        receivers = presence > 0
        expected[~receivers] = 0.0
        np.testing.assert_allclose(plans[h], expected, rtol=1e-12, atol=1e-15, err_msg=f"head {h}")
        assert np.array_equal(model.attention(x, head=h), plans[h])
        sums = plans[h].sum(axis=1)
        np.testing.assert_allclose(sums[receivers & expected.any(axis=1)], 1.0, rtol=1e-14)
    if options["mask"] if "mask" in options else False:
        if options["mask"] == "causal-strict":
            assert not plans[:, 0].any()  # token 0 sees no source


def test_usas_plan_is_sas_and_the_statistics_are_the_observables(mfattn, tmp_path):
    options = dict(n=12, d=3, q="gaussian", k="gaussian", beta=2.5, seed=2, replicas=2)
    usa, sa = mfattn.Model(kernel="usa", **options), mfattn.Model(kernel="sa", **options)
    x = usa.initial_state()
    np.testing.assert_allclose(usa.attention(x, replica=1), sa.attention(x, replica=1), rtol=1e-14, atol=1e-16)
    run = mfattn.run(out=str(tmp_path / "run.h5"), kernel="sa", horizon=0.1, save_every=0.1,
                     observables="default+attention", **options)
    for r in range(2):
        p = sa.attention(np.asarray(run.positions)[0], replica=r)[0]
        entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
        assert np.asarray(run.observables["attention_entropy_mean"])[0, r] == pytest.approx(entropy.mean(), rel=1e-12)
        assert np.asarray(run.observables["attention_largest_weight_max"])[0, r] == pytest.approx(p.max(), rel=1e-12)


def test_sinkhorns_plan_is_doubly_stochastic(mfattn):
    model = mfattn.Model(n=30, d=3, kernel="sinkhorn", beta=2.0, q="gaussian", k="gaussian", seed=6,
                         sinkhorn_tol=1e-13, sinkhorn_iterations=10000)
    plan = model.attention(model.initial_state(), head=0)
    np.testing.assert_allclose(plan.sum(axis=1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(plan.sum(axis=0), 1.0, atol=1e-12)


@pytest.mark.parametrize("call, message", [
    (lambda m, x: m.attention(x, head=2), "head: 2: the model has 1 head (accepted: 0 to 0, or None for every head)"),
    (lambda m, x: m.attention(x, replica=1), "replica: 1: x holds 1 replica (accepted: 0 to 0)"),
])
def test_bad_arguments_name_themselves(mfattn, call, message):
    model = mfattn.Model(n=5, d=3)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        call(model, model.initial_state())


def test_refused_for_a_sign_changing_factor_and_above_the_size_bound(mfattn):
    cosine = mfattn.Model(n=5, d=3, aux_factor="cosine")
    with pytest.raises(ValueError, match="aux_factor=cosine: its weights change sign"):
        cosine.attention(cosine.initial_state())
    big = mfattn.Model(n=12000, d=3)
    with pytest.raises(ValueError, match="exceed the 2\\^27 numbers"):
        big.attention(big.initial_state())


def test_trajectory_matrices_are_the_models_weights(mfattn, tmp_path):
    options = dict(n=6, d=3, q="gaussian", k="goe", v="gaussian", seed=8, replicas=2, matrices="per-replica")
    run = mfattn.run(out=str(tmp_path / "run.h5"), horizon=0.1, **options)
    weights = mfattn.Model(**options).weights()
    for r in range(2):
        matrices = run.matrices(replica=r)
        assert set(matrices) == {"query", "key", "value", "layer_start"}
        for name in ("query", "key", "value"):
            np.testing.assert_array_equal(matrices[name][0], weights[f"attention/{name}"][r][0])
    assert not np.array_equal(run.matrices(replica=0)["query"], run.matrices(replica=1)["query"])
    with pytest.raises(ValueError, match="matrices: replica 2: the file holds 2"):
        run.matrices(replica=2)
    with pytest.raises(ValueError, match="not read from a file"):
        mfattn.run(n=4, d=3, horizon=0.1).matrices()
