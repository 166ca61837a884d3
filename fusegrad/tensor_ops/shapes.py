"""Shape arithmetic shared by the Tensor mixins: validation, broadcasting, padding arguments."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


MAX_NUMEL = 2**63 - 1


def is_index(x: Any) -> bool:
    """A Python or numpy int (bools, floats and numpy floats are not)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def as_index(name: str, x: Any) -> int:
    """x as an int argument of `name`; anything else is a TypeError, as torch."""
    if not is_index(x):
        raise TypeError(f"{name}() needs an int, got {type(x).__name__} {x!r}")
    return int(x)


def check_shape(shape: tuple) -> tuple[int, ...]:
    for d in shape:
        if not is_index(d):
            raise TypeError(f"shape {shape} must contain ints, got {d!r}")
        if d < 0:
            raise ValueError(f"negative dimension in shape {shape}")
    numel = 1
    for d in shape:
        numel *= int(d)
    if numel > MAX_NUMEL:
        # kernels index elements with int64; like torch's "numel: integer multiplication overflow"
        raise RuntimeError(f"shape {shape} has {numel} elements, more than fusegrad can index (2**63 - 1)")
    return tuple(int(d) for d in shape)


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {a} and {b} cannot be broadcast together")
        out.append(y if x == 1 else x)
    return tuple(out)


def pad_pairs(padding: Sequence[Any], ndim: int) -> tuple[tuple[int, int], ...]:
    """Flat torch-order (left_last, right_last, ...) or per-dim ((before, after) | None, ...) -> per-dim pairs."""
    per_dim = all(isinstance(p, (tuple, list)) or p is None for p in padding) and len(padding) == ndim and ndim
    flat = [x for p in padding if isinstance(p, (tuple, list)) for x in p] + [
        p for p in padding if not isinstance(p, (tuple, list)) and (p is not None or not per_dim)
    ]
    if not all(is_index(x) for x in flat):
        bad = next(x for x in flat if not is_index(x))
        raise TypeError(f"padding {tuple(padding)} must contain ints, got {type(bad).__name__} {bad!r}")
    if per_dim:
        if any(p is not None and len(p) != 2 for p in padding):
            raise ValueError(f"padding {tuple(padding)} must have one (before, after) pair per dim")
        return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
    if len(padding) % 2 or len(padding) > 2 * ndim or not all(is_index(p) for p in padding):
        raise ValueError(f"padding {tuple(padding)} must be flat pairs (even length <= {2 * ndim}) or one pair per dim")
    pairs = [(int(padding[i]), int(padding[i + 1])) for i in range(0, len(padding), 2)][::-1]
    return tuple([(0, 0)] * (ndim - len(pairs)) + pairs)
