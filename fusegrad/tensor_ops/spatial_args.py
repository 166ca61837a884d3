"""Per-spatial-dim arguments of convolutions and pools (kernel, stride, dilation, padding): checked and normalised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusegrad.helpers import flatten
from fusegrad.tensor_ops.shapes import is_index

IntOrInts = int | Sequence[int]


def flat_tuple(pieces: Any) -> tuple:
    return tuple(flatten(pieces))


def per_dim(value: IntOrInts, n: int, name: str) -> tuple[int, ...]:
    """An int or one value per spatial dim -> a tuple of n ints."""
    out = (value,) * n if is_index(value) else tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not all(is_index(v) for v in out):
        raise TypeError(f"{name}={value!r} must be an int or {n} ints (one per spatial dim)")
    if len(out) != n:
        raise ValueError(f"{name}={value!r} must be an int or {n} ints (one per spatial dim)")
    return tuple(int(v) for v in out)


def positive(value: IntOrInts, n: int, name: str) -> tuple[int, ...]:
    out = per_dim(value, n, name)
    if any(v <= 0 for v in out):
        raise RuntimeError(f"{name} must be positive, got {value!r}")
    return out


def padding_pairs(padding: IntOrInts, n: int) -> tuple[tuple[int, int], ...]:
    """An int, one value per spatial dim, or a flat torch-order list (left, right, top, bottom, ...)
    -> per-dim pairs."""
    if is_index(padding):
        return ((int(padding), int(padding)),) * n
    pads = tuple(padding) if isinstance(padding, (tuple, list)) else (padding,)
    if not all(is_index(p) for p in pads):
        raise TypeError(f"padding={padding!r} must contain ints")
    pads = tuple(int(p) for p in pads)
    if len(pads) == n:
        return tuple((p, p) for p in pads)
    if len(pads) == 2 * n:
        return tuple((pads[2 * i], pads[2 * i + 1]) for i in range(n))[::-1]
    raise ValueError(f"padding={padding!r} must be an int, {n} values or {2 * n} values (torch order) for {n} dims")
