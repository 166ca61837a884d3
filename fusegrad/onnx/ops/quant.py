"""QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked), DynamicQuantizeLinear and the QLinear ops."""

from __future__ import annotations


from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.loader import onnx_dtype
from fusegrad.onnx.ops.elementwise import cast_to
from fusegrad.onnx.registry import T, axis_of, dtype_of, op


def _broadcast_param(n, p: Tensor, x: Tensor) -> Tensor:
    """A scale or zero point shaped to multiply x: scalar, one value per `axis`, or blocks of `block_size`."""
    if p.ndim == 0 or p.numel() == 1 and p.ndim <= 1:
        return p.reshape(())
    axis = axis_of(n.a("axis", 1), x.ndim, n)
    block = n.a("block_size", 0)
    if block and p.ndim == x.ndim:
        return p.repeat_interleave(block, dim=axis)[(slice(None),) * axis + (slice(0, x.shape[axis]),)]
    return p.reshape([-1 if i == axis else 1 for i in range(x.ndim)])


@op("QuantizeLinear")
def quantize_linear(n, x, scale, zero=None):
    x, scale = T(x), T(scale)
    out_dt = (
        dtype_of(zero)
        if zero is not None
        else (onnx_dtype(n.a("output_dtype"), str(n)) if n.a("output_dtype") else dtypes.uint8)
    )
    s = _broadcast_param(n, scale, x).cast(dtypes.float32)
    y = x.cast(dtypes.float32) / s
    if out_dt in dtypes.fp8s:
        if zero is not None:
            y = y + _broadcast_param(n, T(zero), x).cast(dtypes.float32)
        return cast_to(y, out_dt, bool(n.a("saturate", 1)))
    y = y.round()
    if zero is not None:
        y = y + _broadcast_param(n, T(zero), x).cast(dtypes.float32)
    return y.clip(out_dt.min, out_dt.max).cast(out_dt)


@op("DequantizeLinear")
def dequantize_linear(n, x, scale, zero=None):
    x, scale = T(x), T(scale)
    xf = x.cast(dtypes.float32)
    if zero is not None:
        xf = xf - _broadcast_param(n, T(zero), x).cast(dtypes.float32)
    return (xf * _broadcast_param(n, scale, x).cast(dtypes.float32)).cast(scale.dtype)


@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(n, x):
    x = T(x).cast(dtypes.float32)
    lo, hi = x.min().minimum(0), x.max().maximum(0)
    scale = (hi - lo) / 255
    zero = (-lo / scale).round().clip(0, 255)
    y = ((x / scale).round() + zero).clip(0, 255).cast(dtypes.uint8)
    return y, scale, zero.cast(dtypes.uint8)


def _deq(x, scale, zero):
    return (T(x).cast(dtypes.float32) - T(zero).cast(dtypes.float32)) * T(scale).cast(dtypes.float32)


def _req(y: Tensor, scale, zero) -> Tensor:
    zero = T(zero)
    q = (y / T(scale).cast(dtypes.float32)).round() + zero.cast(dtypes.float32)
    return q.clip(zero.dtype.min, zero.dtype.max).cast(zero.dtype)


@op("QLinearMatMul")
def qlinear_matmul(n, a, a_s, a_z, b, b_s, b_z, y_s, y_z):
    a_f = _deq(a, a_s, a_z)
    b_z, b_s = T(b_z), T(b_s)
    b_zero = b_z.cast(dtypes.float32).reshape(1, -1) if b_z.ndim else b_z.cast(dtypes.float32)
    b_f = (T(b).cast(dtypes.float32) - b_zero) * (b_s.reshape(1, -1) if b_s.ndim else b_s)
    return _req(a_f.matmul(b_f), y_s, y_z)


@op("QLinearConv")
def qlinear_conv(n, x, x_s, x_z, w, w_s, w_z, y_s, y_z, b=None):
    from fusegrad.onnx.ops.nn import conv

    xf = _deq(x, x_s, x_z)
    w_s, w_z = T(w_s), T(w_z)
    shape = (-1,) + (1,) * (T(w).ndim - 1)
    wf = (T(w).cast(dtypes.float32) - w_z.cast(dtypes.float32).reshape(shape if w_z.ndim else ())) * w_s.reshape(
        shape if w_s.ndim else ()
    )
    bias = None
    if b is not None:
        bias = T(b).cast(dtypes.float32) * (T(x_s).cast(dtypes.float32) * w_s.cast(dtypes.float32)).reshape(-1)
    return _req(conv(n, xf, wf, bias), y_s, y_z)


@op("ConvInteger")
def conv_integer(n, x, w, x_z=None, w_z=None):
    from fusegrad.onnx.ops.nn import conv

    xf, wf = T(x).cast(dtypes.int32), T(w).cast(dtypes.int32)
    if x_z is not None:
        xf = xf - T(x_z).cast(dtypes.int32)
    if w_z is not None:
        wz = T(w_z).cast(dtypes.int32)
        wf = wf - (wz.reshape(-1, *([1] * (wf.ndim - 1))) if wz.ndim else wz)
    # integer conv through float32 is exact while sums stay below 2**24 (uint8 data, small kernels)
    return conv(n, xf.float(), wf.float()).round().cast(dtypes.int32)
