"""Ranks that disagree on what they communicate fail with an error naming the rank and the tensor: each side encodes
its (collective, op, root, dtype, shape) as a row of ints, the rows are all-gathered and compared with rank 0's."""

from __future__ import annotations
from typing import Any, Callable

import numpy as np

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import DIST_CHECK
from fusegrad.distributed.comm import DistributedError, World

KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "parameters")
OPS = ("", "sum", "mean", "max", "min")
MAX_DIMS = 8
ROW = 5 + MAX_DIMS  # kind, op, root, dtype, ndim, dims (a longer shape folds its tail into the last dim)
_seen: set[tuple] = set()  # signatures this rank has checked already (FUSEGRAD_DIST_CHECK=1)


def encode(kind: str, op: str, root: int, dtype: DType, shape: tuple[int, ...]) -> list[int]:
    dims = list(shape[: MAX_DIMS - 1]) + ([int(np.prod(shape[MAX_DIMS - 1 :]))] if len(shape) >= MAX_DIMS else [])
    row = [KINDS.index(kind), OPS.index(op), root, dtypes.all.index(dtype), len(shape), *dims]
    return row + [-1] * (ROW - len(row))


def describe(row: np.ndarray) -> str:
    kind, op, root, dt, ndim = (int(x) for x in row[:5])
    shape = tuple(int(d) for d in row[5 : 5 + min(ndim, MAX_DIMS)])
    how = f"({OPS[op]})" if OPS[op] else f"(root={root})" if KINDS[kind] == "broadcast" else ""
    return f"{KINDS[kind]}{how} of {dtypes.all[dt]} {shape}"


def gather_rows(w: World, rows: np.ndarray, what: str) -> np.ndarray:
    """Every rank's rows (the same count on each, which the caller checked) as (size, n, ROW)."""
    out = np.empty((w.size, *rows.shape), np.int64)
    w.wait([w.meta.Iallgather(np.ascontiguousarray(rows, np.int64), out)], f"the metadata check of {what}")
    return out


def compare(w: World, rows: np.ndarray, what: str, label: Callable[[int], str]) -> None:
    """Raise on every rank alike when some rank's rows differ from rank 0's; label(i) names row i's tensor."""
    counts = gather_rows(w, np.array([len(rows)], np.int64), what).reshape(-1)
    if (bad := np.flatnonzero(counts != counts[0])).size:
        r = int(bad[0])
        raise DistributedError(
            f"ranks disagree in {what}: rank 0 has {counts[0]} tensors, rank {r} has {counts[r]}"
        )
    table = gather_rows(w, rows, what)
    for r in range(1, w.size):
        if (diff := np.flatnonzero((table[r] != table[0]).any(axis=1))).size:
            i = int(diff[0])
            raise DistributedError(
                f"ranks disagree in {what} on {label(i)}: rank 0 calls {describe(table[0, i])}, "
                f"rank {r} calls {describe(table[r, i])}"
            )


def check_collective(w: World, kind: str, op: str, root: int, t: Any, what: str) -> None:
    """At a collective this rank has not checked before (or every one, FUSEGRAD_DIST_CHECK=2)."""
    level = int(DIST_CHECK.value)
    sig = (kind, op, root, t.dtype, t.shape)
    if level == 0 or (level == 1 and sig in _seen):
        return
    compare(w, np.array([encode(kind, op, root, t.dtype, t.shape)]), what, lambda i: "the tensor")
    _seen.add(sig)


def check_parameters(w: World, tensors: list[Any], what: str) -> None:
    """Every rank has the same number of tensors with the same shapes and dtypes, in the same order."""
    if int(DIST_CHECK.value) == 0:
        return
    rows = np.array([encode("parameters", "", 0, t.dtype, t.shape) for t in tensors], np.int64).reshape(-1, ROW)
    compare(w, rows, what, lambda i: f"parameter {i}")


__all__ = ["check_collective", "check_parameters"]
