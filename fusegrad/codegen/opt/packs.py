"""Finds the vectors in a linear kernel: groups of `width` isomorphic scalar instructions, one per lane, that a
renderer with vector types emits as one vector instruction (SLP packing of an upcast's separately named lanes).

Seeds are loads of consecutive elements (one buffer, one base index, constant offsets 0..width-1 apart); an
instruction joins a pack when its lanes apply one op to packs lane by lane, or to a scalar shared by all lanes; an
accumulator update packs with its accumulators; stores of a pack to consecutive elements become one store. A pack is
emitted where its first lane stands: every lane's sources stand before that lane, so they are emitted by then."""

from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
from fusegrad.dtype import DType, dtypes
from fusegrad.uop.ops import Ops, UOp

VECTOR_DTYPES = (dtypes.float32, dtypes.float64)
# element-wise in GCC's vector extension with IEEE semantics per lane; MAX (a select in C) packs only where the
# renderer lists it in vector_math (it needs a NaN-propagating vector select)
VECTOR_ALU = (Ops.ADD, Ops.MUL, Ops.NEG, Ops.FDIV)
# comparisons of float lanes give a mask pack (integer lanes of the floats' width, all ones where true), combined by
# AND/OR; a WHERE on a mask pack is a bitwise select
MASK_COMPARE = (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE)
MASK_LOGIC = (Ops.AND, Ops.OR)
# the narrowest vector worth packing: half of a wider register when a tile's columns fill no more (GCC lowers a
# 32-byte vector type to one AVX register even where the widest are 64 bytes)
MIN_VECTOR_BYTES = 16


@dataclass(frozen=True, eq=False)
class Pack:
    lanes: tuple[UOp, ...]  # lane order: lane i holds element i of the vector
    base: UOp | None = None  # loads and stores: the index of lane 0 is base + offset
    offset: int = 0
    mask_of: DType | None = None  # a mask pack (bool lanes): the dtype of the floats it compared

    @property
    def dtype(self) -> DType:
        return self.lanes[0].src[2].dtype if self.lanes[0].op is Ops.STORE else self.lanes[0].dtype


def split_index(index: UOp) -> tuple[UOp, int]:
    """index -> (base, constant offset)."""
    if index.op is Ops.CONST:
        return UOp.const(index.dtype, 0), index.arg
    if index.op is Ops.ADD and index.src[1].op is Ops.CONST:
        return index.src[0], index.src[1].arg
    return index, 0


# the most packs a shared row value may take back to scalars (a row value and the few ops over it)
MAX_SCALAR_CHAIN = 16


def find_packs(
    lin: tuple[UOp, ...],
    vector_bytes: int,
    vector_math: frozenset[tuple[Ops, DType]] = frozenset(),
    loop_vectorizer: bool = False,
) -> dict[UOp, tuple[Pack, int]]:
    """{scalar instruction: (its pack, its lane)} for every instruction that is part of a vector. Gated loads pack
    when one gate guards every lane. vector_math: the (op, dtype) pairs the renderer also has a vector rule for
    (a reciprocal, an exp as a vector function, a MAX as a select); a listed MAX also packs accumulator updates.

    A register tile whose rows are read consecutively (`A.T @ B`, a weight gradient) loads its row values as a run
    too: its products pack along the columns with each row's value as the scalar all lanes share, and that run goes
    back to scalar loads (which the renderer broadcasts), unless another pack reads it lane by lane.

    loop_vectorizer: the target's compiler vectorizes loops itself (a CPU's C compiler); a run of loads no pack reads
    as a vector then goes back to scalar loads too."""
    no_share: set[tuple[UOp, ...]] = set()
    while True:
        lane_of, shared_runs = _pack(lin, vector_bytes, vector_math, no_share)
        read = _read_lane_by_lane(lane_of, shared_runs)
        if not (conflicts := {p.lanes for p in shared_runs & read}):
            break
        no_share |= conflicts
    # a run of loads no pack reads as a vector (every lane used as a scalar: a conv's unrolled taps of one weight row)
    # goes back to scalar loads too: one vector load and its lane extracts inside a loop keep the C compiler from
    # vectorizing that loop itself (a depthwise 3x3 conv at 28x28: 4x slower)
    unread = {p for p, _ in lane_of.values() if loop_vectorizer and p.lanes[0].op is Ops.LOAD and p not in read}
    for pack in shared_runs | unread:
        for u in pack.lanes:
            del lane_of[u]
    written = {u.src[0] for u in lin if u.op is Ops.STORE}
    return lane_of if _keeps_memory_order(lin, lane_of, written) else {}


def _read_lane_by_lane(lane_of: dict[UOp, tuple[Pack, int]], scalars: set[Pack]) -> set[Pack]:
    """The packs some pack reads as a vector operand (its lanes differ), not as one shared scalar; a pack in
    `scalars` (going back to scalars) reads nothing as a vector."""
    read = set()
    for pack in {p for p, _ in lane_of.values()} - scalars:
        for k, s in enumerate(pack.lanes[0].src):
            if s in lane_of and (len(pack.lanes) == 1 or pack.lanes[1].src[k] is not s):
                read.add(lane_of[s][0])
    return read


def _pack(
    lin: tuple[UOp, ...], vector_bytes: int, vector_math: frozenset[tuple[Ops, DType]], no_share: set[tuple[UOp, ...]]
) -> tuple[dict[UOp, tuple[Pack, int]], set[Pack]]:
    """(the packs, the runs of loads whose lanes some pack shares as a scalar); runs in no_share are never shared."""
    # lanes of one pack stand in the same C block: inside the same open loops
    scope: dict[UOp, tuple[UOp, ...]] = {}
    open_loops: list[UOp] = []
    for u in lin:
        if u.op is Ops.ENDRANGE:
            open_loops.remove(u.src[0])
        scope[u] = tuple(open_loops)
        if u.op is Ops.RANGE:
            open_loops.append(u)
    lane_of: dict[UOp, tuple[Pack, int]] = {}
    shared_runs: set[Pack] = set()

    def width(dt: DType) -> int:
        return vector_bytes // dt.itemsize if dt in VECTOR_DTYPES else 0

    def widths(dt: DType) -> tuple[int, ...]:
        # a full vector, else half of one (an 8-column tile of floats under AVX-512), when that is still 16+ bytes
        full = width(dt)
        return (full, full // 2) if vector_bytes >= 2 * MIN_VECTOR_BYTES and full >= 4 else (full,)

    # scalars a pack's lanes share (a register tile's row value): they stay scalars, or that pack would read a vector
    shared: set[UOp] = set()

    def add(lanes: list[UOp], base: UOp | None = None, offset: int = 0, mask_of: DType | None = None) -> None:
        pack = Pack(tuple(lanes), base, offset, mask_of)
        for i, u in enumerate(lanes):
            lane_of[u] = (pack, i)
            if u.op is not Ops.STORE:
                shared.update(s for s in u.src if s not in lane_of)

    # loads of consecutive elements
    runs: dict[tuple, dict[int, UOp]] = {}
    for u in lin:
        if u.op is Ops.LOAD and width(u.dtype) > 1:
            base, off = split_index(u.src[1])
            runs.setdefault((u.src[0], base, u.src[2:], scope[u]), {})[off] = u
    for (_, base, _, _), by_offset in runs.items():
        for lanes, off in _consecutive_runs(by_offset, widths(next(iter(by_offset.values())).dtype)):
            add(lanes, base, off)

    def scalar_chain(pack: Pack) -> list[Pack] | None:
        """The packs that go back to scalars when a lane of `pack` is shared: a run of loads, or a pack of ALU ops
        over such runs (a row value negated for `x - row`, which packed along the rows before the tile's columns
        asked for it); None when one of them may not (a lane of an accumulator, a mask, a run in no_share) or when
        more than MAX_SCALAR_CHAIN packs would (each pack once: a walk per path was exponential in a deep epilogue)."""
        chain, todo, seen = [], [pack], set()
        while todo:
            if (p := todo.pop()) in seen:
                continue
            seen.add(p)
            lanes = p.lanes
            if lanes in no_share or p.mask_of is not None or len(chain) == MAX_SCALAR_CHAIN:
                return None
            chain.append(p)
            if lanes[0].op is Ops.LOAD:
                continue
            if lanes[0].op not in VECTOR_ALU:
                return None
            todo.extend(lane_of[s][0] for u in lanes for s in u.src if s in lane_of)
        return chain

    def shareable(s: UOp) -> bool:
        # a lane of a run of loads (or of ALU ops over such runs) can be one scalar all lanes share: it goes back to
        # scalars then
        return scalar_chain(lane_of[s][0]) is not None

    # ALU ops and accumulators, until no new pack forms (a lane's users may stand before the pack's last lane)
    while True:
        groups: dict[tuple, dict[int, UOp]] = {}
        ranks: dict[tuple, int] = {}
        shares: dict[tuple, UOp] = {}  # a group whose lanes share a lane of a run of loads: that lane
        for u in lin:
            if u in lane_of or u in shared:
                continue
            mask_of = _mask_dtype(u, lane_of)
            if width(u.dtype) <= 1 and mask_of is None:
                continue
            if mask_of is not None:
                operands = u.src
            elif (u.op in VECTOR_ALU or (u.op, u.dtype) in vector_math) and all(s.dtype is u.dtype for s in u.src):
                operands = u.src
            elif u.op is Ops.WHERE and all(s.dtype is u.dtype for s in u.src[1:]):
                # one scalar condition selects whole vectors; a mask pack selects lane by lane (when it compared
                # floats of this width)
                if u.src[0] in lane_of and lane_of[u.src[0]][0].mask_of is not u.dtype:
                    continue
                operands = u.src
            elif u.op is Ops.ACC_UPDATE and (u.arg is Ops.ADD or (u.arg, u.dtype) in vector_math):
                operands = (u.src[1],)
            else:
                continue
            # an update's op joins the key: a sum's and a max's accumulators never share a pack
            extra = (u.arg, u.src[2:]) if u.op is Ops.ACC_UPDATE else u.arg
            for rank, key, lane, lanes_n, shared_lane in _signatures(operands, lane_of, shareable):
                group = (u.op, u.dtype, extra, key, scope[u], lanes_n, mask_of)
                groups.setdefault(group, {}).setdefault(lane, u)
                ranks.setdefault(group, rank)
                if shared_lane is not None:
                    shares[group] = shared_lane
        new, packed_before = 0, set(lane_of)
        # an instruction may fit several groups (a tile's diagonal product lane by lane, or in its row sharing the
        # row value): complete groups are taken by rank, and each instruction joins one pack
        for group in sorted(groups, key=lambda g: ranks[g]):
            g = groups[group]
            lanes_n, mask_of = group[-2:]
            lanes = [g.get(i) for i in range(lanes_n)]
            if None in lanes or any(u in lane_of or u in shared for u in lanes):
                continue
            # a scalar all lanes use that became a lane of a pack in this sweep would be read as its whole vector
            if any(isinstance(k, UOp) and k in lane_of and k not in packed_before for k in group[3]):
                continue
            if mask_of is not None:
                add(lanes, mask_of=mask_of)  # type: ignore[arg-type]
            else:
                if lanes[0].op is Ops.ACC_UPDATE:
                    accs = [u.src[0] for u in lanes]
                    if len({a.src[0].arg for a in accs}) != 1 or len({scope[a] for a in accs}) != 1:
                        continue
                    if any(a in lane_of for a in accs):
                        continue
                    add(accs)
                add(lanes)  # type: ignore[arg-type]
            # a mask that compares columns with their row's value shares that value too: it goes back to a scalar
            if (shared_lane := shares.get(group)) is not None:
                shared_runs.update(scalar_chain(lane_of[shared_lane][0]) or ())
            new += 1
        if not new:
            break

    # stores of one pack's lanes to consecutive elements
    stores: dict[tuple, dict[int, UOp]] = {}
    for u in lin:
        if u.op is Ops.STORE and u.src[2] in lane_of:
            base, off = split_index(u.src[1])
            pack, lane = lane_of[u.src[2]]
            stores.setdefault((u.src[0], base, pack, off - lane, scope[u]), {})[lane] = u
    for (_, base, pack, off, _), by_lane in stores.items():
        if len(by_lane) == len(pack.lanes):
            add([by_lane[i] for i in range(len(pack.lanes))], base, off)
    return lane_of, shared_runs


def _keeps_memory_order(lin: tuple[UOp, ...], lane_of: dict[UOp, tuple[Pack, int]], written: set[UOp]) -> bool:
    """A pack's loads or stores all happen where its first lane stood: no load and store of one element of a buffer
    the kernel writes may change order by that (elements at other offsets from one base are distinct)."""
    position = {u: i for i, u in enumerate(lin)}
    first = {}
    for u, (pack, _) in lane_of.items():
        first[pack] = min(first.get(pack, len(lin)), position[u])
    accesses: dict[UOp, list[tuple[UOp, int, int, UOp, int]]] = {}
    for u in lin:
        if u.op in (Ops.LOAD, Ops.STORE) and u.src[0] in written:
            base, off = split_index(u.src[1])
            emitted = first[lane_of[u][0]] if u in lane_of else position[u]
            accesses.setdefault(u.src[0], []).append((u, position[u], emitted, base, off))
    for items in accesses.values():
        loads = [a for a in items if a[0].op is Ops.LOAD]
        for store in (a for a in items if a[0].op is Ops.STORE):
            for load in loads:
                if load[0] not in lane_of and store[0] not in lane_of:
                    continue
                if load[3] is store[3] and load[4] != store[4]:
                    continue
                if (load[1] < store[1]) != (load[2] < store[2]):
                    return False
    return True


def _mask_dtype(u: UOp, lane_of: dict[UOp, tuple[Pack, int]]) -> DType | None:
    """The float dtype a bool instruction's lanes compare, when it packs as a mask: a comparison of float packs (and
    scalars), or AND/OR of masks of one dtype."""
    if u.dtype is not dtypes.bool or not any(s in lane_of for s in u.src):
        return None
    if u.op in MASK_COMPARE and u.src[0].dtype in VECTOR_DTYPES and u.src[0].dtype is u.src[1].dtype:
        return u.src[0].dtype
    if u.op in MASK_LOGIC and all(s in lane_of and lane_of[s][0].mask_of is not None for s in u.src):
        kinds = {lane_of[s][0].mask_of for s in u.src}
        return kinds.pop() if len(kinds) == 1 else None
    return None


def _consecutive_runs(by_offset: dict[int, UOp], widths: tuple[int, ...]) -> list[tuple[list[UOp], int]]:
    """Runs of consecutive offsets, the widest first: full vectors, then narrower ones from what is left."""
    runs, offsets = [], sorted(by_offset)
    taken: set[int] = set()
    for width in widths:
        for o in offsets:
            if o not in taken and all(o + i in by_offset and o + i not in taken for i in range(width)):
                runs.append(([by_offset[o + i] for i in range(width)], o))
                taken.update(range(o, o + width))
    return runs


def _signatures(
    operands: tuple[UOp, ...], lane_of: dict[UOp, tuple[Pack, int]], shareable: Callable[[UOp], bool]
) -> list[tuple[int, tuple, int, int, UOp | None]]:
    """The groups an instruction may pack in, each (rank, what the lanes must share, this instruction's lane, the
    lanes of its packs, the packed lane they share as a scalar or None); a lower rank is taken first. Packs of one
    width lane by lane, and equal scalars (rank 2). Two packed operands (a tile's row value times its columns) also
    pack along one of them when the other is shareable: a lane of it is then the scalar all lanes share (rank 0 for
    the wider, 1 for the other). Both kinds are offered: a tile's diagonal product fits lane by lane too, but its
    row needs it."""
    found = []
    key, lane, lanes_n = _lane_by_lane(operands, lane_of)
    if lane is not None:
        found.append((2, key, lane, lanes_n, None))
    if len(operands) != 2 or not all(s in lane_of for s in operands):
        return found
    options = []
    for k, s in enumerate(operands):
        if shareable(s):
            pack, lane = lane_of[operands[1 - k]]
            key = (s, pack) if k == 0 else (pack, s)
            options.append((key, lane, len(pack.lanes), s))
    options.sort(key=lambda o: -o[2])
    return [(0 if n == 0 else 1, *o) for n, o in enumerate(options)] + found


def _lane_by_lane(operands: tuple[UOp, ...], lane_of: dict[UOp, tuple[Pack, int]]) -> tuple[tuple, int | None, int]:
    key, lane, lanes_n = [], None, 0
    for s in operands:
        if s in lane_of:
            pack, i = lane_of[s]
            if lane is not None and (i != lane or len(pack.lanes) != lanes_n):
                return (), None, 0
            lane, lanes_n = i, len(pack.lanes)
            key.append(pack)
        else:
            key.append(s)
    return tuple(key), lane, lanes_n
