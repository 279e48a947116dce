"""Gradients through whole runs (docs/model.md section 5b): mfattn.gradient against PyTorch
float64 autograd through the same steps of the field written in test_derivatives.py's oracle
(from docs/model.md, not mfattn's code), against central finite differences of whole runs,
and checkpoints against every state stored, to the bit."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_derivatives import ON_SPHERE, Oracle, expect_autograd_gradients, oracle_numbers  # noqa: E402

# The steps' tableaux (a: the stages' rows, b: the weights), written from docs/model.md section 5.
TABLEAUX = {
    "euler": ([[]], [1.0]),
    "heun": ([[], [1.0]], [0.5, 0.5]),
    "rk4": ([[], [0.5], [0.0, 0.5], [0.0, 0.0, 1.0]], [1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    "dopri5": ([[], [1 / 5], [3 / 40, 9 / 40], [44 / 45, -56 / 15, 32 / 9],
                [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
                [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656]],
               [35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84]),
}

# Six steps of 0.05, the frames on the step grid (every step is dt).
RUN = dict(horizon=0.3, dt=0.05, save_every=0.1, seed=5)

CASES = {
    "rk4-post-heads-mlp-rope-prefix": dict(n=6, d=4, kernel="sa", beta=1.5, heads=2, head_dim=2, mlp=3,
                                           q="gaussian", k="gaussian", v="gaussian", values="plain",
                                           geometry="rope", prefix=1, integrator="rk4"),
    "heun-pre-distance-gelu": dict(n=6, d=3, kernel="sa", mlp=2, mlp_activation="gelu", q="gaussian", k="gaussian",
                                   v="gaussian", aux_factor="distance", aux_lambda=0.3, normalization="pre",
                                   integrator="heun"),
    "euler-ngpt-usa-causal": dict(n=6, d=3, kernel="usa", beta=2.0, q="gaussian", k="gaussian", v="gaussian",
                                  mask="causal", normalization="ngpt", ngpt_alpha=0.7, integrator="euler"),
    "rk4-peri-nulls-amplitudes": dict(n=6, d=3, kernel="sa", q="gaussian", k="gaussian", v="gaussian",
                                      normalization="peri", null_tokens=1, eps_den=1e-3,
                                      amplitudes=[1.0, 2.0, 0.5, 1.5, 1.0, 3.0], integrator="rk4"),
    # Adaptive: the accepted steps frozen (rtol loose enough that they differ from dt).
    "dopri5-post-heads-prefix": dict(n=6, d=4, kernel="sa", beta=2.0, heads=2, head_dim=2, q="gaussian",
                                     k="gaussian", v="gaussian", values="plain", prefix=1, integrator="dopri5",
                                     rtol=1e-5, atol=1e-7),
    # The reference code's step: x <- N(x + h p u(x)), u before the tangent projection.
    "euler-unprojected-heads-mlp-prefix": dict(n=6, d=4, kernel="sa", beta=1.5, heads=2, head_dim=2, mlp=2,
                                               q="gaussian", k="gaussian", v="gaussian", values="plain", prefix=1,
                                               null_tokens=1, integrator="euler-unprojected"),
    # The noise of each step drawn again from its stream (mfattn._core.maruyama_noise in torch).
    "euler-maruyama-heads-mlp-nulls": dict(n=6, d=3, kernel="sa", beta=1.5, heads=1, mlp=2, q="gaussian",
                                           k="gaussian", v="gaussian", values="plain", null_tokens=1,
                                           noise_kappa=20.0, integrator="euler-maruyama"),
    # Sinkhorn attention, its sweeps fixed in number (tolerance 0: the same operations forward and back).
    "rk4-sinkhorn-heads-mlp": dict(n=6, d=4, kernel="sinkhorn", sinkhorn_iterations=3, sinkhorn_tol=0, heads=2,
                                   head_dim=2, mlp=2, q="gaussian", k="gaussian", v="gaussian", beta=1.5,
                                   integrator="rk4"),
    "rk4-none-transported-replicas": dict(n=5, d=4, kernel="sa", heads=2, head_dim=2, q="gaussian", k="gaussian",
                                          v="gaussian", geometry="rope", normalization="none", replicas=2,
                                          integrator="rk4"),
}


def options_of(name):
    spec = dict(CASES[name])
    if spec.get("prefix"):
        rng = np.random.default_rng(7)
        y = rng.standard_normal((spec["prefix"], spec["d"]))
        spec["prefix_init"] = y / np.linalg.norm(y, axis=1, keepdims=True)
    return spec, dict(spec, **RUN)


def noise_of(mfattn, spec, x0, steps):
    """euler-maruyama's normal draws of each step [steps, (R,) n, d] (None for the others)."""
    if spec["integrator"] != "euler-maruyama":
        return None
    replicas = x0.shape[0] if x0.ndim == 3 else 1
    xi = mfattn._core.maruyama_noise(RUN["seed"], steps, replicas, x0.shape[-2], x0.shape[-1])
    return torch.tensor(xi if x0.ndim == 3 else xi[:, 0])


def torch_run(spec, numbers, x0, method, step_sizes, noise=None):
    """x(T) of the run's steps in PyTorch: x <- N(x + h sum_s b_s k_s) on the sphere for the
    moving tokens, k_s = f(x + h sum_m a_sm k_m), for each h of step_sizes; euler-maruyama's
    x <- N(x + (h f(x) + sqrt(2 h / kappa) (xi - <xi, x> x))) with the draws xi of `noise`."""
    oracle = Oracle(spec)
    replicas = x0.shape[0] if x0.dim() == 3 else 1
    moving = (numbers["presence"] > 0)[:, None]
    if method == "euler-maruyama":
        x = x0
        for k, h in enumerate(step_sizes):
            xi, amplitude = noise[k], np.sqrt(2 * h / spec["noise_kappa"])
            tangent = xi - (xi * x).sum(dim=-1, keepdim=True) * x
            y = torch.where(moving, x + (h * oracle.field(x, numbers, replicas) + amplitude * tangent), x)
            x = torch.where(moving, y / y.norm(dim=-1, keepdim=True), y)
        return x
    if method == "euler-unprojected":  # x <- N(x + h p u(x)) for the moving tokens
        x = x0
        for h in step_sizes:
            y = torch.where(moving, x + h * oracle.layer_output(x, numbers), x)
            x = torch.where(moving, y / y.norm(dim=-1, keepdim=True), y)
        return x
    a, b = TABLEAUX[method]
    x = x0
    for h in step_sizes:
        ks = []
        for s in range(len(b)):
            z = x + h * sum(a[s][m] * ks[m] for m in range(s)) if s else x
            ks.append(oracle.field(z, numbers, replicas))
        y = x + h * sum(b[s] * ks[s] for s in range(len(b)))
        if spec.get("normalization", "post") in ON_SPHERE:
            y = torch.where(moving, y / y.norm(dim=-1, keepdim=True), y)
        x = y
    return x


def relative(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    scale = np.linalg.norm(b)
    return np.linalg.norm(a - b) / scale if scale > 0 else np.linalg.norm(a)


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_gradient_is_autograd_through_the_same_steps(mfattn, name):
    spec, options = options_of(name)
    x0 = mfattn.Model(**options).initial_state()
    c = np.random.default_rng(1).standard_normal(x0.shape)
    loss, gradient, trajectory, plan = mfattn.gradient(c, **options)
    if spec["integrator"] == "dopri5":
        assert len(set(plan["step_sizes"])) > 1
    else:
        assert np.array_equal(plan["step_sizes"], np.full(6, RUN["dt"]))
    model = mfattn.Model(**options)
    numbers = oracle_numbers(model, spec, gradient)
    leaves = {k: v.clone().requires_grad_(True) for k, v in numbers.items()}
    xt = torch.tensor(x0, requires_grad=True)
    final = torch_run(spec, leaves, xt, spec["integrator"], plan["step_sizes"],
                      noise_of(mfattn, spec, x0, len(plan["step_sizes"])))
    # The run's last frame is the x(T) differentiated.
    _, _, final_state, _ = mfattn._core.gradient(c, **options)
    assert np.array_equal(trajectory.positions[-1].reshape(final_state.shape), final_state)
    assert relative(final_state, final.detach().numpy()) < 1e-12
    objective = (final * torch.tensor(c)).sum()
    assert abs(loss - objective.item()) <= 1e-12 * abs(objective.item())
    expect_autograd_gradients(gradient, objective, ("x0", xt), leaves, 1e-11)


# Every fixed-step case (dopri5's steps would move with the start; an init file holds one
# replica's rows).
@pytest.mark.parametrize("name", sorted(name for name in CASES if not name.startswith("dopri5")
                                        and "replicas" not in name))
def test_run_gradient_is_the_central_difference_of_whole_runs(mfattn, name, tmp_path):
    spec, options = options_of(name)
    x0 = mfattn.Model(**options).initial_state()
    rng = np.random.default_rng(2)
    c = rng.standard_normal(x0.shape)
    _, gradient, _, _ = mfattn.gradient(c, wrt=["x0", "beta"], **options)
    assert sorted(gradient) == ["beta", "x0"]
    on_sphere = spec.get("normalization", "post") in ON_SPHERE
    t = rng.standard_normal(x0.shape)
    if on_sphere:
        t -= np.sum(t * x0, axis=-1, keepdims=True) * x0

    def loss(x, beta):
        start = tmp_path / "x0.txt"
        np.savetxt(start, x)
        run = mfattn.run(**dict(options, init="file", init_file=str(start), beta=beta))
        return float(np.sum(c * run.positions[-1]))

    def moved(s):
        x = x0 + s * t
        return x / np.linalg.norm(x, axis=-1, keepdims=True) if on_sphere else x

    h, beta = 1e-5, options.get("beta", 1.0)
    along = (loss(moved(h), beta) - loss(moved(-h), beta)) / (2 * h)
    assert abs(along - np.sum(gradient["x0"] * t)) <= 1e-6 * abs(along)
    along = (loss(x0, beta + h) - loss(x0, beta - h)) / (2 * h)
    assert abs(along - gradient["beta"]) <= 1e-6 * abs(along)


def test_layers_in_time_and_loss_times_are_autograd_and_finite_differences(mfattn):
    """Three layers of weights in time (layer_time 0.1, two steps each) and the tokens loss
    summed over the frames at t = 0.1 and 0.3: each layer's matrices' gradient (a leading layer
    axis) and x0's against autograd through the same steps, layer by layer, and one direction
    of every layer's query matrices against central differences of whole runs."""
    spec, options = options_of("rk4-post-heads-mlp-rope-prefix")
    model = mfattn.Model(**options)
    one = model.weights()
    rng = np.random.default_rng(11)
    layers = 3
    weights = {k: np.stack([v] + [v + 0.3 * rng.standard_normal(v.shape) for _ in range(layers - 1)])
               for k, v in one.items()}
    given = dict({k: v for k, v in options.items() if k not in ("q", "k", "v")}, weights=weights, layer_time=0.1)
    x0 = model.initial_state()
    target = rng.standard_normal(x0.shape)
    value, gradient, trajectory, plan = mfattn.gradient(loss="tokens", target=target, loss_times=[0.1, 0.3], **given)
    for key, v in one.items():
        assert gradient[key].shape == (layers,) + v.shape, key
    assert np.array_equal(plan["step_sizes"], np.full(6, RUN["dt"]))
    # One stored state: step k taken again k times from x(0), each in its own layer; the same bits.
    again = mfattn._core.gradient(loss="tokens", target=target, loss_times=[0.1, 0.3], checkpoints=1, **given)
    assert again[3]["recomputed_steps"] == 15 and again[0] == value
    for key in gradient:
        assert np.array_equal(np.asarray(again[1][key]), np.asarray(gradient[key])), key
    numbers = oracle_numbers(model, spec, {k: v for k, v in gradient.items() if k not in one})
    leaves = {k: v.clone().requires_grad_(True) for k, v in numbers.items() if k not in one}
    leaves.update({k: torch.tensor(v, requires_grad=True) for k, v in weights.items()})
    xt = torch.tensor(x0, requires_grad=True)
    x, objective = xt, 0.0
    for layer in range(layers):
        in_layer = dict(leaves, **{k: leaves[k][layer] for k in one})
        x = torch_run(spec, in_layer, x, "rk4", plan["step_sizes"][2 * layer:2 * layer + 2])
        if layer in (0, 2):
            objective = objective + ((x - torch.tensor(target)) ** 2).sum()
    assert relative(trajectory.positions[-1], x.detach().numpy()) < 1e-12
    assert abs(value - objective.item()) <= 1e-12 * abs(objective.item())
    expect_autograd_gradients(gradient, objective, ("x0", xt), leaves, 1e-11)

    direction = rng.standard_normal(weights["attention/query"].shape)

    def loss(s):
        moved = dict(weights, **{"attention/query": weights["attention/query"] + s * direction})
        run = mfattn.run(**dict(given, weights=moved))
        return sum(np.sum((run.positions[frame] - target) ** 2) for frame in (1, 3))

    h = 1e-5
    along = (loss(h) - loss(-h)) / (2 * h)
    assert abs(along - np.sum(gradient["attention/query"] * direction)) <= 1e-6 * abs(along)


def test_regenerated_layers_are_differentiated(mfattn, tmp_path):
    """regen_period: each layer's drawn matrices in force on its interval (three layers), x0's
    gradient against central differences of whole runs."""
    options = dict(RUN, n=5, d=3, kernel="sa", beta=1.5, q="gaussian", k="gaussian", v="gaussian",
                   regen_period=0.1)
    x0 = mfattn.Model(**options).initial_state()
    rng = np.random.default_rng(12)
    c = rng.standard_normal(x0.shape)
    _, gradient, _, _ = mfattn.gradient(c, **options)
    assert gradient["attention/value"].shape[0] == 4  # the layers whose starts the run reaches
    t = rng.standard_normal(x0.shape)
    t -= np.sum(t * x0, axis=-1, keepdims=True) * x0

    def loss(s):
        x = x0 + s * t
        np.savetxt(tmp_path / "x0.txt", x / np.linalg.norm(x, axis=-1, keepdims=True))
        return float(np.sum(c * mfattn.run(**dict(options, init="file", init_file=str(tmp_path / "x0.txt"))).positions[-1]))

    h = 1e-5
    along = (loss(h) - loss(-h)) / (2 * h)
    assert abs(along - np.sum(gradient["x0"] * t)) <= 1e-6 * abs(along)


def test_checkpoints_change_no_bit(mfattn):
    _, options = options_of("rk4-post-heads-mlp-rope-prefix")
    options = dict(options, save_every=0.05, horizon=0.35)  # seven steps
    x0 = mfattn.Model(**options).initial_state()
    c = np.random.default_rng(3).standard_normal(x0.shape)
    every = mfattn._core.gradient(c, checkpoints=7, **options)
    counts = lambda plan: {k: v for k, v in plan.items() if k != "step_sizes"}  # noqa: E731
    assert counts(every[3]) == {"steps": 7, "stored_states": 7, "recomputed_steps": 0}
    for stored in (1, 3, None):
        loss, gradient, final, plan = mfattn._core.gradient(c, checkpoints=stored, **options)
        if stored == 3:
            # The binomial schedule: x(1) and x(4) stored on the way forward; [4, 7) walked back
            # with one state (3 steps again), [1, 4) with two (2), [0, 1) with none.
            assert counts(plan) == {"steps": 7, "stored_states": 3, "recomputed_steps": 5}
        assert loss == every[0] and np.array_equal(final, every[2])
        for key in every[1]:
            assert np.array_equal(np.asarray(gradient[key]), np.asarray(every[1][key])), (stored, key)


def test_bad_input_is_named(mfattn):
    options = dict(n=5, d=3, kernel="sa", **RUN)
    c = np.zeros((5, 3))
    with pytest.raises(ValueError, match="integrator=lie-euler: gradients through runs take euler, euler-unprojected, heun, rk4, dopri5, euler-maruyama"):
        mfattn.gradient(c, **dict(options, integrator="lie-euler"))
    with pytest.raises(ValueError, match="loss_times: 0.15 is none of the run's frame times"):
        mfattn.gradient(c, loss_times=[0.15], **options)
    with pytest.raises(ValueError, match="cotangent: 12 numbers; the run's state has 15"):
        mfattn.gradient(np.zeros((4, 3)), **options)
    with pytest.raises(ValueError, match="cotangent: not finite"):
        mfattn.gradient(np.full((5, 3), np.nan), **options)
    with pytest.raises(TypeError, match="cotangent"):
        mfattn.gradient(np.zeros((5, 3), dtype=complex), **options)
    with pytest.raises(ValueError, match="wrt: attention/gate is none of this model's keys"):
        mfattn.gradient(c, wrt=["x0", "attention/gate"], **options)
    with pytest.raises(ValueError, match="checkpoints: 0"):
        mfattn.gradient(c, checkpoints=0, **options)
    # (Without a device the CUDA backend is refused as it is made; with one, for its derivatives.)
    with pytest.raises(ValueError, match="backend=cuda: "):
        mfattn.gradient(c, **dict(options, backend="cuda"))


def test_torch_flow_passes_gradcheck_and_is_the_run(mfattn):
    import mfattn.torch as flows
    model = mfattn.Model(n=4, d=3, kernel="sa", beta=1.5, q="gaussian", k="gaussian", v="gaussian", values="plain",
                         mlp=2, seed=2)
    run = dict(horizon=0.1, dt=0.05, save_every=0.05, integrator="heun")
    weights = model.weights()
    x0 = torch.tensor(model.initial_state(), requires_grad=True)
    value = torch.tensor(weights["attention/value"], requires_grad=True)
    w1 = torch.tensor(weights["mlp/w1"], requires_grad=True)
    # x(T) is the run's last frame, to the bit, with the model's weights and with them given.
    final = mfattn.run(**dict(model.options, **run)).positions[-1]
    assert np.array_equal(flows.flow(x0, model, **run).detach().numpy(), final)
    assert np.array_equal(flows.flow(x0, model, {"attention/value": value}, **run).detach().numpy(), final)

    # (The initial state stays on the sphere: gradcheck's moves are taken back there in torch.)
    def run_of(x, v, w):
        return flows.flow(x / x.norm(dim=1, keepdim=True), model, {"attention/value": v, "mlp/w1": w},
                          checkpoints=1, **run)
    assert torch.autograd.gradcheck(run_of, (x0, value, w1), eps=1e-6, atol=1e-8, rtol=1e-6)
    with pytest.raises(ValueError, match="x0: shape \\(4, 3\\); flow takes .*the run has replicas=2"):
        flows.flow(x0, model, replicas=2, **run)
    with pytest.raises(ValueError, match="x0: shape \\(2, 4, 3\\); flow takes .*replicas=3"):
        flows.flow(torch.stack([x0, x0]), model, replicas=3, **run)


def test_torch_flow_takes_a_state_for_each_replica(mfattn):
    """(R, n, d): R replicas of the run, each from its own state, shared weights: each replica's
    x(T) and gradients are those of its own run (the value matrix's summed over replicas)."""
    import mfattn.torch as flows
    model = mfattn.Model(n=4, d=3, kernel="sa", beta=1.5, q="gaussian", k="gaussian", v="gaussian", values="plain",
                         seed=2)
    run = dict(horizon=0.1, dt=0.05, save_every=0.05, integrator="rk4")
    starts = [torch.tensor(mfattn.Model(**dict(model.options, seed=s)).initial_state()) for s in (2, 3, 4)]
    value = torch.tensor(model.weights()["attention/value"], requires_grad=True)
    c = torch.tensor(np.random.default_rng(6).standard_normal((3, 4, 3)))
    stacked = torch.stack(starts).requires_grad_()
    final = flows.flow(stacked, model, {"attention/value": value}, **run)
    assert final.shape == (3, 4, 3)
    (c * final).sum().backward()
    value_sum = torch.zeros_like(value)
    for r, start in enumerate(starts):
        one_value = value.detach().clone().requires_grad_()
        x = start.clone().requires_grad_()
        alone = flows.flow(x, model, {"attention/value": one_value}, **run)
        assert torch.allclose(final[r], alone, rtol=0, atol=1e-15)
        (c[r] * alone).sum().backward()
        assert torch.allclose(stacked.grad[r], x.grad, rtol=1e-13, atol=1e-15)
        value_sum += one_value.grad
    assert torch.allclose(value.grad, value_sum, rtol=1e-12, atol=1e-15)


def test_a_torch_optimiser_trains_weights_inside_a_run(mfattn):
    """Adam on the value matrix through mfattn.torch.flow brings x(T) toward the x(T) of other
    value weights (the target a run of hidden weights makes from the same tokens)."""
    import mfattn.torch as flows
    model = mfattn.Model(n=6, d=3, kernel="sa", beta=1.0, q="gaussian", k="gaussian", v="gaussian", values="plain",
                         seed=4)
    run = dict(horizon=0.5, dt=0.05, save_every=0.5)
    x0 = torch.tensor(model.initial_state())
    hidden = torch.tensor(np.random.default_rng(5).standard_normal(model.weights()["attention/value"].shape))
    target = flows.flow(x0, model, {"attention/value": hidden}, **run).detach()
    value = torch.tensor(model.weights()["attention/value"], requires_grad=True)
    optimiser = torch.optim.Adam([value], lr=0.1)
    losses = []
    for _ in range(80):
        optimiser.zero_grad()
        loss = ((flows.flow(x0, model, {"attention/value": value}, **run) - target) ** 2).sum()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 1e-2 * losses[0]


def mmd_torch(x, y, gamma):
    """The mmd loss of docs/model.md section 5b written here: the moving tokens x against y."""
    k = lambda a, b: torch.exp(gamma * a @ b.T)  # noqa: E731
    return k(x, x).mean() - 2 * k(x, y).mean() + k(y, y).mean()


def distances(a, b):
    """|a_i - b_j|, with a zero gradient where two points coincide (the diagonal of a with itself)."""
    squared = ((a[:, None, :] - b[None, :, :]) ** 2).sum(dim=-1)
    zero = squared == 0
    return torch.where(zero, torch.zeros_like(squared), torch.sqrt(torch.where(zero, torch.ones_like(squared), squared)))


def energy_torch(x, y):
    return 2 * distances(x, y).mean() - distances(x, x).mean() - distances(y, y).mean()


def w2_torch(x, y):
    """W2^2 of equal-size empirical measures by the assignment of least cost (scipy's, on the
    values), as a function of x through that assignment."""
    from scipy.optimize import linear_sum_assignment
    cost = ((x[:, None, :] - y[None, :, :]) ** 2).sum(dim=-1)
    rows, columns = linear_sum_assignment(cost.detach().numpy())
    return cost[rows, columns].mean()


def sinkhorn_torch(x, y, eps):
    """(S, G): the Sinkhorn divergence of cost |a - b|^2 (docs/model.md section 5b), its dual
    value from potentials iterated here to their fixed point, and G, a function of x whose
    gradient is S's (the plans held fixed: the envelope theorem)."""
    def plan_and_value(a, b, symmetric):
        cost = ((a[:, None, :] - b[None, :, :]) ** 2).sum(dim=-1).detach()
        log_a, log_b = -np.log(len(a)), -np.log(len(b))
        f, g = torch.zeros(len(a), dtype=torch.float64), torch.zeros(len(b), dtype=torch.float64)
        for _ in range(200000):
            f_new = -eps * torch.logsumexp(log_b + (g[None, :] - cost) / eps, dim=1)
            if symmetric:
                f_new = 0.5 * (f + f_new)
                g_new = f_new
            else:
                g_new = -eps * torch.logsumexp(log_a + (f_new[:, None] - cost) / eps, dim=0)
            change = max((f_new - f).abs().max().item(), (g_new - g).abs().max().item())
            f, g = f_new, g_new
            if change <= 1e-15 * max(1.0, f.abs().max().item(), g.abs().max().item()):
                break
        plan = torch.exp(log_a + log_b + (f[:, None] + g[None, :] - cost) / eps)
        return plan, (f.mean() + g.mean()).item()
    cross, cross_value = plan_and_value(x, y, False)
    own, own_value = plan_and_value(x, x, True)
    _, theirs_value = plan_and_value(y, y, True)
    cost = lambda a, b: ((a[:, None, :] - b[None, :, :]) ** 2).sum(dim=-1)  # noqa: E731
    surrogate = (cross * cost(x, y)).sum() - 0.5 * (own * cost(x, x)).sum()
    return cross_value - 0.5 * own_value - 0.5 * theirs_value, surrogate


@pytest.mark.parametrize("name", ["rk4-peri-nulls-amplitudes", "rk4-none-transported-replicas"])
def test_losses_of_the_final_state_are_autograd_through_the_same_steps(mfattn, name):
    spec, options = options_of(name)
    model = mfattn.Model(**options)
    x0 = model.initial_state()
    rng = np.random.default_rng(9)
    # (A zero cotangent's gradient has every key, all zero: the forward pass alone.)
    numbers = oracle_numbers(model, spec, mfattn._core.gradient(np.zeros(x0.shape), **options)[1])
    moving = numbers["presence"].numpy() > 0
    tokens_target = rng.standard_normal(x0.shape)
    points = rng.standard_normal((4, x0.shape[-1]))
    settings = [("tokens", tokens_target, {}), ("mmd", points, {"loss_gamma": 1.7}),
                ("w2", rng.standard_normal((int(moving.sum()), x0.shape[-1])), {}), ("energy", points, {}),
                ("sinkhorn", points, {"loss_epsilon": 0.5})]
    if x0.ndim == 3:  # a set of 3 points a replica
        settings.append(("mmd", rng.standard_normal((x0.shape[0], 3, x0.shape[-1])), {"loss_gamma": 0.8}))
    for loss, target, extra in settings:
        value, gradient, _, plan = mfattn.gradient(loss=loss, target=target, **extra, **options)
        xt = torch.tensor(x0, requires_grad=True)
        leaves = {k: v.clone().requires_grad_(True) for k, v in numbers.items()}
        final = torch_run(spec, leaves, xt, spec["integrator"], plan["step_sizes"])
        replicas = [final] if final.dim() == 2 else list(final)
        sets = list(torch.tensor(target)) if target.ndim == 3 else [torch.tensor(target)] * len(replicas)
        mask = torch.tensor(moving)
        if loss == "tokens":
            targets = [torch.tensor(tokens_target)] if final.dim() == 2 else list(torch.tensor(tokens_target))
            objective = sum((((f - t) ** 2).sum(dim=1) * mask).sum() for f, t in zip(replicas, targets))
        elif loss == "mmd":
            objective = sum(mmd_torch(f[mask], y, extra["loss_gamma"]) for f, y in zip(replicas, sets))
        elif loss == "w2":
            objective = sum(w2_torch(f[mask], y) for f, y in zip(replicas, sets))
        elif loss == "energy":
            objective = sum(energy_torch(f[mask], y) for f, y in zip(replicas, sets))
        else:
            pairs = [sinkhorn_torch(f[mask], y, extra["loss_epsilon"]) for f, y in zip(replicas, sets)]
            expected = sum(p[0] for p in pairs)
            assert abs(value - expected) <= 1e-12 * abs(expected), loss
            objective = sum(p[1] for p in pairs)
        if loss != "sinkhorn":
            assert abs(value - objective.item()) <= 1e-12 * abs(objective.item()), loss
        expect_autograd_gradients(gradient, objective, ("x0", xt), leaves, 1e-11)


def test_bad_losses_are_named(mfattn):
    options = dict(n=5, d=3, kernel="sa", **RUN)
    c = np.zeros((5, 3))
    with pytest.raises(ValueError, match="cotangent, loss: give one"):
        mfattn.gradient(c, loss="tokens", target=c, **options)
    with pytest.raises(ValueError, match="cotangent, loss: give one"):
        mfattn.gradient(**options)
    with pytest.raises(ValueError, match="target: loss=tokens takes a target array"):
        mfattn.gradient(loss="tokens", **options)
    with pytest.raises(ValueError, match="loss: gauss \\(accepted: tokens, mmd, w2, energy, sinkhorn\\)"):
        mfattn.gradient(loss="gauss", target=c, **options)
    with pytest.raises(ValueError, match="target: 4 points; the w2 loss takes as many as the moving tokens \\(5\\)"):
        mfattn.gradient(loss="w2", target=np.zeros((4, 3)), **options)
    with pytest.raises(ValueError, match="loss_epsilon: the sinkhorn loss's; loss=mmd takes none"):
        mfattn.gradient(loss="mmd", target=c, loss_epsilon=0.1, **options)
    with pytest.raises(ValueError, match="target: 12 numbers; the tokens loss takes one target per token, the state's 15"):
        mfattn.gradient(loss="tokens", target=np.zeros((4, 3)), **options)
    with pytest.raises(ValueError, match="target: 10 numbers; the mmd loss takes rows of d = 3 numbers"):
        mfattn.gradient(loss="mmd", target=np.zeros((5, 2)), **options)
    with pytest.raises(ValueError, match="loss_gamma: the mmd loss's; loss=tokens takes none"):
        mfattn.gradient(loss="tokens", target=c, loss_gamma=2.0, **options)
    with pytest.raises(ValueError, match="target: not finite"):
        mfattn.gradient(loss="mmd", target=np.full((2, 3), np.inf), **options)
    with pytest.raises(ValueError, match="target: 3 sets of points; the run has 1 replicas"):
        mfattn.gradient(loss="mmd", target=np.zeros((3, 2, 3)), **options)


def test_weights_dict_and_a_single_key(mfattn):
    """weights= a dict gives the run and gradient of the model with those weights; wrt= one key
    is that key."""
    options = dict(RUN, n=5, d=3, kernel="sa", beta=1.5, q="gaussian", k="gaussian", v="gaussian", values="plain")
    c = np.random.default_rng(4).standard_normal((5, 3))
    loss, gradient, trajectory, _ = mfattn.gradient(c, wrt="attention/value", **options)
    assert sorted(gradient) == ["attention/value"]
    weights = mfattn.Model(**options).weights()
    given = {k: v for k, v in options.items() if k not in ("q", "k", "v")}
    again, same, run, _ = mfattn.gradient(c, wrt="attention/value", weights=weights, **given)
    # (A preset's value matrix and the same matrix given as a weight are taken through different
    # products: the same run and gradient to rounding.)
    assert relative(same["attention/value"], gradient["attention/value"]) < 1e-13
    assert abs(again - loss) <= 1e-13 * abs(loss) and relative(run.positions, trajectory.positions) < 1e-13
    # The run of the weights given is the one differentiated, to the bit.
    assert np.array_equal(run.positions[-1], mfattn._core.gradient(c, weights=weights, **given)[2])


def test_the_influence_experiment_runs_quick(mfattn, tmp_path):
    """experiments/gradients/influence.py --quick: a profile per setting, every I_s finite and
    positive, x_n(T) most sensitive to x_n(0) itself, and the table and figure written."""
    import csv
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, MFATTN_PYTHON_MODULE_DIR=str(Path(mfattn.__file__).resolve().parents[1]), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(root / "experiments/gradients/influence.py"), "--quick", "--data",
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "| factor | beta | T |" in done.stdout
    rows = list(csv.DictReader(open(tmp_path / "gradients" / "influence.csv")))
    assert len(rows) == 2 * 16
    for setting in ("none", "distance 0.2"):
        profile = [float(r["mean"]) for r in rows if r["factor"] == setting]
        assert all(np.isfinite(profile)) and min(profile) > 0
        assert np.argmax(profile) == 15
    assert (tmp_path / "figures" / "influence_profile.png").stat().st_size > 0
