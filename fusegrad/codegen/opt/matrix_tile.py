"""A plain matmul a target's matrix units can take whole: C[i, j] = sum_k A[i, k] * B[k, j] with every index affine in
the kernel's three loops, sizes that are multiples of the matrix tile, A and B of one float dtype and C of any of them
(a cast of the sum fuses into the store).

The same check reads the kernel lowered without opts (a REDUCE) and its linear instructions (an ACC_UPDATE), so the
heuristics can leave such a kernel without opts for a renderer with `matrix_cores` and that renderer finds it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegrad.dtype import DType, dtypes
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.symbolic import linear_terms

TILE = 32  # rows, columns and reduce steps of one matrix tile (what every size must be a multiple of)
DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16)
# what a plain matmul is made of (index arithmetic, the loads and the product, the reduce and the store)
ALLOWED = frozenset({Ops.DEFINE_GLOBAL, Ops.CONST, Ops.RANGE, Ops.ENDRANGE, Ops.ADD, Ops.MUL, Ops.LOAD, Ops.CAST})
ALLOWED |= {Ops.REDUCE, Ops.DEFINE_ACC, Ops.ACC_UPDATE, Ops.STORE, Ops.SINK}


@dataclass(frozen=True)
class Operand:
    buffer: int  # the DEFINE_GLOBAL's number (its kernel argument)
    offset: int
    strides: tuple[int, int]  # (rows, columns) of the operand as a matrix: A (i, k), B (k, j), C (i, j)


@dataclass(frozen=True)
class Matmul:
    m: int
    n: int
    k: int
    dtype: DType  # of A and B
    out: DType  # of C
    a: Operand
    b: Operand
    c: Operand


def _widened(u: UOp) -> UOp:
    """u below its exact widenings to float32 (a rounding cast stays: the matrix units would not round there)."""
    while u.op is Ops.CAST and u.dtype is dtypes.float32 and u.src[0].dtype in DTYPES:
        u = u.src[0]
    return u


def _affine(index: UOp, loops: tuple[UOp, ...]) -> tuple[int, list[int]] | None:
    terms, const = linear_terms(index)
    strides = [0] * len(loops)
    for k, t in terms:
        if t not in loops:
            return None
        strides[loops.index(t)] += k
    return const, strides


def match_matmul(nodes: list[UOp] | tuple[UOp, ...]) -> Matmul | None:
    """The matmul `nodes` (a kernel's toposort or its linear instructions) compute, or None."""
    if any(u.op not in ALLOWED for u in nodes):
        return None
    stores = [u for u in nodes if u.op is Ops.STORE]
    loops = tuple(u for u in nodes if u.op is Ops.RANGE)
    bufs = {u.arg[0]: u for u in nodes if u.op is Ops.DEFINE_GLOBAL}
    if len(stores) != 1 or len(loops) != 3 or len(bufs) != 3 or any(r.src[0].op is not Ops.CONST for r in loops):
        return None
    store = stores[0]
    total = store.src[2].src[0] if store.src[2].op is Ops.CAST else store.src[2]  # the sum rounded to C's dtype
    if total.op is Ops.REDUCE and total.arg is Ops.ADD and len(total.src) == 2:
        product, red = _widened(total.src[0]), total.src[1]
    elif total.op is Ops.ACC_UPDATE and total.arg is Ops.ADD and len(total.src) == 3:
        product, red = _widened(total.src[1]), total.src[2]
    else:
        return None
    if product.op is Ops.CAST and product.dtype in DTYPES and product.src[0].op is Ops.MUL:
        product = product.src[0]  # a half product rounded before the float32 sum: the matrix units keep it exact
    if product.op is not Ops.MUL or red.arg[1] != "reduce" or store.src[0].arg[0] != 0:
        return None
    a, b = (_widened(s) for s in product.src)
    if a.op is not Ops.LOAD or b.op is not Ops.LOAD or a.src[0].arg[0] == b.src[0].arg[0]:
        return None
    dtype, out = a.src[0].dtype, bufs[0].dtype
    if dtype not in DTYPES or b.src[0].dtype is not dtype or out not in DTYPES or total.dtype not in DTYPES:
        return None
    found = [_affine(u.src[1], loops) for u in (a, b, store)]
    if any(f is None for f in found):
        return None
    (oa, sa), (ob, sb), (oc, sc) = found  # type: ignore[misc]
    r = loops.index(red)
    g = [i for i in range(3) if i != r]
    rows = [i for i in g if sa[i] != 0]
    cols = [i for i in g if sb[i] != 0]
    if len(rows) != 1 or len(cols) != 1 or rows == cols or sa[r] == 0 or sb[r] == 0:
        return None
    i, j = rows[0], cols[0]
    size = [lp.src[0].arg for lp in loops]
    if any(s % TILE for s in size) or sc[r] != 0:
        return None
    return Matmul(
        size[i],
        size[j],
        size[r],
        dtype,
        out,
        Operand(a.src[0].arg[0], oa, (sa[i], sa[r])),
        Operand(b.src[0].arg[0], ob, (sb[r], sb[j])),
        Operand(0, oc, (sc[i], sc[j])),
    )
