"""Convolution, pooling, normalization, dropout and losses."""

from __future__ import annotations

import math

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.registry import C, T, axis_of, op


def auto_pads(n, spatial, kernel, strides, dilations) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial dim from `pads` or `auto_pad`."""
    nd, auto = len(spatial), n.a("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((math.ceil(i / s) - 1) * s + (k - 1) * d + 1 - i, 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            out.append((lo, total - lo))
        return out
    if auto == "VALID":
        return [(0, 0)] * nd
    pads = n.a("pads") or [0] * (2 * nd)
    return [(pads[i], pads[i + nd]) for i in range(nd)]


def torch_order(pads: list[tuple[int, int]]) -> list[int]:
    """Flat (last_begin, last_end, prev_begin, prev_end, …) padding, the order Tensor.conv2d and pools take."""
    return [v for b, e in reversed(pads) for v in (b, e)]


def _geometry(n, x, kernel):
    nd = len(kernel)
    strides = n.a("strides") or [1] * nd
    dilations = n.a("dilations") or [1] * nd
    return strides, dilations, auto_pads(n, x.shape[2:], kernel, strides, dilations)


@op("Conv")
def conv(n, x, w, b=None):
    x, w = T(x), T(w)
    kernel = list(w.shape[2:])
    strides, dilations, pads = _geometry(n, x, kernel)
    return x.conv2d(
        w,
        None if b is None else T(b),
        groups=n.a("group", 1),
        stride=strides,
        dilation=dilations,
        padding=torch_order(pads),
    )


@op("ConvTranspose")
def conv_transpose(n, x, w, b=None):
    x, w = T(x), T(w)
    nd = w.ndim - 2
    strides = n.a("strides") or [1] * nd
    dilations = n.a("dilations") or [1] * nd
    out_pad = n.a("output_padding") or [0] * nd
    y = x.conv_transpose2d(w, None, groups=n.a("group", 1), stride=strides, dilation=dilations)
    full = y.shape[2:]  # (i-1)s + d(k-1) + 1 before output_padding
    want = n.a("output_shape")
    auto = n.a("auto_pad", "NOTSET")
    if want is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        want = [i * s for i, s in zip(x.shape[2:], strides)]
    if want is not None:
        want = list(want)[-nd:]
        pads = []
        for f, op_, o in zip(full, out_pad, want):
            total = f + op_ - o
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads.append((lo, total - lo))
    else:
        p = n.a("pads") or [0] * (2 * nd)
        pads = [(p[i], p[i + nd]) for i in range(nd)]
    grouped = [(0, 0), (0, 0)] + [(-lo, -hi + op_) for (lo, hi), op_ in zip(pads, out_pad)]
    y = y.pad(tuple(grouped))
    if b is not None:
        y = y + T(b).reshape(1, -1, *([1] * nd))
    return y


def _pool_geometry(n, x):
    kernel = n.a("kernel_shape")
    nd = len(kernel)
    strides = n.a("strides") or [1] * nd
    dilations = n.a("dilations") or [1] * nd
    pads = auto_pads(n, x.shape[2:], kernel, strides, dilations)
    return kernel, strides, dilations, pads


@op("MaxPool")
def max_pool(n, x):
    x = T(x)
    kernel, strides, dilations, pads = _pool_geometry(n, x)
    ceil = bool(n.a("ceil_mode", 0))
    is_int = dtypes.is_int(x.dtype)
    xf = x.cast(dtypes.float32) if is_int else x
    if not _fits(pads, kernel, dilations) and n.num_outputs < 2:
        xf, pads = xf.pad(((0, 0), (0, 0)) + tuple(pads), value=-np.inf), [(0, 0)] * len(pads)
    if n.num_outputs < 2:
        y = xf.max_pool2d(kernel, strides, dilations, torch_order(pads), ceil_mode=ceil)
        return y.cast(x.dtype)
    y, idx = xf.max_pool2d(kernel, strides, dilations, torch_order(pads), ceil_mode=ceil, return_indices=True)
    spatial = x.shape[2:]
    plane = int(np.prod(spatial, dtype=np.int64))
    idx = idx.cast(dtypes.int64)
    if n.a("storage_order", 0) and len(spatial) == 2:
        h, w = idx // spatial[1], idx % spatial[1]
        idx = h + w * spatial[0]
    N, Ch = x.shape[:2]
    base = Tensor.arange(N * Ch, dtype=dtypes.int64).reshape(N, Ch, *([1] * len(spatial))) * plane
    return y.cast(x.dtype), idx + base


def _fits(pads, kernel, dilations) -> bool:
    """Whether Tensor's pools take these pads (each at most half the dilated window)."""
    return all(max(p) <= ((k - 1) * d + 1) // 2 for p, k, d in zip(pads, kernel, dilations))


@op("AveragePool")
def average_pool(n, x):
    x = T(x)
    kernel, strides, dilations, pads = _pool_geometry(n, x)
    ceil, include = bool(n.a("ceil_mode", 0)), bool(n.a("count_include_pad", 0))
    if _fits(pads, kernel, dilations):
        return x.avg_pool2d(kernel, strides, dilations, torch_order(pads), ceil_mode=ceil, count_include_pad=include)
    # pads wider than half the window: pad first, then pool the padded input (and a ones mask for the divisor)
    grouped = ((0, 0), (0, 0)) + tuple(pads)
    y = x.pad(grouped).avg_pool2d(kernel, strides, dilations, 0, ceil_mode=ceil)
    if include:
        return y
    ones = Tensor.ones(*x.shape, dtype=x.dtype).pad(grouped).avg_pool2d(kernel, strides, dilations, 0, ceil_mode=ceil)
    return y / ones


@op("LpPool")
def lp_pool(n, x):
    x = T(x)
    kernel, strides, dilations, pads = _pool_geometry(n, x)
    p = n.a("p", 2)
    xp = x.abs().pow(p).pad(((0, 0), (0, 0)) + tuple(pads))
    s = xp.avg_pool2d(kernel, strides, dilations, 0, ceil_mode=bool(n.a("ceil_mode", 0)))
    return (s * int(np.prod(kernel))).pow(1.0 / p)


def _spatial(x):
    return tuple(range(2, x.ndim))


def _global(x, reduce):
    """reduce(x, axes, keepdim=True) over the spatial dims; with constant dims over them flattened into one contiguous
    axis, one loop the C compiler vectorizes, not one per spatial dim (SqueezeNet's 1000x13x13 average with its ReLU,
    one thread: 83 -> 23 us)."""
    if x.ndim > 3 and all(isinstance(d, int) for d in x.shape):
        flat = x.reshape(x.shape[:2] + (math.prod(x.shape[2:]),))
        return reduce(flat, (2,), keepdim=True).reshape(x.shape[:2] + (1,) * (x.ndim - 2))
    return reduce(x, _spatial(x), keepdim=True)


@op("GlobalAveragePool")
def global_average_pool(n, x):
    return _global(T(x), Tensor.mean)


@op("GlobalMaxPool")
def global_max_pool(n, x):
    return _global(T(x), Tensor.max)


@op("GlobalLpPool")
def global_lp_pool(n, x):
    x, p = T(x), n.a("p", 2)
    return x.abs().pow(p).sum(_spatial(x), keepdim=True).pow(1.0 / p)


def _channel(v, x):
    return T(v).reshape(1, -1, *([1] * (x.ndim - 2)))


@op("BatchNormalization")
def batch_norm(n, x, scale, b, mean, var):
    x, eps = T(x), n.a("epsilon", 1e-5)
    if n.a("training_mode", 0):
        axes = (0,) + _spatial(x)
        bm, bv = x.mean(axes), x.var(axes, correction=0)
        mom = n.a("momentum", 0.9)
        y = (x - _channel(bm, x)) / (_channel(bv, x) + eps).sqrt() * _channel(scale, x) + _channel(b, x)
        return y, T(mean) * mom + bm * (1 - mom), T(var) * mom + bv * (1 - mom)
    if all(isinstance(v, np.ndarray) for v in (scale, b, mean, var)):
        # constant statistics fold on the host to one multiply-add, so a following conv reads no rsqrt per tap
        a = (scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)).astype(scale.dtype)
        c = (b.astype(np.float64) - mean.astype(np.float64) * a).astype(b.dtype)
        return x * _channel(a, x) + _channel(c, x)
    a = (T(scale) * (T(var) + eps).rsqrt()).contiguous()
    return x * _channel(a, x) + _channel((T(b) - T(mean) * a).contiguous(), x)


@op("InstanceNormalization")
def instance_norm(n, x, scale, b):
    x, eps = T(x), n.a("epsilon", 1e-5)
    axes = _spatial(x)
    m = x.mean(axes, keepdim=True)
    v = ((x - m) * (x - m)).mean(axes, keepdim=True)
    return (x - m) * (v + eps).rsqrt() * _channel(scale, x) + _channel(b, x)


@op("LayerNormalization")
def layer_norm(n, x, scale, b=None):
    x, eps = T(x), n.a("epsilon", 1e-5)
    axis = axis_of(n.a("axis", -1), x.ndim, n)
    axes = tuple(range(axis, x.ndim))
    xf = x.float() if x.dtype != dtypes.float64 else x
    m = xf.mean(axes, keepdim=True)
    d = xf - m
    inv = ((d * d).mean(axes, keepdim=True) + eps).rsqrt()
    y = (d * inv).cast(x.dtype) * T(scale)
    if b is not None:
        y = y + T(b)
    return y, m, inv


@op("RMSNormalization")
def rms_norm(n, x, scale):
    x, eps = T(x), n.a("epsilon", 1e-5)
    axis = axis_of(n.a("axis", -1), x.ndim, n)
    axes = tuple(range(axis, x.ndim))
    xf = x.float() if x.dtype != dtypes.float64 else x
    inv = ((xf * xf).mean(axes, keepdim=True) + eps).rsqrt()
    return (xf * inv).cast(x.dtype) * T(scale)


@op("GroupNormalization")
def group_norm(n, x, scale, b):
    x, eps, g = T(x), n.a("epsilon", 1e-5), n.a("num_groups")
    N, Ch = x.shape[:2]
    xg = x.reshape(N, g, -1)
    m = xg.mean(2, keepdim=True)
    d = xg - m
    y = (d * ((d * d).mean(2, keepdim=True) + eps).rsqrt()).reshape(x.shape)
    scale, b = T(scale), T(b)
    if n.opset < 21 and scale.shape[0] == g and g != Ch:
        scale, b = scale.repeat_interleave(Ch // g), b.repeat_interleave(Ch // g)
    return y * _channel(scale, x) + _channel(b, x)


@op("LRN")
def lrn(n, x):
    x = T(x)
    size, alpha, beta, bias = n.a("size"), n.a("alpha", 1e-4), n.a("beta", 0.75), n.a("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = (x * x).pad(((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2))
    Ch = x.shape[1]
    total = sq[:, 0:Ch]
    for i in range(1, size):
        total = total + sq[:, i : i + Ch]
    return x / (total * (alpha / size) + bias).pow(beta)


@op("MeanVarianceNormalization")
def mvn(n, x):
    x = T(x)
    axes = tuple(axis_of(a, x.ndim, n) for a in (n.a("axes") or [0, 2, 3]))
    m = x.mean(axes, keepdim=True)
    v = (x * x).mean(axes, keepdim=True) - m * m
    return (x - m) / (v.sqrt() + 1e-9)


@op("LpNormalization")
def lp_norm(n, x):
    x, p = T(x), n.a("p", 2)
    axis = axis_of(n.a("axis", -1), x.ndim, n)
    norm = x.abs().sum(axis, keepdim=True) if p == 1 else (x * x).sum(axis, keepdim=True).sqrt()
    return (norm == 0).where(0, x / norm).cast(x.dtype)


@op("Dropout")
def dropout(n, x, ratio=None, training=None):
    x = T(x)
    train = bool(C(training).reshape(-1)[0]) if training is not None else False
    p = float(C(ratio).reshape(-1)[0]) if ratio is not None else n.a("ratio", 0.5)
    if not train or p == 0:
        return x, Tensor.ones(*x.shape, dtype=dtypes.bool)
    if n.a("seed") is not None:
        Tensor.manual_seed(n.a("seed"))
    keep = Tensor.rand(*x.shape) >= p
    return keep.where(x / (1 - p), 0).cast(x.dtype), keep


@op("NegativeLogLikelihoodLoss")
def nll_loss(n, x, target, weight=None):
    return _nll(n, T(x), T(target), weight)


def _nll(n, logp, target, weight):
    ignore = n.a("ignore_index")
    t = target.cast(dtypes.int32)
    valid = (t != ignore) if ignore is not None else None
    safe = valid.where(t, 0) if valid is not None else t
    picked = -logp.gather(1, safe.unsqueeze(1)).squeeze(1)
    w = T(weight)[safe] if weight is not None else None
    if w is None:
        w = Tensor.ones(*t.shape, dtype=logp.dtype)
    if valid is not None:
        w = valid.where(w, 0)
    loss = picked * w
    red = n.a("reduction", "mean")
    if red == "none":
        return loss.cast(logp.dtype)
    if red == "sum":
        return loss.sum().cast(logp.dtype)
    return (loss.sum() / w.sum()).cast(logp.dtype)


@op("SoftmaxCrossEntropyLoss")
def softmax_ce(n, x, target, weight=None):
    x = T(x)
    logp = x.log_softmax(1)
    loss = _nll(n, logp, T(target), weight)
    return (loss, logp) if n.num_outputs > 1 else loss


@op("Resize", "Upsample")
def resize(n, x, *rest):
    from fusegrad.onnx.ops.resize import resize_op

    return resize_op(n, T(x), *rest)


@op("MaxUnpool")
def max_unpool(n, x, idx, out_shape=None):
    x = T(x)
    nd = x.ndim - 2
    kernel = n.a("kernel_shape")
    strides = n.a("strides") or [1] * nd
    pads = n.a("pads") or [0] * (2 * nd)
    spatial = [
        (i - 1) * s + k - pads[d] - pads[d + nd] for d, (i, s, k) in enumerate(zip(x.shape[2:], strides, kernel))
    ]
    shape = [*x.shape[:2], *spatial]
    total = int(np.prod(shape, dtype=np.int64))
    # ONNX indices count over the whole tensor (batch and channel included), so one flat scatter places every value
    flat = Tensor.zeros(total, dtype=x.dtype).scatter(0, T(idx).reshape(-1).cast(dtypes.int32), x.reshape(-1))
    y = flat.reshape(shape)
    if out_shape is None:
        return y
    # the indices count over the shape the attributes give; a larger output_shape pads at each axis's end
    want = [int(v) for v in C(out_shape).reshape(-1)]
    if want[:2] != shape[:2]:
        raise ValueError(f"{n}: output_shape {want} does not keep the input's batch and channels {shape[:2]}")
    y = y[(slice(None), slice(None)) + tuple(slice(0, min(w, s)) for w, s in zip(want[2:], spatial))]
    return y.pad(((0, 0), (0, 0)) + tuple((0, max(w - s, 0)) for w, s in zip(want[2:], spatial)))


def _stuff(x: Tensor, axis: int, stride: int) -> Tensor:
    """x with stride-1 zeros after each element along axis (the last ones dropped): positions 0, s, 2s, ..."""
    if stride == 1:
        return x
    size = x.shape[axis]
    y = x.unsqueeze(axis + 1)
    pads = [(0, 0)] * y.ndim
    pads[axis + 1] = (0, stride - 1)
    y = y.pad(tuple(pads))
    shape = list(x.shape)
    shape[axis] = size * stride
    return y.reshape(shape)[(slice(None),) * axis + (slice(0, (size - 1) * stride + 1),)]


@op("Col2Im")
def col2im(n, x, image_shape, block_shape):
    x = T(x)
    image, block = [int(v) for v in C(image_shape).reshape(-1)], [int(v) for v in C(block_shape).reshape(-1)]
    nd = len(image)
    dil = n.a("dilations") or [1] * nd
    strides = n.a("strides") or [1] * nd
    pads = n.a("pads") or [0] * (2 * nd)
    N, CK, _ = x.shape
    ch = CK // int(np.prod(block))
    padded = [image[d] + pads[d] + pads[d + nd] for d in range(nd)]
    blocks = [(padded[d] - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1 for d in range(nd)]
    cols = x.reshape(N, ch, *block, *blocks)
    out = None
    for offs in np.ndindex(*block):
        part = cols[(slice(None), slice(None)) + tuple(offs)]  # (N, C, *blocks)
        for d in range(nd):
            part = _stuff(part, 2 + d, strides[d])
        grouped = [(0, 0), (0, 0)]
        for d in range(nd):
            start = offs[d] * dil[d]
            grouped.append((start, padded[d] - start - part.shape[2 + d]))
        part = part.pad(tuple(grouped))
        out = part if out is None else out + part
    crop = tuple(slice(pads[d], pads[d] + image[d]) for d in range(nd))
    return out[(slice(None), slice(None)) + crop]
