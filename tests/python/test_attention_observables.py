"""--observables default+attention (docs/model.md section 6, "Attention statistics"): each
head's plan entropy, largest weight and participation, their mean, min and max over the
receivers, against NumPy written here from the formula (1e-12) through heads, a causal mask,
null tokens, replicas, a prefix, the pre placement and Sinkhorn's plan; the exact values at beta = 0; nothing
extra when not asked; and the refusals."""
from __future__ import annotations

import subprocess

import h5py
import numpy as np
import pytest

STATISTICS = ("entropy", "largest_weight", "participation")


def plans(x, sources, presence, query, key, beta, visible, sinkhorn=False):
    """Each receiver's normalised plan over the sources (rows: receivers x, columns: sources),
    of one head: P_ij proportional to p_j exp(beta <Q x_i, K y_j>) where visible; with
    sinkhorn, the plan scaled to rows 1 and columns c_j = R p_j / M_J (docs/model.md section
    2d), in log space until nothing changes."""
    logits = beta * (x @ query.T) @ (sources @ key.T).T
    logits = np.where(visible & (presence > 0)[None, :], logits + np.log(np.where(presence > 0, presence, 1.0)),
                      -np.inf)
    seen = np.isfinite(logits).any(axis=1)
    logits = logits[seen]
    if sinkhorn:
        from scipy.special import logsumexp
        seen_sources = np.isfinite(logits).any(axis=0)
        log_target = np.log(len(logits) * presence[seen_sources] / presence[seen_sources].sum())
        columns = logits[:, seen_sources]
        g = np.zeros(columns.shape[1])
        for _ in range(20000):
            f = -logsumexp(columns + g[None, :], axis=1)
            new_g = log_target - logsumexp(f[:, None] + columns, axis=0)
            if np.array_equal(new_g, g):
                break
            g = new_g
        logits = columns + g[None, :]
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True)


def summaries(p):
    safe = np.where(p > 0, p, 1.0)
    values = {"entropy": -(p * np.log(safe)).sum(axis=1), "largest_weight": p.max(axis=1),
              "participation": 1 / (p ** 2).sum(axis=1)}
    return {f"attention_{name}_{of}": getattr(np, of)(v) for name, v in values.items() for of in ("mean", "min", "max")}


CASES = {
    "sa-heads-causal-nulls-replicas": dict(n=12, d=4, kernel="sa", heads=2, head_dim=2, q="gaussian", k="gaussian",
                                           v="gaussian", beta=1.3, mask="causal", null_tokens=1, replicas=2),
    "usa-prefix": dict(n=10, d=3, kernel="usa", q="gaussian", k="gaussian", beta=2.0, prefix=2, prefix_weight=0.5),
    "sa-pre-placement": dict(n=10, d=3, kernel="sa", normalization="pre", q="gaussian", k="gaussian", beta=-1.5),
    "sinkhorn-heads-nulls": dict(n=10, d=4, kernel="sinkhorn", heads=2, head_dim=2, q="gaussian", k="gaussian",
                                 beta=1.2, null_tokens=1, sinkhorn_iterations=2000, sinkhorn_tol=0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_series_are_the_formula_in_numpy(mfattn, tmp_path, name):
    options = dict(CASES[name], horizon=0.4, save_every=0.2, seed=3, observables="default+attention")
    trajectory = mfattn.run(out=str(tmp_path / "run.h5"), **options)
    model = mfattn.Model(**{k: v for k, v in options.items() if k not in ("horizon", "save_every", "observables")})
    weights = model.weights()
    queries = weights.get("attention/query", np.eye(model.d)[None])
    keys = weights.get("attention/key", np.eye(model.d)[None])
    queries, keys = queries.reshape(-1, queries.shape[-2], model.d), keys.reshape(-1, keys.shape[-2], model.d)
    replicas = options.get("replicas", 1)
    n = options["n"] + options.get("null_tokens", 0)
    presence = np.r_[np.ones(options["n"]), np.zeros(options.get("null_tokens", 0))]
    with h5py.File(tmp_path / "run.h5", "r") as f:
        prefix = f["particles/prefix/position"][()] if "prefix" in f["particles"] else np.zeros((0, model.d))
        prefix_presence = f["particles/prefix/presence"][()] if "prefix" in f["particles"] else np.zeros(0)
        groups = ["particles/tokens"] + [f"particles/tokens_r{r}" for r in range(1, replicas)]
        positions = np.stack([f[g + "/position/value"][()] for g in groups], axis=1)  # [T, R, n, d]
    heads = queries.shape[0]
    # [T], with a replica axis for replicas and a head axis for heads (output.md).
    shape = (positions.shape[0],) + ((replicas,) if replicas > 1 else ()) + ((heads,) if heads > 1 else ())
    for series in (f"attention_{s}_{of}" for s in STATISTICS for of in ("mean", "min", "max")):
        assert np.asarray(trajectory.observables[series]).shape == shape, series
    for t in range(positions.shape[0]):
        for r in range(replicas):
            x = positions[t, r]
            if options.get("normalization") == "pre":
                x = x / np.linalg.norm(x, axis=1, keepdims=True)
            sources = np.r_[x, prefix]
            source_presence = np.r_[presence, prefix_presence]
            visible = np.ones((n, len(sources)), dtype=bool)
            if options.get("mask") == "causal":
                visible[:, :n] = np.tril(np.ones((n, n), dtype=bool))
            receivers = presence > 0
            for h in range(heads):
                p = plans(x[receivers], sources, source_presence, queries[h], keys[h], options["beta"], visible[receivers],
                          sinkhorn=options["kernel"] == "sinkhorn")
                for key, expected in summaries(p).items():
                    got = np.asarray(trajectory.observables[key]).reshape(positions.shape[0], replicas, heads)[t, r, h]
                    assert got == pytest.approx(expected, rel=1e-12, abs=1e-14), (key, t, r, h)


def test_beta_zero_weighs_every_visible_source_alike(mfattn, tmp_path):
    """Causal, beta = 0: receiver i sees i + 1 sources, so its entropy is log(i + 1), its
    participation i + 1 and its largest weight 1 / (i + 1)."""
    n = 9
    run = mfattn.run(out=str(tmp_path / "run.h5"), n=n, d=3, kernel="sa", beta=0.0, mask="causal", horizon=0.2,
                     save_every=0.1, observables="default+attention")
    seen = np.arange(1, n + 1)
    o = run.observables
    np.testing.assert_allclose(o["attention_entropy_mean"], np.mean(np.log(seen)), rtol=1e-14)
    np.testing.assert_allclose(o["attention_entropy_min"], 0.0, atol=1e-15)
    np.testing.assert_allclose(o["attention_entropy_max"], np.log(n), rtol=1e-14)
    np.testing.assert_allclose(o["attention_participation_mean"], np.mean(seen), rtol=1e-14)
    np.testing.assert_allclose(o["attention_largest_weight_min"], 1 / n, rtol=1e-14)
    np.testing.assert_allclose(o["attention_largest_weight_max"], 1.0, rtol=1e-14)


def test_nothing_extra_when_not_asked(mfattn, tmp_path):
    plain = mfattn.run(out=str(tmp_path / "a.h5"), n=6, d=3, horizon=0.1)
    asked = mfattn.run(out=str(tmp_path / "b.h5"), n=6, d=3, horizon=0.1, observables="default+attention")
    extra = set(asked.observables) - set(plain.observables)
    assert extra == {f"attention_{s}_{of}" for s in STATISTICS for of in ("mean", "min", "max")}
    for name, value in plain.observables.items():
        assert np.array_equal(value, asked.observables[name], equal_nan=True), name


@pytest.mark.parametrize("args, message", [
    (["--observables", "attention"], "--observables attention: needs default among its sets"),
    (["--observables", "default+default"], "--observables default+default: accepted: default, attention"),
    (["--observables", "everything"], "--observables everything: accepted: default, attention"),
    (["--observables", "default+attention", "--aux-factor", "toeplitz", "--toeplitz-coefficients", "1",
      "--toeplitz-frequencies", "0.5"], "its weights change sign"),
])
def test_refusals_are_one_line_and_exit_2(mfattn_binary, tmp_path, args, message):
    done = subprocess.run([str(mfattn_binary), "run", "--n", "5", *args, "--out", str(tmp_path / "x.h5")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("kernel, mask", [("sa", "causal"), ("sinkhorn", "full")])
def test_the_same_numbers_for_any_thread_count(mfattn, tmp_path, kernel, mask):
    options = dict(n=40, d=3, kernel=kernel, q="gaussian", k="gaussian", beta=3.0, horizon=0.2, save_every=0.1,
                   observables="default+attention", mask=mask)
    one = mfattn.run(out=str(tmp_path / "one.h5"), threads=1, **options)
    two = mfattn.run(out=str(tmp_path / "two.h5"), threads=2, **options)
    for name in one.observables:
        if name.startswith("attention_"):
            assert np.array_equal(one.observables[name], two.observables[name]), name
