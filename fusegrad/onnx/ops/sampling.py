"""GridSample: each output point reads the input at a coordinate taken from `grid`, through 1 (nearest),
2 per axis (linear) or 4 per axis (cubic) taps gathered from the flattened spatial dims."""

from __future__ import annotations

import itertools

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.registry import T, op


def _reflect(x: Tensor, lo: float, hi: float) -> Tensor:
    """x folded back into [lo, hi] by repeated reflection at the bounds."""
    span = hi - lo
    if span <= 0:
        return x * 0 + lo
    below, d = x < lo, (x < lo).where(lo - x, x - hi)
    k = (d / span).floor()
    r = d - k * span
    even = (k - (k / 2).floor() * 2) == 0
    inside = (x >= lo) & (x <= hi)
    from_lo, from_hi = lo + r, hi - r
    return inside.where(x, below.where(even.where(from_lo, from_hi), even.where(from_hi, from_lo)))


def _cubic_weights(t: Tensor, a: float = -0.75) -> list[Tensor]:
    """Weights of the taps at offsets -1, 0, 1, 2 from floor(x), with t = x - floor(x)."""

    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@op("GridSample")
def grid_sample(n, x, grid):
    x, grid = T(x), T(grid)
    nd = x.ndim - 2
    N, C, spatial = x.shape[0], x.shape[1], x.shape[2:]
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(n.a("mode", "linear"), n.a("mode", "linear"))
    pad, align = n.a("padding_mode", "zeros"), bool(n.a("align_corners", 0))
    out_shape = grid.shape[1:-1]
    g = grid.cast(dtypes.float32) if grid.dtype != dtypes.float64 else grid
    taps_per_axis = []
    for ax in range(nd):
        size = spatial[ax]
        c = g[..., nd - 1 - ax]  # grid lists x (the last spatial axis) first
        c = (c + 1) / 2 * (size - 1) if align else ((c + 1) * size - 1) / 2
        if pad == "border":
            c = c.clip(0, size - 1)
        elif pad == "reflection":
            c = _reflect(c, 0, size - 1) if align else _reflect(c, -0.5, size - 0.5)
        if mode == "nearest":
            offsets, base = [(0, None)], c.round()
        else:
            base = c.floor()
            t = c - base
            ws = [1 - t, t] if mode == "linear" else _cubic_weights(t)
            offsets = list(zip(range(0 if mode == "linear" else -1, len(ws)), ws))
        taps = []
        for off, w in offsets:
            idx = base + off
            valid = (idx >= 0) & (idx <= size - 1)
            taps.append((idx.clip(0, size - 1).cast(dtypes.int32), w, valid if pad == "zeros" else None))
        taps_per_axis.append(taps)
    strides = [1] * nd
    for ax in range(nd - 2, -1, -1):
        strides[ax] = strides[ax + 1] * spatial[ax + 1]
    flat = x.reshape(N, C, -1)
    P = 1
    for s in out_shape:
        P *= s
    out = None
    for combo in itertools.product(*taps_per_axis):
        lin, weight = None, None
        for ax, (idx, w, valid) in enumerate(combo):
            term = idx * strides[ax]
            lin = term if lin is None else lin + term
            if w is not None:
                weight = w if weight is None else weight * w
            if valid is not None:
                weight = valid.where(1.0 if weight is None else weight, 0.0)
        vals = flat.gather(2, lin.reshape(N, 1, P).expand(N, C, P))
        contrib = vals if weight is None else vals * weight.reshape(N, 1, P).cast(vals.dtype)
        out = contrib if out is None else out + contrib
    return out.reshape(N, C, *out_shape).cast(x.dtype)


def _spectrum(re: Tensor, im, L: int, inverse: bool, onesided: bool, acc) -> tuple[Tensor, Tensor]:
    """The DFT of length L along the last axis, as matmuls with host-built cosine and sine tables."""
    bins = L // 2 + 1 if onesided else L
    ang = 2 * np.pi * np.outer(np.arange(L), np.arange(bins)) / L
    cos = Tensor(np.cos(ang).astype(np.float64 if acc == dtypes.float64 else np.float32))
    sin = Tensor(np.sin(ang).astype(np.float64 if acc == dtypes.float64 else np.float32))
    sign = 1.0 if inverse else -1.0
    out_re = re.matmul(cos) - (0 if im is None else im.matmul(sin)) * sign
    out_im = re.matmul(sin) * sign + (0 if im is None else im.matmul(cos))
    if inverse:
        out_re, out_im = out_re / L, out_im / L
    return out_re, out_im


@op("DFT")
def dft(n, x, length=None, axis_in=None):
    from fusegrad.onnx.registry import C

    x = T(x)
    if n.opset >= 20:
        axis = int(C(axis_in).reshape(-1)[0]) if axis_in is not None else -2
        axis = axis % x.ndim
    else:
        axis = n.a("axis", 1) % (x.ndim - 1)
    inverse, onesided, real_out = bool(n.a("inverse", 0)), bool(n.a("onesided", 0)), False
    acc = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
    re = x[..., 0].cast(acc)
    im = x[..., 1].cast(acc) if x.shape[-1] == 2 else None
    size = x.shape[axis]
    L = int(C(length).reshape(-1)[0]) if length is not None else 2 * (size - 1) if inverse and onesided else size
    re, im = (
        re.transpose(axis, -1) if axis != x.ndim - 2 else re,
        None if im is None else (im.transpose(axis, -1) if axis != x.ndim - 2 else im),
    )
    if inverse and onesided:  # the input holds bins 0..L//2: rebuild the rest by Hermitian symmetry
        k = L - L // 2 - 1
        tail_re = re[..., 1 : 1 + k].flip(-1)
        tail_im = -(im[..., 1 : 1 + k].flip(-1)) if im is not None else None
        re = re[..., : L // 2 + 1].cat(tail_re, dim=-1)
        im = None if im is None else im[..., : L // 2 + 1].cat(tail_im, dim=-1)
        size, onesided, real_out = L, False, True
    if size != L:
        pad = ((0, 0),) * (re.ndim - 1) + ((0, L - size),)
        re = re[..., :L] if size > L else re.pad(pad)
        im = None if im is None else (im[..., :L] if size > L else im.pad(pad))
    out_re, out_im = _spectrum(re, im, L, inverse, onesided, acc)
    if axis != x.ndim - 2:
        out_re, out_im = out_re.transpose(axis, -1), out_im.transpose(axis, -1)
    if real_out:  # an inverse of a one-sided spectrum is a real signal
        return out_re.unsqueeze(-1).cast(x.dtype)
    return out_re.unsqueeze(-1).cat(out_im.unsqueeze(-1), dim=-1).cast(x.dtype)


@op("STFT")
def stft(n, x, step, window=None, length=None):
    from fusegrad.onnx.registry import C

    x = T(x)
    hop = int(C(step).reshape(-1)[0])
    L = int(C(length).reshape(-1)[0]) if length is not None else T(window).shape[0]
    acc = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
    frames = (x.shape[1] - L) // hop + 1
    re = x[..., 0].cast(acc)
    im = x[..., 1].cast(acc) if x.shape[-1] == 2 else None
    re = re[:, 0:L].unsqueeze(1).cat(*[re[:, f * hop : f * hop + L].unsqueeze(1) for f in range(1, frames)], dim=1)
    if im is not None:
        im = im[:, 0:L].unsqueeze(1).cat(*[im[:, f * hop : f * hop + L].unsqueeze(1) for f in range(1, frames)], dim=1)
    if window is not None:
        w = T(window).cast(acc)
        re, im = re * w, None if im is None else im * w
    onesided = bool(n.a("onesided", 1)) and im is None
    out_re, out_im = _spectrum(re, im, L, False, onesided, acc)
    return out_re.unsqueeze(-1).cat(out_im.unsqueeze(-1), dim=-1).cast(x.dtype)
