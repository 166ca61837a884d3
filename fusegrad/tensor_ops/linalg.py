"""Linear algebra (docs/api.md)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fusegrad.dtype import DTypeLike, dtypes, least_upper_dtype, least_upper_float, to_dtype
from fusegrad.helpers import prod
from fusegrad.tensor_ops.movement import permuted
from fusegrad.tensor_ops.reduce import _acc_dtype
from fusegrad.uop.ops import Ops, UOp, elementwise_uop

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool


def _einsum_labels(subscripts: str, ndim: int, index: int, ell_rank: int) -> list[str]:
    """One label per dim of an operand; the dims an ellipsis covers get labels '.0', '.1', ... aligned right."""
    letters = subscripts.replace("...", "")
    if not all(c.isalpha() and c.isascii() for c in letters):
        raise RuntimeError(f"einsum(): invalid subscript in {subscripts!r}; subscripts must be letters [a-zA-Z]")
    if "..." not in subscripts:
        if len(letters) != ndim:
            raise RuntimeError(
                f"einsum(): the number of subscripts in the equation ({len(letters)}) does not match the "
                f"number of dimensions ({ndim}) for operand {index} and no ellipsis was given"
            )
        return list(letters)
    covered = ndim - len(letters)
    if covered < 0 or subscripts.count("...") > 1:
        raise RuntimeError(f"einsum(): subscripts {subscripts!r} do not fit operand {index} with {ndim} dimensions")
    head, tail = subscripts.split("...")
    return list(head) + [f".{ell_rank - covered + j}" for j in range(covered)] + list(tail)


def _diagonal(t: Tensor, a: int, b: int) -> Tensor:
    """The diagonal over dims a < b of t, placed at dim a (dim b removed), made of movement ops."""
    if t.shape[a] != t.shape[b]:
        raise RuntimeError(
            f"einsum(): a subscript repeated in an operand needs one size, got {t.shape[a]}, {t.shape[b]}"
        )
    n = t.shape[a]
    order = [i for i in range(t.ndim) if i not in (a, b)] + [a, b]
    x = t.permute(order).reshape(tuple(t.shape[i] for i in order[:-2]) + (n * n,))
    # element (i, i) sits at i*(n+1) of the flattened pair: pad by n and fold into rows of n+1, keep column 0
    x = x.pad(((0, 0),) * (x.ndim - 1) + ((0, n),)).reshape(x.shape[:-1] + (n, n + 1))
    x = x.shrink((None,) * (x.ndim - 1) + ((0, 1),)).reshape(x.shape[:-1])
    back = list(range(x.ndim - 1))
    back.insert(a, x.ndim - 1)
    return x.permute(back)


def _plain_matmul(x: Tensor, w: Tensor) -> Tensor | None:
    """x @ w of two matrices of one float dtype that sums in itself, as the general path below builds it (the same
    nodes: the broadcast product, its sum over k), without the Tensor ops' checks: every nn.Linear makes one a step.
    None for anything else."""
    dt = x.dtype
    if x.ndim != 2 or w.ndim != 2 or w.dtype is not dt or not dtypes.is_float(dt) or _acc_dtype(dt) is not dt:
        return None
    (m, k), n = x.shape, w.shape[1]
    if not (type(m) is int and type(k) is int and type(n) is int) or x.device != w.device:
        return None
    full = (m, n, k)
    rows = UOp(Ops.EXPAND, dt, (UOp(Ops.RESHAPE, dt, (x.uop,), (m, 1, k)),), full)
    cols = UOp(Ops.EXPAND, dt, (UOp(Ops.RESHAPE, dt, (permuted(w.uop, (1, 0), (k, n)),), (1, n, k)),), full)
    summed = UOp(Ops.REDUCE_AXIS, dt, (elementwise_uop(Ops.MUL, dt, (rows, cols), full),), (Ops.ADD, (2,)))
    # the sum's shape known here, recorded: the gradient asks it, and an unknown one is inferred through an exception
    summed._shape = (m, n, 1)
    return x._new(UOp(Ops.RESHAPE, dt, (summed,), (m, n)))


class LinalgMixin:
    def dot(self, w: Tensor, dtype: DTypeLike | None = None) -> Tensor:
        if self.ndim == 0 or w.ndim == 0:
            raise RuntimeError(
                f"both arguments to matmul need to be at least 1D, but they are {self.ndim}D and {w.ndim}D "
                f"(shapes {self.shape} and {w.shape})"
            )
        k = self.shape[-1]
        wk = w.shape[-2] if w.ndim >= 2 else w.shape[0]
        if k != wk:
            raise RuntimeError(f"matmul shape mismatch: {self.shape} @ {w.shape} ({k} != {wk})")
        batch_a, batch_b = self.shape[:-2], w.shape[:-2]
        for x, y in zip(batch_a[::-1], batch_b[::-1]):
            if x != y and 1 not in (x, y):
                raise RuntimeError(f"matmul batch dims do not broadcast: {self.shape} @ {w.shape}")
        x = self
        if dtype is not None:
            # products are formed in the accumulation dtype when it is the wider one, like torch's upcast inputs
            wide = least_upper_dtype(x.dtype, w.dtype, to_dtype(dtype))
            x, w = x.cast(wide), w.cast(wide)
        if w.ndim >= 2 and _is_transposed_view(w) and _copy_pays(x.shape, w.shape):
            # x @ W.T (every nn.Linear) reads W across rows, where no register tile applies: a copy of W.T costs one
            # pass over W and turns the matmul into the row-contiguous kind the tiles serve
            # (a "layout" copy: the gradients read W itself, in whose natural layout they tile better)
            w = w._new(elementwise_uop(Ops.CONTIGUOUS, w.dtype, (w.uop,), w.shape, "layout"))
        if dtype is None and (out := _plain_matmul(x, w)) is not None:
            return out
        if w.ndim == 1:
            products = x * w
        elif x.ndim == 1:
            products = x.reshape(1, k) * w.transpose(-1, -2)
        else:
            products = x.reshape(x.shape[:-1] + (1, k)) * w.transpose(-1, -2).unsqueeze(-3)
        if dtype is not None:
            return products.sum(-1, dtype=to_dtype(dtype))
        return products.sum(-1).cast(products.dtype)

    def matmul(self, x: Tensor, reverse: bool = False, dtype: DTypeLike | None = None) -> Tensor:
        return x.dot(self, dtype=dtype) if reverse else self.dot(x, dtype=dtype)

    def linear(self, weight: Tensor, bias: Tensor | None = None, dtype: DTypeLike | None = None) -> Tensor:
        """self @ weight + bias with weight shaped (in, out); a 1-D weight scales elementwise."""
        if weight.ndim == 1:
            out = self * weight if dtype is None else (self * weight).cast(to_dtype(dtype))
        else:
            out = self.dot(weight, dtype=dtype)
        return out if bias is None else out + bias

    @staticmethod
    def einsum(formula: str, *operands: Tensor | Sequence[Tensor], dtype: DTypeLike | None = None) -> Tensor:
        """Einstein summation like torch.einsum: '...', implicit output, repeated subscripts (diagonals),
        broadcasting."""
        one_list = len(operands) == 1 and isinstance(operands[0], (list, tuple))
        ops: list[Tensor] = list(operands[0] if one_list else operands)  # type: ignore[arg-type]
        lhs, arrow, rhs = formula.replace(" ", "").partition("->")
        inputs = lhs.split(",")
        if len(inputs) != len(ops):
            raise ValueError(
                f"einsum(): the equation {formula!r} names {len(inputs)} operand(s) but {len(ops)} were given"
            )
        ell_rank = max((t.ndim - len(s.replace("...", "")) for s, t in zip(inputs, ops) if "..." in s), default=0)
        labels = [_einsum_labels(s, t.ndim, i, ell_rank) for i, (s, t) in enumerate(zip(inputs, ops))]
        ellipsis = [f".{j}" for j in range(ell_rank)]
        if arrow:
            out_ndim = len(rhs.replace("...", "")) + (ell_rank if "..." in rhs else 0)
            out = _einsum_labels(rhs, out_ndim, -1, ell_rank) if rhs else []
            for c in out:
                if out.count(c) > 1:
                    raise RuntimeError(f"einsum(): output subscript {c} appears more than once in the output")
                if not any(c in ls for ls in labels):
                    raise RuntimeError(
                        f"einsum(): output subscript {c} does not appear in the equation for any input operand"
                    )
        else:
            letters = [c for ls in labels for c in ls if not c.startswith(".")]
            out = ellipsis + sorted(c for c in set(letters) if letters.count(c) == 1)
        summed = sorted({c for ls in labels for c in ls} - set(out))
        order = out + summed
        # each operand: diagonals of repeated labels, then its dims permuted into `order`
        # with size-1 dims for absent labels
        sizes: dict[str, int] = {}
        aligned = []
        for i, (t, ls) in enumerate(zip(ops, labels)):
            ls = list(ls)
            for c in dict.fromkeys(ls):
                while ls.count(c) > 1:
                    a = ls.index(c)
                    b = ls.index(c, a + 1)
                    t = _diagonal(t, a, b)
                    del ls[b]
            for c, n in zip(ls, t.shape):
                seen = sizes.get(c, 1)
                if n != seen and 1 not in (n, seen):
                    raise RuntimeError(
                        f"einsum(): subscript {c} has size {n} for operand {i} which does not broadcast with "
                        f"previously seen size {seen}"
                    )
                sizes[c] = n if seen == 1 else seen
            present = sorted(ls, key=order.index)
            t = t.permute([ls.index(c) for c in present])
            aligned.append(t.reshape(tuple(t.shape[present.index(c)] if c in present else 1 for c in order)))
        out_dt = least_upper_dtype(*(t.dtype for t in ops))
        # with an accumulation dtype, products are formed in it when it is the wider one (as in dot)
        wide = out_dt if dtype is None else least_upper_dtype(out_dt, to_dtype(dtype))
        product = functools.reduce(lambda a, b: a * b, (t.cast(wide) for t in aligned))
        product = product._broadcast_to(tuple(sizes.get(c, 1) for c in order))
        axes = tuple(range(len(out), len(order)))
        if dtype is not None:
            return product.sum(axes, dtype=to_dtype(dtype)) if axes else product.cast(to_dtype(dtype))
        return product.sum(axes).cast(out_dt) if axes else product

    def qr(self) -> tuple[Tensor, Tensor]:
        """Householder QR of the last two dims (LAPACK's reflector convention): Q (m, m) orthogonal, R (m, n) upper."""
        if self.ndim < 2:
            raise RuntimeError(f"qr needs a tensor of at least 2 dims, got shape {self.shape}")
        m, n = self.shape[-2:]
        r = self.cast(least_upper_float(self.dtype))
        q = type(self).eye(m, dtype=r.dtype, device=self.device).expand(self.shape[:-2] + (m, m))
        rows = type(self).arange(m, device=self.device).reshape(m, 1)
        for j in range(min(m - 1, n)):
            col, alpha = r[..., :, j : j + 1], r[..., j : j + 1, j : j + 1]
            below = rows > j
            tail_norm = below.where(col, 0).square().sum(-2, keepdim=True).sqrt()
            norm = (alpha.square() + tail_norm.square()).sqrt()
            beta = (alpha >= 0).where(-norm, norm)
            # a column that is already zero below the diagonal needs no reflection (tau = 0), as in LAPACK
            done = tail_norm == 0
            tau = done.where(0, (beta - alpha) / done.where(1, beta))
            v = (rows == j).where(1, below.where(col / done.where(1, alpha - beta), 0))
            r = (r - tau * v * (v * r).sum(-2, keepdim=True)).contiguous().contiguous_backward()
            q = (q - tau * (q @ v) * v.transpose(-1, -2)).contiguous().contiguous_backward()
        upper = rows <= type(self).arange(n, device=self.device).reshape(1, n)
        return q, upper.where(r, 0)

    def svd(self, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """One-sided Jacobi SVD of the last two dims: rotate column pairs until orthogonal; S descending."""
        if self.ndim < 2:
            raise RuntimeError(f"svd needs a tensor of at least 2 dims, got shape {self.shape}")
        m, n = self.shape[-2:]
        if m < n:
            u, s, vh = self.transpose(-1, -2).svd(full_matrices)
            return vh.transpose(-1, -2), s, u.transpose(-1, -2)
        out_dt, batch = least_upper_float(self.dtype), self.shape[:-2]
        # rotations accumulate rounding, so they run in float64 and the results are cast back
        a = self.cast(dtypes.float64)
        if n % 2:
            a = a.pad(((0, 0),) * len(batch) + ((0, 0), (0, 1)))  # a zero column pairs with nothing
        width = a.shape[-1]
        # rows of A on top of rows of V (starting as I): one rotation of a column pair updates both
        work = a.cat(
            type(self).eye(width, dtype=dtypes.float64, device=self.device).expand(batch + (width, width)), dim=-2
        )
        # circle-method layout: pair i is (column i, column width-1-i), stored as (..., rows, 2, width/2)
        pairs = type(self).stack(work[..., : width // 2], work[..., width // 2 :].flip(-1), dim=-2)
        for _ in range(_JACOBI_SWEEPS * (width - 1)):
            pairs = _jacobi_round(pairs, m)
        # width-1 rounds of the circle method bring every column back to its starting slot
        work = pairs[..., 0, :].cat(pairs[..., 1, :].flip(-1), dim=-1)[..., :n]
        g, v = work[..., :m, :], work[..., m : m + n, :]
        sigma = g.square().sum(-2).sqrt()
        # sort descending (ties keep column order) with a one-hot permutation
        col, row = sigma.unsqueeze(-1), sigma.unsqueeze(-2)
        before = (col < row) | ((col == row) & _lower_strict(type(self), n, self.device))
        rank = before.cast(dtypes.int32).sum(-1).unsqueeze(-1)
        order = (rank == type(self).arange(n, device=self.device)).cast(dtypes.float64)
        sigma, g, v = (sigma.unsqueeze(-2) @ order).squeeze(-2), g @ order, v @ order
        u_thin = g / (sigma == 0).where(1, sigma).unsqueeze(-2)
        # an orthonormal basis continuing u_thin (also covering zero singular values):
        # QR of [u_thin | I], signs restored
        q, r = u_thin.cat(
            type(self).eye(m, dtype=dtypes.float64, device=self.device).expand(batch + (m, m)), dim=-1
        ).qr()
        flips = ((r[..., :n, :n] * type(self).eye(n, dtype=dtypes.float64, device=self.device)).sum(-1) < 0).where(
            -1.0, 1.0
        )
        u = q * flips.pad(((0, 0),) * len(batch) + ((0, m - n),), value=1.0).unsqueeze(-2)
        if not full_matrices:
            u = u[..., :, :n]
        return u.cast(out_dt), sigma.cast(out_dt), v.transpose(-1, -2).cast(out_dt)

    def newton_schulz(
        self, steps: int, params: Sequence[float] | Sequence[Sequence[float]], eps: float = 1e-07
    ) -> Tensor:
        """Muon's orthogonalisation of the last two dims: X <- aX + (bA + cA^2)X with A = XX^T,
        from X scaled to norm <= 1.
        `params` is one (a, b, c) for every step or a list with one (a, b, c) per step."""
        if self.ndim < 2:
            raise RuntimeError(f"newton_schulz needs a tensor of at least 2 dims, got shape {self.shape}")
        per_step = list(params) if params and isinstance(params[0], (tuple, list)) else [params] * steps
        if len(per_step) < steps or any(len(p) != 3 for p in per_step):
            raise ValueError(f"newton_schulz params must be (a, b, c) or {steps} such triples, got {params!r}")
        tall = self.shape[-2] > self.shape[-1]
        x = self.transpose(-1, -2) if tall else self
        x = x / (x.square().sum((-2, -1), keepdim=True).sqrt() + eps)
        for a, b, c in per_step[:steps]:
            gram = x @ x.transpose(-1, -2)
            # each step in its own buffer: later steps reuse one compiled kernel instead of inlining all earlier ones
            x = (a * x + (b * gram + c * (gram @ gram)) @ x).contiguous()
        return x.transpose(-1, -2) if tall else x


_JACOBI_SWEEPS = 8


def _jacobi_round(pairs: Tensor, rows: int) -> Tensor:
    """Rotate every column pair (top row of `rows` data rows only decides the angle), then move to the next round."""
    data = pairs[..., :rows, :, :]
    p, q = data[..., 0, :], data[..., 1, :]
    stats = type(p).stack(p.square(), q.square(), p * q, dim=-2).sum(-3)
    alpha, beta, gamma = stats[..., 0:1, :], stats[..., 1:2, :], stats[..., 2:3, :]
    # the rotation that zeroes the pair's inner product (Golub & Van Loan's symmetric Schur step)
    flat = gamma == 0
    zeta = (beta - alpha) / (2 * flat.where(1, gamma))
    t = flat.where(0, (zeta >= 0).where(1, -1) / (zeta.abs() + (1 + zeta.square()).sqrt()))
    c = (1 + t.square()).rsqrt()
    s = c * t
    top, bottom = c * pairs[..., 0, :] - s * pairs[..., 1, :], s * pairs[..., 0, :] + c * pairs[..., 1, :]
    half = pairs.shape[-1]
    if half > 1:
        # circle method: the first column stays, every other column moves one slot around the circle
        top, bottom = (
            top[..., :1].cat(bottom[..., :1], top[..., 1 : half - 1], dim=-1),
            bottom[..., 1:].cat(top[..., half - 1 :], dim=-1),
        )
    return type(top).stack(top, bottom, dim=-2).contiguous().contiguous_backward()


def _lower_strict(tensor_class: type[Tensor], n: int, device: str) -> Tensor:
    """[i, j] = j < i: earlier columns win ties."""
    return tensor_class.arange(n, device=device).reshape(1, n) < tensor_class.arange(n, device=device).reshape(n, 1)


def _is_transposed_view(w: Tensor) -> bool:
    """w is a view that swaps its last two axes (W.T, k.transpose(-1, -2)), leaving the others in place."""
    u = w.uop
    n = len(u.shape)
    return u.op is Ops.PERMUTE and tuple(u.arg) == (*range(n - 2), n - 1, n - 2)


# a transposed weight is copied when the matmul has at least this many rows and multiply-adds: below, the extra kernel
# costs more than the register tiles save
COPY_MIN_ROWS, COPY_MIN_MACS = 8, 1 << 18


def _copy_pays(x_shape: tuple, w_shape: tuple) -> bool:
    if not all(isinstance(d, int) for d in (*x_shape, *w_shape)):
        return False  # a symbolic size: the matmul's cost is not known when the graph is built
    rows = prod(x_shape[:-1])
    return rows >= COPY_MIN_ROWS and rows * w_shape[-1] * w_shape[-2] >= COPY_MIN_MACS
