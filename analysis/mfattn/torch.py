"""mfattn.torch: mfattn's field and whole runs inside PyTorch autograd (docs/python.md,
"Derivatives", "Gradients through whole runs").

    import mfattn.torch
    v = mfattn.torch.velocity(x, model)               # x: a float64 tensor (n, d) or (R, n, d)
    v = mfattn.torch.velocity(x, model, weights)      # weights: tensors under model.weights()'s keys
    xT = mfattn.torch.flow(x0, model, weights, horizon=1.0)   # the run's x(T); backward: its adjoint

The forward pass is model.velocity; the backward pass is model.vjp, the exact VJP in O(n)
memory (no n x n weights are stored), so the field can sit inside a torch model or loss:
gradients flow to x and to the weight tensors given. Without `weights` the model's own weights
are held fixed; with them (some or all of model.weights()'s keys; the others keep the model's
values) the field is evaluated at those weights (a Model rebuilt with weights=, held in
memory) and their gradients come back. The other numbers (beta, presences, ...) have their
gradients in model.vjp; give them to the Model as options. Tensors are moved to the CPU and
float64 for mfattn and the results back to x's device and dtype. One backward only: the
backward pass is not itself differentiable (no double backward).
"""
from __future__ import annotations

import numpy as np
import torch

import mfattn


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float64).numpy()


class _Field(torch.autograd.Function):
    """velocity(x; weights) with model.vjp as its backward."""

    @staticmethod
    def forward(ctx, model, keys, x, *weight_tensors):  # noqa: D401 (autograd's signature)
        ctx.model, ctx.keys = model, keys
        ctx.save_for_backward(x)
        return torch.from_numpy(model.velocity(_numpy(x))).to(x.device, x.dtype)

    @staticmethod
    def backward(ctx, cotangent):
        (x,) = ctx.saved_tensors
        gradient = ctx.model.vjp(_numpy(x), _numpy(cotangent))
        as_tensor = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64)).to(x.device, x.dtype)  # noqa: E731
        return (None, None, as_tensor(gradient["x"])) + tuple(as_tensor(gradient[k]) for k in ctx.keys)


def _check_weights(model, weights) -> dict:
    """model.weights(), after checking that `weights` can replace some of them."""
    if not isinstance(weights, dict):
        raise TypeError(f"weights: expected a dict of tensors keyed as model.weights(), got {type(weights).__name__}")
    if model.options.get("matrices") == "per-replica":
        raise ValueError("weights: a model with matrices='per-replica' has a set per replica; "
                         "give weights to a model with shared matrices")
    known = model.weights()
    if known["attention/query"].ndim == 4:
        raise ValueError("weights: a model of several layers (layer_time=, regen_period=) has a set per layer; "
                         "give weights to a model of one layer")
    for key, value in weights.items():
        if key not in known:
            raise ValueError(f"weights: unknown key {key!r} (this model takes {', '.join(known)})")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"weights[{key!r}]: expected a torch.Tensor, got {type(value).__name__}")
    return known


def velocity(x: torch.Tensor, model, weights: dict | None = None) -> torch.Tensor:
    """The field of `model` at x as a differentiable torch function (module docstring)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(model, mfattn.Model):
        raise TypeError(f"model: expected an mfattn.Model, got {type(model).__name__}")
    if not weights:
        return _Field.apply(model, (), x)
    known = _check_weights(model, weights)
    options = dict(model.options)
    keys = tuple(weights)
    at = dict(known, **{k: _numpy(weights[k]) for k in keys})
    # The weights replace the presets' matrices (q=, k=, v= name them; a weights dict refuses them).
    for preset in ("q", "k", "v"):
        options.pop(preset, None)
    model_at = mfattn.Model(**dict(options, weights=at))
    return _Field.apply(model_at, keys, x, *(weights[k] for k in keys))


class _Flow(torch.autograd.Function):
    """x(T) of a run from x0 (at weights) with the run's discrete adjoint as its backward."""

    @staticmethod
    def forward(ctx, options, keys, checkpoints, x0, *weight_tensors):  # noqa: D401 (autograd's signature)
        # Copies: the backward pass runs at these values even if x0 or the weights change in place.
        start = _numpy(x0).copy()
        ctx.options = dict(options, init="file", init_file=start)
        ctx.keys, ctx.checkpoints, ctx.shape = keys, checkpoints, start.shape
        ctx.device, ctx.dtype = x0.device, x0.dtype
        _, _, final, _ = mfattn._core.gradient(np.zeros(start.shape), wrt=[], **ctx.options)
        return torch.from_numpy(final.reshape(start.shape)).to(x0.device, x0.dtype)

    @staticmethod
    def backward(ctx, cotangent):
        _, gradient, _, _ = mfattn._core.gradient(_numpy(cotangent).reshape(ctx.shape), wrt=["x0", *ctx.keys],
                                                  checkpoints=ctx.checkpoints, **ctx.options)
        as_tensor = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64)).to(ctx.device, ctx.dtype)  # noqa: E731
        return (None, None, None, as_tensor(gradient["x0"])) + tuple(as_tensor(gradient[k]) for k in ctx.keys)


def flow(x0: torch.Tensor, model, weights: dict | None = None, checkpoints: int | None = None,
         **run_options) -> torch.Tensor:
    """x(T) of the run of `model` from x0 (a float64 tensor of the state's shape, (n, d), or
    (R, n, d): R replicas, each from its own state), as a differentiable torch function of x0 and, where given, of weight tensors
    under model.weights()'s keys: the forward pass is the run (the model's options with
    run_options: horizon=, dt=, integrator=, ...; x0 its initial state), the backward pass the
    run's discrete adjoint (mfattn.gradient, docs/model.md section 5b) from `checkpoints`
    stored states, so a torch optimiser can train mfattn's weights inside a whole run. The run
    is taken again in the backward pass (a forward pass and the gradient's)."""
    if not isinstance(x0, torch.Tensor):
        raise TypeError(f"x0: expected a torch.Tensor, got {type(x0).__name__}")
    if not isinstance(model, mfattn.Model):
        raise TypeError(f"model: expected an mfattn.Model, got {type(model).__name__}")
    options = dict(model.options, **run_options)
    replicas = int(options.get("replicas", 1))
    if x0.dim() not in (2, 3) or (x0.dim() == 3 and replicas not in (1, x0.shape[0])) or (x0.dim() == 2 and replicas > 1):
        raise ValueError(f"x0: shape {tuple(x0.shape)}; flow takes (n, d), or (R, n, d) for R replicas (each from "
                         f"its own state; the run has replicas={replicas})")
    if x0.dim() == 3:
        options["replicas"] = x0.shape[0]
    options.pop("init", None)
    options.pop("init_file", None)
    if not weights:
        return _Flow.apply(options, (), checkpoints, x0)
    known = _check_weights(model, weights)
    keys = tuple(weights)
    for preset in ("q", "k", "v"):
        options.pop(preset, None)
    options["weights"] = dict(known, **{k: _numpy(weights[k]).copy() for k in keys})
    return _Flow.apply(options, keys, checkpoints, x0, *(weights[k] for k in keys))
