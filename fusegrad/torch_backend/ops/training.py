"""The backward and optimizer ops of a training step, direct (their decompositions cost ~10x more dispatch)."""

from __future__ import annotations

from typing import Any


from fusegrad.tensor import Tensor


from .factories import filled
from .table import OpCall, aten, meta_dtype, register


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(call: OpCall, x: Tensor, end: Tensor, weight: Any) -> Tensor:
    # torch's two-sided form keeps lerp exact at both ends
    small = weight < 0.5 if not isinstance(weight, Tensor) else None
    if small is True:
        return x + (end - x) * weight
    if small is False:
        return end - (end - x) * (1 - weight)
    return (weight.abs() < 0.5).where(x + (end - x) * weight, end - (end - x) * (1 - weight))


@register(aten.addcmul.default)
def _addcmul(call: OpCall, x: Tensor, a: Tensor, b: Tensor, *, value: Any = 1) -> Tensor:
    dt = meta_dtype(call.out)
    return x.cast(dt) + a.cast(dt) * b.cast(dt) * value


@register(aten.addcdiv.default)
def _addcdiv(call: OpCall, x: Tensor, a: Tensor, b: Tensor, *, value: Any = 1) -> Tensor:
    dt = meta_dtype(call.out)
    return x.cast(dt) + a.cast(dt) / b.cast(dt) * value


@register(aten.ones_like.default)
def _ones_like(call: OpCall, x: Tensor, **kwargs: Any) -> Tensor:
    return filled(call, 1)


@register(aten.threshold_backward.default)
def _threshold_backward(call: OpCall, grad: Tensor, x: Tensor, threshold: Any) -> Tensor:
    return (x <= threshold).where(0, grad)


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward(call: OpCall, grad: Tensor, out: Tensor, dim: int, input_dtype: Any) -> Tensor:
    if out.ndim == 0:
        return grad * 0
    return grad - out.exp() * grad.sum(dim, keepdim=True)


@register(aten._softmax_backward_data.default)
def _softmax_backward(call: OpCall, grad: Tensor, out: Tensor, dim: int, input_dtype: Any) -> Tensor:
    if out.ndim == 0:
        return grad * 0
    return out * (grad - (grad * out).sum(dim, keepdim=True))


def _nll_picks(x: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int) -> tuple[Tensor, Tensor]:
    """Per-sample one-hot of the target class (N, C) and its weight, 0 where ignored."""
    classes = x.shape[-1]
    hot = target.unsqueeze(-1) == Tensor.arange(classes, dtype=target.dtype).to(x.device)
    w = hot.cast(x.dtype) if weight is None else hot.where(weight.cast(x.dtype), 0)
    keep = (target != ignore_index).unsqueeze(-1)
    return keep.where(hot, False), keep.where(w, 0)


@register(aten.nll_loss_forward.default)
def _nll_loss_forward(call: OpCall, x: Tensor, target: Tensor, weight: Any, reduction: int, ignore_index: int):
    if x.ndim > 2:
        return NotImplemented
    _, w = _nll_picks(x, target, weight, ignore_index)
    losses = -(w * x).sum(-1)
    total = w.sum()
    if reduction == 0:
        return losses, total
    return (losses.sum() / total if reduction == 1 else losses.sum()), total


@register(aten.nll_loss_backward.default)
def _nll_loss_backward(call: OpCall, grad, x, target, weight, reduction, ignore_index, total_weight) -> Tensor:
    if x.ndim > 2:
        return NotImplemented
    _, w = _nll_picks(x, target, weight, ignore_index)
    g = grad.unsqueeze(-1) if reduction == 0 else grad
    out = -w * g
    return out / total_weight if reduction == 1 else out


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(call: OpCall, grad, x, kernel, stride, padding, dilation, ceil_mode, indices) -> Tensor:
    """Each output's gradient goes to the input position its index names (torch's first maximum)."""
    lead, plane = x.shape[:-2], x.shape[-2] * x.shape[-1]
    idx = indices.reshape(*lead, -1).cast("int32")
    g = grad.reshape(*lead, -1)
    zeros = Tensor.zeros(*lead, plane, dtype=x.dtype, device=x.device)
    return zeros.scatter_reduce(len(lead), idx, g, "sum").reshape(x.shape)
