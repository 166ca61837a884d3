"""Opts chosen without search, from the index arithmetic of a kernel lowered without any."""

from __future__ import annotations
import math
from typing import TYPE_CHECKING
from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import NUM_CPU_THREADS, prod
from fusegrad.uop.ops import Ops, UOp
from fusegrad.codegen.accumulators import INNER_BLOCK
from fusegrad.codegen.opt import Opt, OptOps, check_opts, blockable_sum
from fusegrad.codegen.opt.matrix_tile import match_matmul
from fusegrad.uop.symbolic import linear_terms, sym_eval

if TYPE_CHECKING:
    from fusegrad.renderer import Capabilities

# accumulators along the output's last dim of a reduce kernel that is not matmul-like (a column sum, a matvec over an
# (in, out) weight): up to LATENCY_ACCUMULATORS' worth of vectors, at most COLUMN_MAX_LANES lanes (one thread, AVX2, an
# F32 LLaMA's decode matvecs with 64 lanes against 16: gate+up 1360 -> 790 us, down 506 -> 384), else 8 or 4 lanes
COLUMN_VECTORS = (8, 4, 2, 1)
COLUMN_MAX_LANES = 64
COLUMN_UPCASTS = (8, 4)
# the most vectors of lanes a lane-wise sum keeps in accumulators (independent add chains hide the add's latency)
MAX_LANE_VECTORS = 4
# a register tile's rows: one broadcast value each, reused by every vector of columns
MAX_TILE_ROWS = 8
MIN_TILE_ROWS = 4
# vector registers the tile leaves free: the loaded vectors of the contiguous input and the broadcast row value
SPARE_REGISTERS = 4
# accumulators a tile needs to keep two FMA pipes busy past the FMA's latency with room for load stalls: a tile with
# fewer is worth TOO_FEW_ACCUMULATORS_WORTH, about what it runs at (measured on AVX2's 16 registers, one thread: a
# 1024^2 matmul in 6x2 vectors 88 GFLOPS against 61 in 4x2, 2048^2 91 against 62; a 3x3 conv of 128 -> 32 channels at
# 56x56 in 6x2 over its 32 rows, the last tile overlapping, 78 against 46 in 4x2: at 0.9 the 4x2 tile won there)
LATENCY_ACCUMULATORS = 12
TOO_FEW_ACCUMULATORS_WORTH = 0.7
# what a block of row tiles reads of the row input per reduce block: it stays in L1 while every column tile reuses
# it (measured: 32 KiB beats 64 KiB and more by 5-60 % on 1024^2 and 2048^2)
ROW_BLOCK_BYTES = 32 * 1024
# a matmul's reduce longer than one block of the blocked sums is walked in blocks of at least this many (measured:
# 64 runs 1024^2 and 2048^2 fastest, where longer blocks of a power-of-two-strided column input conflict in L2),
# so a block of the column input stays in L2 for every row tile; at most MAX_REDUCE_BLOCKS partial sums are added in
# memory, one after another, which keeps the error near that of the blocked sums
REDUCE_BLOCK_SIZE = 64
MAX_REDUCE_BLOCKS = 32
# row tiles of a packed matmul that reuse one panel of the column input (measured on 1024^2 and 2048^2: 32-64 tiles
# of 8 rows beat 8-16 by 5-30 %)
PANEL_ROW_BLOCK = 64
# a reduce over one loop (a 1x1 conv, a matmul) whose output rows are longer than MIN_WIDE_COLUMNS: a tile two vectors
# wide is worth less than one vector wide (measured with 16-lane vectors on one thread, 8-row tiles, 1x1 convs of
# 13x13 to 56x56 with 16 to 1024 input channels: one vector 8-32 % faster, matmuls of 64-512 rows within 3 % or
# faster; a 7x7 conv's 49 outputs a row and a 64-column matmul 3-10 % slower, so shorter rows keep two); a conv over
# taps keeps two vectors (3x3 convs with 64 or more input channels: 2x faster than one)
ONE_AXIS_WIDE_WORTH = 0.95
MIN_WIDE_COLUMNS = 64
# the overlap of an overlapping last block of row tiles is at most 1/MAX_BLOCK_OVERLAP of them (recomputed tiles)
MAX_BLOCK_OVERLAP = 32
# panels a row tile of a packed matmul walks in a row (TILE of the panels' loop)
PANEL_PAIR = 2
# the longest panel walked whole (half the L2 of this machine's cores)
PANEL_MAX_BYTES = 1 << 20
# a reduce this short or shorter loses its loop (when nothing is upcast: unrolled lanes would break the vectors)
MAX_FULL_UNROLL = 4
# a reduce over several such short axes (a pool's window) loses all its loops when they hold this many elements or
# fewer together
MAX_WINDOW_UNROLL = 16
# an outermost loop with this many iterations per thread keeps the threads' shares within a few percent
BALANCED_TRIPS = 8
# the longest side of a tile of dot products (x @ W.T's outputs): 4 x 4 vector accumulators fill half of 32 registers
MAX_DOT_TILE = 4
# a dot product's reduce shorter than this many vectors is not worth vector accumulators and their final sums
MIN_DOT_VECTORS = 2
# a copy that reads its input across rows (a transpose) in tiles of this many rows and columns: each tile reads whole
# cache lines of the input once; a row at a time read one line per element, and rows a power of two apart share
# cache sets, so lines were fetched again for every output row (2048x1024: 7.4 -> 0.7 ms; 8 beat 16 and 16 x 4)
TRANSPOSE_TILE = 8
# ... from this many elements: a row at a time thrashes L1 already at 128x784 (one thread, ten copies replayed, best
# of 200: 128x784 43 -> 22 us, 784x128 71 -> 17 us, 128x128 11 -> 4 us; 64x64 and smaller the same either way)
TRANSPOSE_MIN_ELEMENTS = 1 << 12
# worth per output of a column tile two vectors wide (half the row broadcasts of one), one vector wide, and narrower
# ones, which run as scalars
TILE_WORTH = (1.15, 1.0, 0.6, 0.4, 0.25)


def _loops(nodes: list[UOp]) -> dict[int, UOp]:
    """A kernel's loops by number: the lowerer numbers the loops of the output axes with one (_kept_axes) first, in
    order, then the reduce's."""
    return {u.arg[0]: u for u in nodes if u.op is Ops.RANGE}


def _kept_axes(value: UOp) -> list[int]:
    """The output axes that get a loop (every one but those of size 1), in loop order."""
    return [a for a, d in enumerate(value.shape) if d != 1]


def hand_coded_opts(value: UOp, plain: UOp, reads_output: bool, caps: Capabilities) -> list[Opt]:
    """The register tiles and blocks of `tile_opts`, a full UNROLL of a short innermost reduce in a kernel without
    upcasts, and a THREAD split of the largest loop when the outermost one would leave threads idle. caps: the
    target's (the renderer's): the tiles fill its vector registers. A plain matmul on a target with matrix cores gets
    none: its renderer tiles it for them."""
    if caps.matrix_cores and match_matmul(plain.toposort()) is not None:
        return []
    opts = (
        _panel_tile(value, plain, reads_output, caps)
        or _lane_accumulators(value, plain, caps)
        or tile_opts(value, plain, reads_output, caps)
        or _dot_tile(value, plain, reads_output, caps)
        or _transpose_tile(value, plain)
        or _gated_row_vectors(value, plain, reads_output, caps)
    )
    if not opts and (window := _unroll_short_window(value)):
        opts.extend(window + _window_rows(value, plain))
    elif not opts and (unroll := _unroll_short_reduce(value)) is not None:
        opts.append(unroll)
    if (thread := _thread_split(value.shape, opts)) is not None:
        opts.append(thread)
    return opts


def _lane_accumulators(value: UOp, plain: UOp, caps: Capabilities) -> list[Opt]:
    """UPCAST of the whole last output axis when it is 2..MAX_LANE_VECTORS vectors of lanes that every input the reduce
    walks reads as contiguous rows (a split sum's partial kernel, a column sum of a narrow matrix): each iteration adds
    whole rows into independent vector accumulators, where a partial upcast would walk the input once per group."""
    if value.dtype not in (dtypes.float32, dtypes.float64) or any(not isinstance(d, int) for d in value.shape):
        return []
    nodes = plain.toposort()
    ranges = _loops(nodes)
    reduces = [r for r in ranges.values() if r.arg[1] == "reduce"]
    kept = _kept_axes(value)
    if not reduces or not kept or (col_r := ranges.get(len(kept) - 1)) is None or col_r.arg[1] != "global":
        return []
    col, cols, width = kept[-1], value.shape[kept[-1]], _width(value, caps)
    if cols % width or not width < cols <= MAX_LANE_VECTORS * width:
        return []
    inner = max(reduces, key=lambda r: r.arg[0])
    loads = _reduce_loads(nodes, reduces)
    rows = all(coefficient(i, col_r) == 1 and coefficient(i, inner) == cols for i in loads)
    return [Opt(OptOps.UPCAST, col, cols)] if rows else []


def _transpose_tile(value: UOp, plain: UOp) -> list[Opt]:
    """UPCAST by TRANSPOSE_TILE of the innermost output axis and of an output axis the input is contiguous along, in a
    kernel without a reduce whose every load that moves along the innermost axis moves by more than a tile there."""
    if any(not isinstance(d, int) for d in value.shape) or prod(value.shape) < TRANSPOSE_MIN_ELEMENTS:
        return []
    nodes = plain.toposort()
    ranges = _loops(nodes)
    kept = _kept_axes(value)
    if len(kept) < 2 or any(r.arg[1] != "global" for r in ranges.values()) or len(ranges) != len(kept):
        return []
    loads = [u.src[1] for u in nodes if u.op is Ops.LOAD]
    col_r = ranges[len(kept) - 1]
    moving = [i for i in loads if coefficient(i, col_r) != 0]
    if not moving or any(c is None or abs(c) <= TRANSPOSE_TILE for i in moving if (c := coefficient(i, col_r)) != 0):
        return []
    # the output axis the moving loads read contiguously (a load that steps along it by a division, a block's scale
    # in a dequantization, is read a few times per tile)
    row = next(
        (
            j
            for j in range(len(kept) - 1)
            if all(coefficient(i, ranges[j]) in (1, None) for i in moving)
            and any(coefficient(i, ranges[j]) == 1 or _runs_of_tiles(i, ranges[j]) for i in moving)
        ),
        None,
    )
    col = kept[-1]
    if row is None or value.shape[kept[row]] % TRANSPOSE_TILE or value.shape[col] % TRANSPOSE_TILE:
        return []
    return [Opt(OptOps.UPCAST, kept[row], TRANSPOSE_TILE), Opt(OptOps.UPCAST, col, TRANSPOSE_TILE)]


def _runs_of_tiles(index: UOp, r: UOp) -> bool:
    """Whether index steps by one along loop r within each aligned run of TRANSPOSE_TILE steps, though not linearly
    over all of r (a 4-bit dequantization's bytes: k % 32 + k // 64 * 32, each byte's nibble chosen by k // 32 % 2);
    checked with the other loops at 0, on r's first 64 runs."""
    if r.src[0].op is not Ops.CONST or r.src[0].arg % TRANSPOSE_TILE:
        return False
    env = {u: 0 for u in index.toposort() if u.op is Ops.RANGE}
    for start in range(0, min(r.src[0].arg, 64 * TRANSPOSE_TILE), TRANSPOSE_TILE):
        try:
            run = [sym_eval(index, env | {r: start + lane}) for lane in range(TRANSPOSE_TILE)]
        except ValueError:  # a variable or a load: not known here
            return False
        if run != [run[0] + lane for lane in range(TRANSPOSE_TILE)]:
            return False
    return True


def _gated_row_vectors(value: UOp, plain: UOp, reads_output: bool, caps: Capabilities) -> list[Opt]:
    """UPCAST by one vector of the innermost output axis of a kernel without a reduce that reads through a gate (a
    concat's or a pad's select), for a compiler that vectorizes loops: a gated scalar load is one GCC if-converts
    poorly or not at all, a gated vector load of the packed lanes reads them at once (a fire module's concat with its
    ReLU, 128x55x55: 193 -> 44 us; an Inception module's, 576x14x14 in 8-lane vectors, 190 -> 75 us). A row that is
    not a whole number of vectors ends in a tile that overlaps the one before (recomputed, unless the kernel reads its
    own output)."""
    if not (caps.loop_vectorizer and caps.vector_types) or any(not isinstance(d, int) for d in value.shape):
        return []
    nodes = plain.toposort()
    ranges = _loops(nodes)
    kept = _kept_axes(value)
    if not kept or len(ranges) != len(kept) or any(r.arg[1] != "global" for r in ranges.values()):
        return []
    gated = [u for u in nodes if u.op is Ops.LOAD and len(u.src) > 2]
    stores = [u.src[1] for u in nodes if u.op is Ops.STORE]
    col_r, cols = ranges[len(kept) - 1], value.shape[kept[-1]]
    # a vector, or for a shorter row (14 wide at 14x14) the widest smaller one
    amount = next((w for w in (_width(value, caps), 8, 4) if w <= cols), 1)
    if not gated or amount < 4 or (reads_output and cols % amount):
        return []
    # the lanes of a vector are neighbours in the output and in every gated input that moves along the row (a batch
    # norm's per-channel scale does not), and share their gate (a gate along the row, a pad's columns, leaves lanes
    # loaded one by one, each behind a branch where if-conversion is off)
    if any(coefficient(u.src[1], col_r) not in (0, 1) for u in gated) or any(
        coefficient(i, col_r) != 1 for i in stores
    ):
        return []
    if any(col_r in u.src[2].toposort() for u in gated):
        return []
    return [Opt(OptOps.UPCAST, kept[-1], amount)]


def _unroll_short_reduce(value: UOp) -> Opt | None:
    """The innermost reduced axis of the kernel's one reduce, when it is at most MAX_FULL_UNROLL long: its loop would
    cost more than its body."""
    reduces = [u for u in value.toposort(gate=lambda x: x.op is not Ops.DEFINE_GLOBAL) if u.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1:
        return None
    shape, axes = reduces[0].src[0].shape, reduces[0].arg[1]
    if any(not isinstance(shape[a], int) for a in axes):  # a symbolic reduce is never cut
        return None
    inner = max((a for a in axes if shape[a] > 1), default=None)
    return Opt(OptOps.UNROLL, inner, shape[inner]) if inner is not None and shape[inner] <= MAX_FULL_UNROLL else None


def _unroll_short_window(value: UOp) -> list[Opt]:
    """Every reduced axis of the kernel's one reduce, when all are at most MAX_FULL_UNROLL long and together at most
    MAX_WINDOW_UNROLL (a pool's 2x2 or 3x3 window): with no reduce loop left the output loop is straight-line code
    the C compiler vectorizes (measured: a 2x2 max pool of 128x32x8x8 runs 10x faster than with only its inner
    axis unrolled)."""
    reduces = [u for u in value.toposort(gate=lambda x: x.op is not Ops.DEFINE_GLOBAL) if u.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1:
        return []
    shape, axes = reduces[0].src[0].shape, reduces[0].arg[1]
    if any(not isinstance(shape[a], int) for a in axes):  # a symbolic reduce is never cut
        return []
    window = [a for a in sorted(axes, reverse=True) if shape[a] > 1]
    if len(window) < 2 or any(shape[a] > MAX_FULL_UNROLL for a in window):
        return []
    return (
        [Opt(OptOps.UNROLL, a, shape[a]) for a in window] if prod(shape[a] for a in window) <= MAX_WINDOW_UNROLL else []
    )


def _window_rows(value: UOp, plain: UOp) -> list[Opt]:
    """UPCAST by 2 of the output axis outside the innermost one, when it has an even size and the windows of
    neighbouring outputs along it overlap (a 3x3 conv's rows at stride 1 or 2): the pair shares the loads of the rows
    both read (depthwise 3x3 at 28x28: 74 -> 57 us)."""
    kept = _kept_axes(value)
    if len(kept) < 2 or not isinstance(size := value.shape[kept[-2]], int) or size % 2:
        return []
    nodes = plain.toposort()
    ranges = _loops(nodes)
    row_r = ranges.get(len(kept) - 2)
    if row_r is None or row_r.arg[1] != "global":
        return []
    taps = [r for r in ranges.values() if r.arg[1] == "reduce" and r.src[0].op is Ops.CONST]
    for index in (u.src[1] for u in nodes if u.op is Ops.LOAD):
        step = coefficient(index, row_r)
        for tap in taps:
            per_tap = coefficient(index, tap)
            if step and per_tap and step % per_tap == 0 and step < per_tap * tap.src[0].arg:
                return [Opt(OptOps.UPCAST, kept[-2], 2)]
    return []


def _thread_split(shape: tuple[int, ...], opts: list[Opt]) -> Opt | None:
    """THREAD on the axis with the most iterations that splits evenly over the threads, when the outermost loop has
    fewer than BALANCED_TRIPS iterations per thread and does not split evenly."""
    threads = int(NUM_CPU_THREADS.value)
    if threads < 2 or any(not isinstance(d, int) for d in shape):  # a symbolic loop's trips are not known
        return None
    up = {o.axis: o.amount for o in opts if o.op is OptOps.UPCAST}
    tiles = {o.axis: o.amount for o in opts if o.op is OptOps.TILE}
    trips = [-(-(-(-d // up.get(a, 1))) // tiles.get(a, 1)) for a, d in enumerate(shape)]
    first = next((t for t in trips if t > 1), 1)
    if first % threads == 0 or first >= BALANCED_TRIPS * threads:
        return None
    even = [a for a, t in enumerate(trips) if t % threads == 0 and t > first]
    return Opt(OptOps.THREAD, max(even, key=lambda a: trips[a]), threads) if even else None


def tile_opts(value: UOp, plain: UOp, reads_output: bool, caps: Capabilities) -> list[Opt]:
    """Upcasts for a reduce kernel whose last output axis is contiguous in some input and strided along the reduce:
    a register tile of rows x vectors of columns when another input varies along a row axis (matmul-like), else
    16/8/4 accumulators along the last axis. Elementwise kernels get none: the C compiler vectorizes them itself."""
    nodes = plain.toposort()
    ranges = _loops(nodes)
    reduces = [r for r in ranges.values() if r.arg[1] == "reduce"]
    if not reduces:
        return []
    axis_range: dict[int, UOp] = {}
    for axis in _kept_axes(value):
        if (r := ranges.get(len(axis_range))) is not None and r.arg[1] == "global":
            axis_range[axis] = r
        axis_range.setdefault(axis, None)  # type: ignore[arg-type]
    # a symbolic axis is cut only as a tile's rows (an UPCAST no longer than its smallest size, check_opts), in a
    # kernel that does not read its own output: the scores of a prefill chunk against a growing KV cache
    symbolic = {a for a, d in enumerate(value.shape) if isinstance(d, UOp)}
    for axis in symbolic:
        if reads_output or value.shape[axis].vmin < MAX_TILE_ROWS:
            axis_range[axis] = None  # type: ignore[assignment]
    columns = [a for a, r in axis_range.items() if r is not None and a not in symbolic]
    if not columns:
        return []
    col, inner = columns[-1], max(reduces, key=lambda r: r.arg[0])
    axes = [a for a, r in axis_range.items() if r is not None and a <= col]
    col_r = axis_range[col]
    loads = _reduce_loads(nodes, reduces)
    contiguous = [i for i in loads if coefficient(i, col_r) == 1]
    cols = value.shape[col]
    width = _width(value, caps)
    if not contiguous or (cols < width and _reduce_is_contiguous(loads, inner)):
        # a reduce contiguous in every input it walks (a conv's weight gradient) vectorizes best as it is: one
        # accumulator the compiler keeps in a vector; outputs too few to fill a vector would only take that away
        return []
    rows_ok = [a for a in reversed(axes[:-1]) if _is_row_axis(axis_range[a], col_r, inner, contiguous, loads)]
    # the innermost row axis long enough for a register tile (a conv's weight gradient: the input channels, not the
    # 3 kernel taps)
    row = next((a for a in rows_ok if _least(value.shape[a]) >= MIN_TILE_ROWS), rows_ok[0] if rows_ok else None)
    floats = value.dtype in (dtypes.float32, dtypes.float64)
    if row is None and floats and cols % width == 0 and width < cols <= 2 * width:
        # two vectors of columns (a matvec over a weight's panels): both accumulate in one pass down the panel;
        # one vector per pass read every other cache line of it twice (measured: GPT-2's lm_head 18 % faster)
        return [Opt(OptOps.UPCAST, col, cols)]
    if row is None and _unroll_short_window(value):
        # a short window per output (a depthwise conv's 3x3 taps, a stride-1 pool's) loses its loops instead: the
        # output row's loop is then straight-line code the C compiler vectorizes, each tap one shifted vector load;
        # accumulators along the row read each tap's lanes out of vectors of other taps (depthwise 3x3 at 28x28, 136
        # channels: 4x faster)
        return []
    if row is None or not floats:
        ups = [v * width for v in COLUMN_VECTORS if v * width <= COLUMN_MAX_LANES] + list(COLUMN_UPCASTS)
        amount = next((up for up in ups if cols % up == 0 and cols > up), None)
        return [Opt(OptOps.UPCAST, col, amount)] if amount else []
    if row in symbolic:  # tiled rows, neither blocked (partial sums read the output) nor walked in TILE blocks
        return _register_tile(value, row, col, prod(r.src[0].vmax for r in reduces), False, caps, len(reduces) == 1)
    # a symbolic reduce counts at its largest for the tile blocks, and is not blocked (its size is not known)
    reduce_size = prod(r.src[0].vmax for r in reduces)
    symbolic_reduce = any(r.src[0].op is not Ops.CONST for r in reduces)
    # partial sums in memory would overwrite what a kernel adding into its own storage reads
    if not symbolic_reduce and not reads_output and (block := _reduce_block(value, reduce_size)) is not None:
        # partial sums added in memory read the output: only tiles that divide it
        opts = _register_tile(value, row, col, block.amount, True, caps, len(reduces) == 1)
        # the loop over blocks runs inside an output loop, which threads split: some axis needs more than one tile
        applied = check_opts(opts, value.shape, reads_output=True)
        counts = [-(-d // applied.upcasts.get(a, 1)) for a, d in enumerate(value.shape)]
        if opts and any(-(-c // applied.tiles.get(a, 1)) > 1 for a, c in enumerate(counts)):
            plain = _register_tile(value, row, col, reduce_size, reads_output, caps, len(reduces) == 1)
            # the blocks take only tiles that divide the output: where that leaves too few accumulators and a tile
            # free to overlap has enough, the latter wins (AVX2, one thread: 128x784 @ 784x128 55 -> 78 GFLOPS,
            # 256x768 @ 768x768 51 -> 73)
            few = _accumulators(opts, caps, value.dtype)
            if few < LATENCY_ACCUMULATORS <= _accumulators(plain, caps, value.dtype):
                return plain
            return opts + [block]
    return _register_tile(value, row, col, reduce_size, reads_output, caps, len(reduces) == 1)


def _accumulators(opts: list[Opt], caps: Capabilities, dtype: DType) -> int:
    """Vector accumulators of a register tile: its upcasts' product in vectors of the target's lanes."""
    return prod(o.amount for o in opts if o.op is OptOps.UPCAST) // caps.lanes(dtype)


def _register_tile(
    value: UOp, row: int, col: int, reduce_size: int, exact: bool, caps: Capabilities, one_axis: bool = False
) -> list[Opt]:
    """Rows x vectors of columns of outputs in registers, row tiles walked in blocks whose rows of the row input
    (reduce_size elements each) stay in L2. one_axis: the reduce walks one loop (a 1x1 conv, a matmul)."""
    width = caps.vector_bytes // value.dtype.itemsize
    cols, rows = value.shape[col], _least(value.shape[row])
    worth: dict[int, float] = {}
    for amount, w in zip((2 * width, width, 8, 4, 2), TILE_WORTH):
        worth.setdefault(amount, w)  # with 8-lane vectors, 8 is worth a vector
    if one_axis and cols > MIN_WIDE_COLUMNS and (caps.vector_registers - SPARE_REGISTERS) // 2 >= MAX_TILE_ROWS:
        # only where two vectors still get MAX_TILE_ROWS rows (32 registers): with 16 a one-vector tile has 8
        # accumulators against two vectors' 12, and two run 1.3-1.6x faster (1x1 convs at 13x13 and 56x56, AVX2)
        worth[2 * width] = ONE_AXIS_WIDE_WORTH
    if (col_amount := _best_tile(cols, worth, exact)) is None:
        return []
    vectors = max(col_amount // width, 1)
    row_amount = _best_tile(rows, _row_worth(vectors, caps), exact)
    if row_amount is None:
        return [] if exact else [Opt(OptOps.UPCAST, col, col_amount)]
    opts = [Opt(OptOps.UPCAST, row, row_amount), Opt(OptOps.UPCAST, col, col_amount)]
    # blocks of row tiles, at least one per thread, when more than one column tile reuses them
    row_tiles = -(-rows // row_amount)
    per_block = min(
        ROW_BLOCK_BYTES // (row_amount * reduce_size * value.dtype.itemsize),
        row_tiles // max(int(NUM_CPU_THREADS.value), 1),
    )
    per_block = _block_size(row_tiles, per_block, exact)
    if cols > col_amount and per_block >= 2 and isinstance(value.shape[row], int):
        opts.append(Opt(OptOps.TILE, row, per_block))
    return opts


def _least(size: int | UOp) -> int:
    """An axis's size, a symbolic one at its smallest."""
    return size if isinstance(size, int) else size.vmin


def _row_worth(vectors: int, caps: Capabilities) -> dict[int, float]:
    """Worth of each row count of a register tile `vectors` wide, from the most that fit the registers down to half
    of that: less for tiles with fewer than LATENCY_ACCUMULATORS accumulators."""
    max_rows = max(min(MAX_TILE_ROWS, (caps.vector_registers - SPARE_REGISTERS) // vectors), 1)
    return {
        r: 1.0 if r * vectors >= LATENCY_ACCUMULATORS else TOO_FEW_ACCUMULATORS_WORTH
        for r in range(max_rows, max(max_rows // 2, 2) - 1, -1)
    }


def _block_size(tiles: int, most: int, exact: bool) -> int:
    """The most tiles per block, up to `most`, whose last block overlaps the one before it by at most
    1/MAX_BLOCK_OVERLAP of the tiles (recomputed); with exact, a divisor of tiles. 8 row tiles in blocks of 7 computed
    14 (a 3x3 conv at 55x55 with 64 channels on one thread: 884 -> 507 us in blocks of 4)."""
    for amount in range(most, 1, -1):
        overlap = -(-tiles // amount) * amount - tiles
        if overlap == 0 or not exact and overlap * MAX_BLOCK_OVERLAP <= tiles:
            return amount
    return 1


def _panel_tile(value: UOp, plain: UOp, reads_output: bool, caps: Capabilities) -> list[Opt] | None:
    """The register tile of a matmul whose column input is packed in panels (tensor_ops/linalg.py): that input walks
    the reduce one panel row (one or two vectors) after another, whether the output keeps the panels as an axis or
    merges them into its columns (under an epilogue). The panel streams without aliasing, so the reduce is not blocked
    (the accumulators stay in registers over all of it); the row tiles of each thread's share form one block (up to
    PANEL_ROW_BLOCK tiles) that reuses a panel while it is in L2."""
    if any(not isinstance(d, int) for d in value.shape) or value.dtype not in (dtypes.float32, dtypes.float64):
        return None
    nodes = plain.toposort()
    ranges = _loops(nodes)
    reduces = [r for r in ranges.values() if r.arg[1] == "reduce"]
    kept = _kept_axes(value)
    axis_range = {a: ranges.get(i) for i, a in enumerate(kept)}
    if not reduces or not kept or any(r is None or r.arg[1] != "global" for r in axis_range.values()):
        return None
    inner, col = max(reduces, key=lambda r: r.arg[0]), kept[-1]
    col_r, cols, width = axis_range[col], value.shape[col], _width(value, caps)
    loads = [u.src[1] for u in nodes if u.op is Ops.LOAD]
    panel = next(
        (
            (i, p)
            for p in (2 * width, width)
            for i in loads
            if cols % p == 0 and coefficient(i, inner) == p and col_r in i.toposort()
        ),
        None,
    )
    if panel is None or inner.src[0].op is not Ops.CONST:
        return None
    panel_load, cols_per_panel = panel
    if inner.src[0].arg * cols_per_panel * value.dtype.itemsize > PANEL_MAX_BYTES:
        return None  # a panel past L2 is walked in reduce blocks (tile_opts)
    # the row input may walk the reduce through a view that splits it (attention's heads x head_dim, read as x's
    # columns by the output projection): each row still takes one value per reduce step
    rows_ok = [
        a
        for a in reversed(kept[:-1])
        if coefficient(panel_load, axis_range[a]) == 0
        and any(
            coefficient(i, axis_range[a]) not in (0, None) and coefficient(i, inner) != 0 and coefficient(i, col_r) == 0
            for i in loads
        )
    ]
    row = next((a for a in rows_ok if value.shape[a] >= MIN_TILE_ROWS), rows_ok[0] if rows_ok else None)
    if row is None:
        return None
    vectors = max(cols_per_panel // width, 1)
    rows = value.shape[row]
    row_amount = _best_tile(rows, _row_worth(vectors, caps), reads_output)
    if row_amount is None:
        return None
    opts = [Opt(OptOps.UPCAST, row, row_amount), Opt(OptOps.UPCAST, col, cols_per_panel)]
    row_tiles = -(-rows // row_amount)
    per_block = min(PANEL_ROW_BLOCK, max(row_tiles // max(int(NUM_CPU_THREADS.value), 1), 1))
    while per_block >= 2 and row_tiles % per_block:
        per_block -= 1  # an overlapping last block would recompute up to a block of row tiles
    if prod(d for a, d in enumerate(value.shape) if a != row) > cols_per_panel and per_block >= 2:
        opts.append(Opt(OptOps.TILE, row, per_block))
    # each row tile walks PANEL_PAIR panels one after the other while its rows of the row input are in L1 (measured
    # in CPU time: 1024^2 3-6 % faster, 2048^2 the same; 4 or 8 panels are slower)
    trips = {a: -(-value.shape[a] // (cols_per_panel if a == col else 1)) for a in kept}
    walks = [a for a in kept if a != row and coefficient(panel_load, axis_range[a]) != 0 and trips[a] >= PANEL_PAIR]
    if walks and trips[walks[-1]] % PANEL_PAIR == 0:
        opts.append(Opt(OptOps.TILE, walks[-1], PANEL_PAIR))
    return opts


def _dot_tile(value: UOp, plain: UOp, reads_output: bool, caps: Capabilities) -> list[Opt]:
    """A tile of rows x columns of outputs for a matmul whose two inputs are both contiguous along the reduce
    (x @ W.T, the input gradient g @ W.T of x @ W, of the panel layout too): no output axis is contiguous in any
    input, so no vector runs across outputs; each output of the tile keeps its own accumulator, which the C renderer
    vectorizes along the reduce (each a vector of partial sums), and each loaded vector of one input is reused by
    every row (column) of the other's. Convolutions (an input varying along several output axes) are left as they
    are."""
    if any(not isinstance(d, int) for d in value.shape) or value.dtype not in (dtypes.float32, dtypes.float64):
        return []
    nodes = plain.toposort()
    ranges = _loops(nodes)
    reduces = [r for r in ranges.values() if r.arg[1] == "reduce"]
    kept = _kept_axes(value)
    axis_range = {a: ranges.get(i) for i, a in enumerate(kept)}
    if not reduces or len(kept) < 2 or any(r is None or r.arg[1] != "global" for r in axis_range.values()):
        return []
    inner = max(reduces, key=lambda r: r.arg[0])
    if inner.src[0].op is not Ops.CONST or inner.src[0].arg < MIN_DOT_VECTORS * _width(value, caps):
        return []
    loads = _reduce_loads(nodes, reduces)
    if len(loads) != 2 or any(coefficient(i, inner) != 1 for i in loads):
        return []
    varying = []
    for i in loads:
        strides = {a: coefficient(i, r) for a, r in axis_range.items()}
        if any(s is None for s in strides.values()) or any(coefficient(i, r) is None for r in reduces):
            return []
        varying.append([a for a, s in strides.items() if s != 0])
    if any(len(v) != 1 for v in varying) or varying[0] == varying[1]:
        return []
    (row,), (col,) = sorted(varying)
    # accumulators and the loaded vectors of both inputs in registers
    registers = caps.vector_registers - SPARE_REGISTERS - 2 * MAX_DOT_TILE
    tile = dict.fromkeys(range(MAX_DOT_TILE, 1, -1), 1.0)
    row_amount = _best_tile(value.shape[row], tile, reads_output)
    if row_amount is None:
        return []
    col_tile = {a: w for a, w in tile.items() if a * row_amount <= registers}
    col_amount = _best_tile(value.shape[col], col_tile, reads_output)
    opts = [Opt(OptOps.UPCAST, row, row_amount)]
    return opts + [Opt(OptOps.UPCAST, col, col_amount)] if col_amount is not None else opts


def _reduce_block(value: UOp, reduce_size: int) -> Opt | None:
    """A long plain sum's reduce in the shortest blocks of at least REDUCE_BLOCK_SIZE that divide it into at most
    MAX_REDUCE_BLOCKS."""
    if (red := blockable_sum(value)) is None or reduce_size <= INNER_BLOCK:
        return None
    # only the blockable sum's own axis is cut: a kernel whose loops also walk another reduce (a matmul inside a
    # split sum's chunk) has no block of that size
    if red.src[0].shape[red.arg[1][0]] != reduce_size:
        return None
    block = next(
        (
            b
            for b in range(REDUCE_BLOCK_SIZE, reduce_size)
            if reduce_size % b == 0 and reduce_size // b <= MAX_REDUCE_BLOCKS
        ),
        None,
    )
    return Opt(OptOps.REDUCE_BLOCK, red.arg[1][0], block) if block is not None else None


def _reduce_loads(nodes: list[UOp], reduces: list[UOp]) -> list[UOp]:
    """The indices of the loads the reduce walks: an epilogue's loads (a ReLU's backward mask on a conv's input
    gradient, a bias) are made once per output and say nothing about the tile."""
    loads = [u.src[1] for u in nodes if u.op is Ops.LOAD]
    return [i for i in loads if any(r in i.toposort() for r in reduces)] or loads


def _width(value: UOp, caps: Capabilities) -> int:
    return caps.lanes(value.dtype)


def _reduce_is_contiguous(loads: list[UOp], inner: UOp) -> bool:
    strides = [coefficient(i, inner) for i in loads]
    # a symbolic reduce's trip count is not a constant: its loop stays as it is
    return (
        inner.src[0].op is Ops.CONST
        and inner.src[0].arg >= 8
        and any(s == 1 for s in strides)
        and all(s in (0, 1) for s in strides)
    )


def coefficient(index: UOp, r: UOp) -> int | None:
    """The stride of index along loop r, or None when r appears inside division or modulo."""
    terms, _ = linear_terms(index, negations=True)
    if any(t is not r and r in t.toposort() for _, t in terms):
        return None
    return sum(k for k, t in terms if t is r)


def _is_row_axis(r: UOp, col_r: UOp, inner: UOp, contiguous: list[UOp], loads: list[UOp]) -> bool:
    """An axis the contiguous input does not vary along, read by another input that walks the reduce with it."""
    return all(coefficient(i, r) == 0 for i in contiguous) and any(
        coefficient(i, r) not in (0, None) and coefficient(i, col_r) == 0 and coefficient(i, inner) not in (0, None)
        for i in loads
    )


def _best_tile(size: int, worth: dict[int, float], exact: bool) -> int | None:
    """The amount with the best worth times the share of useful outputs (the overlapping last tile recomputes some);
    earlier amounts win ties; with exact, only amounts that divide size."""
    best, best_score = None, 0.0
    for amount, w in worth.items():
        if amount > size or amount < 2 or (exact and size % amount):
            continue
        score = size / (math.ceil(size / amount) * amount) * w
        if score > best_score:
            best, best_score = amount, score
    return best
