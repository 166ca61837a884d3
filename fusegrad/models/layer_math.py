"""The math of the models' layers as functions of their weights, for @function bodies that take the weights as
arguments (so every layer of a model shares one trace). Each computes what its layer class computes, op for op."""

from __future__ import annotations

from fusegrad import Tensor
from fusegrad.models.weights import panel_matmul


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """nn.LayerNorm over the last dim."""
    centered = x - x.mean(axis=(x.ndim - 1,), keepdim=True)
    return centered * ((centered * centered).mean(axis=(x.ndim - 1,), keepdim=True) + eps).rsqrt() * weight + bias


def panel_linear(x: Tensor, weight: Tensor, bias: Tensor, d_out: int) -> Tensor:
    """PanelLinear: x @ W + b for W in panels (weights.to_panels)."""
    return panel_matmul(x, weight, d_out) + bias
