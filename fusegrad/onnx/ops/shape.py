"""Shape and movement ops: Reshape, Transpose, Squeeze, Concat, Split, Slice, Pad, Expand, Tile and friends. The
shape-computing ones also run on numpy when their inputs are constants (see registry.FOLD)."""

from __future__ import annotations

import numpy as np

from fusegrad import Tensor
from fusegrad.onnx.loader import onnx_dtype
from fusegrad.onnx.registry import C, T, axis_of, dtype_of, fold, ints, op

BIG = 2**62


def reshape_target(n, shape: tuple[int, ...], target: list[int]) -> list[int]:
    allowzero = n.a("allowzero", 0)
    out = [shape[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise ValueError(f"{n}: target shape {target} has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        total = int(np.prod(shape, dtype=np.int64))
        if known == 0 or total % known:
            raise ValueError(f"{n}: cannot reshape {shape} to {target}")
        out[out.index(-1)] = total // known
    if int(np.prod(out, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"{n}: cannot reshape {shape} to {target}")
    return out


@op("Reshape")
def reshape(n, x, shape=None):
    target = ints(shape) if shape is not None else n.a("shape")
    return (
        x.reshape(reshape_target(n, tuple(x.shape), target))
        if isinstance(x, np.ndarray)
        else T(x).reshape(reshape_target(n, tuple(x.shape), target))
    )


fold("Reshape")(reshape)


@op("Flatten")
def flatten(n, x):
    axis = n.a("axis", 1)
    axis = axis % x.ndim if x.ndim and axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(lead, int(np.prod(x.shape[axis:], dtype=np.int64)))


fold("Flatten")(flatten)


@op("Transpose")
def transpose(n, x):
    perm = n.a("perm") or list(range(x.ndim))[::-1]
    return np.transpose(x, perm) if isinstance(x, np.ndarray) else T(x).permute(perm)


fold("Transpose")(transpose)


def _squeeze_axes(n, x, axes_in):
    axes = ints(axes_in) if axes_in is not None else n.a("axes")
    if axes is None:
        return [i for i, s in enumerate(x.shape) if s == 1]
    return sorted({axis_of(a, x.ndim, n) for a in axes})


@op("Squeeze")
def squeeze(n, x, axes_in=None):
    axes = _squeeze_axes(n, x, axes_in)
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"{n}: cannot squeeze axis {a} of shape {tuple(x.shape)}")
    return x.reshape([s for i, s in enumerate(x.shape) if i not in axes])


fold("Squeeze")(squeeze)


@op("Unsqueeze")
def unsqueeze(n, x, axes_in=None):
    axes = ints(axes_in) if axes_in is not None else n.a("axes")
    rank = x.ndim + len(axes)
    axes = sorted({axis_of(a, rank, n) for a in axes})
    shape, it = [], iter(x.shape)
    for i in range(rank):
        shape.append(1 if i in axes else next(it))
    return x.reshape(shape)


fold("Unsqueeze")(unsqueeze)


@op("Concat")
def concat(n, *xs):
    xs = [x for x in xs if x is not None]
    axis = axis_of(n.a("axis"), xs[0].ndim, n)
    if all(isinstance(x, np.ndarray) for x in xs):
        return np.concatenate(xs, axis=axis)
    kept = [T(x) for x in xs if x.shape[axis] != 0] or [T(xs[0])]
    return kept[0].cat(*kept[1:], dim=axis) if len(kept) > 1 else kept[0]


fold("Concat")(concat)


@op("Split")
def split(n, x, split_in=None):
    axis = axis_of(n.a("axis", 0), x.ndim, n)
    size = x.shape[axis]
    sizes = ints(split_in) if split_in is not None else n.a("split")
    if not sizes:
        parts = n.a("num_outputs", n.num_outputs)
        chunk = -(-size // parts)
        sizes = [min(chunk, size - i * chunk) for i in range(parts)]
    if sum(sizes) != size:
        raise ValueError(f"{n}: split sizes {sizes} do not add up to {size} (axis {axis})")
    out, start = [], 0
    for s in sizes:
        idx = tuple(slice(None) for _ in range(axis)) + (slice(start, start + s),)
        out.append(x[idx] if isinstance(x, np.ndarray) else T(x)[idx])
        start += s
    return tuple(out)


fold("Split")(split)


def slice_args(n, shape, starts, ends, axes, steps):
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    idx = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = axis_of(ax, len(shape), n)
        dim = shape[ax]
        if sp == 0:
            raise ValueError(f"{n}: slice step 0 on axis {ax}")
        st = st + dim if st < 0 else st
        en = en + dim if en < 0 else en
        if sp > 0:
            st, en = min(max(st, 0), dim), min(max(en, 0), dim)
        else:
            st, en = min(max(st, -1), dim - 1), min(max(en, -1), dim - 1)
        idx[ax] = slice(st, en if en >= 0 else None, sp)
    return tuple(idx)


@op("Slice")
def slice_(n, x, starts=None, ends=None, axes=None, steps=None):
    if n.opset < 10:
        starts, ends, axes, steps = n.a("starts"), n.a("ends"), n.a("axes"), None
    else:
        starts, ends = ints(starts), ints(ends)
        axes = ints(axes) if axes is not None else None
        steps = ints(steps) if steps is not None else None
    idx = slice_args(n, tuple(x.shape), starts, ends, axes, steps)
    if isinstance(x, np.ndarray):
        return x[idx]
    return T(x)[idx]


fold("Slice")(slice_)


@op("Expand")
def expand(n, x, shape):
    out = tuple(np.broadcast_shapes(tuple(x.shape), tuple(ints(shape))))
    if isinstance(x, np.ndarray):
        return np.broadcast_to(x, out).copy()
    x = T(x)
    return x.reshape((1,) * (len(out) - x.ndim) + tuple(x.shape)).expand(out)


fold("Expand")(expand)


@op("Tile")
def tile(n, x, repeats):
    reps = ints(repeats)
    if isinstance(x, np.ndarray):
        return np.tile(x, reps)
    return T(x).repeat(reps) if x.ndim else T(x)


fold("Tile")(tile)


@op("Pad")
def pad(n, x, pads=None, value=None, axes=None):
    x = T(x)
    if n.opset < 11:
        pads, value = n.a("pads") or n.a("paddings"), n.a("value", 0.0)
    else:
        pads = ints(pads)
        value = C(value).reshape(-1)[0].item() if value is not None and C(value).size else 0
    axes = list(range(x.ndim)) if axes is None else [axis_of(a, x.ndim, n) for a in ints(axes)]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"{n}: {len(pads)} pads for {len(axes)} axes")
    grouped = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        grouped[a] = (pads[i], pads[i + len(axes)])
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[
        n.a("mode", "constant")
    ]
    if mode != "constant" and any(b < 0 or e < 0 for b, e in grouped):
        crop = tuple(slice(-b if b < 0 else 0, s + e if e < 0 else s) for (b, e), s in zip(grouped, x.shape))
        x, grouped = x[crop], [(max(b, 0), max(e, 0)) for b, e in grouped]
    if mode == "constant":
        return x.pad(tuple(grouped), value=value)
    if mode == "circular":
        return _wrap_pad(x, grouped)
    return x.pad(tuple(grouped), mode=mode)


def _wrap_pad(x: Tensor, grouped) -> Tensor:
    for ax, (b, e) in enumerate(grouped):
        if b == 0 and e == 0:
            continue
        size = x.shape[ax]
        reps = -(-(b + e) // size) + 1
        tiled = x.repeat([reps * 2 + 1 if i == ax else 1 for i in range(x.ndim)])
        start = (reps * 2 + 1) // 2 * size - b
        x = tiled[tuple(slice(start, start + size + b + e) if i == ax else slice(None) for i in range(x.ndim))]
    return x


@op("Shape")
def shape(n, x):
    s = np.array(x.shape, dtype=np.int64)
    start, end = n.a("start", 0), n.a("end", len(s))
    return s[start:end].copy()


fold("Shape")(shape)


@op("Size")
def size(n, x):
    return np.array(int(np.prod(x.shape, dtype=np.int64)), dtype=np.int64)


fold("Size")(size)


@op("ConstantOfShape")
def constant_of_shape(n, shape_in):
    dims = tuple(ints(shape_in))
    value = n.a("value", np.zeros(1, dtype=np.float32)).reshape(-1)
    if int(np.prod(dims, dtype=np.int64)) <= 4096:
        return np.full(dims, value[0], dtype=value.dtype)
    return Tensor.full(dims, value[0].item(), dtype=dtype_of(value)).contiguous()


fold("ConstantOfShape")(constant_of_shape)


@op("Range")
def range_(n, start, limit, delta):
    s, lim, d = (C(v).reshape(-1)[0] for v in (start, limit, delta))
    count = max(int(np.ceil((lim - s) / d)), 0)
    return (s + np.arange(count, dtype=np.float64 if C(start).dtype.kind == "f" else np.int64) * d).astype(
        C(start).dtype
    )


fold("Range")(range_)


@op("DepthToSpace")
def depth_to_space(n, x):
    x, b = T(x), n.a("blocksize")
    N, c, h, w = x.shape
    if n.a("mode", "DCR") == "DCR":
        y = x.reshape(N, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(N, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(N, c // (b * b), h * b, w * b)


@op("SpaceToDepth")
def space_to_depth(n, x):
    x, b = T(x), n.a("blocksize")
    N, c, h, w = x.shape
    y = x.reshape(N, c, h // b, b, w // b, b)
    y = y.permute(0, 1, 3, 5, 2, 4) if n.a("mode", "DCR") == "CRD" else y.permute(0, 3, 5, 1, 2, 4)
    return y.reshape(N, c * b * b, h // b, w // b)


@op("Trilu")
def trilu(n, x, k=None):
    x, k = T(x), ints(k)[0] if k is not None else 0
    rows, cols = x.shape[-2], x.shape[-1]
    diff = Tensor.arange(cols).reshape(1, cols) - Tensor.arange(rows).reshape(rows, 1)
    keep = diff >= k if n.a("upper", 1) else diff <= k
    return keep.where(x, 0).cast(x.dtype)


@op("EyeLike")
def eye_like(n, x):
    dt = onnx_dtype(n.a("dtype"), str(n)) if n.a("dtype") is not None else dtype_of(x)
    rows, cols = x.shape
    diff = Tensor.arange(cols).reshape(1, cols) - Tensor.arange(rows).reshape(rows, 1)
    return (diff == n.a("k", 0)).cast(dt)


@op("Identity")
def identity(n, x):
    return x


fold("Identity")(identity)


@op("CenterCropPad")
def center_crop_pad(n, x, shape_in):
    x = T(x)
    axes = [axis_of(a, x.ndim, n) for a in (n.a("axes") or range(x.ndim))]
    for a, want in zip(axes, ints(shape_in)):
        have = x.shape[a]
        if want < have:
            start = (have - want) // 2
            x = x[(slice(None),) * a + (slice(start, start + want),)]
        elif want > have:
            before = (want - have) // 2
            pads = [(0, 0)] * x.ndim
            pads[a] = (before, want - have - before)
            x = x.pad(tuple(pads))
    return x
