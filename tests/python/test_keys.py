"""`mfattn keys` (docs/cli.md, "mfattn keys"): one query against n keys. Its statistics
against NumPy written here from the formulas (1e-12), the exact facts at beta = 0 (entropy
log n, participation n, largest weight 1/n), the large-n limits on S^2 from the exact moments
E exp(beta <q, k>) = sinh(beta) / beta (within 3 standard errors), the same numbers for any
thread count and any list of n, O(1) memory at n = 1e7, and bad input: one line, exit 2,
nothing written."""
from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest


def keys(binary, *args, timeout=600):
    return subprocess.run([str(binary), "keys", *args], capture_output=True, text=True, timeout=timeout)


def read(path):
    with h5py.File(path, "r") as f:
        return {name: f["keys/samples/" + name][()] for name in f["keys/samples"]} | {
            "query": f["keys/query"][()], "n": f["keys/n"][()], "beta": f["keys/beta"][()],
            "mean": {name: f["keys/mean/" + name][()] for name in f["keys/mean"]},
            "error": {name: f["keys/standard_error/" + name][()] for name in f["keys/standard_error"]}}


def test_statistics_are_the_formulas_in_numpy(mfattn_binary, tmp_path):
    """Keys from a file, large and negative beta: every statistic of every sample against the
    plan written here with a log-sum-exp (no exponential overflows in either)."""
    rng = np.random.default_rng(4)
    k = rng.standard_normal((50, 4))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    np.savetxt(tmp_path / "keys.txt", k, fmt="%.17g")
    betas = [-2.0, 0.5, 30.0, 800.0]
    done = keys(mfattn_binary, "--d", "4", "--keys", str(tmp_path / "keys.txt"), "--beta", ",".join(map(str, betas)),
                "--samples", "3", "--top", "5", "--seed", "9", "--quiet", "--out", str(tmp_path / "k.h5"))
    assert done.returncode == 0, done.stderr
    got = read(tmp_path / "k.h5")
    assert list(got["n"]) == [50] and got["query"].shape == (3, 4)
    np.testing.assert_allclose(np.linalg.norm(got["query"], axis=1), 1.0, atol=1e-15)
    for s, q in enumerate(got["query"]):
        for b, beta in enumerate(betas):
            logits = beta * (k @ q)
            p = np.exp(logits - logits.max())
            p /= p.sum()
            o = p @ k
            expected = {"largest_weight": p.max(), "entropy": -(p * np.log(p, where=p > 0, out=np.zeros_like(p))).sum(),
                        "participation": 1 / (p ** 2).sum(), "output_norm": np.linalg.norm(o),
                        "output_along_query": o @ q}
            for name, value in expected.items():
                np.testing.assert_allclose(got[name][s, 0, b], value, rtol=1e-12, atol=1e-14, err_msg=(name, beta))
            np.testing.assert_allclose(got["top_weights"][s, 0, b], np.sort(p)[::-1][:5], rtol=1e-12, atol=1e-300)


def test_beta_zero_is_exact_and_large_n_meets_the_moments_on_s2(mfattn_binary, tmp_path):
    """beta = 0: P_j = 1/n. On S^2, <q, k> is uniform on [-1, 1]: E w = sinh(beta) / beta,
    E w^2 = sinh(2 beta) / (2 beta), E [s w] / E w = coth(beta) - 1/beta (the Langevin function),
    so as n grows the participation / n -> (E w)^2 / E w^2, the entropy - log n ->
    log E w - beta L(beta), and the output -> L(beta) q: within 3 standard errors at n = 1e5."""
    done = keys(mfattn_binary, "--d", "3", "--n", "1e3,1e5", "--beta", "0,1,5", "--samples", "48", "--seed", "2",
                "--out", str(tmp_path / "k.h5"))
    assert done.returncode == 0, done.stderr
    assert "| 100000 | 5 |" in done.stdout
    got = read(tmp_path / "k.h5")
    assert list(got["n"]) == [1000, 100000] and list(got["beta"]) == [0, 1, 5]
    for i, n in enumerate((1000, 100000)):
        np.testing.assert_allclose(got["entropy"][:, i, 0], np.log(n), rtol=1e-13)
        np.testing.assert_allclose(got["participation"][:, i, 0], n, rtol=1e-12)
        np.testing.assert_allclose(got["largest_weight"][:, i, 0], 1 / n, rtol=1e-12)
    mean, error = got["mean"], got["error"]
    n = 1e5
    for b, beta in ((1, 1.0), (2, 5.0)):
        ew, ew2 = np.sinh(beta) / beta, np.sinh(2 * beta) / (2 * beta)
        langevin = 1 / np.tanh(beta) - 1 / beta
        limits = {"participation": n * ew ** 2 / ew2, "entropy": np.log(n) + np.log(ew) - beta * langevin,
                  "output_along_query": langevin}
        for name, limit in limits.items():
            assert abs(mean[name][1, b] - limit) < 3 * error[name][1, b], (name, beta, mean[name][1, b], limit)
            assert error[name][1, b] > 0


def test_the_same_numbers_for_any_thread_count_and_list_of_n(mfattn_binary, tmp_path):
    common = ["--d", "5", "--beta", "2,-1", "--samples", "5", "--seed", "3", "--quiet"]
    one = keys(mfattn_binary, *common, "--n", "300", "--threads", "1", "--out", str(tmp_path / "one.h5"))
    two = keys(mfattn_binary, *common, "--n", "3000,300", "--threads", "2", "--out", str(tmp_path / "two.h5"))
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    a, b = read(tmp_path / "one.h5"), read(tmp_path / "two.h5")
    assert list(b["n"]) == [300, 3000]
    for name in ("largest_weight", "entropy", "participation", "output_norm", "output_along_query", "top_weights"):
        assert np.array_equal(a[name][:, 0], b[name][:, 0]), name
    assert np.array_equal(a["query"], b["query"])


def test_ten_million_keys_take_no_memory_of_their_own(mfattn_binary, tmp_path):
    """The keys are streamed: 1e7 keys (80 MB were they stored) in the process's own few MB,
    measured by a fresh Python whose only child is the run."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", code, str(mfattn_binary), "keys", "--d", "3", "--n", "1e7", "--beta",
                           "1", "--samples", "1", "--threads", "1", "--quiet", "--out", str(tmp_path / "k.h5")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) < 40_000  # kB


@pytest.mark.parametrize("args, message", [
    (["--d", "1", "--n", "10", "--beta", "1"], "--d 1: expected an integer in 2..64"),
    (["--n", "0", "--beta", "1"], "--n 0: expected whole numbers in 1..1e12"),
    (["--n", "1.5", "--beta", "1"], "--n 1.5: expected whole numbers in 1..1e12"),
    (["--n", "10", "--beta", "nan"], "--beta nan: expected 1 to 64 finite numbers"),
    (["--n", "10"], "--beta: required"),
    (["--n", "10", "--beta", "1", "--top", "17"], "--top 17: expected an integer in 1..16"),
    (["--n", "10", "--beta", "1", "--samples", "0"], "--samples 0: expected an integer in 1..1000000"),
    (["--n", "10", "--beta", "1", "--seed", "-1"], "--seed -1: expected an integer in 0..18446744073709551615"),
    (["--n", "10", "--beta", "1", "--keys", "{keys}"], "--n 10: not with --keys"),
    (["--beta", "1", "--keys", "{bad}"], "row 2 has norm 2, not 1"),
    (["--n", "10", "--beta", "1", "--normalize-keys"], "--normalize-keys: needs --keys FILE"),
    (["--beta", "1", "--keys", "{zero}", "--normalize-keys"], "row 2 is zero and cannot be normalised"),
    (["--n", "1,2,3,4", "--beta", "1,2,3,4,5", "--samples", "1000000"], "more than the 10000000 a report keeps"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(mfattn_binary, tmp_path, args, message):
    np.savetxt(tmp_path / "keys.txt", np.eye(3))
    np.savetxt(tmp_path / "bad.txt", [[1, 0, 0], [0, 2, 0]])
    np.savetxt(tmp_path / "zero.txt", [[1, 0, 0], [0, 0, 0]])
    args = [a.format(keys=tmp_path / "keys.txt", bad=tmp_path / "bad.txt", zero=tmp_path / "zero.txt") for a in args]
    done = keys(mfattn_binary, *args, "--out", str(tmp_path / "k.h5"))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "k.h5").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_existing_output_is_kept_without_overwrite(mfattn_binary, tmp_path):
    out = tmp_path / "k.h5"
    out.write_text("mine")
    done = keys(mfattn_binary, "--n", "10", "--beta", "1", "--out", str(out))
    assert done.returncode == 2 and "exists (give --overwrite to replace it)" in done.stderr
    assert out.read_text() == "mine"
    again = keys(mfattn_binary, "--n", "10", "--beta", "1", "--quiet", "--overwrite", "--out", str(out))
    assert again.returncode == 0 and h5py.is_hdf5(out)


def test_the_one_query_experiment_runs_quick(mfattn_binary, tmp_path):
    """experiments/attention/one_query.py --quick: its files and table."""
    import csv
    import os
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "experiments/attention/one_query.py"), "--quick", "--data",
                           str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, MFATTN_BINARY=str(mfattn_binary)))
    assert done.returncode == 0, done.stderr
    assert "| 3 | 1000 |" in done.stdout and "| 4 | 100 |" in done.stdout
    rows = list(csv.DictReader(open(tmp_path / "attention" / "one_query.csv")))
    assert len(rows) == 2 * 2 * 16
    # Far below the transition the plan spreads, far above it picks one key.
    first, last = rows[0], rows[15]
    assert float(first["largest_weight"]) < 0.05 and float(last["largest_weight"]) > 0.9
