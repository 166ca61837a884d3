"""Optimizations as explicit actions on a kernel's ranges: an `Opt` names one, `check_opts` validates a list against
a kernel's output shape, and the lowerer applies them. `hand_coded_opts` (heuristic.py) chooses them."""

from __future__ import annotations
import enum
from dataclasses import dataclass
from fusegrad.dtype import dtypes
from fusegrad.uop.ops import Ops, UOp


class OptOps(enum.Enum):
    # compute `amount` consecutive outputs along an output axis per loop iteration, each a separately named value
    UPCAST = "UPCAST"
    # cache blocking: walk an axis's tiles (its upcast groups, or elements) in blocks of `amount`, the loop over the
    # tiles of one block moved innermost among the output loops, so what the other axes read is reused by the block
    TILE = "TILE"
    # a sum kernel's reduce (axis: of the reduce's input) in blocks of `amount`, the loop over blocks placed after the
    # first output loop: each block adds its partial sums to the output in memory, so what one block reads stays in
    # cache for every output tile of the block
    REDUCE_BLOCK = "REDUCE_BLOCK"
    # the kernel's reduce (axis: of the reduce's input) walked `amount` elements per iteration, each a separately
    # lowered value, combined before the accumulator: a short reduce loses its loop, a long one its loop overhead
    UNROLL = "UNROLL"
    # the loops split across CPU threads: an output axis's loop cut into `amount` equal chunks, the loop over chunks
    # outermost (the thread pool splits it; NUM_CPU_THREADS still bounds the threads), the rest in place
    THREAD = "THREAD"
    # the kernel's reduce axis (of the reduce's input) walked to the next multiple of `amount`, the tail masked: its
    # loads are not made and it adds the reduce's identity (so an UNROLL may divide it)
    PADTO = "PADTO"


# opts on the axes of the kernel's single reduce (of its input shape), checked by check_reduce_opts
REDUCE_OPTS = (OptOps.UNROLL, OptOps.PADTO)


@dataclass(frozen=True)
class Opt:
    op: OptOps
    axis: int  # an axis of the kernel's output shape
    amount: int

    def __repr__(self) -> str:
        return f"Opt({self.op.value}, axis={self.axis}, amount={self.amount})"


class OptError(ValueError):
    """An opt that cannot apply to this kernel; the message names the opt and the shape."""


@dataclass(frozen=True)
class AppliedOpts:
    upcasts: dict[int, int]  # output axis -> outputs per tile
    tiles: dict[int, int]  # output axis -> tiles per block
    thread: tuple[int, int] | None = None  # (output axis, chunks) of a THREAD opt


@dataclass(frozen=True)
class ReduceOpts:
    unroll: dict[int, int]  # reduce input axis -> elements per iteration
    padto: dict[int, int]  # reduce input axis -> the padded size


def check_opts(opts: tuple[Opt, ...] | list[Opt], shape: tuple[int, ...], reads_output: bool) -> AppliedOpts:
    """What valid opts do to each axis, else OptError. An axis whose size the amount does not divide gets a last tile
    (or block) that overlaps the one before it (recomputing equal values), which is wrong when the kernel reads the
    buffer it writes, so such a kernel needs amounts that divide."""
    upcasts: dict[int, int] = {}
    tiles: dict[int, int] = {}
    thread: tuple[int, int] | None = None
    for opt in opts:
        if not isinstance(opt, Opt) or not isinstance(opt.op, OptOps):
            raise OptError(f"not an Opt: {opt!r}")
        if opt.op is OptOps.REDUCE_BLOCK or opt.op in REDUCE_OPTS:
            continue  # check_reduce_block, check_reduce_opts
        if not isinstance(opt.axis, int) or not 0 <= opt.axis < len(shape):
            raise OptError(f"{opt}: axis {opt.axis!r} is not an axis of the output shape {shape}")
        if isinstance(shape[opt.axis], UOp) and not _upcast_fits(opt, shape[opt.axis], reads_output):
            # a tile of a symbolic axis could end past the value the variable takes at run time
            raise OptError(
                f"{opt}: axis {opt.axis} has a symbolic size; only an UPCAST no larger than its smallest value "
                f"({shape[opt.axis].vmin}) cuts it, in a kernel that does not read its own output"
            )
        if opt.op is OptOps.UPCAST:
            size = shape[opt.axis] if isinstance(shape[opt.axis], int) else shape[opt.axis].vmin
            if not isinstance(opt.amount, int) or opt.amount < 2:
                raise OptError(f"{opt}: amount must be an int >= 2, got {opt.amount!r}")
            if opt.axis in upcasts:
                raise OptError(f"{opt}: axis {opt.axis} of shape {shape} is already upcast by {upcasts[opt.axis]}")
            if opt.amount > size:
                raise OptError(f"{opt}: amount {opt.amount} exceeds the size {size} of axis {opt.axis} of {shape}")
            if reads_output and size % opt.amount:
                raise OptError(
                    f"{opt}: amount {opt.amount} does not divide the size {size} of axis {opt.axis} of {shape}, and "
                    "the kernel reads the buffer it writes, so an overlapping last tile would read its own results"
                )
            upcasts[opt.axis] = opt.amount
        elif opt.op is OptOps.TILE:
            if not isinstance(opt.amount, int) or opt.amount < 2:
                raise OptError(f"{opt}: amount must be an int >= 2, got {opt.amount!r}")
            if opt.axis in tiles:
                raise OptError(f"{opt}: axis {opt.axis} of shape {shape} is already tiled by {tiles[opt.axis]}")
            tiles[opt.axis] = opt.amount
        elif opt.op is OptOps.THREAD:
            if not isinstance(opt.amount, int) or opt.amount < 2:
                raise OptError(f"{opt}: amount must be an int >= 2, got {opt.amount!r}")
            if thread is not None:
                raise OptError(f"{opt}: the kernel is already split across threads along axis {thread[0]}")
            thread = (opt.axis, opt.amount)
    for axis, amount in tiles.items():
        count = -(-shape[axis] // upcasts.get(axis, 1))
        if amount > count:
            raise OptError(f"Opt(TILE, axis={axis}, amount={amount}): amount exceeds the {count} tiles of axis {axis}")
        if reads_output and count % amount:
            raise OptError(
                f"Opt(TILE, axis={axis}, amount={amount}): amount does not divide the {count} tiles of axis {axis}, "
                "and the kernel reads the buffer it writes, so an overlapping last block would read its own results"
            )
    if thread is not None:
        axis, amount = thread
        trips = -(-(-(-shape[axis] // upcasts.get(axis, 1))) // tiles.get(axis, 1))
        if trips % amount or trips == amount == 1:
            raise OptError(
                f"Opt(THREAD, axis={axis}, amount={amount}): amount does not divide the {trips} iterations of the loop "
                f"of axis {axis} of {shape} into equal chunks"
            )
    if _lanes(upcasts) > MAX_LANES:
        raise OptError(f"{list(opts)}: {_lanes(upcasts)} outputs per iteration exceed the limit of {MAX_LANES}")
    return AppliedOpts(upcasts, tiles, thread)


def _upcast_fits(opt: Opt, size: UOp, reads_output: bool) -> bool:
    """An UPCAST of a symbolic axis: its tiles start at most amount before the axis's end (the last one moved back to
    overlap the one before), so it needs the axis at least amount long, and outputs the kernel never reads back."""
    return opt.op is OptOps.UPCAST and not reads_output and isinstance(opt.amount, int) and size.vmin >= opt.amount


def check_reduce_opts(
    opts: tuple[Opt, ...] | list[Opt], reduce: tuple[tuple[int, ...], tuple[int, ...]] | None, blocked: bool
) -> ReduceOpts:
    """What valid UNROLL and PADTO opts do to the reduce's axes, else OptError. reduce is (input shape, reduced axes)
    of the kernel's one REDUCE_AXIS, None when it has none or several; blocked: a REDUCE_BLOCK is applied too."""
    unroll: dict[int, int] = {}
    padto: dict[int, int] = {}
    given: dict[tuple[OptOps, int], int] = {}
    # PADTOs first: an UNROLL divides the padded size, wherever it stands in the list
    ordered = sorted((o for o in opts if isinstance(o, Opt) and o.op in REDUCE_OPTS), key=lambda o: o.op.value)
    for opt in ordered:
        if reduce is None:
            raise OptError(f"{opt}: the kernel has no single reduce for it to apply to")
        if blocked:
            raise OptError(f"{opt}: the kernel's reduce is already cut into blocks (REDUCE_BLOCK)")
        shape, axes = reduce
        if not isinstance(opt.axis, int) or opt.axis not in axes:
            raise OptError(f"{opt}: axis {opt.axis!r} is not a reduced axis {axes} of the reduce's input {shape}")
        if isinstance(shape[opt.axis], UOp):
            raise OptError(f"{opt}: reduced axis {opt.axis} has a symbolic size; only axes of constant size are cut")
        if not isinstance(opt.amount, int) or opt.amount < 2:
            raise OptError(f"{opt}: amount must be an int >= 2, got {opt.amount!r}")
        if (opt.op, opt.axis) in given:
            raise OptError(f"{opt}: axis {opt.axis} already has a {opt.op.value} of {given[(opt.op, opt.axis)]}")
        given[(opt.op, opt.axis)] = opt.amount
        if opt.op is OptOps.PADTO:
            padto[opt.axis] = -(-shape[opt.axis] // opt.amount) * opt.amount
            continue
        size = padto.get(opt.axis, shape[opt.axis])
        if size % opt.amount:
            raise OptError(
                f"{opt}: amount does not divide the size {size} of reduced axis {opt.axis} of {shape} "
                "(a PADTO can round the size up)"
            )
        unroll[opt.axis] = opt.amount
    if _lanes(unroll) > MAX_UNROLL:
        raise OptError(f"{list(opts)}: {_lanes(unroll)} values per reduce iteration exceed the limit of {MAX_UNROLL}")
    return ReduceOpts(unroll, padto)


def check_reduce_block(opts: tuple[Opt, ...] | list[Opt], reduce: tuple[tuple[int, ...], int] | None) -> Opt | None:
    """The one valid REDUCE_BLOCK among opts (or None), else OptError. reduce is (input shape, reduced axis) of the
    kernel's blockable_sum, else None (partial sums of anything else cannot be added up in memory)."""
    blocks = [o for o in opts if isinstance(o, Opt) and o.op is OptOps.REDUCE_BLOCK]
    if not blocks:
        return None
    opt = blocks[0]
    if len(blocks) > 1:
        raise OptError(f"{blocks}: a kernel's reduce is blocked once")
    if reduce is None:
        raise OptError(
            f"{opt}: the kernel's value is not a single float sum over one axis (under an elementwise epilogue)"
        )
    shape, axis = reduce
    if opt.axis != axis:
        raise OptError(f"{opt}: axis {opt.axis!r} is not the reduced axis {axis} of the reduce's input {shape}")
    size = shape[axis]
    if isinstance(size, UOp):
        raise OptError(f"{opt}: the reduced axis {axis} has a symbolic size; only constant sizes are blocked")
    if not isinstance(opt.amount, int) or opt.amount < 1 or size % opt.amount or opt.amount == size:
        raise OptError(f"{opt}: amount must divide the reduced size {size} into more than one block")
    return opt


def single_sum(value: UOp) -> UOp | None:
    """The REDUCE_AXIS when value is exactly one float sum over one axis (up to reshapes of size-1 dims, and
    permutes: a weight gradient's sum is stored transposed, each output still one sum of its own)."""
    while value.op is Ops.PERMUTE or (
        value.op is Ops.RESHAPE and [d for d in value.shape if d != 1] == [d for d in value.src[0].shape if d != 1]
    ):
        value = value.src[0]
    if value.op is Ops.REDUCE_AXIS and value.arg[0] is Ops.ADD and len(value.arg[1]) == 1:
        return value if dtypes.is_float(value.dtype) else None
    return None


# ops of an epilogue a blocked sum may carry: lane-wise in the renderer's vectors (packs.py: arithmetic, comparisons
# of floats as masks, and/or of masks, selects)
EPILOGUE_OPS = (Ops.ADD, Ops.MUL, Ops.NEG, Ops.FDIV, Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.WHERE)


def blockable_sum(value: UOp) -> UOp | None:
    """The REDUCE_AXIS whose partial sums a REDUCE_BLOCK may add in the output buffer: value itself when it is one
    float sum over one axis, or the one such sum under an elementwise epilogue of the same dtype (a bias, an
    activation) that keeps its element order; the epilogue is then applied by the last block."""
    if (red := single_sum(value)) is not None or not dtypes.is_float(value.dtype):
        return red
    nodes = value.toposort(gate=lambda x: x.op is not Ops.DEFINE_GLOBAL)
    reduces = [u for u in nodes if u.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1 or (red := single_sum(reduces[0])) is None or red.dtype != value.dtype:
        return None
    kept = [d for d in value.shape if d != 1]
    on_path: set[UOp] = {red}
    for u in nodes:
        if u is red or not any(s in on_path for s in u.src):
            continue
        on_path.add(u)
        same_order = u.op is Ops.RESHAPE and [d for d in u.shape if d != 1] == kept
        # every block computes the epilogue and only the last stores it: it must stay in the vectors (packs.py)
        if u.op not in EPILOGUE_OPS and not same_order:
            return None
    return red if [d for d in red.shape if d != 1] == kept else None


# past this many separately named outputs per iteration a kernel only grows, it cannot keep them in registers
MAX_LANES = 1024
# the same for the values an unrolled reduce combines per iteration
MAX_UNROLL = 256


def _lanes(upcasts: dict[int, int]) -> int:
    out = 1
    for amount in upcasts.values():
        out *= amount
    return out
