"""NN functional ops and losses (docs/api.md)."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fusegrad.lazy_numpy import np

from fusegrad.gradient import register_gradient
from fusegrad.dtype import DTypeLike, dtypes, least_upper_dtype, sum_acc_dtype, to_dtype
from fusegrad.helpers import CHECK_OOB, TRAINING, ceildiv, flatten, prod
from fusegrad.tensor_ops.attention import flash_attention, uses_flash
from fusegrad.tensor_ops.indexing import check_index_bounds
from fusegrad.tensor_ops.shapes import is_index
from fusegrad.uop.ops import GroupOp, Ops, UOp

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool
# a convolution's padded input with at least this many elements is stored padded before the conv reads it: read
# through the padding, each lane of a register tile has its own bounds check, so no load of the tile is a vector (the
# digits convnet's first conv, 128x1x10x10 padded: 340 us gated, 30 us + a 10 us copy stored)
CONV_PAD_REALIZE_SIZE = 2**12
# a conv's weight gradient from an output gradient this large is computed with the output channels last (a matmul)
CONV_WEIGHT_GRAD_MATMUL_SIZE = 2**16
# a large conv's weight gradient is summed per sample first while the partials (batch x weight) stay this small
CONV_PER_SAMPLE_LIMIT = 2**24
IntOrInts = int | Sequence[int]

# ---------------------------------------------------------------------------------------------------------------------
# argument checks


def _cat(pieces: Any) -> tuple:
    return tuple(flatten(pieces))


def _per_dim(value: IntOrInts, n: int, name: str) -> tuple[int, ...]:
    """An int or one value per spatial dim -> a tuple of n ints."""
    out = (value,) * n if is_index(value) else tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not all(is_index(v) for v in out):
        raise TypeError(f"{name}={value!r} must be an int or {n} ints (one per spatial dim)")
    if len(out) != n:
        raise ValueError(f"{name}={value!r} must be an int or {n} ints (one per spatial dim)")
    return tuple(int(v) for v in out)


def _positive(value: IntOrInts, n: int, name: str) -> tuple[int, ...]:
    out = _per_dim(value, n, name)
    if any(v <= 0 for v in out):
        raise RuntimeError(f"{name} must be positive, got {value!r}")
    return out


def _pad_pairs(padding: IntOrInts, n: int) -> tuple[tuple[int, int], ...]:
    """An int, one value per spatial dim, or a flat torch-order list (left, right, top, bottom, ...)
    -> per-dim pairs."""
    if is_index(padding):
        return ((int(padding), int(padding)),) * n
    pads = tuple(padding) if isinstance(padding, (tuple, list)) else (padding,)
    if not all(is_index(p) for p in pads):
        raise TypeError(f"padding={padding!r} must contain ints")
    pads = tuple(int(p) for p in pads)
    if len(pads) == n:
        return tuple((p, p) for p in pads)
    if len(pads) == 2 * n:
        return tuple((pads[2 * i], pads[2 * i + 1]) for i in range(n))[::-1]
    raise ValueError(f"padding={padding!r} must be an int, {n} values or {2 * n} values (torch order) for {n} dims")


def _check_conv(x: Tensor, weight: Tensor, groups: int, in_channels: int) -> int:
    """The number of spatial dims; x must be batched (unbatched inputs are handled by the caller)."""
    n = weight.ndim - 2
    if weight.ndim < 3:
        raise RuntimeError(f"conv weight needs 3+ dims (channels, channels, *kernel), got {weight.shape}")
    if x.ndim != weight.ndim:
        raise RuntimeError(
            f"expected a {n + 1}-D (unbatched) or {n + 2}-D (batched) input for a weight of shape "
            f"{weight.shape}, got input of shape {x.shape}"
        )
    if not is_index(groups):
        raise TypeError(f"groups must be an int, got {groups!r}")
    if groups <= 0:
        raise RuntimeError(f"groups must be a positive int, got {groups!r}")
    if in_channels != x.shape[1] or in_channels % groups:
        raise RuntimeError(
            f"Given groups={groups}, weight of size {list(weight.shape)}, expected input{list(x.shape)} to "
            f"have {in_channels} channels, but got {x.shape[1]} channels instead"
        )
    return n


def _out_size(size: int, k: int, s: int, d: int, pads: tuple[int, int], ceil_mode: bool) -> int:
    """Pooled length of one dim; with ceil_mode the last window must still start inside the input or left padding."""
    span = size + pads[0] + pads[1] - d * (k - 1) - 1
    out = (ceildiv(span, s) if ceil_mode else span // s) + 1
    return out - 1 if ceil_mode and (out - 1) * s >= size + pads[0] else out


def _kernel_dims(kernel_size: IntOrInts) -> int:
    if is_index(kernel_size):
        return 2
    if not isinstance(kernel_size, (tuple, list)) or not all(is_index(k) for k in kernel_size):
        raise TypeError(f"kernel_size={kernel_size!r} must be an int or a sequence of ints")
    return len(kernel_size)


class _BatchSizeError(RuntimeError, ValueError):
    """torch raises ValueError for a batch-size mismatch of a loss, this API RuntimeError for any shape mismatch."""


def _check_batch(logits: Tensor, target: Tensor) -> None:
    if logits.ndim >= 2 and (target.ndim == 0 or target.shape[0] != logits.shape[0]):
        raise _BatchSizeError(
            f"Expected input batch_size ({logits.shape[0]}) to match target batch_size "
            f"({target.shape[0] if target.ndim else 0})."
        )


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction!r} is not a valid value for reduction")


def _check_smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def _reduce_loss(loss: Tensor, reduction: str, count: Tensor | int | None = None) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (loss.numel() if count is None else count)


def _classes_last(x: Tensor, class_axis: int) -> Tensor:
    return x.permute([i for i in range(x.ndim) if i != class_axis] + [class_axis])


def _zero_stuffed(x: Tensor, stride: tuple[int, ...]) -> Tensor:
    """(N, C, *spatial) with s-1 zeros after every element of each spatial dim (trailing ones included)."""
    lead, spatial = x.shape[:2], x.shape[2:]
    x = x.reshape(lead + _cat((i, 1) for i in spatial))
    x = x.pad(((0, 0), (0, 0)) + _cat(((0, 0), (0, s - 1)) for s in stride))
    return x.reshape(lead + tuple(i * s for i, s in zip(spatial, stride)))


def _stride_phases(
    k: int, s: int, d: int, pads: tuple[int, int], size: int, out: int
) -> list[tuple[int, int, int, int, tuple[int, int]] | None]:
    """Per phase r of one strided dim (padded input positions q*s + r, q < ceil((lo + size) / s)): None when no tap
    reaches it, else (first tap j0, dilation of its sub-kernel, tap step, tap count M, padding of the gradient).
    Tap j reads gradient q - (j*d - r)/s, so taps j0 + m*step read q - c - m*d' (c the first one's offset); the padding
    (left c + (M-1)*d', right so the sub-convolution has ceil((lo + size) / s) outputs) makes that a plain
    stride-1 correlation with the sub-kernel reversed."""
    common = math.gcd(s, d)
    step, sub_d, q = s // common, d // common, ceildiv(pads[0] + size, s)
    phases: list[tuple[int, int, int, int, tuple[int, int]] | None] = []
    for r in range(s):
        first = next((j for j in range(min(k, step)) if (j * d - r) % s == 0), None)
        if first is None:
            phases.append(None)
            continue
        count, c = ceildiv(k - first, step), (first * d - r) // s
        phases.append((first, sub_d, step, count, (c + (count - 1) * sub_d, q - c - out)))
    return phases


def _computed_once(grad: Tensor) -> Tensor:
    """A convolution's output gradient stored once when it is computed (e.g. a ReLU's and a pool's backward): the input
    and weight gradients read it in several kernels, and recomputing it in each, through the pool's window index
    arithmetic, costs more than the pass that stores it."""
    nodes = grad.uop.toposort(gate=_not_stored)
    computes = any(u.op in GroupOp.ALU or u.op is Ops.REDUCE_AXIS for u in nodes)
    # a gradient made of constants alone (a sum's) is cheaper recomputed than read
    reads_data = any(not _not_stored(u) for u in nodes)
    return grad.contiguous() if computes and reads_data else grad


def _tiles_without_padding(args: tuple[tuple[int, ...], ...]) -> bool:
    """A pool's windows tile its input: side by side (stride = kernel, no dilation) and inside it (no padding)."""
    kernel, stride, dilation, pads, _, extra = args
    return kernel == stride and all(d == 1 for d in dilation) and all(p == (0, 0) for p in pads) and not any(extra)


def _not_stored(u: UOp) -> bool:
    return u.op not in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN)


def _flipped_kernel(weight: Tensor, groups: int) -> Tensor:
    """(A, B, *kernel) -> (groups*B, A/groups, *kernel): in/out channels swapped per group, taps reversed; the kernel
    of the transposed convolution."""
    return _swapped_channels(weight, groups).flip(tuple(range(2, weight.ndim)))


def _swapped_channels(weight: Tensor, groups: int) -> Tensor:
    """(A, B, *kernel) -> (groups*B, A/groups, *kernel): in/out channels swapped per group, taps in place."""
    a, b, kernel = weight.shape[0] // groups, weight.shape[1], weight.shape[2:]
    return weight.reshape((groups, a, b) + kernel).transpose(1, 2).reshape((groups * b, a) + kernel)


# ---------------------------------------------------------------------------------------------------------------------


class NNMixin:
    def _windows(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
        """(..., *spatial) -> (..., *out, *kernel) sliding windows as a view made of movement ops only."""
        n, p = len(kernel), self.ndim - len(kernel)
        prefix, spatial, keep = self.shape[:p], self.shape[p:], (None,) * p
        outs = tuple((i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(spatial, kernel, stride, dilation))
        if all(k == s and d == 1 for k, s, d in zip(kernel, stride, dilation)):
            # non-overlapping windows are a plain split of each dim into (out, kernel)
            x = self.shrink(keep + tuple((0, o * k) for o, k in zip(outs, kernel))).reshape(
                prefix + _cat(zip(outs, kernel))
            )
            return x.permute(
                tuple(range(p)) + tuple(p + 2 * i for i in range(n)) + tuple(p + 2 * i + 1 for i in range(n))
            )
        # tile each dim e times and fold it into rows of length i+d: row a then starts a*d elements into the input
        tiles = tuple(ceildiv(k * (i + d), i) for i, k, d in zip(spatial, kernel, dilation))
        x = self.reshape(prefix + _cat((1, i) for i in spatial)).expand(prefix + _cat(zip(tiles, spatial)))
        x = x.reshape(prefix + tuple(e * i for e, i in zip(tiles, spatial)))
        x = x.shrink(keep + tuple((0, k * (i + d)) for i, k, d in zip(spatial, kernel, dilation)))
        x = x.reshape(prefix + _cat((k, i + d) for i, k, d in zip(spatial, kernel, dilation)))
        # every s-th start position: take o*s positions (padding past the end), split (o, s), keep the first
        spans = tuple(min(o * s, i + d) for o, s, i, d in zip(outs, stride, spatial, dilation))
        x = x.shrink(keep + _cat((None, (0, sp)) for sp in spans))
        x = x.pad(((0, 0),) * p + _cat(((0, 0), (0, o * s - sp)) for o, s, sp in zip(outs, stride, spans)))
        x = x.reshape(prefix + _cat(zip(kernel, outs, stride))).shrink(
            keep + _cat((None, None, (0, 1)) for _ in kernel)
        )
        x = x.reshape(prefix + _cat(zip(kernel, outs)))
        return x.permute(tuple(range(p)) + tuple(p + 2 * i + 1 for i in range(n)) + tuple(p + 2 * i for i in range(n)))

    # ------------------------------------------------------------------ convolution
    def conv2d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride: IntOrInts = 1,
        dilation: IntOrInts = 1,
        padding: IntOrInts = 0,
        dtype: DTypeLike | None = None,
    ) -> Tensor:
        """Cross-correlation over weight.ndim-2 spatial dims: pad, a windowed view, one multiply-reduce."""
        if self.ndim == weight.ndim - 1 >= 2:
            return self.unsqueeze(0).conv2d(weight, bias, groups, stride, dilation, padding, dtype).squeeze(0)
        n = _check_conv(self, weight, groups, weight.shape[1] * groups)
        cout, kernel = weight.shape[0], weight.shape[2:]
        if cout % groups:
            raise RuntimeError(f"Given groups={groups}, expected weight {weight.shape} to be divisible by it at dim 0")
        if bias is not None and bias.shape != (cout,):
            raise RuntimeError(
                f"Given weight of shape {weight.shape}, expected bias of shape ({cout},), got {bias.shape}"
            )
        stride_t, dilation_t = _positive(stride, n, "stride"), _positive(dilation, n, "dilation")
        pads = _pad_pairs(padding, n)
        x = self.pad(((0, 0), (0, 0)) + pads)
        if any(i < d * (k - 1) + 1 for i, k, d in zip(x.shape[2:], kernel, dilation_t)):
            raise RuntimeError(
                f"padded input size per channel {x.shape[2:]} is smaller than the dilated kernel "
                f"{tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation_t))}"
            )
        out_dt = least_upper_dtype(self.dtype, weight.dtype)
        if dtype is None and bias is not None and self.dtype == weight.dtype == bias.dtype:
            # the bias added inside: its gradient is summed from the output gradient the conv's backward stores
            return self._conv_core(weight, groups, stride_t, dilation_t, pads, None, bias)
        if dtype is None:
            out = self._conv_core(weight, groups, stride_t, dilation_t, pads, None).cast(out_dt)
        else:
            # products are formed in the accumulation dtype when it is the wider one, like torch's upcast inputs
            wide = least_upper_dtype(out_dt, to_dtype(dtype))
            out = self.cast(wide)._conv_core(weight.cast(wide), groups, stride_t, dilation_t, pads, to_dtype(dtype))
        return out if bias is None else out + bias.reshape((1, cout) + (1,) * n)

    def _conv_core(
        self,
        weight: Tensor,
        groups: int,
        stride: tuple[int, ...],
        dilation: tuple[int, ...],
        pads: tuple[tuple[int, int], ...],
        acc_dtype: Any,
        bias: Tensor | None = None,
    ) -> Tensor:
        """(N, C_in, *spatial) -> (N, C_out, *out): the padded input's windowed view times the weight, one reduce,
        plus the bias when given. Its gradient is registered as two convolutions of the same windowed form (input: the
        transposed convolution of the output gradient; weight: the input's windows times it), whose kernels index
        without division, and the bias's sum of the output gradient."""
        n, (cout, cin_g), kernel = weight.ndim - 2, weight.shape[:2], weight.shape[2:]
        padded = self._conv_padded(pads)
        win = padded._windows(kernel, stride, dilation)  # (N, C_in, *out, *kernel)
        bs, outs = self.shape[0], win.shape[2 : 2 + n]
        # the kernel taps before the input channels: the channels are the innermost, longest reduce loop
        win = win.reshape((bs, groups, 1, cin_g) + outs + kernel)
        win = win.permute((0, 1, 2) + tuple(range(4 + n, 4 + 2 * n)) + (3,) + tuple(range(4, 4 + n)))
        w = weight.reshape((1, groups, cout // groups, cin_g) + kernel).permute(
            (0, 1, 2) + tuple(range(4, 4 + n)) + (3,)
        )
        w = w.reshape(w.shape + (1,) * n)
        axes = tuple(range(3, 4 + n))
        out = (win * w).sum(axes, dtype=acc_dtype).reshape((bs, cout) + outs)
        if bias is not None:
            out = out + bias.reshape((1, cout) + (1,) * n)
        x_uop, w_uop, padded_uop, device = self.uop, weight.uop, padded.uop, self.device
        bias_dtype = None if bias is None else bias.dtype

        def backward(g: Any) -> tuple[Any, ...]:
            x_in, w_in, grad = Tensor(x_uop, device=device), Tensor(w_uop, device=device), Tensor(g, device=device)
            grad = _computed_once(grad)
            dx = grad._conv_input_grad(w_in, groups, stride, dilation, pads, x_in.shape[2:])
            dw = Tensor(padded_uop, device=device)._conv_weight_grad(grad, groups, stride, dilation, kernel)
            if bias_dtype is None:
                return dx.cast(x_in.dtype).uop, dw.cast(w_in.dtype).uop
            db = grad.sum((0,) + tuple(range(2, 2 + n)))
            return dx.cast(x_in.dtype).uop, dw.cast(w_in.dtype).uop, db.cast(bias_dtype).uop

        register_gradient(out.uop, (x_uop, w_uop) if bias is None else (x_uop, w_uop, bias.uop), backward)
        return out

    def _conv_padded(self, pads: tuple[tuple[int, int], ...]) -> Tensor:
        """The input padded for a convolution; a large one is stored padded, so the conv's loads need no bounds
        checks (a check per lane would keep them from being vector loads)."""
        if all(p == (0, 0) for p in pads):
            return self
        if prod(self.shape[:2]) * prod(i + a + b for i, (a, b) in zip(self.shape[2:], pads)) < CONV_PAD_REALIZE_SIZE:
            return self.pad(((0, 0), (0, 0)) + pads)
        # a computed input (a ReLU of the previous conv) is stored as it is first: its pass vectorizes, where the
        # padding pass, a bounds check per element, computing it too costs twice as much
        return _computed_once(self).pad(((0, 0), (0, 0)) + pads).contiguous()

    def _conv_input_grad(
        self,
        weight: Tensor,
        groups: int,
        stride: tuple[int, ...],
        dilation: tuple[int, ...],
        pads: tuple[tuple[int, int], ...],
        spatial: tuple[int, ...],
    ) -> Tensor:
        """The gradient of a convolution of a (N, C_in, *spatial) input from the output gradient self (N, C_out,
        *out): at stride 1 the output gradient padded by the dilated kernel, convolved with the kernel flipped and its
        channels swapped per group; a strided conv goes phase by phase (`_conv_input_grad_by_phase`)."""
        n, kernel = weight.ndim - 2, weight.shape[2:]
        if any(s > 1 for s in stride):
            return self._conv_input_grad_by_phase(weight, groups, stride, dilation, pads, spatial)
        g = self
        reach = tuple(d * (k - 1) for k, d in zip(kernel, dilation))
        # tap k-1-a of the flipped kernel at input position p reads the gradient at p + pad - a*d: shifted
        # right by reach - pad, and cut or filled to spatial + reach (negative amounts crop)
        g = g.pad(
            ((0, 0), (0, 0))
            + tuple((r - lo, i + lo - gs) for r, (lo, _), i, gs in zip(reach, pads, spatial, g.shape[2:]))
        )
        w = _flipped_kernel(weight, groups)
        if g.numel() >= CONV_PAD_REALIZE_SIZE:
            # stored: the padded gradient needs no bounds checks, the swapped kernel is read in its own order
            g, w = (g.contiguous() if g.uop is not self.uop else g), w.contiguous()
        # stored as it is: an elementwise epilogue fused into its register tiles (a ReLU's backward mask, one per
        # output) keeps the C compiler from vectorizing the tiles; applied in a pass of its own it costs far less
        return g._conv_core(w, groups, (1,) * n, dilation, ((0, 0),) * n, None).contiguous()

    def _conv_input_grad_by_phase(
        self,
        weight: Tensor,
        groups: int,
        stride: tuple[int, ...],
        dilation: tuple[int, ...],
        pads: tuple[tuple[int, int], ...],
        spatial: tuple[int, ...],
    ) -> Tensor:
        """The input gradient of a strided convolution without zero-stuffing the output gradient (reading a stuffed
        gradient divides every index by the stride): padded input position q*s + r (a phase r per stride step) only
        gets taps j with j*d = r (mod s), so each phase is a stride-1 transposed convolution of the gradient with
        the kernel's taps j0, j0 + s', ... (s' = s / gcd(s, d)) at dilation d / gcd(s, d). The phases are stored side
        by side as (N, C_in, Q, s) per dim, whose flat order is the padded input's: the gradient is a crop of it."""
        n, kernel, outs = len(stride), weight.shape[2:], self.shape[2:]
        per_dim = [_stride_phases(*a) for a in zip(kernel, stride, dilation, pads, spatial, outs)]
        lead, flipped = (self.shape[0], weight.shape[1] * groups), weight.flip(tuple(range(2, 2 + n)))
        total: Tensor | None = None
        for phase in itertools.product(*(range(s) for s in stride)):
            taps = [dim[r] for dim, r in zip(per_dim, phase)]
            if any(t is None for t in taps):
                continue  # no kernel tap lands on this phase: its positions get zero gradient
            # the sub-kernel's taps reversed: every dim flipped before the stepped slices (a flip outside a slice's
            # reshape would put negative terms into its index split), channels swapped, stored for the conv
            k_last = tuple(k - 1 - j0 - (m - 1) * step for k, (j0, _, step, m, _) in zip(kernel, taps))
            w = flipped[(slice(None), slice(None)) + tuple(slice(a, None, t[2]) for a, t in zip(k_last, taps))]
            w = _swapped_channels(w, groups).contiguous()
            g = self.pad(((0, 0), (0, 0)) + tuple(gpad for _, _, _, _, gpad in taps))
            if g.numel() >= CONV_PAD_REALIZE_SIZE:
                g = g.contiguous()
            part = g._conv_core(w, groups, (1,) * n, tuple(d for _, d, _, _, _ in taps), ((0, 0),) * n, None)
            # (N, C, *Q) -> (N, C, Q1, s1, Q2, s2, ...) with this phase's values at index r of each s axis
            part = part.contiguous().reshape(lead + _cat((q, 1) for q in part.shape[2:]))
            part = part.pad(((0, 0), (0, 0)) + _cat(((0, 0), (r, s - 1 - r)) for r, s in zip(phase, stride)))
            total = part if total is None else total + part
        assert total is not None, "phase 0 always holds tap 0"
        interleaved = total.contiguous().reshape(lead + tuple(q * s for q, s in zip(total.shape[2::2], stride)))
        return interleaved.shrink((None, None) + tuple((lo, lo + i) for (lo, _), i in zip(pads, spatial)))

    def _conv_weight_grad(
        self,
        grad: Tensor,
        groups: int,
        stride: tuple[int, ...],
        dilation: tuple[int, ...],
        kernel: tuple[int, ...],
    ) -> Tensor:
        """The gradient of a convolution's (C_out, C_in/groups, *kernel) weight: the padded input's windows (self)
        times the output gradient, summed over the batch and the output positions."""
        n, bs, cin_g, outs = len(kernel), self.shape[0], self.shape[1] // groups, grad.shape[2:]
        cout_g = grad.shape[1] // groups
        win = self._windows(kernel, stride, dilation).reshape((bs, groups, 1, cin_g) + outs + kernel)
        if grad.numel() < CONV_WEIGHT_GRAD_MATMUL_SIZE:
            g = grad.reshape((bs, groups, cout_g, 1) + outs + (1,) * n)
            dw = (win * g).sum((0,) + tuple(range(4, 4 + n)))
            return dw.reshape((groups * cout_g, cin_g) + kernel)
        # a large one is computed with the output channels last, read from a channels-last copy of the gradient:
        # then its last output axis is contiguous in one input and walked by the reduce in the other, a matmul the
        # register-tile heuristics take (in the weight's own order no output axis is contiguous in any input)
        o_axes, k_axes = tuple(range(4, 4 + n)), tuple(range(4 + n, 4 + 2 * n))
        x = win.permute((0, 1, 3) + k_axes + o_axes + (2,))  # (N, G, C_in/G, *kernel, *out, 1)
        g = grad.reshape((bs, groups, cout_g) + outs).permute((0, 1) + tuple(range(3, 3 + n)) + (2,)).contiguous()
        g = g.reshape((bs, groups, 1) + (1,) * n + outs + (cout_g,))
        positions = tuple(range(3 + n, 3 + 2 * n))
        if bs * prod(kernel) * cin_g * cout_g * groups <= CONV_PER_SAMPLE_LIMIT:
            # per sample first: one sample's rows stay in cache for every output tile; then the sum over the batch
            dw = (x * g).sum(positions).contiguous().sum(0).contiguous()  # (G, C_in/G, *kernel, C_out/G)
        else:
            dw = (x * g).sum((0,) + positions).contiguous()
        dw = dw.permute((0, 2 + n, 1) + tuple(range(2, 2 + n)))
        return dw.reshape((groups * cout_g, cin_g) + kernel)

    def conv_transpose2d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride: IntOrInts = 1,
        dilation: IntOrInts = 1,
        padding: IntOrInts = 0,
        output_padding: IntOrInts = 0,
    ) -> Tensor:
        """The gradient of conv2d w.r.t. its input: zero-stuff the input by stride,
        then a conv with the flipped kernel."""
        if self.ndim == weight.ndim - 1 >= 2:
            batched = self.unsqueeze(0).conv_transpose2d(
                weight, bias, groups, stride, dilation, padding, output_padding
            )
            return batched.squeeze(0)
        n = _check_conv(self, weight, groups, weight.shape[0])
        kernel = weight.shape[2:]
        stride_t, dilation_t = _positive(stride, n, "stride"), _positive(dilation, n, "dilation")
        pads, out_pad = _pad_pairs(padding, n), _per_dim(output_padding, n, "output_padding")
        if any(not 0 <= op < max(s, d) for op, s, d in zip(out_pad, stride_t, dilation_t)):
            raise RuntimeError(
                f"output padding must be non-negative and smaller than either stride or dilation, but got "
                f"output_padding={out_pad}, stride={stride_t}, dilation={dilation_t}"
            )
        spatial = self.shape[2:]
        if any(s > 1 for s in stride_t):
            return self._conv_transpose_by_phase(weight, bias, groups, stride_t, dilation_t, pads, out_pad)
        # insert s-1 zeros between input elements (none after the last)
        x = _zero_stuffed(self, stride_t).shrink(
            (None, None) + tuple((0, max(i - 1, 0) * s + min(i, 1)) for i, s in zip(spatial, stride_t))
        )
        # the kernel with in/out channels swapped per group and its taps reversed
        w = _flipped_kernel(weight, groups)
        conv_pads = [
            (d * (k - 1) - b, d * (k - 1) - a + op) for (b, a), k, d, op in zip(pads, kernel, dilation_t, out_pad)
        ]
        return x.conv2d(w, bias, groups=groups, dilation=dilation_t, padding=_cat(reversed(conv_pads)))

    def _conv_transpose_by_phase(
        self,
        weight: Tensor,
        bias: Tensor | None,
        groups: int,
        stride: tuple[int, ...],
        dilation: tuple[int, ...],
        pads: tuple[tuple[int, int], ...],
        out_pad: tuple[int, ...],
    ) -> Tensor:
        """A strided transposed convolution: the input gradient of the conv2d it transposes (one stride-1
        convolution per stride phase), never reading a zero-stuffed input, whose indices divide by the stride."""
        sizes = zip(self.shape[2:], weight.shape[2:], stride, dilation, pads, out_pad)
        spatial = tuple((i - 1) * s - lo - hi + d * (k - 1) + op + 1 for i, k, s, d, (lo, hi), op in sizes)
        if any(o < 1 for o in spatial):
            raise RuntimeError(
                f"conv_transpose2d of input {self.shape} with weight {weight.shape}, stride={stride}, "
                f"dilation={dilation}, padding={pads}, output_padding={out_pad} has output size {spatial}"
            )
        out = self._conv_input_grad_by_phase(weight, groups, stride, dilation, pads, spatial)
        out = out.cast(least_upper_dtype(self.dtype, weight.dtype))
        return out if bias is None else out + bias.reshape((1, out.shape[1]) + (1,) * len(stride))

    # ------------------------------------------------------------------ pooling
    def _pool_args(
        self, kernel_size: IntOrInts, stride: IntOrInts | None, dilation: IntOrInts, padding: IntOrInts, ceil_mode: bool
    ) -> tuple[tuple[int, ...], ...]:
        """Validated (kernel, stride, dilation, pads, outs, extra right padding for ceil_mode) of a pooling op."""
        n = _kernel_dims(kernel_size)
        kernel = _positive(kernel_size, n, "kernel_size")
        no_stride = stride is None or not isinstance(stride, int) and len(stride) == 0
        stride_t, dilation_t = (
            kernel if no_stride else _positive(stride, n, "stride"),
            _positive(dilation, n, "dilation"),
        )
        if self.ndim < n:
            raise RuntimeError(f"pooling with a {n}-D kernel {kernel} needs {n}+ dims, got shape {self.shape}")
        pads = _pad_pairs(padding, n)
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
        x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
        total = x._pooled_windows(args, 0).sum(tuple(range(x.ndim, x.ndim + n)), dtype=sum_acc_dtype(x.dtype))
        # the divisor counts the taps inside the input (count_include_pad=False) or inside input + regular padding
        counts = []
        for i, k, s, d, (b, a), o in zip(self.shape[-n:], kernel, stride_t, dilation_t, pads, outs):
            lo, hi = (0, b + i + a) if count_include_pad else (b, b + i)
            counts.append([sum(1 for t in range(k) if lo <= j * s + t * d < hi) for j in range(o)])
        if all(c == k for cs, k in zip(counts, kernel) for c in cs):
            return (total / prod(kernel)).cast(x.dtype)
        per_dim = [Tensor(c, device=self.device, dtype=total.dtype) for c in counts]
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
        win = self._pooled_windows(args, lowest)
        axes = tuple(range(self.ndim, self.ndim + n))
        values = win.max(axes)
        if dtypes.is_float(self.dtype) and _tiles_without_padding(args):
            self._register_tiled_max_pool_gradient(values, args)
        if not return_indices:
            return values
        # the first tap (in input order) holding the window's max, as a flat offset into the input's spatial plane
        spatial = self.shape[-n:]
        plane = prod(spatial)
        flat = Tensor.arange(plane, device=self.device).reshape(spatial)._pooled_windows(args, plane)
        hit = win == values.reshape(values.shape + (1,) * n)
        if dtypes.is_float(self.dtype):
            hit = hit | win.ne(win)  # NaN wins, like torch
        return values, hit.where(flat, plane).min(axes)

    def _register_tiled_max_pool_gradient(self, values: Tensor, args: tuple[tuple[int, ...], ...]) -> None:
        """The gradient of a max pool whose windows tile the input (stride = kernel, no dilation or padding) goes to one
        tap per window, the one torch picks (the first maximum; the last NaN): its tap number is stored once per window,
        and each input position compares its own tap number with it. The plain rule for a max divides the gradient
        among tied taps (per-element division, a tie count per window) and, through the windows' movement ops, indexes
        the input by division."""
        kernel, _, _, _, outs, _ = args
        n, x_uop, device = len(kernel), self.uop, self.device
        lead, taps = self.shape[:-n], prod(kernel)

        def backward(g: Any) -> tuple[Any, ...]:
            x, grad = Tensor(x_uop, device=device), Tensor(g, device=device)
            win = x._pooled_windows(args, -math.inf)
            # the forward's maximum (the same node, so the same stored buffer), not a running maximum: a select per
            # tap that the C compiler makes a branch, which random data mispredicts
            most = win.max(tuple(range(x.ndim, x.ndim + n)))
            tap = [t.squeeze(-1) for t in win.reshape(lead + outs + (taps,)).split(1, -1)]
            # integer arithmetic, no select: the first tap equal to the maximum (from the last tap back), else (a NaN
            # window) the last NaN
            chosen = Tensor.zeros(lead + outs, dtype=dtypes.int32, device=device)
            for t in reversed(range(taps)):
                chosen = chosen + (tap[t] == most).cast(dtypes.int32) * (t - chosen)
            for t in range(taps):
                chosen = chosen + tap[t].ne(tap[t]).cast(dtypes.int32) * (t - chosen)
            # stored: each of the window's taps reads it; recomputed per tap it would repeat the scan taps times
            chosen = chosen.contiguous().reshape(lead + outs + (1,) * n)
            number = Tensor.arange(taps, dtype=dtypes.int32, device=device).reshape(kernel)
            # times a 0/1 mask, not a select (a branch the data decides, like above), as the plain rule for a max does
            per_tap = grad.reshape(lead + outs + (1,) * n) * (chosen == number).cast(grad.dtype)
            # (..., *out, *kernel) -> (..., out1, k1, out2, k2, ...), stored in that order: its loops index the
            # windows' values without division, and the input positions are a plain reshape of it
            p = len(lead)
            per_tap = per_tap.permute(tuple(range(p)) + _cat((p + i, p + n + i) for i in range(n))).contiguous()
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
        kernel = _positive(kernel_size, n, "kernel_size")
        stride_t = kernel if stride is None else _positive(stride, n, "stride")
        dilation_t, pads = _positive(dilation, n, "dilation"), _pad_pairs(padding, n)
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
        hit = indices.reshape(prefix + (count, 1)) == Tensor.arange(plane, device=self.device).reshape(1, plane)
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
        quantized = Tensor(np.floor(weights * (1 << bits) + 0.5).astype(np.int64), device=self.device)
        mixed = self.unsqueeze(axis) * quantized.reshape((out, size) + trailing)
        return (mixed.sum(axis + 1) + (1 << bits >> 1)) >> bits

    def _resample(self, axis: int, out: int, mode: str, align_corners: bool) -> Tensor:
        size, trailing = self.shape[axis], (1,) * (self.ndim - axis - 1)
        compute = dtypes.float64 if self.dtype is dtypes.float64 else dtypes.float32
        dst = Tensor.arange(out, device=self.device).cast(compute).reshape(out, 1)
        src = Tensor.arange(size, device=self.device).reshape(1, size)
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
        scale = Tensor(size / out, device=self.device, dtype=dtypes.float32)
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
        if not (TRAINING or Tensor.training) or p == 0:
            return self
        if p == 1:
            return self * 0
        keep = Tensor.rand(self.shape, device=self.device, contiguous=False) >= p
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
        no_dropout = dropout_p == 0 or not (TRAINING or Tensor.training)
        if no_dropout and uses_flash(self, key, value, attn_mask, enable_gqa):
            return flash_attention(self, key, value, attn_mask, is_causal)
        if enable_gqa and self.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            key, value = key._repeat_heads(heads // kv_heads), value._repeat_heads(heads // kv_heads)
        # scores accumulate in at least float32, then return to the query dtype before the softmax
        acc = least_upper_dtype(self.dtype, dtypes.float32)
        scores = (self.matmul(key.transpose(-1, -2), dtype=acc) * (1 / math.sqrt(self.shape[-1]))).cast(self.dtype)
        if is_causal:
            rows, cols = (
                Tensor.arange(self.shape[-2], device=self.device),
                Tensor.arange(key.shape[-2], device=self.device),
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

    # ------------------------------------------------------------------ losses
    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        _check_reduction(reduction)
        if self.shape != Y.shape:
            raise ValueError(f"binary_crossentropy target shape {Y.shape} != input shape {self.shape}")
        # torch clamps each log at -100 so that p in {0, 1} gives a finite loss
        loss = -(Y * self.log().maximum(-100.0) + (1 - Y) * (1 - self).log().maximum(-100.0))
        return _reduce_loss(loss, reduction)

    def binary_crossentropy_logits(
        self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None
    ) -> Tensor:
        _check_reduction(reduction)
        if self.shape != Y.shape:
            raise ValueError(f"binary_crossentropy_logits target shape {Y.shape} != input shape {self.shape}")
        # log(1 + e^-x) written so that it never overflows: max(-x, 0) + log(1 + e^-|x|)
        softplus_neg = (-self).maximum(0) + (1 + (-self.abs()).exp()).log()
        pos = softplus_neg if pos_weight is None else (1 + (pos_weight - 1) * Y) * softplus_neg
        return _reduce_loss((1 - Y) * self + pos, reduction)

    def sparse_categorical_crossentropy(
        self,
        Y: Tensor,
        ignore_index: int = -1,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        _check_as: str = "sparse_categorical_crossentropy",
    ) -> Tensor:
        """Cross-entropy of logits with the classes on the LAST axis and class labels Y (integer-valued)."""
        _check_reduction(reduction)
        _check_smoothing(label_smoothing)
        if self.ndim == 0 or Y.shape != self.shape[:-1]:
            raise RuntimeError(
                f"sparse_categorical_crossentropy labels of shape {Y.shape} must have the shape of the logits "
                f"{self.shape} without its last (class) axis"
            )
        classes, logp = self.shape[-1], self.log_softmax(-1)
        picked = (Y.unsqueeze(-1) == Tensor.arange(classes, device=self.device)).where(logp, 0).sum(-1)
        if CHECK_OOB:  # a label outside the classes (other than the ignored one) is an IndexError at realize
            check_index_bounds(_check_as, "classes", (Y == ignore_index).where(0, Y), 0, classes, picked)
        # without smoothing no term of the whole row: 0 * sum(logp) is NaN when a class's logit is -inf (masked)
        loss = -picked
        if label_smoothing:
            loss = -(1 - label_smoothing) * picked - label_smoothing / classes * logp.sum(-1)
        if ignore_index == -1:
            return _reduce_loss(loss, reduction)
        keep = Y != ignore_index
        return _reduce_loss(keep.where(loss, 0), reduction, keep.sum())

    def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
        """torch-like: classes on axis 1 (axis 0 for 1-D logits); Y holds class indices or class probabilities."""
        _check_reduction(reduction)
        _check_smoothing(label_smoothing)
        if self.ndim == 0:
            raise RuntimeError("cross_entropy needs logits with a class axis, got a 0-d tensor")
        class_axis = 1 if self.ndim >= 2 else 0
        logits = _classes_last(self, class_axis)
        if Y.shape == self.shape and dtypes.is_float(Y.dtype):
            target = _classes_last(Y, class_axis) * (1 - label_smoothing) + label_smoothing / self.shape[class_axis]
            return _reduce_loss(-(target * logits.log_softmax(-1)).sum(-1), reduction)
        without = self.shape[:class_axis] + self.shape[class_axis + 1 :]
        if Y.shape != self.shape:
            _check_batch(self, Y)
        if Y.shape != without or not dtypes.is_int(Y.dtype):
            raise RuntimeError(
                f"cross_entropy target ({Y.shape}, {Y.dtype}) must be integer class indices of shape "
                f"{without} or float probabilities of shape {self.shape}"
            )
        return logits.sparse_categorical_crossentropy(
            Y, label_smoothing=label_smoothing, reduction=reduction, _check_as="cross_entropy"
        )

    def nll_loss(
        self, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None, reduction: str = "mean"
    ) -> Tensor:
        """Negative log-likelihood of log-probabilities (classes on axis 1, axis 0 for 1-D); a weighted mean divides by
        the summed weights of the counted targets."""
        _check_reduction(reduction)
        if self.ndim == 0:
            raise RuntimeError("nll_loss needs log-probabilities with a class axis, got a 0-d tensor")
        class_axis = 1 if self.ndim >= 2 else 0
        classes, without = self.shape[class_axis], self.shape[:class_axis] + self.shape[class_axis + 1 :]
        _check_batch(self, Y)
        if Y.shape != without:
            raise RuntimeError(f"nll_loss target shape {Y.shape} must be {without} for input {self.shape}")
        if not dtypes.is_int(Y.dtype):
            raise RuntimeError(f"nll_loss targets must be integer class indices, got {Y.dtype}")
        if weight is not None and weight.shape != (classes,):
            raise RuntimeError(f"nll_loss weight of shape {weight.shape} must have one entry per class ({classes})")
        hit = Y.unsqueeze(-1) == Tensor.arange(classes, device=self.device)
        labels = Y if ignore_index is None else (Y == ignore_index).where(0, Y)
        check_index_bounds("nll_loss", "classes", labels, 0, classes, hit)
        w = hit.where(weight if weight is not None else 1.0, 0.0).cast(self.dtype).sum(-1)
        if ignore_index is not None:
            w = (Y != ignore_index).where(w, 0.0)
        loss = -hit.where(_classes_last(self, class_axis), 0).sum(-1) * w
        return _reduce_loss(loss, reduction, w.sum())
