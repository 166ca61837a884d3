"""NN functional ops (docs/api.md): resizing, normalisation, dropout, attention, sequential. Convolutions, pools and
losses have files of their own (conv.py, pool.py, losses.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fusegrad.lazy_numpy import np

from fusegrad.dtype import dtypes, least_upper_dtype, sum_acc_dtype
from fusegrad.helpers import TRAINING, prod
from fusegrad.tensor_ops.attention import flash_attention, uses_flash
from fusegrad.tensor_ops.shapes import is_index

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


class NNMixin:
    # ------------------------------------------------------------------ resizing
    def interpolate(self, size: Sequence[int], mode: str = "linear", align_corners: bool = False) -> Tensor:
        """Resize the last len(size) dims, one dim at a time,
        each as a contraction with an (out, in) resampling matrix."""
        if mode not in ("linear", "nearest", "nearest-exact"):
            raise NotImplementedError(
                f"interpolate mode {mode!r} is not supported: use linear, nearest or nearest-exact"
            )
        if align_corners and mode != "linear":
            raise ValueError(
                f"align_corners option can only be set with the interpolating modes (linear), not {mode!r}"
            )
        size = tuple(size)
        if not all(is_index(s) for s in size):
            raise TypeError(f"interpolate size {size} must contain ints")
        size = tuple(int(s) for s in size)
        if not 0 < len(size) <= self.ndim or not all(s > 0 for s in size):
            raise ValueError(
                f"interpolate size {size} must be 1..{self.ndim} positive ints for input of shape {self.shape}"
            )
        if mode == "linear" and not dtypes.is_float(self.dtype):
            # torch's integer resize is separable, the last dim first, each pass in fixed point and rounded
            x = self.cast(dtypes.int64)
            for axis, out in reversed(tuple(zip(range(self.ndim - len(size), self.ndim), size))):
                if x.shape[axis] != out:
                    x = x._resample_fixed_point(axis, out, align_corners)
            return x.maximum(self.dtype.min).minimum(self.dtype.max).cast(self.dtype)
        x = self
        for axis, out in zip(range(self.ndim - len(size), self.ndim), size):
            if x.shape[axis] != out:
                x = x._resample(axis, out, mode, align_corners)
        return x

    def _resample_fixed_point(self, axis: int, out: int, align_corners: bool) -> Tensor:
        """One linear pass over an int64 tensor as torch's integer kernel does it: the weights quantized to the most
        fraction bits that keep the largest one below 2**15, the sum rounded half up and shifted back."""
        size, trailing = self.shape[axis], (1,) * (self.ndim - axis - 1)
        weights = np.zeros((out, size))
        for o in range(out):
            if align_corners:
                pos = o * ((size - 1) / (out - 1) if out > 1 else 0.0)
            else:
                pos = max((o + 0.5) * (size / out) - 0.5, 0.0)
            lo = min(math.floor(pos), size - 1)
            weights[o, lo] += 1 - (pos - lo)
            weights[o, min(lo + 1, size - 1)] += pos - lo
        bits = 0
        while bits < 22 and int(0.5 + weights.max() * (1 << (bits + 1))) < 1 << 15:
            bits += 1
        quantized = type(self)(np.floor(weights * (1 << bits) + 0.5).astype(np.int64), device=self.device)
        mixed = self.unsqueeze(axis) * quantized.reshape((out, size) + trailing)
        return (mixed.sum(axis + 1) + (1 << bits >> 1)) >> bits

    def _resample(self, axis: int, out: int, mode: str, align_corners: bool) -> Tensor:
        size, trailing = self.shape[axis], (1,) * (self.ndim - axis - 1)
        compute = dtypes.float64 if self.dtype is dtypes.float64 else dtypes.float32
        dst = type(self).arange(out, device=self.device).cast(compute).reshape(out, 1)
        src = type(self).arange(size, device=self.device).reshape(1, size)
        if mode == "linear":
            # torch's source positions: corner-aligned, or pixel centres clamped at 0
            if align_corners:
                pos = dst * ((size - 1) / (out - 1) if out > 1 else 0.0)
            else:
                pos = ((dst + 0.5) * (size / out) - 0.5).maximum(0.0)
            lo = pos.floor().cast(dtypes.int32).minimum(size - 1)
            hi, frac = (lo + 1).minimum(size - 1), pos - lo.cast(compute)
            weights = (src == lo).where(1.0 - frac, 0.0) + (src == hi).where(frac, 0.0)
            wide = self.cast(compute) if self.dtype.itemsize < 4 else self
            mixed = wide.unsqueeze(axis) * weights.cast(wide.dtype).reshape((out, size) + trailing)
            return mixed.sum(axis + 1).cast(self.dtype)
        # nearest picks floor(dst * in/out) in float32 like torch;
        # nearest-exact rounds the pixel-centre position instead
        scale = type(self)(size / out, device=self.device, dtype=dtypes.float32)
        pos = (dst.cast(dtypes.float32) + (0.5 if mode == "nearest-exact" else 0.0)) * scale
        pick = (pos.floor().cast(dtypes.int32).minimum(size - 1) == src).reshape((out, size) + trailing)
        picked = pick.where(self.unsqueeze(axis), 0)
        if self.dtype is dtypes.bool:
            return picked.any(axis + 1)
        return picked.sum(axis + 1, dtype=sum_acc_dtype(self.dtype)).cast(self.dtype)

    # ------------------------------------------------------------------ normalisation, regularisation, attention
    def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-05) -> Tensor:
        x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
        centered = x - x.mean(axis, keepdim=True)
        return centered * (centered.square().mean(axis, keepdim=True) + eps).rsqrt()

    def batchnorm(
        self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor, axis: int | Sequence[int] = 1
    ) -> Tensor:
        axes = self._axes(axis)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        for name, stat in (("weight", weight), ("bias", bias), ("mean", mean), ("invstd", invstd)):
            if stat is not None and stat.numel() != prod(shape):
                raise RuntimeError(
                    f"batchnorm {name} of shape {stat.shape} does not fit input {self.shape} along axis {axis}"
                )
        scale = invstd.reshape(shape) if weight is None else weight.reshape(shape) * invstd.reshape(shape)
        out = (self - mean.reshape(shape)) * scale
        return out if bias is None else out + bias.reshape(shape)

    def dropout(self, p: float = 0.5) -> Tensor:
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        if not (TRAINING or type(self).training) or p == 0:
            return self
        if p == 1:
            return self * 0
        keep = type(self).rand(self.shape, device=self.device, contiguous=False) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    def scaled_dot_product_attention(
        self,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        enable_gqa: bool = False,
    ) -> Tensor:
        if is_causal and attn_mask is not None:
            raise RuntimeError("scaled_dot_product_attention: explicit attn_mask should not be set when is_causal=True")
        if (
            min(self.ndim, key.ndim, value.ndim) < 2
            or key.shape[-1] != self.shape[-1]
            or key.shape[-2] != value.shape[-2]
        ):
            raise RuntimeError(
                f"scaled_dot_product_attention shapes do not fit: query {self.shape}, key {key.shape}, "
                f"value {value.shape}"
            )
        if enable_gqa and self.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            heads, kv_heads = self.shape[-3], key.shape[-3]
            if kv_heads == 0 or heads % kv_heads or value.shape[-3] != kv_heads:
                raise RuntimeError(
                    f"enable_gqa needs the query heads ({heads}) to be a multiple of the key/value heads "
                    f"({kv_heads}, {value.shape[-3]})"
                )
        no_dropout = dropout_p == 0 or not (TRAINING or type(self).training)
        if no_dropout and uses_flash(self, key, value, attn_mask, enable_gqa):
            return flash_attention(self, key, value, attn_mask, is_causal)
        if enable_gqa and self.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            key, value = key._repeat_heads(heads // kv_heads), value._repeat_heads(heads // kv_heads)
        # scores accumulate in at least float32, then return to the query dtype before the softmax
        acc = least_upper_dtype(self.dtype, dtypes.float32)
        scores = (self.matmul(key.transpose(-1, -2), dtype=acc) * (1 / math.sqrt(self.shape[-1]))).cast(self.dtype)
        if is_causal:
            rows, cols = (
                type(self).arange(self.shape[-2], device=self.device),
                type(self).arange(key.shape[-2], device=self.device),
            )
            attn_mask = rows.reshape(-1, 1) >= cols.reshape(1, -1)
        if attn_mask is not None:
            if attn_mask.dtype is dtypes.bool:
                scores = attn_mask.where(scores, -math.inf)
            else:
                scores = scores + attn_mask.cast(scores.dtype)
        return scores.softmax(-1).dropout(dropout_p) @ value

    def _repeat_heads(self, times: int) -> Tensor:
        """(..., H, S, E) -> (..., H*times, S, E), each head repeated `times` times in place
        (like repeat_interleave)."""
        shape = self.shape
        x = self.reshape(shape[:-2] + (1,) + shape[-2:]).expand(shape[:-2] + (times,) + shape[-2:])
        return x.reshape(shape[:-3] + (shape[-3] * times,) + shape[-2:])

    def sequential(self, ll: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        return functools.reduce(lambda x, f: f(x), ll, self)
