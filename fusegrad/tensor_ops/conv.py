"""Convolutions (docs/api.md): conv2d over any number of spatial dims, conv_transpose2d, and their gradients."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from fusegrad.dtype import DTypeLike, least_upper_dtype, to_dtype
from fusegrad.gradient import register_gradient
from fusegrad.helpers import ceildiv, prod
from fusegrad.tensor_ops.shapes import is_index
from fusegrad.tensor_ops.spatial_args import IntOrInts, flat_tuple, padding_pairs, per_dim, positive
from fusegrad.uop.ops import GroupOp, Ops, UOp

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

# a convolution's padded input with at least this many elements is stored padded before the conv reads it: read
# through the padding, each lane of a register tile has its own bounds check, so no load of the tile is a vector (the
# digits convnet's first conv, 128x1x10x10 padded: 340 us gated, 30 us + a 10 us copy stored)
CONV_PAD_REALIZE_SIZE = 2**12
# a conv's weight gradient from an output gradient this large is computed with the output channels last (a matmul)
CONV_WEIGHT_GRAD_MATMUL_SIZE = 2**16
# a large conv's weight gradient is summed per sample first while the partials (batch x weight) stay this small
CONV_PER_SAMPLE_LIMIT = 2**24
# a stride-1 conv whose output rows are shorter than this runs over the flat positions of its padded input
# (`_flat_conv`): tiles along an output row this short do not fill the vectors (ResNet-50's 3x3 convs at 7x7, 14x14
# and 28x28, batch 1: 2-11x faster measured per kernel)
FLAT_CONV_MAX_WIDTH = 32
# ... and so does one whose rows are shorter than this and not whole 32-wide tiles: the last tile of a row overlaps the
# one before it (a 56-wide row runs 64 columns); the flat positions waste only the padding columns (ResNet-50's 1x1
# and 3x3 convs at 56x56, batch 1: about 5-15 % faster per kernel, min of 7 calls, loaded)
FLAT_CONV_MAX_PARTIAL_WIDTH, CONV_ROW_TILE = 64, 32
# ... and a strided conv runs as a stride-1 conv over its input's stride phases (`_stride_phase_split`), when each
# output sums at least this many products: then the passes these layouts add (the flat result's crop, the phases'
# copy) cost little next to the conv (the small convs of tests and of the digits convnet keep their one kernel)
CONV_RELAYOUT_MIN_REDUCE = 64
# ... or at least this many when the conv has this many outputs: a large conv's windowed layout costs far more than the
# passes (ShuffleNet's 3x3 stride-2 stem of 3 channels, 27 products: 1.0 -> 0.38 ms; its grouped 1x1 convs of 34
# channels per group at 28x28: 0.40 -> 0.08 ms), while a small one keeps its one kernel
CONV_RELAYOUT_MIN_REDUCE_LARGE, CONV_RELAYOUT_LARGE_OUTPUT = 16, 2**16
# ... unless its phases would compute this many times its products (a 3x3 stride-2 conv's 2x2 taps over 4 phases:
# 16/9; the taps past the kernel multiply zeros) and its windows copied side by side (`_window_columns`) hold at most
# this many elements: then the copy and a plain matmul of the weight as it is over it cost less
CONV_PHASE_WASTE, CONV_WINDOW_COLUMNS_MAX = 1.5, 2**22
# a conv over several taps sums its input channels in blocks of this many, each block's taps and channels in turn: a
# block's input rows and weights stay in L1 for all its taps, where walking every channel per tap streamed them from
# L2 once per tap (AVX2, one thread, per kernel: 3x3 convs 256 -> 256 at 56x56 50 -> 76 GFLOPS, 128 -> 128 at
# 112x112 54 -> 78, 512 -> 512 at 28x28 48 -> 75, 128 -> 32 at 56x56 33 -> 43, a 5x5 96 -> 128 at 28x28 34 -> 64;
# 64 -> 64 at 224x224, 32 and 48 channels the same either way within the noise; blocks of 16 ran as fast on the 3x3
# convs of 128 or more channels, slower on the 5x5 and at 64 channels)
CONV_CHANNEL_BLOCK = 8
# a stored one-tap conv (a 1x1 over flat positions, the window columns' matmul) summing at least this many inputs per
# output sums chunks of this many into partials, chunk by chunk, then adds the partials: one chunk of the columns stays
# in L2 for every register tile, where the whole reduce streamed all columns from L3 once per row tile; the partials'
# sum costs a pass over chunks x outputs (AVX2, one thread, per conv with the sum: ResNet-50's 3x3 stride-2 conv of
# 512 channels as columns 6.2 -> 4.1 ms, its 1x1 convs 1024 -> 256 at 14x14 1.69 -> 1.27 ms, 2048 -> 512 at 7x7 2.02
# -> 1.78, 512 -> 1024 at 14x14 2.77 -> 2.50, Inception's 1024 -> 352 at 7x7 0.64 -> 0.57)
CONV_CHUNKED_REDUCE_MIN, CONV_REDUCE_CHUNK = 1024, 256
# a stride-1 conv of groups 1 with short rows and at most this many output positions per sample copies its windows
# into columns too: the flat positions' padding columns and the tiles' last partial vector waste more than the copy
# (SqueezeNet's 3x3 convs at 13x13 and 27x27, ResNet-50's at 7x7, 14x14 and 28x28, batch 1: 5-20 % faster per conv;
# at 55x55 and 56x56 the flat conv stays 5-10 % faster), while the columns hold at most this many elements (4 MB:
# each 8-channel row tile streams all of them: VGG-19's 512 channels at 28x28, 14 MB, ran 3x slower as columns, loaded)
# and it has at least this many output channels to share the copy (DenseNet's 3x3 convs of 32 outputs took the same
# time either way, one conv at 28x28 602 vs 589 us, and its model 52 more kernels)
# ... and its input channels do not form CONV_CHANNEL_BLOCKs: the flat layout summing them in blocks ran faster (AVX2,
# one thread, per kernel: 3x3 convs 512 -> 512 at 14x14 18.2 -> 11.9 ms, 512 at 7x7 5.9 -> 3.2, 256 at 14x14 4.1 ->
# 2.9, 32 -> 128 at 27x27 0.77 -> 0.62; 48 -> 192 at 13x13 0.37 either way)
WINDOW_COLUMNS_MAX_POSITIONS, STRIDE_1_COLUMNS_MAX, WINDOW_COLUMNS_MIN_OUTPUTS = 32 * 32, 2**20, 64


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


def _zero_stuffed(x: Tensor, stride: tuple[int, ...]) -> Tensor:
    """(N, C, *spatial) with s-1 zeros after every element of each spatial dim (trailing ones included)."""
    lead, spatial = x.shape[:2], x.shape[2:]
    x = x.reshape(lead + flat_tuple((i, 1) for i in spatial))
    x = x.pad(((0, 0), (0, 0)) + flat_tuple(((0, 0), (0, s - 1)) for s in stride))
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


def _conv_forward(
    padded: Tensor,
    weight: Tensor,
    groups: int,
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    acc_dtype: Any,
    bias: Tensor | None,
) -> Tensor:
    """(N, C_in, *padded spatial) -> (N, C_out, *out) with the bias added: a strided conv as a stride-1 conv over the
    input's stride phases, a small stride-1 conv as a matmul over its windows copied into columns, one with short output
    rows over the input's flat positions, else the padded input's windowed view times the weight."""
    n, kernel = weight.ndim - 2, weight.shape[2:]
    outs = tuple((i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(padded.shape[2:], kernel, stride, dilation))
    reduce, outputs = weight.shape[1] * prod(kernel), padded.shape[0] * weight.shape[0] * prod(outs)
    long_reduce = reduce >= CONV_RELAYOUT_MIN_REDUCE or (
        reduce >= CONV_RELAYOUT_MIN_REDUCE_LARGE and outputs >= CONV_RELAYOUT_LARGE_OUTPUT
    )
    if long_reduce and any(s > 1 for s in stride) and all(d == 1 for d in dilation):
        taps = prod(ceildiv(k, s) * min(k, s) for k, s in zip(kernel, stride))
        columns = outputs // weight.shape[0] * reduce  # the window columns' elements
        if groups == 1 and taps >= CONV_PHASE_WASTE * prod(kernel) and columns <= CONV_WINDOW_COLUMNS_MAX:
            return _window_columns(padded, weight, stride, acc_dtype, bias, outs)
        x, w = _stride_phase_split(padded, weight, stride, outs)
        out = _conv_forward(x, w, groups, (1,) * n, dilation, acc_dtype, bias)
        return out.shrink((None, None) + tuple((0, o) for o in outs))
    short_rows = outs[-1] < FLAT_CONV_MAX_WIDTH or (
        outs[-1] < FLAT_CONV_MAX_PARTIAL_WIDTH and outs[-1] % CONV_ROW_TILE != 0
    )
    plain = groups == 1 and all(s == 1 for s in stride) and all(d == 1 for d in dilation) and prod(kernel) > 1
    columns = outputs // weight.shape[0] * reduce
    small = prod(outs) <= WINDOW_COLUMNS_MAX_POSITIONS and columns <= STRIDE_1_COLUMNS_MAX
    small = small and weight.shape[0] >= WINDOW_COLUMNS_MIN_OUTPUTS
    # channels summed in blocks run the flat layout faster than the columns' matmul, and without the copy
    small = small and _channel_blocks(weight.shape[1], kernel) == (weight.shape[1],)
    # the columns copied from a stored padded input: copied from a padding view, the copy is fused into the matmul
    if reduce >= CONV_RELAYOUT_MIN_REDUCE and n >= 2 and plain and short_rows and small and not _not_stored(padded.uop):
        return _window_columns(padded, weight, stride, acc_dtype, bias, outs)
    if long_reduce and n >= 2 and all(s == 1 for s in stride) and short_rows:
        return _flat_conv(padded, weight, groups, dilation, acc_dtype, bias, outs)
    win = padded._windows(kernel, stride, dilation)  # (N, C_in, *out, *kernel)
    return _windows_times_weight(win, weight, groups, acc_dtype, bias)


def _windows_times_weight(
    win: Tensor, weight: Tensor, groups: int, acc_dtype: Any, bias: Tensor | None, store: bool = False
) -> Tensor:
    """(N, C_in, *out, *kernel) windows (any number of output axes) times the (C_out, C_in/groups, *kernel) weight,
    summed over the taps and the input channels: (N, C_out, *out), the bias added; stored when `store`, and a large
    grouped conv's always."""
    n, (cout, cin_g), kernel = weight.ndim - 2, weight.shape[:2], weight.shape[2:]
    bs, outs = win.shape[0], win.shape[2 : win.ndim - n]
    m = len(outs)
    chunked = cin_g >= CONV_CHUNKED_REDUCE_MIN and cin_g % CONV_REDUCE_CHUNK == 0
    if store and groups == 1 and prod(kernel) == 1 and chunked:
        return _chunked_reduce(win.reshape((bs, cin_g) + outs), weight.reshape((cout, cin_g)), acc_dtype, bias)
    # the kernel taps before the input channels: the channels are the innermost reduce loop; over many taps, the
    # channels in blocks outside the taps (`_channel_blocks`)
    chans = _channel_blocks(cin_g, kernel)
    c = len(chans)
    win = win.reshape((bs, groups, 1) + chans + outs + kernel)
    taps, pos = tuple(range(3 + c + m, 3 + c + m + n)), tuple(range(3 + c, 3 + c + m))
    win = win.permute((0, 1, 2) + tuple(range(3, 2 + c)) + taps + (2 + c,) + pos)
    w = weight.reshape((1, groups, cout // groups) + chans + kernel)
    w = w.permute((0, 1, 2) + tuple(range(3, 2 + c)) + tuple(range(3 + c, 3 + c + n)) + (2 + c,))
    w = w.reshape(w.shape + (1,) * m)
    out = (win * w).sum(tuple(range(3, 3 + c + n)), dtype=acc_dtype).reshape((bs, groups, cout // groups) + outs)
    if bias is not None:
        out = out + bias.reshape((1, groups, cout // groups) + (1,) * m)
    if store or (groups > 1 and cout > groups and cin_g * prod(kernel) >= CONV_RELAYOUT_MIN_REDUCE):
        # stored with the groups as their own axis: merged into the channels, the input's index would divide the
        # channel by the group's size, and no axis would be left for the register tile's rows (AlexNet's grouped
        # 5x5 conv, batch 1: no opts at all, 0.2 GFLOPS)
        out = out.contiguous()
    return out.reshape((bs, cout) + outs)


def _chunked_reduce(x: Tensor, weight: Tensor, acc_dtype: Any, bias: Tensor | None) -> Tensor:
    """(N, K, *out) columns times the (C_out, K) weight as partial sums over chunks of CONV_REDUCE_CHUNK of the
    reduce, stored chunk-major (N, chunks, C_out, *out), then summed over the chunks: (N, C_out, *out), stored."""
    (bs, k), outs, cout = x.shape[:2], x.shape[2:], weight.shape[0]
    chunks, m = k // CONV_REDUCE_CHUNK, len(outs)
    x = x.reshape((bs, chunks, 1, CONV_REDUCE_CHUNK) + outs)
    w = weight.reshape((cout, chunks, CONV_REDUCE_CHUNK)).permute(1, 0, 2)
    w = w.reshape((1, chunks, cout, CONV_REDUCE_CHUNK) + (1,) * m)
    out = (x * w).sum(3, dtype=acc_dtype).contiguous().sum(1, dtype=acc_dtype)
    if bias is not None:
        out = out + bias.reshape((1, cout) + (1,) * m)
    return out.contiguous()


def _channel_blocks(cin: int, kernel: tuple[int, ...]) -> tuple[int, ...]:
    """The input channels as (blocks, CONV_CHANNEL_BLOCK) when a conv over several taps has at least two blocks of
    them, else (cin,)."""
    if prod(kernel) > 1 and cin % CONV_CHANNEL_BLOCK == 0 and cin >= 2 * CONV_CHANNEL_BLOCK:
        return (cin // CONV_CHANNEL_BLOCK, CONV_CHANNEL_BLOCK)
    return (cin,)


def _flat_conv(
    padded: Tensor,
    weight: Tensor,
    groups: int,
    dilation: tuple[int, ...],
    acc_dtype: Any,
    bias: Tensor | None,
    outs: tuple[int, ...],
) -> Tensor:
    """A stride-1 conv computed at every flat position of the padded input (tap offsets are sums of row strides), the
    positions past each output row's end computed too and dropped: one long output axis contiguous in the input,
    which the register tiles run along (a 7x7 output's rows are too short for a vector). The flat result is stored,
    or the kernel's loops would follow the cropped (N, C_out, *out) shape again."""
    n, kernel, spatial = weight.ndim - 2, weight.shape[2:], padded.shape[2:]
    cout, bs = weight.shape[0], padded.shape[0]
    x = padded if _reads_in_place(padded) else padded.contiguous()
    x = x.reshape(padded.shape[:2] + (prod(spatial),))
    row = [prod(spatial[i + 1 :]) for i in range(n)]
    for k, d, r in zip(kernel, dilation, row):
        x = x._windows((k,), (1,), (d * r,))  # (N, C, *taps so far, positions, k)
        x = x.permute(tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))
    positions = x.shape[-1]  # every position whose window stays inside the input
    win = x.permute((0, 1, x.ndim - 1) + tuple(range(2, x.ndim - 1))).reshape(padded.shape[:2] + (positions,) + kernel)
    out = _windows_times_weight(win, weight, groups, acc_dtype, bias, store=True)  # (N, C_out, positions)
    # the positions as rows of the padded input, padded to whole rows, each cropped to the output's width
    out = out.pad(((0, 0), (0, 0), (0, outs[0] * row[0] - positions))).reshape((bs, cout, outs[0]) + spatial[1:])
    return out.shrink((None, None, None) + tuple((0, o) for o in outs[1:]))


def _window_columns(
    padded: Tensor, weight: Tensor, stride: tuple[int, ...], acc_dtype: Any, bias: Tensor | None, outs: tuple[int, ...]
) -> Tensor:
    """A strided conv as a matmul: every output position's window is copied into a column (N, C_in * taps,
    positions), stored, and the weight as it is, (C_out, C_in * taps), times it sums each column, a register tile of
    output channels x positions running along the contiguous columns."""
    kernel, (bs, cin) = weight.shape[2:], padded.shape[:2]
    win = padded._windows(kernel, stride, (1,) * len(kernel))  # (N, C_in, *out, *kernel)
    n = len(kernel)
    win = win.permute((0, 1) + tuple(range(2 + n, 2 + 2 * n)) + tuple(range(2, 2 + n))).contiguous()
    cols = win.reshape((bs, cin * prod(kernel), prod(outs), 1))
    w = weight.reshape((weight.shape[0], cin * prod(kernel), 1))
    # stored flat, or the kernel's loops would follow the (N, C_out, *out) shape again (a 7-wide row in the tile)
    out = _windows_times_weight(cols, w, 1, acc_dtype, bias, store=True)
    return out.reshape((bs, weight.shape[0]) + outs)


def _reads_in_place(x: Tensor) -> bool:
    """Whether x is a stored buffer or values computed elementwise from stored buffers read in their own order (no
    movement but reshapes): then its flat view indexes without division."""
    nodes = x.uop.toposort(gate=_not_stored)
    return not any(u.op in GroupOp.Movement and u.op is not Ops.RESHAPE for u in nodes)


def _stride_phase_split(
    padded: Tensor, weight: Tensor, stride: tuple[int, ...], outs: tuple[int, ...]
) -> tuple[Tensor, Tensor]:
    """A strided conv as a stride-1 one: input position q*s + r of a dim is phase r's position q, and tap j = a*s + r
    reads phase r at q + a. The input's phases become channels (C_in * phases, *(out + taps - 1)), stored, and the
    weight (C_out, C_in/groups * phases, *ceil(k/s)), stored too, holds zeros for the taps past k. Only phases some
    tap reads are kept (a 1x1 strided conv keeps one: a subsampled input)."""
    n, (cout, cin_g), kernel = weight.ndim - 2, weight.shape[:2], weight.shape[2:]
    taps = tuple(ceildiv(k, s) for k, s in zip(kernel, stride))
    phases = tuple(min(k, s) for k, s in zip(kernel, stride))
    lead = padded.shape[:2]
    # each dim cut or zero-filled to s * (out + taps - 1): positions no output reads are never read
    sizes = tuple(s * (o + t - 1) for s, o, t in zip(stride, outs, taps))
    x = padded.shrink((None, None) + tuple((0, min(i, z)) for i, z in zip(padded.shape[2:], sizes)))
    x = x.pad(((0, 0), (0, 0)) + tuple((0, max(z - i, 0)) for i, z in zip(padded.shape[2:], sizes)))
    x = x.reshape(lead + flat_tuple((z // s, s) for z, s in zip(sizes, stride)))
    x = x.shrink((None, None) + flat_tuple((None, (0, p)) for p in phases))
    x = x.permute((0, 1) + tuple(3 + 2 * i for i in range(n)) + tuple(2 + 2 * i for i in range(n)))
    x = x.reshape((lead[0], lead[1] * prod(phases)) + tuple(z // s for z, s in zip(sizes, stride))).contiguous()
    if taps == kernel:
        # every tap is phase 0 (k = 1 or s = 1 along each dim): the phased weight is the weight itself, and a copy
        # of it would run every call (ResNet-50's 1x1 stride-2 convs: 2.7 MB of weights a call)
        return x, weight
    w = weight.pad(((0, 0), (0, 0)) + tuple((0, t * s - k) for t, s, k in zip(taps, stride, kernel)))
    w = w.reshape((cout, cin_g) + flat_tuple((t, s) for t, s in zip(taps, stride)))
    w = w.shrink((None, None) + flat_tuple((None, (0, p)) for p in phases))
    w = w.permute((0, 1) + tuple(3 + 2 * i for i in range(n)) + tuple(2 + 2 * i for i in range(n)))
    # stored: read through its padding and phase split, every tap's index would divide by the stride
    return x, w.reshape((cout, cin_g * prod(phases)) + taps).contiguous()


# ---------------------------------------------------------------------------------------------------------------------


class ConvMixin:
    def _windows(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
        """(..., *spatial) -> (..., *out, *kernel) sliding windows as a view made of movement ops only."""
        n, p = len(kernel), self.ndim - len(kernel)
        prefix, spatial, keep = self.shape[:p], self.shape[p:], (None,) * p
        outs = tuple((i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(spatial, kernel, stride, dilation))
        if all(k == s and d == 1 for k, s, d in zip(kernel, stride, dilation)):
            # non-overlapping windows are a plain split of each dim into (out, kernel)
            x = self.shrink(keep + tuple((0, o * k) for o, k in zip(outs, kernel))).reshape(
                prefix + flat_tuple(zip(outs, kernel))
            )
            return x.permute(
                tuple(range(p)) + tuple(p + 2 * i for i in range(n)) + tuple(p + 2 * i + 1 for i in range(n))
            )
        # tile each dim e times and fold it into rows of length i+d: row a then starts a*d elements into the input
        tiles = tuple(ceildiv(k * (i + d), i) for i, k, d in zip(spatial, kernel, dilation))
        x = self.reshape(prefix + flat_tuple((1, i) for i in spatial)).expand(prefix + flat_tuple(zip(tiles, spatial)))
        x = x.reshape(prefix + tuple(e * i for e, i in zip(tiles, spatial)))
        x = x.shrink(keep + tuple((0, k * (i + d)) for i, k, d in zip(spatial, kernel, dilation)))
        x = x.reshape(prefix + flat_tuple((k, i + d) for i, k, d in zip(spatial, kernel, dilation)))
        # every s-th start position: take o*s positions (padding past the end), split (o, s), keep the first
        spans = tuple(min(o * s, i + d) for o, s, i, d in zip(outs, stride, spatial, dilation))
        x = x.shrink(keep + flat_tuple((None, (0, sp)) for sp in spans))
        x = x.pad(((0, 0),) * p + flat_tuple(((0, 0), (0, o * s - sp)) for o, s, sp in zip(outs, stride, spans)))
        x = x.reshape(prefix + flat_tuple(zip(kernel, outs, stride))).shrink(
            keep + flat_tuple((None, None, (0, 1)) for _ in kernel)
        )
        x = x.reshape(prefix + flat_tuple(zip(kernel, outs)))
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
        stride_t, dilation_t = positive(stride, n, "stride"), positive(dilation, n, "dilation")
        pads = padding_pairs(padding, n)
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
        """(N, C_in, *spatial) -> (N, C_out, *out): the padded input times the weight, one reduce (laid out by
        `_conv_forward`), plus the bias when given. Its gradient is registered as two convolutions of the windowed
        form (input: the transposed convolution of the output gradient; weight: the input's windows times it), whose
        kernels index without division, and the bias's sum of the output gradient."""
        n, kernel = weight.ndim - 2, weight.shape[2:]
        padded = self._conv_padded(pads)
        out = _conv_forward(padded, weight, groups, stride, dilation, acc_dtype, bias)
        x_uop, w_uop, padded_uop, device, tensor_class = self.uop, weight.uop, padded.uop, self.device, type(self)
        bias_dtype = None if bias is None else bias.dtype

        def backward(g: Any) -> tuple[Any, ...]:
            x_in, w_in = tensor_class(x_uop, device=device), tensor_class(w_uop, device=device)
            grad = tensor_class(g, device=device)
            grad = _computed_once(grad)
            dx = grad._conv_input_grad(w_in, groups, stride, dilation, pads, x_in.shape[2:])
            dw = tensor_class(padded_uop, device=device)._conv_weight_grad(grad, groups, stride, dilation, kernel)
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
        # padding pass, a bounds check per element, computing it too costs twice as much (even a batch norm and ReLU
        # after a stored 1x1 conv: GCC vectorizes the gated loads as gathers; ResNet-50 52 -> 65 ms computed there)
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
            part = part.contiguous().reshape(lead + flat_tuple((q, 1) for q in part.shape[2:]))
            part = part.pad(((0, 0), (0, 0)) + flat_tuple(((0, 0), (r, s - 1 - r)) for r, s in zip(phase, stride)))
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
        stride_t, dilation_t = positive(stride, n, "stride"), positive(dilation, n, "dilation")
        pads, out_pad = padding_pairs(padding, n), per_dim(output_padding, n, "output_padding")
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
        return x.conv2d(w, bias, groups=groups, dilation=dilation_t, padding=flat_tuple(reversed(conv_pads)))

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
