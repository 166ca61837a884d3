"""Matmuls, convolutions and pooling."""

from __future__ import annotations

from typing import Any


from fusegrad.tensor import Tensor


from .table import OpCall, aten, register


@register(aten.mm.default, aten.bmm.default, aten.dot.default)
def _mm(call: OpCall, a: Tensor, b: Tensor) -> Tensor:
    return a.matmul(b)


@register(aten.addmm.default)
def _addmm(call: OpCall, bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    prod_ = a.matmul(b)
    prod_ = prod_ * alpha if alpha != 1 else prod_
    if beta == 0:
        return prod_
    return prod_ + (bias * beta if beta != 1 else bias)


def _conv(x: Tensor, w: Tensor, bias: Tensor | None, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return x.conv_transpose2d(
            w, bias, groups, tuple(stride), tuple(dilation), tuple(padding), tuple(output_padding)
        )
    return x.conv2d(w, bias, groups, tuple(stride), tuple(dilation), tuple(padding))


@register(aten.convolution.default)
def _convolution(call: OpCall, x, w, bias, stride, padding, dilation, transposed, output_padding, groups) -> Tensor:
    return _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@register(aten.convolution_backward.default)
def _convolution_backward(
    call: OpCall, grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask
) -> tuple:
    """The gradients through fusegrad's own autodiff of the same convolution."""
    xv, wv = x.detach(), w.detach()
    out = _conv(xv, wv, None, stride, padding, dilation, transposed, output_padding, groups)
    gx, gw = out.gradient(xv, wv, gradient=grad)
    gb = grad.sum(tuple(d for d in range(grad.ndim) if d != 1)) if mask[2] else None
    return (gx if mask[0] else None, gw if mask[1] else None, gb)


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d(call: OpCall, x: Tensor, kernel, stride=(), padding=0, dilation=1, ceil_mode=False) -> tuple:
    values, indices = x.max_pool2d(tuple(kernel), tuple(stride) or None, dilation, padding, ceil_mode, True)
    return values, indices.cast("int64")


@register(aten.avg_pool2d.default)
def _avg_pool2d(
    call: OpCall, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
) -> Tensor:
    if divisor_override is not None:
        raise NotImplementedError("fuse: aten.avg_pool2d with divisor_override is not supported")
    return x.avg_pool2d(tuple(kernel), tuple(stride) or None, 1, padding, ceil_mode, count_include_pad)


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(
    call: OpCall, grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
) -> Tensor:
    xv = x.detach()
    out = xv.avg_pool2d(tuple(kernel), tuple(stride) or None, 1, padding, ceil_mode, count_include_pad)
    return out.gradient(xv, gradient=grad)[0]
