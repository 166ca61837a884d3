"""Control flow: If, Loop and Scan run their subgraphs once per branch or iteration, conditions read on the host."""

from __future__ import annotations

import numpy as np

from fusegrad.onnx.registry import C, T, op


def _run(n, graph, values: list) -> list:
    env = dict(n.env)
    for name, v in zip(graph.inputs, values):
        env[name] = v
    return n.runner.run_graph(graph, env)


@op("If")
def if_(n, cond):
    branch = n.a("then_branch") if bool(C(cond).reshape(-1)[0]) else n.a("else_branch")
    return tuple(_run(n, branch, []))


def _stack(parts: list, axis: int = 0):
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.stack(parts, axis)
    ts = [T(p) for p in parts]
    return ts[0].stack(*ts[1:], dim=axis) if len(ts) > 1 else ts[0].unsqueeze(axis)


@op("Loop")
def loop(n, trips=None, cond=None, *carried):
    body = n.a("body")
    limit = int(C(trips).reshape(-1)[0]) if trips is not None else None
    keep = bool(C(cond).reshape(-1)[0]) if cond is not None else True
    carried, scans, i = list(carried), None, 0
    while keep and (limit is None or i < limit):
        outs = _run(n, body, [np.array(i, dtype=np.int64), np.array(keep)] + carried)
        keep = bool(C(outs[0]).reshape(-1)[0])
        carried = outs[1 : 1 + len(carried)]
        step = outs[1 + len(carried) :]
        scans = [[] for _ in step] if scans is None else scans
        for acc, v in zip(scans, step):
            acc.append(v)
        i += 1
    n_scan = n.num_outputs - len(carried)
    if scans is None:
        scans = [[] for _ in range(n_scan)]
    stacked = [_stack(s) if s else np.zeros((0,), dtype=np.float32) for s in scans]
    return tuple(carried) + tuple(stacked)


@op("Scan")
def scan(n, *args):
    if n.opset < 9:
        return _scan8(n, *args)
    body = n.a("body")
    m = n.a("num_scan_inputs")
    states, xs = list(args[: len(args) - m]), [T(x) for x in args[len(args) - m :]]
    in_axes = n.a("scan_input_axes") or [0] * m
    in_dirs = n.a("scan_input_directions") or [0] * m
    n_out = n.num_outputs - len(states)
    out_axes = n.a("scan_output_axes") or [0] * n_out
    out_dirs = n.a("scan_output_directions") or [0] * n_out
    xs = [x.flip(a % x.ndim) if d else x for x, a, d in zip(xs, in_axes, in_dirs)]
    steps = xs[0].shape[in_axes[0] % xs[0].ndim]
    outs: list[list] = [[] for _ in range(n_out)]
    for t in range(steps):
        sl = [x[(slice(None),) * (a % x.ndim) + (t,)] for x, a in zip(xs, in_axes)]
        res = _run(n, body, states + sl)
        states = res[: len(states)]
        for acc, v in zip(outs, res[len(states) :]):
            acc.append(v)
    stacked = []
    for acc, a, d in zip(outs, out_axes, out_dirs):
        y = T(_stack(acc, 0))
        a = a % y.ndim
        if a:
            y = y.permute(*range(1, a + 1), 0, *range(a + 1, y.ndim))
        stacked.append(y.flip(a) if d else y)
    return tuple(states) + tuple(stacked)


def _scan8(n, lens, *args):
    """Scan before opset 9: axis 0 of every state and scan input is a batch, each sample scanned on its own along
    axis 1 for its sequence_lens steps; its scan outputs are zero-padded to the longest sequence."""
    body = n.a("body")
    m = n.a("num_scan_inputs")
    states, xs = [T(s) for s in args[: len(args) - m]], [T(x) for x in args[len(args) - m :]]
    dirs = n.a("directions") or [0] * m
    batch, longest = xs[0].shape[0], xs[0].shape[1]
    steps = [int(v) for v in C(lens).reshape(-1)] if lens is not None else [longest] * batch
    final: list[list] = [[] for _ in states]
    scanned: list[list] = [[] for _ in range(n.num_outputs - len(states))]
    for b in range(batch):
        st, outs = [s[b] for s in states], [[] for _ in scanned]
        for t in range(steps[b]):
            res = _run(n, body, st + [x[b, steps[b] - 1 - t if d else t] for x, d in zip(xs, dirs)])
            st = list(res[: len(st)])
            for acc, v in zip(outs, res[len(st) :]):
                acc.append(T(v))
        for acc, v in zip(final, st):
            acc.append(T(v))
        for acc, parts in zip(scanned, outs):
            y = _stack(parts, 0)
            acc.append(y.pad(((0, longest - steps[b]),) + ((0, 0),) * (y.ndim - 1)))
    return tuple(_stack(acc, 0) for acc in final) + tuple(_stack(acc, 0) for acc in scanned)
