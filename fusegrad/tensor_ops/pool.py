"""Pooling (docs/api.md): avg_pool2d, max_pool2d (with a tiled gradient), max_unpool2d over any spatial dims."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fusegrad.dtype import dtypes, sum_acc_dtype
from fusegrad.gradient import register_gradient
from fusegrad.helpers import ceildiv, prod
from fusegrad.tensor_ops.indexing import check_index_bounds
from fusegrad.tensor_ops.shapes import is_index
from fusegrad.tensor_ops.spatial_args import IntOrInts, flat_tuple, padding_pairs, positive
from fusegrad.uop.ops import Ops

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool
# a reduce's output this large is stored before a pool reads its windows (`_stored_if_reduced`)
POOL_STORE_REDUCED_SIZE = 2**14
# a max pool's input rows this long or longer run dim by dim (`_separable`): shorter ones run slower that way
SEPARABLE_MIN_ROW = 12


def _out_size(size: int, k: int, s: int, d: int, pads: tuple[int, int], ceil_mode: bool) -> int:
    """Pooled length of one dim; with ceil_mode the last window must still start inside the input or left padding."""
    span = size + pads[0] + pads[1] - d * (k - 1) - 1
    out = (ceildiv(span, s) if ceil_mode else span // s) + 1
    return out - 1 if ceil_mode and (out - 1) * s >= size + pads[0] else out


def _stored_if_reduced(x: Tensor) -> Tensor:
    """x stored first when it is large and computed by a reduce (a conv's output): fused into the pool's window, the
    conv's reduce runs inside the pool's and loses its register tile (VGG-19's conv + 2x2 max pool, batch 1: 2.7
    GFLOPS fused, about 20 stored; DenseNet-121's 1x1 conv + 2x2 average pool: 6.7 GFLOPS fused)."""
    if x.numel() < POOL_STORE_REDUCED_SIZE:
        return x
    nodes = x.uop.toposort(gate=lambda u: u.op not in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN))
    return x.contiguous() if any(u.op is Ops.REDUCE_AXIS for u in nodes) else x


def _kernel_dims(kernel_size: IntOrInts) -> int:
    if is_index(kernel_size):
        return 2
    if not isinstance(kernel_size, (tuple, list)) or not all(is_index(k) for k in kernel_size):
        raise TypeError(f"kernel_size={kernel_size!r} must be an int or a sequence of ints")
    return len(kernel_size)


def _tiles_without_padding(args: tuple[tuple[int, ...], ...]) -> bool:
    """A pool's windows tile its input: side by side (stride = kernel, no dilation) and inside it (no padding)."""
    kernel, stride, dilation, pads, _, extra = args
    return kernel == stride and all(d == 1 for d in dilation) and all(p == (0, 0) for p in pads) and not any(extra)


def _separable(args: tuple[tuple[int, ...], ...], x: Tensor) -> bool:
    """A max pool worth computing dim by dim (`_max_pool_dim_by_dim`): windows of several taps along two or more dims
    that overlap along one (stride below the window's span), over at least POOL_STORE_REDUCED_SIZE elements (a smaller
    one is not worth a second kernel) whose rows are at least SEPARABLE_MIN_ROW long. One thread, a 3x3 pool of a
    ReLU with padding 1, the same minute: stride 2 at 576x14x14 143 -> 43 us, 256x28x28 163 -> 71, 64x112x112 432 ->
    247; stride 1 the same at 14x14 and 28x28, 272 -> 217 at 64x56x56; 7-wide rows 2-3.5x slower."""
    kernel, stride, dilation = args[:3]
    overlap = any(s < d * (k - 1) + 1 for k, s, d in zip(kernel, stride, dilation))
    if not all(isinstance(d, int) for d in x.shape):
        return False
    big = x.numel() >= POOL_STORE_REDUCED_SIZE and x.shape[-1] >= SEPARABLE_MIN_ROW
    return big and sum(k > 1 for k in kernel) >= 2 and overlap


class PoolMixin:
    def _pool_args(
        self, kernel_size: IntOrInts, stride: IntOrInts | None, dilation: IntOrInts, padding: IntOrInts, ceil_mode: bool
    ) -> tuple[tuple[int, ...], ...]:
        """Validated (kernel, stride, dilation, pads, outs, extra right padding for ceil_mode) of a pooling op."""
        n = _kernel_dims(kernel_size)
        kernel = positive(kernel_size, n, "kernel_size")
        no_stride = stride is None or not isinstance(stride, int) and len(stride) == 0
        stride_t, dilation_t = (
            kernel if no_stride else positive(stride, n, "stride"),
            positive(dilation, n, "dilation"),
        )
        if self.ndim < n:
            raise RuntimeError(f"pooling with a {n}-D kernel {kernel} needs {n}+ dims, got shape {self.shape}")
        pads = padding_pairs(padding, n)
        if any(not 0 <= p <= (d * (k - 1) + 1) // 2 for pair, k, d in zip(pads, kernel, dilation_t) for p in pair):
            raise RuntimeError(
                f"pad should be non-negative and at most half of effective kernel size, but got "
                f"padding={padding}, kernel_size={kernel} and dilation={dilation_t}"
            )
        spatial = self.shape[-n:]
        dims = list(zip(spatial, kernel, stride_t, dilation_t, pads))
        outs = tuple(_out_size(i, k, s, d, p, ceil_mode) for i, k, s, d, p in dims)
        if any(o <= 0 for o in outs):
            raise RuntimeError(
                f"Given input size {spatial}, kernel_size={kernel}, stride={stride_t}, dilation={dilation_t} "
                f"and padding={padding}: calculated output size {outs} is too small"
            )
        # with ceil_mode the last window may run past the right padding; those taps read extra padding
        extra = tuple(
            max(0, (o - 1) * s + d * (k - 1) + 1 - (i + b + a)) for o, (i, k, s, d, (b, a)) in zip(outs, dims)
        )
        return kernel, stride_t, dilation_t, pads, outs, extra

    def _pooled_windows(self, args: tuple[tuple[int, ...], ...], value: Scalar) -> Tensor:
        """Pad with `value` (regular and ceil_mode padding) and return the (..., *out, *kernel) windows."""
        kernel, stride, dilation, pads, outs, extra = args
        lead = ((0, 0),) * (self.ndim - len(kernel))
        x = self.pad(lead + tuple((b, a + e) for (b, a), e in zip(pads, extra)), value=value)
        spans = tuple((0, (o - 1) * s + d * (k - 1) + 1) for o, s, d, k in zip(outs, stride, dilation, kernel))
        return x.shrink((None,) * len(lead) + spans)._windows(kernel, stride, dilation)

    def avg_pool2d(
        self,
        kernel_size: IntOrInts = (2, 2),
        stride: IntOrInts | None = None,
        dilation: IntOrInts = 1,
        padding: IntOrInts = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> Tensor:
        args = self._pool_args(kernel_size, stride, dilation, padding, ceil_mode)
        kernel, stride_t, dilation_t, pads, outs, _ = args
        n = len(kernel)
        x = _stored_if_reduced(self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float))
        if x.numel() >= POOL_STORE_REDUCED_SIZE and any(p != (0, 0) for p in pads):
            # stored padded: read through the padding, every tap's load is gated and the window loop stays scalar
            lead = ((0, 0),) * (x.ndim - n)
            x, args = x.pad(lead + pads).contiguous(), (kernel, stride_t, dilation_t, ((0, 0),) * n) + args[4:]
        total = x._pooled_windows(args, 0).sum(tuple(range(x.ndim, x.ndim + n)), dtype=sum_acc_dtype(x.dtype))
        # the divisor counts the taps inside the input (count_include_pad=False) or inside input + regular padding
        counts = []
        for i, k, s, d, (b, a), o in zip(self.shape[-n:], kernel, stride_t, dilation_t, pads, outs):
            lo, hi = (0, b + i + a) if count_include_pad else (b, b + i)
            counts.append([sum(1 for t in range(k) if lo <= j * s + t * d < hi) for j in range(o)])
        if all(c == k for cs, k in zip(counts, kernel) for c in cs):
            return (total / prod(kernel)).cast(x.dtype)
        per_dim = [type(self)(c, device=self.device, dtype=total.dtype) for c in counts]
        divisor = functools.reduce(lambda acc, c: acc.unsqueeze(-1) * c, per_dim[1:], per_dim[0])
        return (total / divisor).cast(x.dtype)

    def max_pool2d(
        self,
        kernel_size: IntOrInts = (2, 2),
        stride: IntOrInts | None = None,
        dilation: IntOrInts = 1,
        padding: IntOrInts = 0,
        ceil_mode: bool = False,
        return_indices: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        args = self._pool_args(kernel_size, stride, dilation, padding, ceil_mode)
        n = len(args[0])
        lowest = -math.inf if dtypes.is_float(self.dtype) else self.dtype.min  # padding never wins
        x = _stored_if_reduced(self)
        if not return_indices and _separable(args, x):
            values = x._max_pool_dim_by_dim(args, lowest)
            x._register_window_max_gradient(values, args, lowest)
            return values
        win = x._pooled_windows(args, lowest)
        axes = tuple(range(self.ndim, self.ndim + n))
        values = win.max(axes)
        if dtypes.is_float(self.dtype) and _tiles_without_padding(args):
            self._register_tiled_max_pool_gradient(values, args)
        if not return_indices:
            return values
        # the first tap (in input order) holding the window's max, as a flat offset into the input's spatial plane
        spatial = self.shape[-n:]
        plane = prod(spatial)
        flat = type(self).arange(plane, device=self.device).reshape(spatial)._pooled_windows(args, plane)
        hit = win == values.reshape(values.shape + (1,) * n)
        if dtypes.is_float(self.dtype):
            hit = hit | win.ne(win)  # NaN wins, like torch
        return values, hit.where(flat, plane).min(axes)

    def _max_pool_dim_by_dim(self, args: tuple[tuple[int, ...], ...], lowest: Scalar) -> Tensor:
        """The max pool of args one spatial dim after another, outermost first, each pass but the last stored: a
        window's max is the max of its rows' maxima (NaN wins either way), so a k x k window costs k + k taps an
        output instead of k * k, and the first pass reads its rows contiguously. Each pass is the elementwise maximum
        of its taps' strided slices, not a reduce over a window view: the view's broadcast would make the scheduler
        store an elementwise input (a conv's ReLU) the pass can compute as it reads."""
        kernel, stride, dilation, pads, outs, extra = args
        x, n = self, len(kernel)
        for i, (k, s, d, (before, after), o, e) in enumerate(zip(kernel, stride, dilation, pads, outs, extra)):
            axis = x.ndim - n + i
            pairs = tuple((before, after + e) if j == axis else (0, 0) for j in range(x.ndim))
            xp = x.pad(pairs, value=lowest) if before or after + e else x
            taps = [xp[(slice(None),) * axis + (slice(t * d, t * d + (o - 1) * s + 1, s),)] for t in range(k)]
            x = functools.reduce(lambda m, t: m.maximum(t), taps)
            x = x.contiguous() if i < n - 1 else x
        return x

    def _register_window_max_gradient(self, values: Tensor, args: tuple[tuple[int, ...], ...], lowest: Scalar) -> None:
        """The dim-by-dim max pool's gradient is the window max's: tied taps share their window's gradient equally, as
        the single-kernel pool's do (the chain of maximums would halve it at each tie: 0.375/0.5625 where the window
        max gives 0.4167/0.6944 on zeros)."""
        x_uop, device, tensor_class, n = self.uop, self.device, type(self), len(args[0])

        def backward(g: Any) -> tuple[Any, ...]:
            x = tensor_class(x_uop, device=device)
            window_max = x._pooled_windows(args, lowest).max(tuple(range(x.ndim, x.ndim + n)))
            return (window_max.gradient(x, gradient=tensor_class(g, device=device))[0].uop,)

        register_gradient(values.uop, (x_uop,), backward)

    def _register_tiled_max_pool_gradient(self, values: Tensor, args: tuple[tuple[int, ...], ...]) -> None:
        """The gradient of a max pool whose windows tile the input (stride = kernel, no dilation or padding) goes to one
        tap per window, the one torch picks (the first maximum; the last NaN): its tap number is stored once per window,
        and each input position compares its own tap number with it. The plain rule for a max divides the gradient
        among tied taps (per-element division, a tie count per window) and, through the windows' movement ops, indexes
        the input by division."""
        kernel, _, _, _, outs, _ = args
        n, x_uop, device, tensor_class = len(kernel), self.uop, self.device, type(self)
        lead, taps = self.shape[:-n], prod(kernel)

        def backward(g: Any) -> tuple[Any, ...]:
            x, grad = tensor_class(x_uop, device=device), tensor_class(g, device=device)
            win = x._pooled_windows(args, -math.inf)
            # the forward's maximum (the same node, so the same stored buffer), not a running maximum: a select per
            # tap that the C compiler makes a branch, which random data mispredicts
            most = win.max(tuple(range(x.ndim, x.ndim + n)))
            tap = [t.squeeze(-1) for t in win.reshape(lead + outs + (taps,)).split(1, -1)]
            # integer arithmetic, no select: the first tap equal to the maximum (from the last tap back), else (a NaN
            # window) the last NaN
            chosen = tensor_class.zeros(lead + outs, dtype=dtypes.int32, device=device)
            for t in reversed(range(taps)):
                chosen = chosen + (tap[t] == most).cast(dtypes.int32) * (t - chosen)
            for t in range(taps):
                chosen = chosen + tap[t].ne(tap[t]).cast(dtypes.int32) * (t - chosen)
            # stored: each of the window's taps reads it; recomputed per tap it would repeat the scan taps times
            chosen = chosen.contiguous().reshape(lead + outs + (1,) * n)
            number = tensor_class.arange(taps, dtype=dtypes.int32, device=device).reshape(kernel)
            # times a 0/1 mask, not a select (a branch the data decides, like above), as the plain rule for a max does
            per_tap = grad.reshape(lead + outs + (1,) * n) * (chosen == number).cast(grad.dtype)
            # (..., *out, *kernel) -> (..., out1, k1, out2, k2, ...), stored in that order: its loops index the
            # windows' values without division, and the input positions are a plain reshape of it
            p = len(lead)
            per_tap = per_tap.permute(tuple(range(p)) + flat_tuple((p + i, p + n + i) for i in range(n))).contiguous()
            dx = per_tap.reshape(lead + tuple(o * k for o, k in zip(outs, kernel)))
            # the rows and columns left over past the last window get none
            dx = dx.pad(((0, 0),) * p + tuple((0, i - o * k) for i, o, k in zip(x.shape[p:], outs, kernel)))
            return (dx.uop,)

        register_gradient(values.uop, (x_uop,), backward)

    def max_unpool2d(
        self,
        indices: Tensor,
        kernel_size: IntOrInts = (2, 2),
        stride: IntOrInts | None = None,
        dilation: IntOrInts = 1,
        padding: IntOrInts = 0,
        output_size: Sequence[int] | None = None,
    ) -> Tensor:
        n = _kernel_dims(kernel_size)
        kernel = positive(kernel_size, n, "kernel_size")
        stride_t = kernel if stride is None else positive(stride, n, "stride")
        dilation_t, pads = positive(dilation, n, "dilation"), padding_pairs(padding, n)
        if indices.shape != self.shape:
            raise RuntimeError(f"max_unpool: indices shape {indices.shape} must equal input shape {self.shape}")
        if not dtypes.is_int(indices.dtype):
            raise RuntimeError(f"max_unpool: indices must be integers, got {indices.dtype}")
        if self.ndim < n:
            raise RuntimeError(f"max_unpool with a {n}-D kernel needs {n}+ dims, got shape {self.shape}")
        prefix, pooled = self.shape[:-n], self.shape[-n:]
        if output_size is None:
            dims = zip(pooled, stride_t, pads, dilation_t, kernel)
            out_sp = tuple((i - 1) * s - b - a + d * (k - 1) + 1 for i, s, (b, a), d, k in dims)
        elif len(output_size) in (n, self.ndim):
            out_sp = tuple(output_size)[-n:]
        else:
            raise ValueError(f"output_size {tuple(output_size)} must have {n} or {self.ndim} entries")
        plane, count = prod(out_sp), prod(pooled)
        vals = self.reshape(prefix + (count, 1))
        hit = indices.reshape(prefix + (count, 1)) == type(self).arange(plane, device=self.device).reshape(1, plane)
        check_index_bounds("max_unpool", "output plane", indices, 0, plane, hit)
        # overlapping windows can name one position several times, always with the same max value: the forward averages
        # the copies, and every copy still gets the position's whole gradient (torch's backward gathers it)
        copies = hit.cast(dtypes.int32).sum(-2, keepdim=True).maximum(1)
        if dtypes.is_float(self.dtype):
            # inf/nan divided by the count is itself, and the detach trick would turn it into inf - inf = nan
            plain = (copies == 1) | ~vals.detach().isfinite()
            vals = plain.where(vals, vals.detach() / copies.cast(self.dtype) + (vals - vals.detach()))
        else:
            vals = vals // copies
        out = hit.where(vals, 0).sum(-2, dtype=sum_acc_dtype(self.dtype))
        return out.cast(self.dtype).reshape(prefix + out_sp)
