"""Blocked ("flash") scaled dot-product attention: softmax(q·kᵀ·scale + mask)·v without the N x M scores.

The queries are cut into row blocks. Each block meets only the keys it can see (causal: the keys up to its last row; the
blocks above the diagonal are never computed), so one block's scores are Bq x M' and the whole N x M matrix never
exists. The forward saves the output and each row's logsumexp; the backward recomputes every block's probabilities from
the logsumexp (FlashAttention-2's formulation): past the block threshold one pass of key blocks (the problem transposed)
stores each block's rows of dk and dv and adds its part of dq into dq in place, so training is O(N·d) in memory there.
Grouped-query attention views the query heads as (kv heads, group) against key/value heads broadcast over the group: k
and v are never repeated in memory. Past the threshold the blocks are also one head's (a key/value head with its group
under GQA), so each block's scores, keys and values stay in cache between its kernels."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusegrad.dtype import dtypes, least_upper_dtype
from fusegrad.gradient import register_gradient
from fusegrad.uop.ops import UOp
from fusegrad.uop.sint import Variable, sint

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

# past this many score bytes (all heads) the scores are computed in row blocks, each realized on its own; below it one
# block (the whole score matrix) is cheaper: fewer kernels and no realize inside the op (8 heads of 64 on AVX2: seq 512,
# 8 MB, ran 1.1x faster in one block; seq 1024, 32 MB, 1.2x faster in blocks of one head)
FLASH_SCORE_BYTES = 2**24
# the score bytes of one row block (all heads) at most: its scores and probabilities are the op's largest temporaries
FLASH_BLOCK_BYTES = 2**24
# the blocked forward walks one head at a time (_forward_heads) in row blocks of at most this many score bytes, in
# whole multiples of HEAD_BLOCK_ROWS rows (a multiple of the register tile's rows: 16- and 32-row blocks ran 1.2x slower
# than 24 and 48 on AVX2's 6-row tiles). Under TinyJit seq 4096 ran alike from 24 to 240 rows; without it each block's
# realize costs ~4 ms of Python, so the longer blocks (120 rows there) cost 8 heads ~2 s less per call than 24 rows
HEAD_BLOCK_BYTES = 2**21
HEAD_BLOCK_ROWS = 24
# a row block is never shorter than this (shorter blocks cost more launches than they save in memory)
FLASH_MIN_BLOCK_ROWS = 16
# causal scores under FLASH_SCORE_BYTES still come in this many row blocks (computed together, not realized one by
# one): the blocks above the diagonal are skipped, (n + 1) / 2n of the work is left
CAUSAL_BLOCKS = 4
# a causal block reads its visible keys in steps of this many (or of keys / CAUSAL_KEY_SHAPES when longer), so blocks
# of rows share kernels (one compile per step); each block computes half a step past its rows on average
CAUSAL_KEY_STEP = 256
CAUSAL_KEY_SHAPES = 16
# the forward's row blocks keep their scores under 1/8 of the inputs (its peak stays under twice the inputs); the
# backward's key blocks under 1/BACKWARD_SHARE: each block adds its part of dq into all of dq (a read and a write of
# the queries it meets), which longer blocks amortize (seq 4096: 96-row blocks cost 0.8x the time of 24-row ones)
BACKWARD_SHARE = 2
# the lowest finite float32: a fully masked row's max is raised to it
LOWEST_FLOAT32 = -3.4028234663852886e38


@dataclass(frozen=True)
class _Problem:
    """What every block needs: the float32 views of q, k, v (GQA: q as (..., kv heads, group, N, d), k and v as
    (..., kv heads, 1, M, d)), the mask in the same layout, the softmax scale and the causal flag."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    scale: float
    causal: bool
    # k's rows packed into panels of `panel` keys, each contiguous over d ((..., M/panel, d, panel)), or None
    k_panels: Tensor | None = None
    panel: int = 0
    # the problem seen from the keys (the backward's key blocks): rows are keys, "keys" are queries, and causal
    # means a row sees the columns at or after it
    transposed: bool = False
    # causal: 0, 1, 2, ... as float32 in memory, past every row and key: the mask compares loaded columns with their
    # row's value as vectors (from indices it was an integer compare per lane, the scores' epilogue all scalar)
    positions: Tensor | None = None

    @property
    def rows(self) -> int:
        return self.q.shape[-2]

    def visible(self, start: int, end: int) -> tuple[int, int]:
        """The [lo, hi) keys a block of rows [start, end) reads: all of them, or under causal the keys up to the
        block's last row (transposed: from its first row on)."""
        keys = self.k.shape[-2]
        if not self.causal:
            return 0, keys
        # rounded to a step (the causal mask hides the extra keys): blocks share kernel shapes, at most
        # CAUSAL_KEY_SHAPES of them
        step = -(-max(CAUSAL_KEY_STEP, -(-keys // CAUSAL_KEY_SHAPES)) // 64) * 64  # whole panels of kᵀ
        if self.transposed:
            return min(start // step * step, keys), keys
        return 0, min(-(-end // step) * step, keys)

    def scores(self, start: int, end: int, at: sint | None = None) -> Tensor:
        """Scaled and masked float32 scores of rows [start, end) against their visible keys; `at` is start or a
        Variable bound to it (_block_start)."""
        (lo, hi), at = self.visible(start, end), start if at is None else at
        q = _rows(self.q, at, end - start)
        s = _times_t(q, self.k, self.k_panels, self.panel, lo, hi) * self.scale
        if self.causal:
            assert self.positions is not None
            # rows sliced at `at`, not an arange starting there: blocks of one shape then share their kernels
            row = _rows(self.positions.reshape(-1, 1), at, end - start)
            col = self.positions[lo:hi].reshape(1, -1)
            # compared at the scores' full shape: a (rows, keys) mask broadcast over the heads is realized apart
            # once its recompute looks costly (96-row blocks: a bool buffer read lane by lane, 5x the kernel's time)
            row, col = row.expand(s.shape), col.expand(s.shape)
            s = (col >= row if self.transposed else row >= col).where(s, -math.inf)
        elif self.mask is not None:
            m = _rows(self.mask, at, end - start)[..., lo:hi]
            s = m.where(s, -math.inf) if m.dtype is dtypes.bool else s + m.cast(dtypes.float32)
        return s


def _times_t(a: Tensor, b: Tensor, panels: Tensor | None, panel: int, lo: int, hi: int) -> Tensor:
    """a·b[..., lo:hi, :]ᵀ in float32, through b's panels ((..., rows/panel, d, panel)) when the range fills whole
    panels: the register tile then walks one panel's d rows, `panel` columns each, contiguous, where bᵀ's rows (a
    row of b apart) would alias in L1 (seq 4096: 5 GFLOPS against ~80 for the panels). With panel 0, `panels` is bᵀ
    stored whole ((..., d, rows)): a plain matmul over its columns, not a transposed copy of b made per block."""
    if panels is not None and not panel:
        return a.matmul(panels[..., lo:hi], dtype=dtypes.float32)
    if panels is not None and lo % panel == 0 and hi % panel == 0:
        bp = panels[..., lo // panel : hi // panel, :, :].transpose(-1, -2).unsqueeze(-4)
        return (a.unsqueeze(-2).unsqueeze(-2) * bp).sum(-1, dtype=dtypes.float32).flatten(-2)
    return a.matmul(b[..., lo:hi, :].transpose(-1, -2), dtype=dtypes.float32)


def _panel_width(k: Tensor, any_rows: bool = False) -> int:
    """Rows of k per panel of kᵀ (two vectors: the register tile's width) where the target's tiles gain from panels
    and k's rows fill whole panels (any_rows: whatever k's rows); else 0 (the plain matmul)."""
    if not isinstance(k.device, str):
        return 0
    from fusegrad.engine.realize import panel_columns  # the engine, which the tensor has loaded already

    panel = panel_columns(k.device)
    return panel if panel and (any_rows or k.shape[-2] % panel == 0 and k.shape[-2] > panel) else 0


def _packed(k: Tensor, panel: int) -> Tensor:
    """k (..., M, d) as panels of kᵀ: (..., M/panel, d, panel), one contiguous copy."""
    return _internal(
        k.reshape(k.shape[:-2] + (k.shape[-2] // panel, panel, k.shape[-1])).transpose(-1, -2).contiguous()
    )


def _row_blocks(p: _Problem, heads: int, share: int = 8, blocked: bool = False) -> tuple[list[tuple[int, int]], bool]:
    """[start, end) row blocks and whether each is realized on its own: when all scores fit FLASH_SCORE_BYTES (and not
    `blocked`) one block (CAUSAL_BLOCKS when causal) computed with the rest, else blocks of FLASH_BLOCK_BYTES realized
    one by one, each block's scores also under 1/share of the inputs."""
    rows, keys = p.rows, p.k.shape[-2]
    if not blocked and heads * rows * keys * 4 <= FLASH_SCORE_BYTES:
        size, each = max(FLASH_MIN_BLOCK_ROWS, -(-rows // CAUSAL_BLOCKS)) if p.causal else rows, False
    else:
        # the forward: a block's scores and probabilities stay under a quarter of the inputs: with the output blocks
        # and the output the peak stays under twice the inputs
        inputs = 4 * (p.q.numel() + p.k.numel() + p.v.numel())
        block_bytes = min(FLASH_BLOCK_BYTES, inputs // share)
        size, each = max(FLASH_MIN_BLOCK_ROWS, block_bytes // (heads * keys * 4)), True
    blocks = [(s, min(s + size, rows)) for s in range(0, rows, size)]
    return blocks, each and len(blocks) > 1


def _sum_to(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """t summed over the axes a broadcast to its shape added (a gradient back to a broadcast input's shape)."""
    extra = t.ndim - len(shape)
    if extra:
        t = t.sum(tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(t.shape, shape)) if a != b)
    return t.sum(axes, keepdim=True) if axes else t


def _realized(t: Tensor, keep: list[Tensor]) -> Tensor:
    """t computed now, as a lazy tensor over t's graph (so a gradient still finds its inputs); `keep` holds the result
    (a graph node keeps its value only while someone holds it)."""
    lazy, tensor_class = t.uop, type(t)
    keep.append(tensor_class(lazy, device=t.device).realize())  # a tensor of our own: the caller's keeps its graph
    return _internal(tensor_class(lazy, device=t.device))


def _internal(t: Tensor) -> Tensor:
    """t marked as no gradient target: a live tensor inside the op's graph that is one would make backward take the
    plain rules through every block instead of the registered gradient (10x the kernels)."""
    t.requires_grad = False
    return t


def _rows(t: Tensor, at: sint, size: int) -> Tensor:
    """Rows [at, at + size) of t (dim -2); `at` may be a bound Variable."""
    return t.shrink((None,) * (t.ndim - 2) + ((at, at + size), None))


def _block_start(blocks: list[tuple[int, int]], start: int, end: int) -> sint:
    """A full-size block's start as a Variable bound to it: the realized blocks then share their kernels (one
    lowering, not one per block: seq 4096's 171 blocks took minutes to lower); the shorter last block keeps its int."""
    size = blocks[0][1] - blocks[0][0]
    if end - start != size or len(blocks) == 1:
        return start
    return Variable("flash_row", 0, blocks[-1][1] - size).bind(start)


def _block(p: _Problem, start: int, end: int, at: sint | None = None) -> tuple[Tensor, Tensor]:
    """Rows [start, end)'s output (float32) and logsumexp, lazily."""
    s = p.scores(start, end, at).contiguous()
    row_max = s.max(-1, keepdim=True)
    # a row that sees no key has max -inf: subtracting the lowest float instead keeps its probabilities 0 (its output
    # 0/0, NaN, as a softmax over no key). A max, not a select on `== -inf`: GCC keeps that select a branch and the
    # exp loop around it scalar (seq 4096 on AVX2: 5.3 s of exp against 0.6 s)
    row_max = row_max.maximum(LOWEST_FLOAT32)
    prob = (s - row_max).exp().contiguous()
    total = prob.sum(-1, keepdim=True)
    lo, hi = p.visible(start, end)
    out = prob.matmul(p.v[..., lo:hi, :], dtype=dtypes.float32) / total
    return out, row_max + total.log()


def _forward(p: _Problem, blocks: list[tuple[int, int]], each: bool, keep: list[Tensor]) -> tuple[Tensor, Tensor]:
    """The output (float32) and each row's logsumexp, row block by row block; with `each` the blocks are realized one
    at a time (the engine frees a realize's temporaries when it ends) and gathered (_Gathered)."""
    if not each:
        outs, lses = zip(*(_block(p, start, end) for start, end in blocks))
        return _cat_rows(list(outs)), _cat_rows(list(lses))
    outs, lses = _Gathered(len(blocks), keep), _Gathered(len(blocks), keep)
    for start, end in blocks:
        out, lse = _block(p, start, end, _block_start(blocks, start, end))
        outs.add(out)
        lses.add(lse)
    return outs.result(), lses.result()


def _head_axis(p: _Problem) -> int | None:
    """The leading axis of q that the blocked forward and backward walk one index at a time (a head, or under GQA a
    key/value head with its group): the innermost where k has q's size (each block then reads one head's keys and
    values), else the innermost where q has more than one; None when every leading axis of q has size 1."""
    leading = range(p.q.ndim - 2)
    own = [a for a in leading if p.q.shape[a] > 1 and p.k.shape[a] == p.q.shape[a]]
    shared = [a for a in leading if p.q.shape[a] > 1]
    return (own or shared or [None])[-1]


def _head(t: Tensor | None, axis: int, at: sint) -> Tensor | None:
    """Index `at` of t's leading axis `axis` (kept, size 1); t itself where it broadcasts along it."""
    if t is None or t.shape[axis] == 1:
        return t
    return t.shrink(tuple((at, at + 1) if a == axis else None for a in range(t.ndim)))


def _forward_heads(p: _Problem, axis: int, keep: list[Tensor]) -> tuple[Tensor, Tensor]:
    """The blocked forward one head (index of `axis`) at a time: a block's scores, probabilities, keys and values are
    one head's (seq 4096, d 64: ~5 MB against ~22 MB for all 8 heads), so they stay in the last-level cache between
    the block's kernels (P·V ran at 89 GFLOPS per head against 67 for 8 heads at once). Each head's row blocks are
    gathered and realized, then the heads are joined (a cat of one source per head)."""
    count = p.q.shape[axis]
    # the scores' memory bound of _row_blocks (a block's scores under 1/8 of the inputs) holds here too
    budget = min(HEAD_BLOCK_BYTES, FLASH_BLOCK_BYTES, 4 * (p.q.numel() + p.k.numel() + p.v.numel()) // 8)
    outs: list[Tensor] = []
    lses: list[Tensor] = []
    for h in range(count):
        ph = _head_problem(p, axis, _head_index(count, h))
        blocks = _head_blocks(ph, budget)
        held: list[Tensor] = []  # the head's gathered groups, freed once the head's output is realized
        out, lse = _forward(ph, blocks, len(blocks) > 1, held)
        outs.append(_realized(out, keep))
        lses.append(_realized(lse, keep))
    return _cat_axis(outs, axis), _cat_axis(lses, axis)


def _head_index(count: int, h: int) -> UOp:
    """Head h of count as a bound Variable: every head's blocks share their kernels."""
    return Variable("flash_head", 0, count - 1).bind(h)


def _head_problem(p: _Problem, axis: int, at: sint) -> _Problem:
    """p restricted to index `at` of its leading axis `axis` (the tensors that broadcast along it kept whole)."""
    q, k, v, mask, panels = (_head(t, axis, at) for t in (p.q, p.k, p.v, p.mask, p.k_panels))
    assert q is not None and k is not None and v is not None
    return _Problem(q, k, v, mask, p.scale, p.causal, panels, p.panel, positions=p.positions)


def _backward_heads(p: _Problem, axis: int, out: Tensor, lse: Tensor, g: Tensor):
    """_backward_blocked one head (index of `axis`) at a time, as the forward (_forward_heads): a key block's
    probabilities and score gradients are one head's. A gradient whose input broadcasts along the axis (one key head
    for all) is the sum of the heads' parts, the others their cat."""
    count = p.q.shape[axis]
    parts = []
    for h in range(count):
        at = _head_index(count, h)
        grads = _backward_blocked(_head_problem(p, axis, at), *(_head(t, axis, at) for t in (out, lse, g)))
        parts.append([t.realize() for t in grads])
    joined = []
    for i, whole in enumerate((p.q, p.k, p.v)):
        heads = [part[i] for part in parts]
        joined.append(sum(heads[1:], heads[0]) if whole.shape[axis] == 1 else _cat_axis(heads, axis))
    return tuple(joined)


def _head_blocks(p: _Problem, budget: int) -> list[tuple[int, int]]:
    """One head's row blocks: as many rows as `budget` score bytes hold, rounded down to whole HEAD_BLOCK_ROWS steps
    where one fits, and at least FLASH_MIN_BLOCK_ROWS."""
    rows, keys = p.rows, p.k.shape[-2]
    fit = budget // (math.prod(p.q.shape[:-2]) * keys * 4)
    size = max(FLASH_MIN_BLOCK_ROWS, fit // HEAD_BLOCK_ROWS * HEAD_BLOCK_ROWS or fit)
    return [(s, min(s + size, rows)) for s in range(0, rows, size)]


def _cat_axis(parts: list[Tensor], axis: int) -> Tensor:
    return parts[0] if len(parts) == 1 else parts[0].cat(*parts[1:], dim=axis)


class _Gathered:
    """Row blocks realized one by one, every ~√n of them gathered into one realized group whose blocks are then freed:
    a cat of all n blocks at once selects among n sources per element (seq 4096, 171 blocks: 1.8 s), two levels of
    √n cost two copies. `keep` holds the groups; without it (gradients, which no graph needs to reach through) the
    blocks and groups are plain realized tensors."""

    def __init__(self, n: int, keep: list[Tensor] | None):
        self.size, self.keep = math.isqrt(max(n - 1, 0)) + 1, keep
        self.groups: list[Tensor] = []
        self.blocks: list[Tensor] = []
        self.held: list[Tensor] = []

    def add(self, block: Tensor) -> None:
        self.blocks.append(block.realize() if self.keep is None else _realized(block, self.held))
        if len(self.blocks) == self.size:
            self._close()

    def _close(self) -> None:
        if self.blocks:
            group = _cat_rows(self.blocks)
            self.groups.append(group.realize() if self.keep is None else _realized(group, self.keep))
            self.blocks, self.held = [], []

    def result(self) -> Tensor:
        self._close()
        return _cat_rows(self.groups)


def _cat_rows(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else parts[0].cat(*parts[1:], dim=-2)


def _backward(p: _Problem, blocks: list[tuple[int, int]], out: Tensor, lse: Tensor, g: Tensor):
    """dq, dk, dv (float32, in p's layouts) from the output gradient g under the block threshold, as one lazy graph:
    each block's probabilities are recomputed from the saved logsumexp; dk and dv are summed over the row blocks."""
    # D = rowsum(dO * O): the softmax's backward term, one value per row
    delta = (g * out).sum(-1, keepdim=True)
    keys = p.k.shape[-2]
    dqs: list[Tensor] = []
    dk: Tensor | None = None
    dv: Tensor | None = None
    for start, end in blocks:
        seen = p.visible(start, end)[1]
        # scores stored, then exponentiated: an exp in the matmul's epilogue ran 4x slower than the two kernels
        prob = (p.scores(start, end).contiguous() - _rows(lse, start, end - start)).exp().contiguous()
        g_block = _rows(g, start, end - start)
        dprob = g_block.matmul(p.v[..., :seen, :].transpose(-1, -2), dtype=dtypes.float32)
        dscore = (prob * (dprob - _rows(delta, start, end - start))).contiguous()
        dqs.append(dscore.matmul(p.k[..., :seen, :], dtype=dtypes.float32) * p.scale)
        dk_part = dscore.transpose(-1, -2).matmul(_rows(p.q, start, end - start), dtype=dtypes.float32) * p.scale
        dv_part = prob.transpose(-1, -2).matmul(g_block, dtype=dtypes.float32)
        dk_part, dv_part = _sum_to(dk_part, p.k[..., :seen, :].shape), _sum_to(dv_part, p.v[..., :seen, :].shape)
        if seen < keys:
            pads = ((0, 0),) * (dk_part.ndim - 2) + ((0, keys - seen), (0, 0))
            dk_part, dv_part = dk_part.pad(pads), dv_part.pad(pads)
        dk = dk_part if dk is None else dk + dk_part
        dv = dv_part if dv is None else dv + dv_part
    assert dk is not None and dv is not None
    return _cat_rows(dqs), dk, dv


def _packed_if(t: Tensor, held: list[Tensor]) -> tuple[Tensor | None, int]:
    """t's panels (_packed) and their width where t's rows fill whole panels; on a target without panels tᵀ stored
    whole and width 0 (else the scheduler copies a transposed operand per block: CL); else (None, 0). Realized into
    `held`."""
    if panel := _panel_width(t):
        return _realized(_packed(t, panel), held), panel
    if isinstance(t.device, str) and not _panel_width(t, any_rows=True):
        return _realized(t.transpose(-1, -2).contiguous(), held), 0
    return None, 0


def _backward_blocked(p: _Problem, out: Tensor, lse: Tensor, g: Tensor):
    """dq, dk, dv (float32, in p's layouts) past the block threshold, in one pass over key blocks (the problem
    transposed: a block of kᵀ's rows against all the queries it meets) that recompute the block probabilities from the
    saved logsumexp: each block stores its rows of dk = dSᵀ·Q and dv = Pᵀ·dO and adds dSᵀᵀ·K into dq in place, so
    only dq is summed through memory (one read and write of the queries it meets per block)."""
    g = g.contiguous().realize()
    # D = rowsum(dO * O): the softmax's backward term, one value per row; O read once in one piece (through the
    # forward's gathered groups it was one input per group, a kernel 10x slower)
    delta = (g * out.contiguous()).sum(-1, keepdim=True).realize()
    lse = lse.contiguous().realize()
    held: list[Tensor] = []
    # the key blocks' problem: k's rows (broadcast over the GQA group) against q, the mask transposed
    q_panels, q_panel = _packed_if(p.q, held)
    g_panels, g_panel = _packed_if(g, held)
    mask = None if p.mask is None else p.mask.transpose(-1, -2)
    pt = _Problem(p.k, p.q, p.v, mask, p.scale, p.causal, q_panels, q_panel, transposed=True, positions=p.positions)
    # in blocks even where one head's scores are under the threshold (_backward_heads), as measured; a single key block
    # as long as all the queries first met the blocked-sum bug of dq's in-place update (fixed in codegen since: a
    # kernel reading its own output is never REDUCE_BLOCKed) and was not timed after the fix
    key_blocks = _row_blocks(pt, math.prod(p.q.shape[:-2]), BACKWARD_SHARE, blocked=True)[0]
    lse_t, delta_t = lse.transpose(-1, -2), delta.transpose(-1, -2)
    dq, dk, dv = _zeros_like(p.q), _empty_like(p.k), _empty_like(p.v)
    for start, end in key_blocks:
        at, size = _block_start(key_blocks, start, end), end - start
        lo, hi = pt.visible(start, end)
        k_rows, v_rows = _rows(p.k, at, size), _rows(p.v, at, size)
        if lo == hi:  # keys past every query's causal reach: no gradient
            dk[..., at : at + size, :], dv[..., at : at + size, :] = 0.0, 0.0
            continue
        prob = (pt.scores(start, end, at) - lse_t[..., lo:hi]).exp().contiguous()
        dprob = _times_t(v_rows, g, g_panels, g_panel, lo, hi)
        dscore = (prob * (dprob - delta_t[..., lo:hi])).contiguous()  # reads the stored prob, no second exp
        prob.realize(dscore)  # one schedule, then read by the three stores
        dk[..., at : at + size, :] = (
            _sum_to(dscore.matmul(p.q[..., lo:hi, :], dtype=dtypes.float32), k_rows.shape) * p.scale
        )
        dv[..., at : at + size, :] = _sum_to(prob.matmul(g[..., lo:hi, :], dtype=dtypes.float32), v_rows.shape)
        dq_part = dscore.transpose(-1, -2).matmul(k_rows, dtype=dtypes.float32) * p.scale
        dq[..., lo:hi, :] = dq[..., lo:hi, :] + dq_part
    return dq, dk, dv


def _zeros_like(t: Tensor) -> Tensor:
    """Float32 zeros of t's shape in storage of their own: the key blocks add their parts of dq into it in place."""
    return type(t).zeros(*t.shape, dtype=dtypes.float32, device=t.device).contiguous().realize()


def _empty_like(t: Tensor) -> Tensor:
    """Float32 storage of t's shape that the blocks write their rows into (no gather of realized blocks)."""
    return type(t).empty(*t.shape, dtype=dtypes.float32, device=t.device).contiguous().realize()


def _broadcasts(shape: tuple, target: tuple) -> bool:
    return len(shape) <= len(target) and all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


def uses_flash(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, enable_gqa: bool) -> bool:
    """Can flash_attention take these (already checked) inputs: concrete shapes, float dtypes, one batch layout for q,
    k and v (k/v heads equal to q's, or a divisor under GQA, or one head), a mask that broadcasts to the scores?"""
    tensors = (query, key, value) + (() if attn_mask is None else (attn_mask,))
    if not all(isinstance(d, int) for t in tensors for d in t.shape):
        return False
    if not all(dtypes.is_float(t.dtype) for t in (query, key, value)) or not query.ndim == key.ndim == value.ndim:
        return False
    if query.ndim >= 3:
        heads, kv_heads = query.shape[-3], key.shape[-3]
        if query.shape[:-3] != key.shape[:-3] or key.shape[:-2] != value.shape[:-2] or kv_heads == 0:
            return False
        if kv_heads != heads and (heads % kv_heads or not (enable_gqa or kv_heads == 1)):
            return False
    return attn_mask is None or _broadcasts(attn_mask.shape, query.shape[:-1] + (key.shape[-2],))


def flash_attention(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
) -> Tensor:
    """softmax(q·kᵀ/√d + mask)·v over the last two dims, computed in row blocks (module docstring); shapes already
    checked by the caller. k and v may have fewer heads (dim -3) than q when q's heads are a multiple of theirs."""
    device, out_dtype, tensor_class = query.device, query.dtype, type(query)
    acc = least_upper_dtype(query.dtype, dtypes.float32)
    q, k, v = query.cast(acc), key.cast(acc), value.cast(acc)
    heads_q = query.shape[-3] if query.ndim >= 3 else 1
    group = heads_q // key.shape[-3] if query.ndim >= 3 and key.ndim >= 3 and key.shape[-3] != heads_q else 1
    # the mask as a view over the full score shape: every block slices its rows and keys out of it
    mask = None if attn_mask is None else attn_mask.expand(query.shape[:-1] + (key.shape[-2],))
    if group > 1:
        kv_heads = key.shape[-3]
        if mask is not None:
            mask = mask.reshape(mask.shape[:-3] + (kv_heads, group) + mask.shape[-2:])
        q = q.reshape(q.shape[:-3] + (kv_heads, group) + q.shape[-2:])
        k, v = (t.reshape(t.shape[:-3] + (kv_heads, 1) + t.shape[-2:]) for t in (k, v))
    panel = _panel_width(k)
    k_panels = _packed(k, panel) if panel else None
    positions = None
    if is_causal:
        n = max(query.shape[-2], key.shape[-2])
        positions = _internal(tensor_class.arange(n, device=device, dtype=dtypes.float32).contiguous())
    problem = _Problem(q, k, v, mask, 1 / math.sqrt(query.shape[-1]), is_causal, k_panels, panel, positions=positions)
    blocks, each = _row_blocks(problem, math.prod(q.shape[:-2]))
    keep: list[Tensor] = []
    # the forward's panels only, freed when this returns: the output's groups are gathered after it (the peak)
    panels_held: list[Tensor] = []
    if each:  # q, k, v and k's panels are read by every block's realize: computed once, not once per block
        q, k, v = (_realized(t, keep) for t in (q, k, v))
        positions = None if positions is None else _realized(positions, keep)
        k_panels, panel = _packed_if(k, panels_held)
        problem = _Problem(q, k, v, mask, problem.scale, is_causal, k_panels, panel, positions=positions)
    axis = _head_axis(problem) if each else None
    if axis is not None:
        out, lse = _forward_heads(problem, axis, keep)
    else:
        out, lse = _forward(problem, blocks, each, keep)
    result = out.reshape(query.shape[:-1] + (value.shape[-1],)).cast(out_dtype)
    inputs = (query.uop, key.uop, value.uop)
    shapes = (query.shape, key.shape, value.shape)
    dtypes_in = (query.dtype, key.dtype, value.dtype)
    # the output may be the registered node itself, which the closure must not hold (weakref: the gradient is only
    # asked for while the node lives)
    out_ref, lse_uop = weakref.ref(out.uop), lse.uop

    def backward(g: UOp) -> tuple[UOp, ...]:
        out_uop = out_ref()
        assert out_uop is not None, "the attention output died before its gradient was asked for"
        grad = tensor_class(g, device=device).cast(dtypes.float32).reshape(out_uop.shape)
        out_t, lse_t = tensor_class(out_uop, device=device), tensor_class(lse_uop, device=device)
        if axis is not None:
            grads = _backward_heads(problem, axis, out_t, lse_t, grad)
        elif each:
            grads = _backward_blocked(problem, out_t, lse_t, grad)
        else:
            grads = _backward(problem, blocks, out_t, lse_t, grad)
        _ = keep  # the realized blocks stay computed for as long as the gradient can be asked for
        return tuple(t.reshape(s).cast(dt).uop for t, s, dt in zip(grads, shapes, dtypes_in))

    register_gradient(result.uop, inputs, backward)
    return result
