"""Sequence ops: an ONNX sequence of tensors is a Python list of values (each a Tensor or a numpy constant)."""

from __future__ import annotations

import numpy as np

from fusegrad.onnx.ops.shape import concat, split
from fusegrad.onnx.registry import C, T, axis_of, op


def _pos(n, seq, pos, default: int) -> int:
    """A position counted from the back when negative; SequenceInsert takes [-n, n] (n: before the end, -1: before
    the last tensor), the others [-n, n - 1]."""
    p = int(C(pos).reshape(-1)[0]) if pos is not None else default
    if not -len(seq) <= p <= len(seq) - (n.op_type != "SequenceInsert"):
        raise IndexError(f"{n}: position {p} is out of range for a sequence of {len(seq)}")
    return p + len(seq) if p < 0 else p


@op("SequenceConstruct")
def sequence_construct(n, *xs):
    return list(xs)


@op("SequenceEmpty")
def sequence_empty(n):
    return []


@op("SequenceAt")
def sequence_at(n, seq, pos):
    return seq[_pos(n, seq, pos, 0)]


@op("SequenceInsert")
def sequence_insert(n, seq, x, pos=None):
    out = list(seq)
    out.insert(_pos(n, seq, pos, len(seq)), x)
    return out


@op("SequenceErase")
def sequence_erase(n, seq, pos=None):
    out = list(seq)
    del out[_pos(n, seq, pos, len(seq) - 1)]
    return out


@op("SequenceLength")
def sequence_length(n, seq):
    return np.array(len(seq), dtype=np.int64)


@op("SplitToSequence")
def split_to_sequence(n, x, sizes=None):
    axis = axis_of(n.a("axis", 0), x.ndim, n)
    if sizes is None:
        parts = [
            T(x)[(slice(None),) * axis + (i,)]
            if not n.a("keepdims", 1)
            else T(x)[(slice(None),) * axis + (slice(i, i + 1),)]
            for i in range(x.shape[axis])
        ]
        return parts
    s = C(sizes)
    if s.ndim == 0:
        k = int(s)
        s = np.array([k] * (x.shape[axis] // k) + ([x.shape[axis] % k] if x.shape[axis] % k else []))
    return list(split(_Fixed(n, axis), x, s))


class _Fixed:
    """A node view with a fixed axis and no `split` attribute, for reusing Split's code."""

    def __init__(self, n, axis: int):
        self.n, self.axis = n, axis
        self.num_outputs = 0

    def a(self, key, default=None):
        return self.axis if key == "axis" else default

    def __repr__(self) -> str:
        return repr(self.n)


@op("ConcatFromSequence")
def concat_from_sequence(n, seq):
    axis = n.a("axis")
    if n.a("new_axis", 0):
        xs = [T(x) for x in seq]
        return xs[0].stack(*xs[1:], dim=axis_of(axis, xs[0].ndim + 1, n))
    return concat(n, *seq)


@op("SequenceMap")
def sequence_map(n, seq, *extra):
    body = n.a("body")
    outs: list[list] = [[] for _ in body.outputs]
    for i in range(len(seq)):
        args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
        env = dict(n.env)
        env.update(zip(body.inputs, args))
        for acc, v in zip(outs, n.runner.run_graph(body, env)):
            acc.append(v)
    return tuple(outs)
