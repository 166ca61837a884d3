"""BEAM search: opts chosen by timing candidate opt lists on the device, each checked against the kernel without opts
on the same random inputs, the winner cached on disk by kernel AST, device, compiler and the code generator's source.
The engine hands it the device as a SearchTarget (engine/search_target.py): codegen imports no device.
The heuristic's opts are a start candidate and the bar: the fastest few are timed again, in turns with the heuristic,
and one of them replaces it only when it stays faster, so noise in one measurement never crowns a slower list."""

from __future__ import annotations
import functools
import hashlib
import json
import math
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol
import numpy as np
from fusegrad.dtype import dtypes, to_numpy_dtype
from fusegrad.helpers import DEBUG, IGNORE_BEAM_CACHE, NUM_CPU_THREADS, cache_dir
from fusegrad.codegen import KernelInfo, kernel_name, lower_to_linear
from fusegrad.codegen.lowerer import output_value
from fusegrad.codegen.opt import Opt, OptError, OptOps, blockable_sum
from fusegrad.codegen.opt.heuristic import SPARE_REGISTERS
from fusegrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from fusegrad.renderer import Capabilities, Renderer

# seconds one kernel's search may spend compiling and timing expansions, after the start candidates (the kernel
# without opts, which is also the reference, and the heuristic's), which are always measured
SEARCH_BUDGET_S = 15.0
# runs per timed candidate; the median is its time
TIMING_RUNS = 5
# the fastest candidates timed again at the end, in turns with the heuristic's, for FINAL_RUNS rounds each
FINAL_CANDIDATES = 3
FINAL_RUNS = 7
# a candidate replaces the heuristic's opts only when its final median is at least this share faster
MIN_WIN = 0.02
# and when it ran faster than the heuristic's in at least this many of the FINAL_RUNS rounds: the two run back to
# back in each round, so load from other processes hits both alike; a list that only ties wins about half of them
MIN_ROUND_WINS = 6
# a candidate whose first run is this many times slower than the best so far is not run again
SLOW_FACTOR = 3.0
# a level of the search must beat the best time by this share to continue
MIN_IMPROVEMENT = 0.01
# 3, 6 and 12 rows of a register tile fill the vector registers differently from the powers of two
UPCAST_AMOUNTS = (2, 3, 4, 6, 8, 12, 16, 32)
# up to 128: a packed matmul's row tiles reuse one panel of the column input in blocks of 32-128 tiles
TILE_AMOUNTS = (2, 4, 8, 16, 32, 64, 128)
# another amount for an opt a candidate has is tried before any new opt when it is at most this factor away; farther
# ones come after the new opts (the budget runs out on the least likely first)
NEAR_FACTOR = 3.0
REDUCE_BLOCK_AMOUNTS = (16, 32, 64, 128, 256)
UNROLL_AMOUNTS = (2, 3, 4, 8)
# a reduce this short is also tried without its loop
MAX_FULL_UNROLL = 16
PADTO_AMOUNTS = (4, 8, 16)
# float reassociation changes the last bits of a sum: error relative to the largest magnitude of the output
FLOAT_TOLERANCE = {dtypes.float16: 2e-2, dtypes.bfloat16: 5e-2}
DEFAULT_FLOAT_TOLERANCE = 2e-3


class SearchTarget(Protocol):
    """The device BEAM times candidates on, as the engine hands it over."""

    name: str  # the device, as the cache key names it

    @property
    def renderer(self) -> Renderer: ...

    def identity(self) -> str:
        """The compiler and device: a winner timed with another is stale."""
        ...

    def build(self, info: KernelInfo) -> Callable[[list[Any]], None]: ...

    def allocate(self, params: list[UOp]) -> list[Any]:
        """A buffer (copyin, numpy) of the device per DEFINE_GLOBAL, of its size and dtype."""
        ...

    def synchronize(self) -> None: ...


@dataclass
class SearchResult:
    opts: tuple[Opt, ...]
    from_cache: bool
    tried: int = 0  # candidates compiled and run
    failed: list[tuple[tuple[Opt, ...], str]] = field(default_factory=list)  # candidates skipped, and why
    time_before_s: float = 0.0  # the heuristic's opts
    time_after_s: float = 0.0


def deadline_clock() -> float:
    return time.monotonic()


# the clock a kernel run is timed with (a test swaps in a fake one)
run_timer = time.perf_counter


def beam_search(ast: UOp, device: SearchTarget, width: int) -> SearchResult:
    """The cached winner for this kernel on this device, else a search of beam `width` whose winner is cached."""
    path = cache_path(ast, device)
    if not IGNORE_BEAM_CACHE and (opts := _load(path)) is not None and _lowers(ast, device, opts):
        return SearchResult(opts, from_cache=True)
    result = _search(ast, device, max(int(width), 1))
    _store(path, result.opts)
    return result


def _lowers(ast: UOp, device: SearchTarget, opts: tuple[Opt, ...]) -> bool:
    # a cache entry written for other code (or edited by hand) may hold opts this kernel rejects: search again
    try:
        lower_to_linear(ast, device.renderer, opts=opts)
    except OptError:
        return False
    return True


def cache_path(ast: UOp, device: SearchTarget) -> str:
    nodes = ast.toposort()
    index = {n: i for i, n in enumerate(nodes)}
    table = repr(tuple((n.op, n.dtype, tuple(index[s] for s in n.src), n.arg) for n in nodes))
    # the threads a kernel is split over change which opts win (and the heuristic's list, the bar)
    identity = f"{table}|{device.name}|{device.identity()}|{_codegen_identity()}|threads={NUM_CPU_THREADS.value}"
    key = hashlib.sha256(identity.encode()).hexdigest()
    return os.path.join(cache_dir(), "beam", f"{key}.json")


@functools.cache
def _codegen_identity() -> str:
    """A hash of the source that turns opts into code (codegen, renderer): a winner timed for older code is stale."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    digest = hashlib.sha256()
    for folder in ("codegen", "renderer"):
        for dirpath, dirnames, filenames in sorted(os.walk(os.path.join(root, folder))):
            dirnames.sort()
            for name in sorted(f for f in filenames if f.endswith(".py")):
                with open(os.path.join(dirpath, name), "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()


def _load(path: str) -> tuple[Opt, ...] | None:
    """The cached opts, or None when the file is missing or damaged (a damaged one is searched again)."""
    try:
        with open(path) as f:
            entries = json.load(f)["opts"]
        opts = tuple(Opt(OptOps(op), axis, amount) for op, axis, amount in entries)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(o.axis, int) and isinstance(o.amount, int) for o in opts):
        return None
    return opts


def _store(path: str, opts: tuple[Opt, ...]) -> None:
    data = json.dumps({"opts": [[o.op.value, o.axis, o.amount] for o in opts]}).encode()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # readers see the whole file or none
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as e:
        warnings.warn(
            f"BEAM cache {os.path.dirname(path)} is not writable ({e.strerror or e}); not cached", stacklevel=3
        )


def compile_candidate(ast: UOp, device: SearchTarget, opts: tuple[Opt, ...]) -> Callable[[list[Any]], None]:
    return device.build(lower_to_linear(ast, device.renderer, opts=opts))


class KernelBench:
    """Random inputs of the kernel's sizes (its own buffers, never the user's), the output reset before each run."""

    def __init__(self, ast: UOp, device: SearchTarget):
        rng = np.random.default_rng(0)
        params = sorted((u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg[0])
        self.buffers = device.allocate(params)
        # filled on the host and copied in: a device buffer (CL, CUDA) has no host view
        self.initial = [_random_fill(rng, np.empty(b.size, to_numpy_dtype(b.dtype))) for b in self.buffers]
        for b, values in zip(self.buffers, self.initial):
            b.copyin(values)
        self.device, self.out_dtype = device, params[0].dtype

    def run(self, program: Callable[[list[Any]], None]) -> float:
        # a kernel that reads its output (an assign) starts from the same values every run
        self.buffers[0].copyin(self.initial[0])
        st = run_timer()
        program(self.buffers)
        self.device.synchronize()
        return run_timer() - st

    def output(self) -> np.ndarray:
        return self.buffers[0].numpy()

    def matches(self, out: np.ndarray, ref: np.ndarray) -> bool:
        if out.dtype.kind != "f":
            return bool(np.array_equal(out, ref))
        out, ref = out.astype(np.float64), ref.astype(np.float64)
        same = (out == ref) | (np.isnan(out) & np.isnan(ref))
        finite = np.isfinite(ref)
        scale = max(float(np.max(np.abs(ref[finite]), initial=0.0)), 1.0)
        tol = FLOAT_TOLERANCE.get(self.out_dtype, DEFAULT_FLOAT_TOLERANCE) * scale
        return bool(np.all(same | (finite & (np.abs(out - ref) <= tol))))


def _random_fill(rng: np.random.Generator, view: np.ndarray) -> np.ndarray:
    # integers may index other buffers: zeros are in range for any gather (so are the zeros of other storage kinds)
    view[:] = rng.standard_normal(view.size).astype(view.dtype) if view.dtype.kind == "f" else 0
    return view.copy()


def actions(ast: UOp, caps: Capabilities) -> list[Opt]:
    """One more opt: upcasts, tiles and thread splits of every output axis, blocks of a plain sum's reduce, unrolls
    and paddings of the axes of a kernel's one reduce (an UNROLL whose amount does not divide waits for a PADTO)."""
    value = output_value(ast)
    width = caps.lanes(value.dtype)
    out: list[Opt] = []
    for axis, size in enumerate(value.shape):
        if not isinstance(size, int) or size == 1:
            continue  # a symbolic axis is never cut (check_opts refuses it)
        for amount in sorted(set(UPCAST_AMOUNTS) | {width, 2 * width, 3 * width}):
            if 2 <= amount <= size:
                out.append(Opt(OptOps.UPCAST, axis, amount))
        out.extend(Opt(OptOps.TILE, axis, amount) for amount in TILE_AMOUNTS if amount < size)
    if (red := blockable_sum(value)) is not None:
        axis = red.arg[1][0]
        size = red.src[0].shape[axis]
        size = size if isinstance(size, int) else 0  # a symbolic reduce is not blocked
        out.extend(Opt(OptOps.REDUCE_BLOCK, axis, a) for a in REDUCE_BLOCK_AMOUNTS if a < size and size % a == 0)
    threads = int(NUM_CPU_THREADS.value)
    if threads >= 2:
        out.extend(
            Opt(OptOps.THREAD, axis, n)
            for axis, size in enumerate(value.shape)
            for n in (threads, 2 * threads)
            if isinstance(size, int) and size >= n  # a symbolic axis is never cut
        )
    reduces = [u for u in value.toposort(gate=lambda x: x.op is not Ops.DEFINE_GLOBAL) if u.op is Ops.REDUCE_AXIS]
    if len(reduces) == 1:
        shape = reduces[0].src[0].shape
        for axis in (a for a in reduces[0].arg[1] if isinstance(shape[a], int) and shape[a] > 1):
            size = shape[axis]
            amounts = sorted(set(UNROLL_AMOUNTS) | ({size} if size <= MAX_FULL_UNROLL else set()))
            out.extend(Opt(OptOps.UNROLL, axis, a) for a in amounts if a <= size and (size % a == 0 or a < 8))
            out.extend(Opt(OptOps.PADTO, axis, a) for a in PADTO_AMOUNTS if size % a)
    return out


# new opts in the order a short search tries them: a thread split and cache blocks change how memory is walked and
# compile fast; a new upcast grows the kernel, unrolls and paddings of the reduce rarely pay on a register tile
NEW_OPT_ORDER = (OptOps.THREAD, OptOps.TILE, OptOps.REDUCE_BLOCK, OptOps.UPCAST, OptOps.UNROLL, OptOps.PADTO)


def nearest_first(base: tuple[Opt, ...], moves: list[Opt], width: int) -> list[Opt]:
    """moves in the order a search with little time should try them on base: other amounts of base's own opts at
    most NEAR_FACTOR away (nearest first: a tile of 6 or 12 rows before one of 2), then new opts (NEW_OPT_ORDER),
    then the far amounts and those that would cut an upcast of whole vectors (width lanes) into partial ones; ties
    keep the order of `actions`."""
    current = {(o.op, o.axis): o.amount for o in base}

    def rank(indexed: tuple[int, Opt]) -> tuple[int, float, int]:
        i, move = indexed
        if (have := current.get((move.op, move.axis))) is None:
            return (1, float(NEW_OPT_ORDER.index(move.op)) if move.op in NEW_OPT_ORDER else 9.0, i)
        if move.amount <= 0 or have <= 0:
            return (2, math.inf, i)
        distance = abs(math.log(move.amount / have))
        partial = move.op is OptOps.UPCAST and have % width == 0 and move.amount % width != 0
        return (0 if distance <= math.log(NEAR_FACTOR) and not partial else 2, distance, i)

    return [m for _, m in sorted(enumerate(moves), key=rank)]


def fits_registers(ast: UOp, opts: tuple[Opt, ...], caps: Capabilities) -> bool:
    """False when a reduce kernel's upcast outputs need more vector registers than the register tile may use even
    packed in full vectors (the heuristic's SPARE_REGISTERS left for loaded vectors): its accumulators would spill
    in the inner loop, so it is not worth compiling. Kernels without a reduce keep no accumulators."""
    value = output_value(ast)
    if not any(u.op is Ops.REDUCE_AXIS for u in value.toposort(gate=lambda x: x.op is not Ops.DEFINE_GLOBAL)):
        return True
    lanes = math.prod(o.amount for o in opts if o.op is OptOps.UPCAST and isinstance(o.amount, int))
    return -(-lanes // caps.lanes(value.dtype)) <= caps.vector_registers - SPARE_REGISTERS


def _search(ast: UOp, device: SearchTarget, width: int) -> SearchResult:
    start_time = deadline_clock()
    bench = KernelBench(ast, device)
    # the kernel without opts is the reference every candidate must match, and the first start candidate
    reference_program = compile_candidate(ast, device, ())
    reference_time = bench.run(reference_program)
    reference = bench.output()
    caps = device.renderer.capabilities
    heuristic = lower_to_linear(ast, device.renderer).opts
    result = SearchResult(heuristic, from_cache=False)
    timed: dict[tuple[Opt, ...], float] = {}
    programs: dict[tuple[Opt, ...], Callable[[list[Any]], None]] = {(): reference_program}
    seen: set[frozenset[Opt]] = set()

    def measure(opts: tuple[Opt, ...]) -> None:
        seen.add(frozenset(opts))
        try:
            program = compile_candidate(ast, device, opts)
        except OptError as e:
            result.failed.append((opts, f"invalid: {e}"))
            return
        except Exception as e:  # a compiler error, a lowering bug: the candidate is skipped, the search goes on
            result.failed.append((opts, f"{type(e).__name__}: {e}"))
            return
        result.tried += 1
        first = bench.run(program)
        if not bench.matches(bench.output(), reference):
            result.failed.append((opts, "wrong values"))
            return
        best = min(timed.values(), default=float("inf"))
        runs = [first] if first > SLOW_FACTOR * best else [bench.run(program) for _ in range(TIMING_RUNS)]
        timed[opts], programs[opts] = statistics.median(runs), program

    timed[()], result.tried = reference_time, 1
    seen.add(frozenset())
    if heuristic:
        measure(heuristic)
    deadline = deadline_clock() + SEARCH_BUDGET_S
    beam = sorted(timed, key=timed.__getitem__)[:width]
    moves = actions(ast, caps)
    lanes = caps.lanes(output_value(ast).dtype)
    while deadline_clock() < deadline:
        best_before = timed[beam[0]]
        for base in beam:
            for move in nearest_first(base, moves, lanes):
                # another amount for an opt the candidate has, else one more opt
                cand = tuple(move if (o.op, o.axis) == (move.op, move.axis) else o for o in base)
                if move not in cand:
                    cand += (move,)
                if frozenset(cand) in seen:
                    continue
                if deadline_clock() >= deadline:
                    break
                if not fits_registers(ast, cand, caps):
                    seen.add(frozenset(cand))
                    result.failed.append((cand, "its accumulators exceed the vector registers"))
                    continue
                measure(cand)
        beam = sorted(timed, key=timed.__getitem__)[:width]
        if timed[beam[0]] > best_before * (1 - MIN_IMPROVEMENT):
            break
    result.opts, final = _final_choice(bench, heuristic if heuristic in timed else (), timed, programs)
    result.time_before_s, result.time_after_s = final.get(heuristic, float("nan")), final[result.opts]
    if DEBUG >= 2:
        print(
            f"BEAM {kernel_name(ast)}: {result.tried} candidates run, {len(result.failed)} skipped,"
            f" {deadline_clock() - start_time:.1f}s; heuristic {list(heuristic)} {result.time_before_s * 1e6:.1f}us"
            f" -> {list(result.opts)} {result.time_after_s * 1e6:.1f}us"
        )
    return result


def _final_choice(
    bench: KernelBench,
    baseline: tuple[Opt, ...],
    timed: dict[tuple[Opt, ...], float],
    programs: dict[tuple[Opt, ...], Callable[[list[Any]], None]],
) -> tuple[tuple[Opt, ...], dict[tuple[Opt, ...], float]]:
    """(the winner, final medians): the FINAL_CANDIDATES fastest lists timed again in turns with the baseline (the
    heuristic's opts), FINAL_RUNS rounds; one replaces the baseline only when its median is MIN_WIN faster and it
    was faster in MIN_ROUND_WINS of the rounds."""
    best_time = min(timed.values())
    ranked = sorted((o for o in timed if o != baseline and timed[o] <= SLOW_FACTOR * best_time), key=timed.__getitem__)
    finalists = ranked[:FINAL_CANDIDATES]
    contenders = [baseline, *finalists]
    runs: dict[tuple[Opt, ...], list[float]] = {o: [] for o in contenders}
    for _ in range(FINAL_RUNS):
        for opts in contenders:
            runs[opts].append(bench.run(programs[opts]))
    final = {o: statistics.median(t) for o, t in runs.items()}
    rounds_won = {o: sum(a < b for a, b in zip(runs[o], runs[baseline])) for o in finalists}
    clear = [o for o in finalists if final[o] < final[baseline] * (1 - MIN_WIN) and rounds_won[o] >= MIN_ROUND_WINS]
    return min(clear, key=final.__getitem__, default=baseline), final


__all__ = [
    "beam_search",
    "SearchResult",
    "SearchTarget",
    "SEARCH_BUDGET_S",
    "cache_path",
    "actions",
    "compile_candidate",
    "nearest_first",
    "fits_registers",
]
