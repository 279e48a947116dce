"""Sweep files with [derived] expressions and [zip] groups (docs/sweeps.md), through the binary.

The derived values that `mfattn sweep --dry-run` prints are compared bit for bit (as Python
float reprs) with the same formula evaluated by Python's float arithmetic and math module;
the case ids with the FNV-1a recipe of docs/sweeps.md, so files without the new sections keep
their ids."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy
import pytest

from conftest import REPO_ROOT

DEADLINE = 120.0


def reference_step(beta: float) -> float:
    """The USA step of the reference code of arXiv:2312.10794."""
    return 0.1 / max(math.sqrt(beta) * math.exp(beta - 0.5), 1)


def case_id(lines: list[str]) -> str:
    """docs/sweeps.md, "Case ids and files"."""
    h = 0xcbf29ce484222325
    for byte in "".join(line + "\n" for line in sorted(lines)).encode():
        h = ((h ^ byte) * 0x100000001b3) % 2**64
    return f"{h:016x}"


def dry_run(binary: Path, sweep: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), "sweep", "--dry-run", "--config", str(sweep),
                           "--out-dir", str(sweep.with_suffix(".out"))],
                          capture_output=True, text=True, timeout=DEADLINE)


def dry_run_cases(binary: Path, sweep: Path) -> list[tuple[str, dict[str, str]]]:
    """(case id, {name: value} of its axes and derived options, in printed order) per case."""
    done = dry_run(binary, sweep)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("mfattn sweep: "), lines[0]
    cases = []
    for index, line in enumerate(lines[1:]):
        words = line.split()
        assert words[0] == str(index) and words[2] == "missing", line
        cases.append((words[1], dict(word.split("=", 1) for word in words[3:])))
    return cases


def refused(binary: Path, sweep: Path) -> str:
    """The one stderr line of a sweep file that is refused (exit 2, nothing created)."""
    done = dry_run(binary, sweep)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert not sweep.with_suffix(".out").exists()
    run = subprocess.run([str(binary), "sweep", "--config", str(sweep), "--out-dir",
                          str(sweep.with_suffix(".out"))], capture_output=True, text=True,
                         timeout=DEADLINE)
    assert run.returncode == 2 and run.stderr == done.stderr and run.stdout == ""
    assert not sweep.with_suffix(".out").exists()
    return done.stderr.strip()


def shortest(x: float) -> str:
    """The C++ shortest round-trip text of the doubles used here (Python's repr, without a
    trailing ".0")."""
    text = repr(x)
    return text[:-2] if text.endswith(".0") else text


def cap_boundary() -> tuple[float, float]:
    """Adjacent doubles lo < hi around the cap sqrt(beta) e^(beta - 1/2) = 1 of the step, as
    Python evaluates it: below lo the step is 0.1, from hi on it is 0.1 / (the product)."""
    f = lambda b: math.sqrt(b) * math.exp(b - 0.5)  # noqa: E731
    lo, hi = 0.1, 2.0
    while math.nextafter(lo, math.inf) < hi:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            mid = math.nextafter(lo, math.inf)
        lo, hi = (mid, hi) if f(mid) < 1 else (lo, mid)
    assert f(lo) < 1 <= f(hi)
    return lo, hi


def test_reference_example_has_the_reference_step_and_zipped_seeds(mfattn_binary):
    cases = dry_run_cases(mfattn_binary, REPO_ROOT / "experiments/sweeps/reference_usa_step.ini")
    betas = [float(b) for b in numpy.linspace(0.1, 9, 10)]
    assert len(cases) == 10
    for k, (cid, values) in enumerate(cases):
        assert list(values) == ["beta", "seed", "dt"]
        assert float(values["beta"]) == betas[k] and values["seed"] == str(k)
        dt = float(values["dt"])
        assert repr(dt) == repr(reference_step(betas[k])), (values, reference_step(betas[k]))
        # The derived step is one more resolved parameter of the id (kernel usa is run's default).
        lines = ["n=32", "d=2", "horizon=1", "replicas=512", f"beta={shortest(betas[k])}",
                 f"dt={values['dt']}"] + ([f"seed={k}"] if k else [])
        assert cid == case_id(lines), values


def test_derived_step_matches_python_bit_for_bit_across_the_cap(mfattn_binary, tmp_path):
    lo, hi = cap_boundary()
    betas = [1e-3, 0.1, 0.5, math.nextafter(lo, 0), lo, hi, math.nextafter(hi, math.inf), 1.0,
             1.7, 2.5, 4.25, 7.3, 9.0, 12.0]
    sweep = tmp_path / "cap.ini"
    sweep.write_text("[base]\nn = 8\nd = 2\nhorizon = 1\n"
                     f"[axes]\nbeta = {' '.join(repr(b) for b in betas)}\n"
                     "[derived]\ndt = 0.1 / max(sqrt(beta) * exp(beta - 0.5), 1)\n")
    cases = dry_run_cases(mfattn_binary, sweep)
    assert len(cases) == len(betas)
    for beta, (_, values) in zip(betas, cases):
        assert float(values["beta"]) == beta
        assert repr(float(values["dt"])) == repr(reference_step(beta)), (beta, values["dt"])
    # Both branches of the max are taken: the cap below the boundary, the product above it.
    dt_of = {float(v["beta"]): float(v["dt"]) for _, v in cases}
    assert dt_of[lo] == 0.1 and dt_of[math.nextafter(lo, 0)] == 0.1
    assert dt_of[hi] == 0.1 / (math.sqrt(hi) * math.exp(hi - 0.5)) and dt_of[1.7] < 0.1
    assert dt_of[12.0] == 0.1 / (math.sqrt(12.0) * math.exp(11.5))


def test_every_operator_and_function_matches_python(mfattn_binary, tmp_path):
    # The same formulas in the sweep's syntax and in Python's, over an axis of betas.
    formulas = {
        "pos-scale": ("abs(log(beta) * pi) + floor(beta * 7) / ceil(beta + e)",
                      lambda b: abs(math.log(b) * math.pi) + math.floor(b * 7) / math.ceil(b + math.e)),
        "rope-base": ("2 + pow(beta, 1.5) + min(beta, 0.5, 3) * max(1, beta, -2) + exp(-beta) + 1e-3",
                      lambda b: 2 + math.pow(b, 1.5) + min(b, 0.5, 3) * max(1, b, -2) + math.exp(-b) + 1e-3),
        "tau": ("-2 ^ 2 + 2 ^ 3 ^ 0.5 + 10 + sqrt(beta / 7)",
                lambda b: -2 ** 2 + 2 ** 3 ** 0.5 + 10 + math.sqrt(b / 7)),
    }
    betas = [0.3, 1.0, 2.718281828459045, 5.5]
    lines = "".join(f"{name} = {text}\n" for name, (text, _) in formulas.items())
    sweep = tmp_path / "ops.ini"
    sweep.write_text(f"[base]\nn = 8\nd = 4\ngeometry = rope\n[axes]\nbeta = {' '.join(map(repr, betas))}\n"
                     f"[derived]\n{lines}")
    for beta, (_, values) in zip(betas, dry_run_cases(mfattn_binary, sweep)):
        for name, (_, formula) in formulas.items():
            assert repr(float(values[name])) == repr(formula(beta)), (name, beta, values[name])
    # '**' is not the power operator of a sweep file (one of ^ and ** is, and it is ^).
    sweep.write_text("[base]\nn = 8\n[derived]\nhorizon = 2 ** 3\n")
    assert refused(mfattn_binary, sweep) == (
        f"mfattn sweep: {sweep}:4: derived horizon: syntax error at column 3 of '2 ** 3': "
        "'**' is not an operator: write a power as a ^ b")


def test_integer_options_and_chained_derived_values(mfattn_binary, tmp_path):
    sweep = tmp_path / "chain.ini"
    sweep.write_text("[base]\nd = 3\nthreads = 1\n[axes]\nbeta = 1 2.5\n"
                     "[derived]\nhorizon = beta * 4\nsave-every = horizon / 10\n"
                     "n = 2 ^ 4 + floor(horizon)\nreplicas = n / 2\n")
    cases = dry_run_cases(mfattn_binary, sweep)
    assert [v for _, v in cases] == [
        {"beta": "1", "horizon": "4", "save-every": "0.4", "n": "20", "replicas": "10"},
        {"beta": "2.5", "horizon": "10", "save-every": "1", "n": "26", "replicas": "13"},
    ]
    assert repr(0.4) == repr(4 / 10)
    sweep.write_text("[base]\nd = 3\n[axes]\nn = 8 9\n[derived]\nreplicas = n / 2\n")
    assert refused(mfattn_binary, sweep) == (
        f"mfattn sweep: {sweep}:6: derived replicas: --replicas takes an integer, the expression gives 4.5 "
        "in case 1 of 2 (n=9)")
    sweep.write_text("[base]\nd = 3\n[derived]\nsave-every = horizon / 10\nhorizon = 5\n")
    assert refused(mfattn_binary, sweep) == (
        f"mfattn sweep: {sweep}:4: derived save-every: variable horizon: it is derived below (line 5): "
        "a derived option may use only the options derived above it")


def test_zipped_axes_order_and_case_count(mfattn_binary, tmp_path):
    sweep = tmp_path / "zip.ini"
    sweep.write_text("[base]\nd = 3\nthreads = 1\n"
                     "[axes]\nkernel = usa sa\n"
                     "[zip]\nbeta = 0.5 1 2\nseed = 7 8 9\n"
                     "[axes]\nn = 8 16\n"
                     "[derived]\ndt = 0.01 / beta\n")
    cases = dry_run_cases(mfattn_binary, sweep)
    assert dry_run(mfattn_binary, sweep).stdout.startswith("mfattn sweep: 12 cases, 12 in this share")
    expected = [(kernel, beta, seed, n) for kernel in ("usa", "sa")
                for beta, seed in zip(("0.5", "1", "2"), ("7", "8", "9")) for n in ("8", "16")]
    assert [(v["kernel"], v["beta"], v["seed"], v["n"]) for _, v in cases] == expected
    assert [list(v) for _, v in cases][0] == ["kernel", "beta", "seed", "n", "dt"]
    assert all(float(v["dt"]) == 0.01 / float(v["beta"]) for _, v in cases)
    assert len({cid for cid, _ in cases}) == 12


def test_bad_derived_and_zip_sections_are_refused_with_one_line(mfattn_binary, tmp_path):
    sweep = tmp_path / "bad.ini"
    base = "[base]\nd = 3\nn = 8\n"
    for text, expected in [
        ("[zip]\nbeta = 1 2 3\nseed = 1 2\n",
         ":6: [zip]: axis seed has 2 values, axis beta 3 (the axes of a zip group advance together: "
         "give each as many values)"),
        ("[zip.steps]\nbeta = 1 2\nseed = 1\n",
         ":6: [zip.steps]: axis seed has 1 value, axis beta 2 (the axes of a zip group advance together: "
         "give each as many values)"),
        ("[derived]\ndt = 0.1 / sqrt(bta)\n",
         ":5: derived dt: unknown variable 'bta' (variables are the numeric options of mfattn run, with '-' "
         "written as '_', e.g. save_every; constants: pi, e)"),
        ("[derived]\ndt = 0.1 / (1 + beta\n",
         ":5: derived dt: syntax error at column 16 of '0.1 / (1 + beta': '(' at column 7 is not closed"),
        ("[axes]\nbeta = 1 2\n[derived]\nbeta = 3\n", ":7: derived beta: also an axis (keep one)"),
        ("[zip]\nbeta = 1 2\nseed = 1 2\n[derived]\nseed = 3\n", ":8: derived seed: also an axis (keep one)"),
        ("[derived]\nn = 3\n", ":5: derived n: also set in the base config (keep one)"),
        ("[derived]\ndt = kernel\n", ":5: derived dt: variable kernel: --kernel takes text, not a number"),
        ("[axes]\nbeta = 0 1\n[derived]\ndt = 0.1 / beta\n",
         ":7: derived dt: division by zero (0.1 / 0) in case 0 of 2 (beta=0)"),
        ("[axes]\nbeta = 1 800\n[derived]\ndt = 1 / exp(beta)\n",
         ":7: derived dt: exp(800) = inf is not a finite number in case 1 of 2 (beta=800)"),
    ]:
        sweep.write_text(base + text)
        assert refused(mfattn_binary, sweep) == f"mfattn sweep: {sweep}{expected}", text
    # The rules of axes, for zipped axes.
    for text, expected in [("[zip]\nn = 8 9\n", "axis n: also set in the base config (keep one)"),
                           ("[axes]\nbeta = 1 2\n[zip]\nbeta = 3 4\n", "axis beta: given twice"),
                           ("[zip]\nseed =\n", "axis seed: no values"),
                           ("[zip]\nresume = true false\n", "axis resume: not allowed (the sweep sets --resume itself)")]:
        sweep.write_text(base + text)
        assert refused(mfattn_binary, sweep) == f"mfattn sweep: {expected}", text


def test_files_without_the_new_sections_keep_their_ids(mfattn_binary):
    # seed003_grid.ini: d = 3, beta = 1, horizon = 20 are run's defaults; save-every = 0.1 is not.
    cases = dry_run_cases(mfattn_binary, REPO_ROOT / "experiments/sweeps/seed003_grid.ini")
    defaults = {"kernel": "usa", "geometry": "none", "n": "64", "seed": "0"}
    assert len(cases) == 24
    for cid, values in cases:
        lines = ["save-every=0.1"] + [f"{k}={v}" for k, v in values.items() if defaults[k] != v]
        assert cid == case_id(lines), values
    assert cases[0][0] == "0f270d4adbfcd37c"  # the id docs/sweeps.md shows for case 0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
