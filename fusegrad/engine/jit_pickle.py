"""Pickling a captured TinyJit step: kernels travel as their ASTs and opts (compiled again, from the disk cache when
it has them, on load), buffers as their contents, except intermediates (only their place in an arena) and inputs
(only their shape: every replay brings its own)."""

from __future__ import annotations
import copyreg
from typing import Any
from fusegrad.lazy_numpy import np
from fusegrad.engine.jit_program import CapturedJit, GraphStep, IndexCheckRunner, Launch
from fusegrad.engine.realize import Runner
from fusegrad.dtype import dtypes
from fusegrad.runtime.device import Buffer, Device
from fusegrad.runtime.buffers import buffer_of, buffer_uop
from fusegrad.uop.ops import Ops, UOp


def _encode_view(u: UOp, index: dict[Buffer, int]) -> Any:
    """A tensor's view as nested tuples with ("buffer", i) leaves, so loading builds fresh BUFFER nodes."""
    if u.op is Ops.BUFFER:
        return ("buffer", index[buffer_of[u]])
    return (u.op, u.dtype, u.arg, tuple(_encode_view(s, index) for s in u.src))


def _decode_view(code: Any, bases: list[UOp]) -> UOp:
    if code[0] == "buffer":
        return bases[code[1]]
    op, dtype, arg, src = code
    return UOp(op, dtype, tuple(_decode_view(s, bases) for s in src), arg)


def _leaf_buffers(frozen: Any, out: list[Buffer]) -> None:
    if type(frozen) is tuple and len(frozen) == 2 and isinstance(frozen[0], UOp):
        out.extend(buffer_of[u] for u in frozen[0].toposort() if u.op is Ops.BUFFER)
    elif isinstance(frozen, (list, tuple)):
        for x in frozen:
            _leaf_buffers(x, out)
    elif isinstance(frozen, dict):
        for x in frozen.values():
            _leaf_buffers(x, out)


def _map_leaves(frozen: Any, fn: Any) -> Any:
    if type(frozen) is tuple and len(frozen) == 2 and (isinstance(frozen[0], UOp) or frozen[0] == "view"):
        return fn(frozen)
    if isinstance(frozen, list):
        return [_map_leaves(x, fn) for x in frozen]
    if isinstance(frozen, tuple):
        items = (_map_leaves(x, fn) for x in frozen)
        return tuple(items) if type(frozen) is tuple else type(frozen)(*items)
    if isinstance(frozen, dict):
        return {k: _map_leaves(x, fn) for k, x in frozen.items()}
    return frozen


def captured_state(cap: Any) -> dict:
    inputs = set(cap.input_buffers)
    table: list[Buffer] = []
    index: dict[Buffer, int] = {}
    returned: list[Buffer] = []
    _leaf_buffers(cap.returns, returned)
    for b in [*cap.input_buffers, *(b for la in cap.launches for b in la.buffers), *returned, *cap.rng_buffers]:
        if b not in index:
            index[b] = len(table)
            table.append(b)
    buffers = []
    for b in table:
        if b in inputs:
            buffers.append(("input", b.device, b.size, b.dtype, None))
        elif b in cap.placement:
            buffers.append(("planned", b.device, b.size, b.dtype, cap.placement[b]))
        else:
            buffers.append(("data", b.device, b.size, b.dtype, b.host_view().copy()))
    launches = [
        (
            None
            if la.runner is None
            else ("check", la.runner.check)
            if isinstance(la.runner, IndexCheckRunner)
            else (la.runner.device, la.ast, la.runner.info.opts),
            [index[b] for b in la.buffers],
        )
        for la in cap.launches
    ]
    return {
        "buffers": buffers,
        "arenas": [(a.device, a.size) for a in cap.arenas],
        "launches": launches,
        "inputs": [index[b] for b in cap.input_buffers],
        "layout": cap.layout,
        "returns": _map_leaves(cap.returns, lambda f: ("view", (_encode_view(f[0], index), f[1]))),
        "planned": (cap.planned_from, cap.planned_to),
        "var_vals": cap._last_vals,  # the values the kernels' variable buffers hold now
        "rng": ([index[b] for b in cap.rng_buffers], cap.rng_calls),
    }


def captured_from_state(state: dict, use_graphs: bool) -> CapturedJit:
    from fusegrad.codegen import lower_to_linear  # loaded when a step is unpickled, not at import

    arenas = [Buffer(device, size, dtypes.uint8).ensure_allocated() for device, size in state["arenas"]]
    table: list[Buffer] = []
    placement: dict[Buffer, tuple[int, int]] = {}
    for kind, device, size, dtype, extra in state["buffers"]:
        if kind == "planned":
            arena, offset = extra
            b = Buffer(device, size, dtype)
            b.use_external(arenas[arena].host_view()[offset : offset + b.nbytes])
            placement[b] = extra
        else:
            b = Buffer(device, size, dtype, initial=np.asarray(extra) if kind == "data" else None).ensure_allocated()
        table.append(b)
    bases = [buffer_uop(b) for b in table]
    launches = []
    for program, idx in state["launches"]:
        runner = None
        if program is not None and program[0] == "check":
            runner = IndexCheckRunner(program[1])
        elif program is not None:
            device, ast, opts = program
            info = lower_to_linear(ast, Device[device].renderer, opts=opts)
            runner = Runner(info, Device[device].build(info), device)
        ast = program[1] if program is not None and program[0] != "check" else None
        launches.append(Launch(runner, [table[i] for i in idx], ast))
    cap = CapturedJit(
        launches,
        [table[i] for i in state["inputs"]],
        state["layout"],
        _map_leaves(state["returns"], lambda f: (_decode_view(f[1][0], bases), f[1][1])),
        [bases[i] for i in state["inputs"]],
        var_vals=state["var_vals"],
        rng_buffers=[table[i] for i in state["rng"][0]],
        rng_calls=state["rng"][1],
    )
    cap.arenas, cap.placement = arenas, placement
    cap.planned_from, cap.planned_to = state["planned"]
    cap.build_steps(use_graphs)
    return cap


def _reduce_captured(cap: CapturedJit) -> tuple:
    return captured_from_state, (captured_state(cap), any(isinstance(s, GraphStep) for s in cap.steps))


copyreg.pickle(CapturedJit, _reduce_captured)  # registered here, so jit_program knows nothing of pickling
