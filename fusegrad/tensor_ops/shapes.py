"""Shape arithmetic shared by the Tensor mixins: validation, broadcasting, padding arguments."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def check_shape(shape: tuple) -> tuple[int, ...]:
    for d in shape:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise TypeError(f"shape {shape} must contain ints, got {d!r}")
        if d < 0:
            raise ValueError(f"negative dimension in shape {shape}")
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
    if all(isinstance(p, (tuple, list)) or p is None for p in padding) and len(padding) == ndim and ndim:
        return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
    if len(padding) % 2 or len(padding) > 2 * ndim or not all(isinstance(p, int) for p in padding):
        raise ValueError(f"padding {tuple(padding)} must be flat pairs (even length <= {2 * ndim}) or one pair per dim")
    pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)][::-1]
    return tuple([(0, 0)] * (ndim - len(pairs)) + pairs)
