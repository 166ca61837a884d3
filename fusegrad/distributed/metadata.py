"""Ranks that disagree on what they communicate fail with an error naming the rank and the tensor: each side encodes
its (collective, op, root, dtype, shape) as a row of ints, the rows are all-gathered and compared with rank 0's."""

from __future__ import annotations
from typing import Any, Callable

import numpy as np

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import DIST_BLOCKING, DIST_CHECK, DIST_TIMEOUT
from fusegrad.distributed.comm import DistributedError, Watched, World

KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "parameters")
OPS = ("", "sum", "mean", "max", "min")
MAX_DIMS = 8
# collective number, kind, op, root, dtype, ndim, dims (a longer shape folds its tail into the last dim)
ROW = 6 + MAX_DIMS


def encode(call: int, kind: str, op: str, root: int, dtype: DType, shape: tuple[int, ...]) -> list[int]:
    dims = list(shape[: MAX_DIMS - 1]) + ([int(np.prod(shape[MAX_DIMS - 1 :]))] if len(shape) >= MAX_DIMS else [])
    row = [call, KINDS.index(kind), OPS.index(op), root, dtypes.all.index(dtype), len(shape), *dims]
    return row + [-1] * (ROW - len(row))


def describe(row: np.ndarray) -> str:
    call, kind, op, root, dt, ndim = (int(x) for x in row[:6])
    shape = tuple(int(d) for d in row[6 : 6 + min(ndim, MAX_DIMS)])
    if KINDS[kind] == "parameters" and root == -1:  # compare()'s first row
        return f"a check of {shape[0]} tensors as collective #{call + 1}"
    how = f"({OPS[op]})" if OPS[op] else f"(root={root})" if KINDS[kind] == "broadcast" else ""
    return f"{KINDS[kind]}{how} of {str(dtypes.all[dt]).removeprefix('dtypes.')} {shape} as collective #{call + 1}"


def gather_rows(w: World, rows: np.ndarray, what: str) -> np.ndarray:
    """Every rank's rows (the same count on each, which the caller checked) as (size, n, ROW)."""
    out, rows = np.empty((w.size, *rows.shape), np.int64), np.ascontiguousarray(rows, np.int64)
    if w.can_block and int(DIST_BLOCKING.value) > 0:  # a few hundred bytes: a blocking call is fastest
        w.call(lambda: w.meta.Allgather(rows, out), f"the metadata check of {what}")
    else:
        w.wait([w.meta.Iallgather(rows, out)], f"the metadata check of {what}")
    return out


def compare(w: World, rows: np.ndarray, what: str, label: Callable[[int], str]) -> None:
    """Raise on every rank alike when some rank's rows differ from rank 0's; label(i) names row i's tensor (or is
    empty for a single row). A first row of the same size as a collective's says how many rows follow."""
    header = np.array([encode(w.calls, "parameters", "", -1, dtypes.int64, (len(rows),))], np.int64)
    heads = gather_rows(w, header, what)
    counts = heads[:, 0, 6]
    if (heads[:, 0, 1] == KINDS.index("parameters")).all() and (bad := np.flatnonzero(counts != counts[0])).size:
        r = int(bad[0])
        raise DistributedError(f"ranks disagree in {what}: rank 0 has {counts[0]} tensors, rank {r} has {counts[r]}")
    check_table(heads, what, lambda i: "")
    check_table(gather_rows(w, rows, what), what, label)


def check_table(table: np.ndarray, what: str, label: Callable[[int], str]) -> None:
    """table (size, n, ROW): every rank's rows; raise naming the first rank and row that differ from rank 0's."""
    raw = table.tobytes()
    n = len(raw) // len(table)
    if raw == raw[:n] * len(table):  # every rank's rows alike: one bytes comparison, the per-call case
        return
    for r in range(1, len(table)):
        if (diff := np.flatnonzero((table[r] != table[0]).any(axis=1))).size:
            i = int(diff[0])
            raise DistributedError(
                f"ranks disagree in {what}{label(i)}: rank 0 calls {describe(table[0, i])}, "
                f"rank {r} calls {describe(table[r, i])}"
            )


class RowCheck:
    """The check of one eager collective (kind, op, root, dtype, shape, name), called again: its row, and the
    all-gather of the rows bound once to libmpi (a blocking call, watched like a collective's) where it can be."""

    def __init__(self, w: World, row: list[int], what: str, blocking: bool):
        self.w, self.what = w, what
        self.row, self.table = np.array([row], np.int64), np.empty((w.size, 1, ROW), np.int64)
        self.direct = w.lib.bind("all_gather", w.meta, None, 0, self.table, self.row) if blocking and w.lib else None
        self.watched = Watched(f"the metadata check of {what}", float(DIST_TIMEOUT.value))  # what the watchdog reads

    def __call__(self) -> None:
        w = self.w
        self.row[0, 0] = w.calls
        if self.direct is None:
            table = gather_rows(w, self.row, self.what)
        else:
            w.watched(self.watched, self.direct)
            table = self.table
        check_table(table, self.what, lambda i: "")


_checks: dict[tuple, RowCheck] = {}  # (world, kind, op, root, dtype, shape, name, ...) -> its check


def check_collective(w: World, kind: str, op: str, root: int, t: Any, what: str) -> None:
    """Before an eager collective (a TinyJit replay repeats a checked capture): one small all-gather of one row per
    rank, so ranks that called different collectives, or a different number of them, fail instead of mixing data."""
    if not int(DIST_CHECK.value):
        return
    blocking = w.can_block and int(DIST_BLOCKING.value) > 0  # a few hundred bytes: a blocking call is fastest
    key = (id(w), kind, op, root, t.dtype, t.shape, what, blocking, DIST_TIMEOUT.value)
    if (check := _checks.get(key)) is None or check.w is not w:
        if len(_checks) >= 256:  # the oldest goes
            _checks.pop(next(iter(_checks)))
        check = _checks[key] = RowCheck(w, encode(0, kind, op, root, t.dtype, t.shape), what, blocking)
    check()


def check_parameters(w: World, tensors: list[Any], what: str, names: list[str] | None = None) -> None:
    """Every rank has the same number of tensors with the same shapes and dtypes, in the same order."""
    if int(DIST_CHECK.value) == 0:
        return
    rows = np.array([encode(w.calls, "parameters", "", 0, t.dtype, t.shape) for t in tensors], np.int64).reshape(
        -1, ROW
    )
    compare(w, rows, what, lambda i: f" on {names[i]!r}" if names else f" on parameter {i}")


__all__ = ["check_collective", "check_parameters"]
