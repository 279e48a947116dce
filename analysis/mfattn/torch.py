"""mfattn.torch: mfattn's field inside PyTorch autograd (docs/python.md, "Derivatives").

    import mfattn.torch
    v = mfattn.torch.velocity(x, model)               # x: a float64 tensor (n, d) or (R, n, d)
    v = mfattn.torch.velocity(x, model, weights)      # weights: tensors under model.weights()'s keys

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


def velocity(x: torch.Tensor, model, weights: dict | None = None) -> torch.Tensor:
    """The field of `model` at x as a differentiable torch function (module docstring)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(model, mfattn.Model):
        raise TypeError(f"model: expected an mfattn.Model, got {type(model).__name__}")
    if not weights:
        return _Field.apply(model, (), x)
    if not isinstance(weights, dict):
        raise TypeError(f"weights: expected a dict of tensors keyed as model.weights(), got {type(weights).__name__}")
    options = dict(model.options)
    if options.get("matrices") == "per-replica":
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
    keys = tuple(weights)
    at = dict(known, **{k: _numpy(weights[k]) for k in keys})
    # The weights replace the presets' matrices (q=, k=, v= name them; a weights dict refuses them).
    for preset in ("q", "k", "v"):
        options.pop(preset, None)
    model_at = mfattn.Model(**dict(options, weights=at))
    return _Field.apply(model_at, keys, x, *(weights[k] for k in keys))
