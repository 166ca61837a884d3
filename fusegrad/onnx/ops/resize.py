"""Resize / Upsample: each resized axis is a (out × in) weight matrix built on the host from the coordinate
transform and the interpolation mode, applied as a contraction (nearest uses a gather, exact for every dtype)."""

from __future__ import annotations

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.registry import C, axis_of


def _coords(mode: str, out: int, size: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    x = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adj = out / (scale * size)
        return size / 2 * (1 - adj) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":  # the unrounded output length size·scale, as the reference computes it
        return x * (size - 1) / (size * scale - 1) if out > 1 else np.zeros(out)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "tf_crop_and_resize":
        lo, hi = roi
        if out > 1:
            return lo * (size - 1) + x * (hi - lo) * (size - 1) / (out - 1)
        return np.full(out, 0.5 * (lo + hi) * (size - 1))
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _nearest(c: np.ndarray, how: str) -> np.ndarray:
    if how == "round_prefer_floor":
        return np.where(c - np.floor(c) == 0.5, np.floor(c), np.round(c))
    if how == "round_prefer_ceil":
        return np.where(c - np.floor(c) == 0.5, np.ceil(c), np.round(c))
    if how == "floor":
        return np.floor(c)
    if how == "ceil":
        return np.ceil(c)
    raise ValueError(f"unknown nearest_mode {how!r}")


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def weights(n, mode: str, out: int, size: int, scale: float, roi) -> tuple[np.ndarray, np.ndarray]:
    """(out × size) weights and a mask of output positions that take the extrapolation value."""
    coord = n.a("coordinate_transformation_mode", "half_pixel" if n.opset >= 11 else "asymmetric")
    c = _coords(coord, out, size, scale, roi)
    outside = (c < 0) | (c > size - 1) if coord == "tf_crop_and_resize" else np.zeros(out, bool)
    W = np.zeros((out, size))
    rows = np.arange(out)
    antialias = bool(n.a("antialias", 0)) and scale < 1
    if mode == "nearest":
        how = n.a("nearest_mode", "round_prefer_floor" if n.opset >= 11 and n.op_type == "Resize" else "floor")
        idx = np.clip(_nearest(c, how), 0, size - 1).astype(np.int64)
        W[rows, idx] = 1
    elif mode == "linear" and not antialias:
        x0 = np.floor(c)
        t = c - x0
        for off, w in ((0, 1 - t), (1, t)):
            np.add.at(W, (rows, np.clip(x0 + off, 0, size - 1).astype(np.int64)), w)
    else:
        a = n.a("cubic_coeff_a", -0.75)
        support = (1.0 if mode == "linear" else 2.0) / (scale if antialias else 1.0)
        lo = np.floor(c - support) + 1
        taps = int(np.ceil(2 * support)) + 1
        for k in range(taps):
            p = lo + k
            d = (c - p) * (scale if antialias else 1.0)
            w = np.maximum(1 - np.abs(d), 0) if mode == "linear" else _cubic(d, a)
            inside = (p >= 0) & (p <= size - 1)
            if n.a("exclude_outside", 0):
                w = np.where(inside, w, 0)
            np.add.at(W, (rows, np.clip(p, 0, size - 1).astype(np.int64)), w)
        # the stretched antialias filter sums to about 1/scale; taps past the edge clamp to it unless excluded
        if n.a("exclude_outside", 0) or antialias:
            W = W / np.maximum(W.sum(1, keepdims=True), 1e-300)
    W[outside] = 0
    return W, outside


def resize_op(n, x: Tensor, *rest):
    if n.op_type == "Upsample" or n.opset < 11:
        roi, sizes = None, None
        scales = C(rest[0]) if rest else np.asarray(n.a("scales"), np.float32)
    else:
        roi = C(rest[0]) if len(rest) > 0 and rest[0] is not None and C(rest[0]).size else None
        scales = C(rest[1]) if len(rest) > 1 and rest[1] is not None and C(rest[1]).size else None
        sizes = C(rest[2]) if len(rest) > 2 and rest[2] is not None and C(rest[2]).size else None
    axes = [axis_of(a, x.ndim, n) for a in (n.a("axes") or range(x.ndim))]
    mode = n.a("mode", "nearest")
    mode = {"bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    in_shape = [x.shape[a] for a in axes]
    if sizes is not None:
        out = [int(v) for v in sizes]
        scale = [o / i for o, i in zip(out, in_shape)]
        policy = n.a("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            s = min(scale) if policy == "not_larger" else max(scale)
            scale = [s] * len(axes)
            out = [int(np.floor(s * i + 0.5)) for i in in_shape]
    else:
        scale = [float(v) for v in scales]
        out = [int(np.floor(i * s)) for i, s in zip(in_shape, scale)]
    roi_pairs = [(0.0, 1.0)] * len(axes)
    if roi is not None:
        r = [float(v) for v in roi.reshape(-1)]
        k = len(r) // 2
        roi_pairs = [(r[i], r[i + k]) for i in range(k)]
        if k == x.ndim and len(axes) != x.ndim:
            roi_pairs = [roi_pairs[a] for a in axes]
    extrap = n.a("extrapolation_value", 0.0)
    y = x
    for j, ax in enumerate(axes):
        if out[j] == in_shape[j] and scale[j] == 1.0 and n.a("coordinate_transformation_mode") != "tf_crop_and_resize":
            continue
        W, outside = weights(n, mode, out[j], in_shape[j], scale[j], roi_pairs[j])
        if mode == "nearest":
            idx = W.argmax(1).astype(np.int32)
            y = y[(slice(None),) * ax + (Tensor(idx),)]
            if outside.any():
                shape = [out[j] if i == ax else 1 for i in range(x.ndim)]
                y = Tensor(outside.reshape(shape)).where(extrap, y).cast(x.dtype)
            continue
        yf = y if dtypes.is_float(y.dtype) else y.float()
        moved = yf.transpose(ax, -1) if ax != y.ndim - 1 else yf
        r = moved.matmul(Tensor(W.T.astype(np.float32 if yf.dtype != dtypes.float64 else np.float64)).cast(yf.dtype))
        r = r.transpose(ax, -1) if ax != y.ndim - 1 else r
        if outside.any():
            shape = [out[j] if i == ax else 1 for i in range(x.ndim)]
            r = Tensor(outside.reshape(shape)).where(extrap, r)
        y = r
    if dtypes.is_int(x.dtype) and not dtypes.is_int(y.dtype):
        y = y.round().clip(x.dtype.min, x.dtype.max)
    return y.cast(x.dtype)
