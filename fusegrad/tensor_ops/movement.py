"""Movement: shape, layout, combine, tile and window (docs/api.md).

Everything here is built from the view primitives (RESHAPE PERMUTE EXPAND PAD SHRINK FLIP) plus WHERE, so the
gradients come from their rules and a chain of these ops stays one kernel."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fusegrad.dtype import dtypes, least_upper_dtype
from fusegrad.helpers import argfix, prod
from fusegrad.tensor_ops.base import TensorBase
from fusegrad.tensor_ops.pydata import check_py_values, py_scalar
from fusegrad.tensor_ops.shapes import MAX_NUMEL, ShapeError, as_index, check_shape, check_sym, is_index, pad_pairs
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.sint import bound_value, canonical, shape_str, smax, smin, sprod, ssub, sym_str

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool
PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _rearrange_side(side: str) -> list[list[str] | str]:
    """One side of an einops formula as top-level items: a list of axis names (a group; `()` and `1` are empty)
    or '...'."""
    tokens = re.findall(r"\.\.\.|\(|\)|[A-Za-z_]\w*|\d+|\S", side)
    items: list[list[str] | str] = []
    group: list[str] | None = None
    for tok in tokens:
        if tok == "(":
            if group is not None:
                raise ValueError(f"nested parentheses in rearrange pattern {side!r}")
            group = []
        elif tok == ")":
            if group is None:
                raise ValueError(f"unbalanced ')' in rearrange pattern {side!r}")
            items.append(group)
            group = None
        elif tok == "...":
            if group is not None:
                raise ValueError(f"'...' inside parentheses is not supported in rearrange pattern {side!r}")
            items.append(tok)
        elif tok.isdigit():
            if tok != "1":
                raise ValueError(f"only the anonymous axis 1 is supported in rearrange, got {tok!r} in {side!r}")
            if group is None:
                items.append([])
        elif tok[0].isalpha() or tok[0] == "_":
            if group is None:
                items.append([tok])
            else:
                group.append(tok)
        else:
            raise ValueError(f"unexpected {tok!r} in rearrange pattern {side!r}")
    if group is not None:
        raise ValueError(f"unbalanced '(' in rearrange pattern {side!r}")
    return items


def permuted(u: UOp, order: tuple[int, ...], shape: tuple) -> UOp:
    """PERMUTE of u (of `shape`) by order, its shape recorded: a matmul's transposed weight is asked it at once."""
    out = UOp(Ops.PERMUTE, u.dtype, (u,), order)
    out._shape = tuple(shape[i] for i in order)
    return out


def _bound(x: Any) -> Any:
    """A shrink bound: an int, or a symbolic one (a bound Variable expression) in canonical form."""
    return canonical(check_sym("shrink", x)) if isinstance(x, UOp) else int(x)


class MovementMixin:
    # ------------------------------------------------------------------ G15: shape and layout
    def reshape(self, shape: Any, *args: Any) -> Tensor:
        if not args and type(shape) is tuple and (fast := self._reshape_sizes(shape)) is not None:
            return fast
        new = list(argfix(shape, *args))
        if any(d is None for d in new[self.ndim :]):
            raise ValueError(f"None in reshape {tuple(new)} has no dim to keep in {self.shape}")
        new = [self.shape[i] if d is None else d for i, d in enumerate(new)]
        if new.count(-1) > 1:
            raise RuntimeError(f"only one dimension can be inferred in reshape {tuple(new)}")
        if -1 in new:
            known = sprod(d for d in new if not isinstance(d, int) or d != -1)
            if isinstance(known, UOp) or isinstance(self.numel(), UOp):
                raise ValueError(f"cannot infer a -1 in reshape {tuple(new)} of a symbolic shape {self.shape}")
            if known == 0 or self.numel() % known:
                raise ValueError(f"cannot reshape {self.shape} into {tuple(new)}")
            new[new.index(-1)] = self.numel() // known
        shape_t = check_shape(tuple(new))
        if (numel := sprod(shape_t)) is not self.numel() and numel != self.numel():
            # symbolic counts agree when their forms do, or (a concrete buffer viewed symbolically) their bound values
            if (
                isinstance(numel, int)
                and isinstance(self.numel(), int)
                or bound_value(numel) != bound_value(self.numel())
                or smax(numel) > smax(self.numel())  # some value of the variables would read past the data
            ):
                raise ValueError(
                    f"cannot reshape {shape_str(self.shape)} ({sym_str(self.numel())} elements) into "
                    f"{shape_str(shape_t)}"
                )
        return self if shape_t == self.shape else self._new(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape_t))

    def _reshape_sizes(self, shape: tuple) -> Tensor | None:
        """reshape(shape) when shape is non-negative Python ints of the same element count as a concrete self: the
        check the general path makes, without its parsing (every matmul, broadcast and reduce reshapes); else None."""
        uop = self.uop
        if shape == (old := uop.shape):
            return self
        numel = 1
        for d in shape:
            if type(d) is not int or d < 0:
                return None
            numel *= d
        old_numel = 1
        for d in old:
            if type(d) is not int:
                return None
            old_numel *= d
        if numel != old_numel or numel > MAX_NUMEL:
            return None  # the general path names the error
        return self._new(UOp(Ops.RESHAPE, uop.dtype, (uop,), shape))

    def view(self, shape: Any, *args: Any) -> Tensor:
        return self.reshape(shape, *args)

    def expand(self, shape: Any, *args: Any) -> Tensor:
        new = argfix(shape, *args)
        if len(new) < self.ndim:
            raise ValueError(f"expand to {new} has fewer dims than {self.shape}")
        padded = (None,) * (len(new) - self.ndim) + self.shape
        target = tuple(s if d in (-1, None) else d for s, d in zip(padded, new))
        if any(t is None for t in target):
            raise ValueError(f"cannot keep a new leading dim with -1 in expand {new}")
        return self._broadcast_to(check_shape(target))

    def permute(self, order: Any, *args: Any) -> Tensor:
        order_t = tuple(self._axis(a) for a in argfix(order, *args))
        if sorted(order_t) != list(range(self.ndim)):
            raise RuntimeError(f"permute order {argfix(order, *args)} is not a permutation of {self.ndim} dims")
        return self if order_t == tuple(range(self.ndim)) else self._new(permuted(self.uop, order_t, self.shape))

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        a, b = self._axis(dim0), self._axis(dim1)
        if self.ndim == 0:
            return self
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        s, e = self._axis(start_dim), self._axis(end_dim)
        if self.ndim == 0:
            return self.reshape(1)
        if s > e:
            raise RuntimeError(f"flatten start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        return self.reshape(self.shape[:s] + (sprod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        d, sizes = self._axis(dim), list(sizes)
        if sizes.count(-1) > 1:
            raise RuntimeError(f"unflatten sizes {tuple(sizes)}: only one dimension can be inferred")
        known = prod(s for s in sizes if s != -1)
        if -1 in sizes and known and self.shape[d] % known == 0:
            sizes[sizes.index(-1)] = self.shape[d] // known
        if -1 in sizes or prod(sizes) != self.shape[d]:
            raise RuntimeError(
                f"unflatten sizes {tuple(sizes)} don't multiply up to the size {self.shape[d]} of dim {dim}"
            )
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(d for d in self.shape if d != 1))
        axes = self._axes(dim)
        if self.ndim == 0:
            return self
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes or s != 1))

    def unsqueeze(self, dim: int) -> Tensor:
        d = self._axis(dim, extra=1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
        if len(arg) != self.ndim:
            raise ValueError(f"shrink needs one entry per dim ({self.ndim}), got {len(arg)}")
        if any(a is not None and (len(a) != 2 or not all(is_index(x) or isinstance(x, UOp) for x in a)) for a in arg):
            raise TypeError(f"shrink bounds {tuple(arg)} must be (start, end) int pairs or None")
        bounds = tuple((0, s) if a is None else (_bound(a[0]), _bound(a[1])) for a, s in zip(arg, self.shape))
        for (b, e), s in zip(bounds, self.shape):
            # symbolic bounds are checked at the values their variables are bound to now
            if not 0 <= bound_value(b) <= bound_value(e) <= bound_value(s):
                shown = "(" + ", ".join(f"({sym_str(b)}, {sym_str(e)})" for b, e in bounds) + ")"
                shown = str(tuple(arg)) if all(isinstance(x, int) for p in bounds for x in p) else shown
                raise ValueError(f"shrink bounds {shown} are invalid for shape {shape_str(self.shape)}")
            # one kernel serves every value: the view must stay inside the largest shape for all of them
            if smin(b) < 0 or smax(e) > smax(s) or smin(ssub(e, b)) < 0:
                shown = "(" + ", ".join(f"({sym_str(b)}, {sym_str(e)})" for b, e in bounds) + ")"
                raise ValueError(
                    f"shrink bounds {shown} leave shape {shape_str(self.shape)} (at most "
                    f"{shape_str(self.max_shape)}) for some values in their variables' ranges"
                )
        if all(b == 0 and e is s or b == 0 and e == s for (b, e), s in zip(bounds, self.shape)):
            return self
        return self._new(UOp(Ops.SHRINK, self.dtype, (self.uop,), bounds))

    def shrink_to(self, shape: Any, *args: Any) -> Tensor:
        new = argfix(shape, *args)
        if len(new) != self.ndim:
            raise ValueError(f"shrink_to {new} needs one entry per dim of {self.shape}")
        if any(n is not None and not 0 <= n <= s for n, s in zip(new, self.shape)):
            raise ValueError(f"cannot shrink {self.shape} to {new}")
        return self.shrink(tuple(None if n is None else (0, n) for n in new))

    def flip(self, axis: Any, *args: Any) -> Tensor:
        axes = [self._axis(a) for a in argfix(axis, *args)]
        if len(set(axes)) != len(axes):
            raise RuntimeError(f"flip axis {argfix(axis, *args)} repeats a dimension")
        if not axes or self.ndim == 0:
            return self
        return self._new(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in axes for i in range(self.ndim))))

    def pad(
        self, padding: Sequence[int] | Sequence[tuple[int, int] | None], mode: str = "constant", value: Scalar = 0.0
    ) -> Tensor:
        if mode not in PAD_MODES:
            raise NotImplementedError(f"pad mode {mode!r} is not one of {PAD_MODES}")
        if mode != "constant" and value != 0:
            raise RuntimeError(f"pad mode {mode!r} doesn't take a value (got {value})")
        if dtypes.is_int(self.dtype):  # a fill the dtype cannot hold is refused like Tensor([value], dtype=...)
            value = check_py_values([py_scalar(value)], self.dtype)[0]
        pads = pad_pairs(padding, self.ndim)
        if any(isinstance(x, UOp) for p in pads for x in p) or any(isinstance(d, UOp) for d in self.shape):
            if mode != "constant" or any(bound_value(x) < 0 for p in pads for x in p):
                raise NotImplementedError(f"symbolic sizes pad only in constant mode by >= 0, got {mode!r} {pads}")
            return self._pad_const(pads, value)
        for (b, a), s in zip(pads, self.shape):
            if s + b + a < 0 or (mode == "circular" and s + min(b, 0) + min(a, 0) < 0):
                raise RuntimeError(f"padding {tuple(padding)} crops dim of size {s} to a negative size")
        pos, neg = tuple((max(b, 0), max(a, 0)) for b, a in pads), tuple((max(-b, 0), max(-a, 0)) for b, a in pads)
        # circular wraps around the cropped tensor; the other modes pad the original and crop the result, like torch
        if mode == "circular":
            return self._crop(neg)._pad_dims(pos, mode, tuple(padding))
        return (self._pad_const(pos, value) if mode == "constant" else self._pad_dims(pos, mode, tuple(padding)))._crop(
            neg
        )

    def _crop(self, amounts: tuple[tuple[int, int], ...]) -> Tensor:
        return self.shrink(tuple((b, s - a) for (b, a), s in zip(amounts, self.shape)))

    def _pad_dims(self, pads: tuple[tuple[int, int], ...], mode: str, padding: tuple) -> Tensor:
        t = self
        for d, (b, a) in enumerate(pads):
            if b or a:
                t = t._pad_dim(d, b, a, mode, padding)
        return t

    def _pad_dim(self, d: int, before: int, after: int, mode: str, padding: tuple) -> Tensor:
        """Pad dim d by reading the tensor itself: circular, reflect or replicate."""
        n = self.shape[d]
        if mode == "circular":
            if before > n or after > n:
                raise RuntimeError(f"circular padding {padding} wraps around dim {d} of size {n} more than once")
            return self._tile_dim(d, 3)._shrink_dim(d, n - before, 2 * n + after)
        if mode == "reflect":
            if before >= n or after >= n:
                raise RuntimeError(f"reflect padding {padding} must be smaller than dim {d} of size {n}")
            left, right = self._shrink_dim(d, 1, before + 1).flip(d), self._shrink_dim(d, n - 1 - after, n - 1).flip(d)
        else:
            if n == 0:
                raise RuntimeError(f"replicate padding {padding} of dim {d} with size 0")
            left, right = self._shrink_dim(d, 0, 1), self._shrink_dim(d, n - 1, n)
            left, right = left._expand_dim(d, before), right._expand_dim(d, after)
        return left.cat(self, right, dim=d)

    def _pad_const(self, pads: tuple[tuple[int, int], ...], value: Scalar) -> Tensor:
        if all(p == (0, 0) for p in pads):
            return self
        out = self._new(UOp(Ops.PAD, self.dtype, (self.uop,), pads))
        if value == 0 and math.copysign(1, value) > 0:
            return out  # -0.0 is a value to fill, not PAD's zero
        inside = type(self).ones(self.shape, dtype=dtypes.bool, device=self.device)._pad_const(pads, 0)
        return inside._select(out, type(self)._filled(out.shape, value, self.dtype, self.device))

    def pad_to(self, shape: Any, *args: Any, value: Scalar = 0) -> Tensor:
        new = argfix(shape, *args)
        if len(new) != self.ndim:
            raise ValueError(f"pad_to {new} needs one entry per dim of {self.shape}")
        if any(n is not None and n < s for n, s in zip(new, self.shape)):
            raise ValueError(f"cannot pad {self.shape} to {new}")
        return self.pad(tuple((0, 0 if n is None else n - s) for n, s in zip(new, self.shape)), value=value)

    def rearrange(self, formula: str, **sizes: int) -> Tensor:
        if formula.count("->") != 1:
            raise ValueError(f"rearrange pattern {formula!r} needs exactly one '->'")
        lhs, rhs = (_rearrange_side(side) for side in formula.split("->"))
        n_ell = self.ndim - (len(lhs) - 1) if "..." in lhs else 0
        if ("..." in lhs) != ("..." in rhs) or lhs.count("...") > 1 or rhs.count("...") > 1:
            raise ValueError(f"'...' must appear once on both sides or not at all in {formula!r}")
        if n_ell < 0 or ("..." not in lhs and len(lhs) != self.ndim):
            raise ValueError(f"rearrange pattern {formula!r} does not match a tensor of shape {self.shape}")
        ell = [f"...{i}" for i in range(n_ell)]
        lhs_groups = [g for item in lhs for g in ([[e] for e in ell] if item == "..." else [item])]
        rhs_groups = [g for item in rhs for g in ([[e] for e in ell] if item == "..." else [item])]
        lhs_names, rhs_names = [n for g in lhs_groups for n in g], [n for g in rhs_groups for n in g]
        if (
            len(set(lhs_names)) != len(lhs_names)
            or len(set(rhs_names)) != len(rhs_names)
            or set(lhs_names) != set(rhs_names)
        ):
            raise ValueError(f"rearrange pattern {formula!r} must name each axis once on each side")
        if unknown := set(sizes) - set(lhs_names):
            raise ValueError(f"rearrange sizes {sorted(unknown)} are not axes of {formula!r}")
        dims = dict(sizes)
        for group, size in zip(lhs_groups, self.shape):
            missing = [n for n in group if n not in dims]
            if len(missing) > 1:
                raise ValueError(f"rearrange cannot infer both {missing} in {formula!r}; give their sizes")
            known = prod(dims[n] for n in group if n in dims)
            if missing and known and size % known == 0:
                dims[missing[0]] = size // known
            if any(n not in dims for n in group) or prod(dims[n] for n in group) != size:
                raise ValueError(
                    f"rearrange axes {group} with sizes {sizes} do not split dim of size {size} in {formula!r}"
                )
        t = self.reshape(tuple(dims[n] for n in lhs_names)).permute(tuple(lhs_names.index(n) for n in rhs_names))
        return t.reshape(tuple(prod(dims[n] for n in g) for g in rhs_groups))

    # ------------------------------------------------------------------ G16: combine, tile and window
    def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
        tensors = _tensor_list(self, args)
        out_dt = least_upper_dtype(*(t.dtype for t in tensors))
        if any(t.shape != (0,) for t in tensors):
            tensors = [t for t in tensors if t.shape != (0,)]  # legacy torch: skipped
        first = tensors[0]
        if first.ndim == 0:
            raise ShapeError("zero-dimensional tensors cannot be concatenated")
        d = first._axis(dim)
        for i, t in enumerate(tensors):
            if t.device != first.device:
                raise RuntimeError(f"cat of tensors on different devices: {first.device} and {t.device}")
            if t.ndim != first.ndim or any(a != b for j, (a, b) in enumerate(zip(t.shape, first.shape)) if j != d):
                raise RuntimeError(
                    f"cat along dim {dim}: tensor {i} has shape {t.shape}, tensor 0 has shape {first.shape}"
                )
        pieces = [t.cast(out_dt) for t in tensors if t.shape[d]]
        if not pieces:
            return first.cast(out_dt)
        total, offset, out = sum(t.shape[d] for t in pieces), 0, None
        # every piece is padded into place and selected where it lies: one fused elementwise kernel, exact values
        for t in pieces:
            pads = tuple((offset, total - offset - t.shape[d]) if i == d else (0, 0) for i in range(t.ndim))
            placed = t._pad_const(pads, 0)
            if out is None:
                out = placed
            else:
                inside = t.ones(t.shape, dtype=dtypes.bool, device=t.device)._pad_const(pads, 0)
                out = inside._select(placed, out)
            offset += t.shape[d]
        return out  # type: ignore[return-value]

    def stack(self, *args: Tensor, dim: int = 0) -> Tensor:
        tensors = _tensor_list(self, args)
        for i, t in enumerate(tensors):
            if t.shape != tensors[0].shape:
                raise RuntimeError(
                    f"stack expects equal shapes, got {tensors[0].shape} at entry 0 and {t.shape} at entry {i}"
                )
        d = tensors[0]._axis(dim, extra=1)
        # self may be the torch form's list (Tensor.stack([a, b])): the first entry is a tensor
        first, *rest = (t.unsqueeze(d) for t in tensors)
        return first.cat(*rest, dim=d)

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        d = self._axis(dim)
        n = self.shape[d]
        if not is_index(sizes) and not (isinstance(sizes, (list, tuple)) and all(is_index(s) for s in sizes)):
            raise TypeError(f"split sizes must be an int or a sequence of ints, got {sizes!r}")
        if is_index(sizes):
            sizes = int(sizes)
            if sizes < 0 or (sizes == 0 and n):
                raise RuntimeError(f"split size {sizes} is invalid for dim {dim} of size {n}")
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if n else [0]
        sizes = list(sizes)
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise RuntimeError(f"split sizes {tuple(sizes)} must be non-negative and sum to {n}, the size of dim {dim}")
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return tuple(self._shrink_dim(d, b, b + s) for b, s in zip(starts, sizes))

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        d = self._axis(dim)
        chunks = as_index("chunk", chunks)
        if chunks <= 0:
            raise RuntimeError(f"chunk expects chunks > 0, got {chunks}")
        n = self.shape[d]
        return list(self.split(math.ceil(n / chunks), d)) if n else [self] * chunks

    def repeat(self, repeats: Any, *args: Any) -> Tensor:
        reps = argfix(repeats, *args)
        if not all(is_index(r) for r in reps):
            raise TypeError(f"repeat {reps} must contain ints")
        reps = tuple(int(r) for r in reps)
        if len(reps) < self.ndim:
            raise ShapeError(f"repeat {reps} has fewer dims than the tensor's shape {self.shape}")
        if any(r < 0 for r in reps):
            raise ShapeError(f"repeat {reps} has a negative count")
        base = (1,) * (len(reps) - self.ndim) + self.shape
        t = self.reshape(tuple(v for s in base for v in (1, s)))
        return t.expand(tuple(v for r, s in zip(reps, base) for v in (r, s))).reshape(
            tuple(r * s for r, s in zip(reps, base))
        )

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
        if not isinstance(repeats, int):
            raise TypeError(f"repeat_interleave needs an int count, got {type(repeats).__name__}")
        if repeats < 0:
            raise RuntimeError(f"repeat_interleave count {repeats} is negative")
        t, d = (self.flatten(), 0) if dim is None else (self, self._axis(dim))
        if t.ndim == 0:
            t = t.reshape(1)
        return t.unsqueeze(d + 1)._expand_dim(d + 1, repeats).flatten(d, d + 1)

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        shift_t = (shifts,) if is_index(shifts) else tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
        if not all(is_index(s) for s in shift_t):
            raise TypeError(f"roll shifts {shifts!r} must be an int or a sequence of ints")
        shift_t = tuple(int(s) for s in shift_t)
        if dims is None:
            if len(shift_t) != 1:
                raise RuntimeError(f"roll shifts {shifts} need dims of the same length, got None")
            return self.flatten().roll(shift_t, 0).reshape(self.shape)
        dim_t = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shift_t) != len(dim_t):
            raise RuntimeError(f"roll shifts {shifts} and dims {dims} must have equal lengths")
        t = self
        for s, dim in zip(shift_t, dim_t):
            d = t._axis(dim)
            n = t.shape[d] if t.ndim else 1
            if n and s % n:
                t = t._tile_dim(d, 2)._shrink_dim(d, n - s % n, 2 * n - s % n)
        return t

    def unfold(self, dim: int, size: int, step: int) -> Tensor:
        d = self._axis(dim)
        if self.ndim == 0:
            return self.reshape(1).unfold(0, size, step).reshape(size)
        n = self.shape[d]
        if size > n or size < 0:
            raise RuntimeError(f"unfold size {size} does not fit dim {dim} of size {n}")
        if step <= 0:
            raise RuntimeError(f"unfold step {step} must be > 0")
        windows = (n - size) // step + 1
        t = self.permute(tuple(i for i in range(self.ndim) if i != d) + (d,))
        batch = t.shape[:-1]
        if size == 0:
            t = t.shrink_to(batch + (0,)).reshape(batch + (windows, 0))
        else:
            # rows of width n+step over n-periodic data: element (w, j) is x[(w*(n+step) + j) % n] = x[w*step + j]
            rows = math.ceil(windows * (n + step) / n)
            t = t.unsqueeze(-2)._expand_dim(len(batch), rows).reshape(batch + (rows * n,))
            t = (
                t.shrink_to(batch + (windows * (n + step),))
                .reshape(batch + (windows, n + step))
                .shrink_to(batch + (windows, size))
            )
        return t.permute(tuple(range(d)) + (t.ndim - 2,) + tuple(range(d, t.ndim - 2)) + (t.ndim - 1,))

    def meshgrid(self, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        if indexing not in ("ij", "xy"):
            raise RuntimeError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
        tensors = (self, *args)
        for i, t in enumerate(tensors):
            if t.ndim > 1:
                raise RuntimeError(f"meshgrid expects 0-D or 1-D tensors, got shape {t.shape} at position {i}")
        axes = list(range(len(tensors)))
        if indexing == "xy" and len(tensors) > 1:
            axes[0], axes[1] = 1, 0
        shape = [0] * len(tensors)
        for t, a in zip(tensors, axes):
            shape[a] = t.numel()
        return tuple(
            t.reshape(tuple(-1 if i == a else 1 for i in range(len(shape)))).expand(shape)
            for t, a in zip(tensors, axes)
        )

    def diag(self) -> Tensor:
        if self.ndim != 1:
            raise ValueError(f"diag expects a 1-D tensor, got shape {self.shape}")
        n = self.shape[0]
        # row r of the (n, n+1) padded matrix starts at flat position r*(n+1), the diagonal of an (n, n) view
        return self.reshape(n, 1)._pad_const(((0, 0), (0, n)), 0).reshape(n * (n + 1)).shrink_to(n * n).reshape(n, n)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        d1, d2 = self._axis(dim1), self._axis(dim2)
        if d1 == d2:
            raise RuntimeError(f"diagonal dims cannot be identical: dim1={dim1}, dim2={dim2}")
        t = self.permute(tuple(i for i in range(self.ndim) if i not in (d1, d2)) + (d1, d2))
        batch, (rows, cols) = t.shape[:-2], t.shape[-2:]
        t = t._shrink_dim(-1, min(offset, cols), cols) if offset >= 0 else t._shrink_dim(-2, min(-offset, rows), rows)
        m = min(t.shape[-2:])
        # the diagonal of an (m, m) matrix is column 0 of its flat data laid out in rows of m+1
        t = (
            t.shrink_to(batch + (m, m))
            .reshape(batch + (m * m,))
            ._pad_const(tuple((0, 0) for _ in batch) + ((0, m),), 0)
        )
        return t.reshape(batch + (m, m + 1)).shrink_to(batch + (m, 1)).reshape(batch + (m,))

    def triu(self, diagonal: int = 0) -> Tensor:
        return self._triangle(diagonal, upper=True)

    def tril(self, diagonal: int = 0) -> Tensor:
        return self._triangle(diagonal, upper=False)

    def _triangle(self, diagonal: int, upper: bool) -> Tensor:
        if self.ndim < 2:
            raise RuntimeError(f"{'triu' if upper else 'tril'} needs at least 2 dims, got shape {self.shape}")
        rows, cols = self.shape[-2:]
        above = type(self).arange(cols, device=self.device).reshape(1, cols) - type(self).arange(
            rows, device=self.device
        ).reshape(rows, 1)
        keep = (above >= diagonal) if upper else (above <= diagonal)
        return keep._broadcast_to(self.shape)._select(self, self.zeros_like())

    # ------------------------------------------------------------------ helpers
    def _select(self, x: Tensor, y: Tensor) -> Tensor:
        """where(self, x, y) for a bool self and x, y of its shape and one dtype."""
        return self._alu(Ops.WHERE, x, y, dtype=x.dtype)

    def _shrink_dim(self, d: int, start: int, end: int) -> Tensor:
        return self.shrink(tuple((start, end) if i == d % self.ndim else None for i in range(self.ndim)))

    def _expand_dim(self, d: int, size: int) -> Tensor:
        """Expand size-1 dim d to size."""
        return self.expand(tuple(size if i == d % self.ndim else s for i, s in enumerate(self.shape)))

    def _tile_dim(self, d: int, times: int) -> Tensor:
        """Repeat the whole tensor `times` times along dim d (a view)."""
        return self.unsqueeze(d)._expand_dim(d, times).flatten(d, d + 1)


def _tensor_list(first: Any, rest: tuple) -> list[Tensor]:
    """cat/stack operands: `a.cat(b, c)`, `Tensor.cat(a, b)` and the torch form `Tensor.cat([a, b])`."""
    items = [*first, *rest] if isinstance(first, (list, tuple)) else [first, *rest]
    if len(items) == 1 and isinstance(items[0], (list, tuple)):
        items = list(items[0])
    if not items:
        raise ValueError("expected a non-empty list of Tensors")
    for t in items:
        if not isinstance(t, TensorBase):
            raise TypeError(f"expected Tensors, got {type(t).__name__}")
    return items
