"""Ops of detection models: NonMaxSuppression (IoU as Tensor math, the greedy pick on the host), RoiAlign (bilinear
samples as separable weight matrices, pooled by matmuls) and DeformConv (bilinear taps gathered at offset positions,
then one matmul per group with the weights)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.registry import C, T, op


def _corners(boxes: Tensor, center_point_box: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(lo0, lo1, hi0, hi1) of each box: [y1, x1, y2, x2] in either corner order, or [x_c, y_c, w, h]."""
    if center_point_box:
        xc, yc, w, h = (boxes[..., i] for i in range(4))
        return xc - w / 2, yc - h / 2, xc + w / 2, yc + h / 2
    a0, a1, b0, b1 = (boxes[..., i] for i in range(4))
    return a0.minimum(b0), a1.minimum(b1), a0.maximum(b0), a1.maximum(b1)


def pairwise_iou(boxes: Tensor, center_point_box: int) -> Tensor:
    """(B, S, S) intersection over union of every pair of boxes in each batch; 0 where the union is empty."""
    acc = dtypes.float64 if boxes.dtype == dtypes.float64 else dtypes.float32
    lo0, lo1, hi0, hi1 = _corners(boxes.cast(acc), center_point_box)
    area = (hi0 - lo0) * (hi1 - lo1)
    ih = (hi0.unsqueeze(2).minimum(hi0.unsqueeze(1)) - lo0.unsqueeze(2).maximum(lo0.unsqueeze(1))).relu()
    iw = (hi1.unsqueeze(2).minimum(hi1.unsqueeze(1)) - lo1.unsqueeze(2).maximum(lo1.unsqueeze(1))).relu()
    inter = ih * iw
    union = area.unsqueeze(2) + area.unsqueeze(1) - inter
    ok = (area.unsqueeze(2) > 0) & (area.unsqueeze(1) > 0) & (union > 0)
    return ok.where(inter / ok.where(union, 1.0), 0.0)


def _scalar(v, default, kind):
    return default if v is None or C(v).size == 0 else kind(C(v).reshape(-1)[0])


@op("NonMaxSuppression")
def non_max_suppression(n, boxes, scores, max_out=None, iou_threshold=None, score_threshold=None):
    """How many boxes survive depends on the values: the IoU matrix is Tensor math, the greedy pick reads it."""
    boxes, scores = T(boxes), T(scores)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[::2] != boxes.shape[:2]:
        raise ValueError(
            f"{n}: boxes {boxes.shape} must be (batches, boxes, 4) and scores {scores.shape} (batches, classes, boxes)"
        )
    limit = _scalar(max_out, 0, int)
    iou_max = _scalar(iou_threshold, 0.0, float)
    score_min = _scalar(score_threshold, None, float)
    if limit <= 0 or boxes.shape[1] == 0:
        return Tensor.empty(0, 3, dtype=dtypes.int64)
    iou = pairwise_iou(boxes, n.a("center_point_box", 0)).numpy()
    score = C(scores).astype(np.float64)
    picked = []
    for b, c in itertools.product(range(score.shape[0]), range(score.shape[1])):
        s = score[b, c]
        order = np.argsort(-s, kind="stable")  # highest first; ties keep the lower box index first
        if score_min is not None:
            order = order[s[order] > score_min]
        alive = np.ones(len(order), bool)
        taken = 0
        for k, box in enumerate(order):
            if taken == limit:
                break
            if not alive[k]:
                continue
            picked.append((b, c, box))
            taken += 1
            alive[k + 1 :] &= iou[b, box, order[k + 1 :]] <= iou_max
    return Tensor(np.array(picked, dtype=np.int64).reshape(-1, 3))


def _bilinear_1d(c: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per sample coordinate c: the weight matrices (..., size) of its low and high tap, and whether c is inside
    [-1, size] (a sample outside reads 0). Coordinates below 0 clamp to 0, at or past size - 1 to the last row."""
    inside = (c >= -1) & (c <= size)
    c = c.maximum(0)
    low = c.floor().minimum(size - 1)
    at_end = low >= size - 1
    c = at_end.where(size - 1, c)
    high = at_end.where(low, low + 1)
    frac = c - low
    grid = Tensor.arange(size).cast(c.dtype)
    w_low = (low.unsqueeze(-1) == grid).where((1 - frac).unsqueeze(-1), 0.0)
    w_high = (high.unsqueeze(-1) == grid).where(frac.unsqueeze(-1), 0.0)
    return w_low, w_high, inside


def _sample_coords(start: Tensor, extent: Tensor, bins: int, grid: int, counts: Tensor) -> Tensor:
    """(R, bins, grid) sample positions along one axis: grid points evenly inside each of `bins` bins."""
    step = (extent / bins).reshape(-1, 1, 1)
    b = Tensor.arange(bins).reshape(1, bins, 1).cast(start.dtype)
    g = Tensor.arange(grid).reshape(1, 1, grid).cast(start.dtype)
    return start.reshape(-1, 1, 1) + b * step + (g + 0.5) * step / counts.reshape(-1, 1, 1)


@op("RoiAlign")
def roi_align(n, x, rois, batch_indices):
    x = T(x)
    if x.ndim != 4:
        raise ValueError(f"{n}: X must be (N, C, H, W), got shape {x.shape}")
    N, Ch, H, W = x.shape
    rois_t = T(rois)
    R = rois_t.shape[0]
    bidx = C(batch_indices).reshape(-1).astype(np.int64)
    if rois_t.ndim != 2 or rois_t.shape[1] != 4 or len(bidx) != R:
        raise ValueError(f"{n}: rois {rois_t.shape} must be (num_rois, 4) with num_rois batch_indices, got {len(bidx)}")
    if R and (bidx.min() < 0 or bidx.max() >= N):
        bad = bidx[(bidx < 0) | (bidx >= N)]
        raise ValueError(f"{n}: batch_indices {bad.tolist()} are out of range for a batch of {N}")
    ph, pw = n.a("output_height", 1), n.a("output_width", 1)
    ratio, scale, mode = n.a("sampling_ratio", 0), n.a("spatial_scale", 1.0), n.a("mode", "avg")
    half_pixel = n.opset >= 16 and n.a("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    if R == 0:
        return Tensor.empty(0, Ch, ph, pw, dtype=x.dtype)
    acc = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
    r = rois_t.cast(acc)
    shift = 0.5 if half_pixel else 0.0
    x0, y0 = r[:, 0] * scale - shift, r[:, 1] * scale - shift
    w, h = r[:, 2] * scale - shift - x0, r[:, 3] * scale - shift - y0
    if not half_pixel:  # the legacy transform keeps each ROI at least one pixel wide
        w, h = w.maximum(1.0), h.maximum(1.0)
    if ratio > 0:
        gh_each = gw_each = np.full(R, ratio, np.int64)
    else:  # adaptive: ceil(roi size / bins) samples per bin, a per-ROI count read on the host
        hw = Tensor.stack(h, w).numpy()
        gh_each = np.ceil(hw[0] / np.float32(ph)).astype(np.int64)
        gw_each = np.ceil(hw[1] / np.float32(pw)).astype(np.int64)
    gh, gw = max(int(gh_each.max()), 1), max(int(gw_each.max()), 1)
    ys = _sample_coords(y0, h, ph, gh, Tensor(gh_each.astype(np.float64)).cast(acc))
    xs = _sample_coords(x0, w, pw, gw, Tensor(gw_each.astype(np.float64)).cast(acc))
    wy_lo, wy_hi, in_y = _bilinear_1d(ys, H)  # (R, ph, gh, H)
    wx_lo, wx_hi, in_x = _bilinear_1d(xs, W)  # (R, pw, gw, W)
    # samples past an ROI's own grid count (adaptive grids differ per ROI) are padding, not zeros
    real_y = Tensor.arange(gh).reshape(1, 1, gh) < Tensor(gh_each.astype(np.int32)).reshape(R, 1, 1)
    real_x = Tensor.arange(gw).reshape(1, 1, gw) < Tensor(gw_each.astype(np.int32)).reshape(R, 1, 1)
    feats = x[Tensor(bidx.astype(np.int32))].cast(acc) if N > 1 else x.cast(acc).expand(R, Ch, H, W)
    if mode == "avg":
        keep_y = (in_y & real_y).unsqueeze(-1)
        keep_x = (in_x & real_x).unsqueeze(-1)
        ay = keep_y.where(wy_lo + wy_hi, 0.0).sum(2)  # (R, ph, H): every sample's weights in a bin summed
        ax = keep_x.where(wx_lo + wx_hi, 0.0).sum(2)  # (R, pw, W)
        pooled = ay.unsqueeze(1).matmul(feats).matmul(ax.unsqueeze(1).transpose(-1, -2))
        count = Tensor((np.maximum(gh_each * gw_each, 1)).astype(np.float64)).cast(acc).reshape(R, 1, 1, 1)
        return (pooled / count).cast(x.dtype)
    if mode != "max":
        raise ValueError(f"{n}: mode {mode!r} is not 'avg' or 'max'")
    # max mode takes, per sample, the largest of its four weighted taps, then the largest over the bin's samples
    best = None
    for wy in (wy_lo, wy_hi):
        for wx in (wx_lo, wx_hi):
            rows = wy.reshape(R, 1, ph * gh, H)
            tap = rows.matmul(feats).matmul(wx.reshape(R, 1, pw * gw, W).transpose(-1, -2))
            best = tap if best is None else best.maximum(tap)
    best = best.reshape(R, Ch, ph, gh, pw, gw)
    inside = (in_y.reshape(R, 1, ph, gh, 1, 1) & in_x.reshape(R, 1, 1, 1, pw, gw)).where(best, 0.0)
    real = real_y.reshape(R, 1, 1, gh, 1, 1) & real_x.reshape(R, 1, 1, 1, 1, gw)
    pooled = real.where(inside, -math.inf).max((3, 5))
    sampled = Tensor(gh_each * gw_each > 0).reshape(R, 1, 1, 1)  # an empty ROI (no samples at all) gives 0
    return sampled.where(pooled, 0.0).cast(x.dtype)


@op("DeformConv")
def deform_conv(n, x, w, offset, b=None, mask=None):
    x, w, offset = T(x), T(w), T(offset)
    nd = x.ndim - 2
    N, Cin, spatial = x.shape[0], x.shape[1], x.shape[2:]
    kernel = list(n.a("kernel_shape") or w.shape[2:])
    strides = list(n.a("strides") or [1] * nd)
    dilations = list(n.a("dilations") or [1] * nd)
    pads = list(n.a("pads") or [0] * (2 * nd))
    group, og = n.a("group", 1), n.a("offset_group", 1)
    oC = w.shape[0]
    if Cin % group or oC % group or Cin % og or w.shape[1] * group != Cin:
        raise ValueError(f"{n}: channels {Cin} (weights {w.shape}) do not split into group={group}, offset_group={og}")
    out = [
        (spatial[a] + pads[a] + pads[a + nd] - dilations[a] * (kernel[a] - 1) - 1) // strides[a] + 1 for a in range(nd)
    ]
    K, P = math.prod(kernel), math.prod(out)
    if tuple(offset.shape) != (N, og * K * nd, *out):
        raise ValueError(f"{n}: offset has shape {offset.shape}, expected {(N, og * K * nd, *out)}")
    acc = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
    off = offset.cast(acc).reshape(N, og, K, nd, P)
    # sampling position per (offset group, kernel tap, output point) along each axis, before the learned offset
    taps = np.array(list(itertools.product(*[range(k) for k in kernel])), np.float64).reshape(K, nd)
    outs = np.array(list(itertools.product(*[range(o) for o in out])), np.float64).reshape(P, nd)
    base = outs[None, :, :] * strides - pads[:nd] + taps[:, None, :] * dilations  # (K, P, nd)
    coords = [off[:, :, :, a, :] + Tensor(base[:, :, a]).cast(acc).reshape(1, 1, K, P) for a in range(nd)]
    per_axis = []
    for a, c in enumerate(coords):
        lo = c.floor()
        frac = c - lo
        per_axis.append([(lo + k, wt) for k, wt in ((0, 1 - frac), (1, frac))])
    flat_strides = [math.prod(spatial[a + 1 :]) for a in range(nd)]
    cpg = Cin // og
    flat = x.cast(acc).reshape(N, og, cpg, math.prod(spatial))
    cols = None
    for combo in itertools.product(*per_axis):
        lin, weight = None, None
        for a, (idx, wt) in enumerate(combo):
            ok = (idx >= 0) & (idx <= spatial[a] - 1)  # a tap outside the input reads 0
            wt = ok.where(wt, 0.0)
            term = idx.clip(0, spatial[a] - 1).cast(dtypes.int32) * flat_strides[a]
            lin = term if lin is None else lin + term
            weight = wt if weight is None else weight * wt
        vals = flat.gather(3, lin.reshape(N, og, 1, K * P).expand(N, og, cpg, K * P))
        part = vals * weight.reshape(N, og, 1, K * P)
        cols = part if cols is None else cols + part
    cols = cols.reshape(N, og, cpg, K, P)
    if mask is not None:
        cols = cols * T(mask).cast(acc).reshape(N, og, 1, K, P)
    cols = cols.reshape(N, group, (Cin // group) * K, P)
    wg = w.cast(acc).reshape(1, group, oC // group, (Cin // group) * K)
    y = wg.matmul(cols).reshape(N, oC, *out)
    if b is not None:
        y = y + T(b).cast(acc).reshape(1, oC, *([1] * nd))
    return y.cast(x.dtype)
