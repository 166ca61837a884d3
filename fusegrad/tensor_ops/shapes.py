"""Shape arithmetic shared by the Tensor mixins: validation, broadcasting, padding arguments."""

from __future__ import annotations

from typing import Any, Sequence

from fusegrad.lazy_numpy import np

from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.sint import bound_value, canonical, smax, sym_str


MAX_NUMEL = 2**63 - 1


def is_index(x: Any) -> bool:
    """A Python or numpy int (bools, floats and numpy floats are not)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def as_index(name: str, x: Any) -> int:
    """x as an int argument of `name`; anything else is a TypeError, as torch."""
    if not is_index(x):
        raise TypeError(f"{name}() needs an int, got {type(x).__name__} {x!r}")
    return int(x)


def is_size(x: Any) -> bool:
    """An int, or a symbolic integer over bound variables."""
    return is_index(x) or isinstance(x, UOp)


def check_sym(name: str, x: UOp) -> Any:
    """A symbolic size or bound, simplified: an integer expression whose variables are all bound."""
    from fusegrad.dtype import dtypes

    if unbound := [n for n in x.toposort(gate=lambda u: u.op is not Ops.BIND) if n.op is Ops.DEFINE_VAR]:
        raise AssertionError(f"{name}: Variable {unbound[0].arg[0]!r} must be bound (v.bind(value)) to be a size")
    leaves = x.toposort(gate=lambda u: u.op is not Ops.BIND)
    if not dtypes.is_int(x.dtype) or any(n.op not in GroupOp.ALU | {Ops.BIND, Ops.CONST} for n in leaves):
        raise TypeError(f"{name}: a symbolic size is an integer expression over bound Variables, got {sym_str(x)}")
    return canonical(x)


class ShapeError(ValueError, RuntimeError):
    """Sizes or arguments of the right type that do not fit together: a ValueError as tinygrad raises, and a
    RuntimeError as torch raises for the same calls."""


def check_shape(shape: tuple) -> tuple[Any, ...]:
    shape = tuple(check_sym(f"shape {tuple(sym_str(d) for d in shape)}", d) if isinstance(d, UOp) else d for d in shape)
    for d in shape:
        if isinstance(d, (tuple, list)) and len(shape) > 1:  # alone it is a wrong type (torch's TypeError, below)
            raise ShapeError(f"shape {shape}: a size tuple is the only argument or none is, got {d!r} among sizes")
        if not is_size(d):
            raise TypeError(f"shape {shape} must contain ints, got {d!r}")
        if bound_value(d) < 0:
            raise ValueError(f"negative dimension in shape {shape}")
    numel = 1
    for d in shape:
        numel *= smax(d)
    if numel > MAX_NUMEL:
        # kernels index elements with int64; like torch's "numel: integer multiplication overflow"
        raise RuntimeError(f"shape {shape} has {numel} elements, more than fusegrad can index (2**63 - 1)")
    return tuple(d if isinstance(d, UOp) else int(d) for d in shape)


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
    if not all(is_size(x) for x in flat):
        bad = next(x for x in flat if not is_size(x))
        raise TypeError(f"padding {tuple(padding)} must contain ints, got {type(bad).__name__} {bad!r}")
    if per_dim:
        if any(p is not None and len(p) != 2 for p in padding):
            raise ValueError(f"padding {tuple(padding)} must have one (before, after) pair per dim")
        return tuple((0, 0) if p is None else (_pad_amount(p[0]), _pad_amount(p[1])) for p in padding)
    if len(padding) % 2 or len(padding) > 2 * ndim or not all(is_size(p) for p in padding):
        raise ValueError(f"padding {tuple(padding)} must be flat pairs (even length <= {2 * ndim}) or one pair per dim")
    pairs = [(_pad_amount(padding[i]), _pad_amount(padding[i + 1])) for i in range(0, len(padding), 2)][::-1]
    return tuple([(0, 0)] * (ndim - len(pairs)) + pairs)


def _pad_amount(x: Any) -> Any:
    if not isinstance(x, UOp):
        return int(x)
    x = check_sym("pad", x)
    if isinstance(x, UOp) and x.vmin < 0:
        raise ValueError(f"a symbolic pad amount must be >= 0 for every value of its variables, got {sym_str(x)}")
    return x
