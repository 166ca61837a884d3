"""The kernels of docs/custom_kernels.md, written as a tinygrad user writes them (only the import differs)."""

import math
from fusegrad import AddrSpace, AxisType, KernelInfo, UOp


def add_one(B: UOp, A: UOp) -> UOp:
    A, B = A.flatten(), B.flatten()
    i = UOp.range(A.size, 0)
    return B[i].store(A[i] + 1).end(i).sink(arg=KernelInfo(name="add_one"))


def row_sum(out: UOp, x: UOp) -> UOp:
    rows, cols = x.shape
    i = UOp.range(rows, 0)
    k = UOp.range(cols, 1, axis_type=AxisType.REDUCE)
    acc = UOp.placeholder((1,), x.dtype, 0, addrspace=AddrSpace.REG)
    acc = acc[0].set(0.0)
    acc = acc[0].set(acc.after(k)[0] + x[i, k], end=k)
    return out[i].store(acc[0]).end(i).sink(arg=KernelInfo(name="row_sum"))


def gemm(C: UOp, A: UOp, B: UOp) -> UOp:
    M, K = A.shape
    N = B.shape[1]
    i, j = UOp.range(M, 0), UOp.range(N, 1)
    k = UOp.range(K, 2, axis_type=AxisType.REDUCE)
    acc = UOp.placeholder((1,), C.dtype.base, 0, addrspace=AddrSpace.REG)
    acc = acc[0].set(0.0)
    acc = acc[0].set(acc.after(k)[0] + A[i, k] * B[k, j], end=k)
    return C[i, j].store(acc[0]).end(i, j).sink(arg=KernelInfo(name="gemm", opts_to_apply=()))


def tiled_gemm(C: UOp, A: UOp, B: UOp, TM: int = 4, TN: int = 4) -> UOp:
    M, K = A.shape
    N = B.shape[1]
    i, j = UOp.range(M // TM, 0), UOp.range(N // TN, 1)
    k = UOp.range(K, 2, axis_type=AxisType.REDUCE)
    ti, tj = UOp.range(TM, 3, axis_type=AxisType.UPCAST), UOp.range(TN, 4, axis_type=AxisType.UPCAST)
    acc = UOp.placeholder((TM, TN), C.dtype, 0, addrspace=AddrSpace.REG)
    acc = acc[ti, tj].set(0.0, end=(ti, tj))
    acc = acc[ti, tj].set(acc.after(k)[ti, tj] + A[i * TM + ti, k] * B[k, j * TN + tj], end=(ti, tj, k))
    store = C[i * TM + ti, j * TN + tj].store(acc[ti, tj]).end(ti, tj)
    return store.end(i, j).sink(arg=KernelInfo(name=f"gemm_{TM}x{TN}", opts_to_apply=()))


def sum_and_max(total: UOp, biggest: UOp, x: UOp) -> UOp:
    i = UOp.range(x.shape[0], 0)
    k = UOp.range(x.shape[1], 1, axis_type=AxisType.REDUCE)
    acc = UOp.placeholder((2,), x.dtype, 0, addrspace=AddrSpace.REG)
    acc = acc[0].set(0.0)
    acc = acc[1].set(-math.inf)
    body = UOp.group(acc[0].store(acc.after(k)[0] + x[i, k]), acc[1].store(acc.after(k)[1].maximum(x[i, k])))
    acc = acc.after(body.end(k))
    return total[i].store(acc[0]).end(i).sink(biggest[i].store(acc[1]).end(i), arg=KernelInfo(name="sum_and_max"))


def attention_no_softmax(out: UOp, q: UOp, k: UOp, v: UOp) -> UOp:
    L, D = q.shape
    S, E = v.shape
    i, e = UOp.range(L, 0), UOp.range(E, 1)
    j = UOp.range(S, 2, axis_type=AxisType.REDUCE)
    d = UOp.range(D, 3, axis_type=AxisType.REDUCE)
    score = UOp.placeholder((1,), q.dtype, 0, addrspace=AddrSpace.REG)
    score = score[0].set(0.0)
    score = score[0].set(score.after(d)[0] + q[i, d] * k[j, d], end=d)
    acc = UOp.placeholder((1,), q.dtype, 1, addrspace=AddrSpace.REG)
    acc = acc[0].set(0.0)
    acc = acc[0].set(acc.after(j)[0] + score[0] * (1 / math.sqrt(D)) * v[j, e], end=j)
    return out[i, e].store(acc[0]).end(i, e).sink(arg=KernelInfo(name="attention"))


def gemm_backward(grads: list, C, A, B) -> list:
    """d(A @ B): the output gradient times each other operand, by the same custom kernel."""
    (g,) = grads
    return [None, matmul(g, B.T), matmul(A.T, g)]


def matmul(a, b):
    """a @ b by the custom gemm, with a custom backward."""
    from fusegrad import Tensor

    out = Tensor.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
    return Tensor.custom_kernel(out, a, b, fxn=gemm, grad_fxn=gemm_backward)[0]


def blocked_gemm(C: UOp, A: UOp, B: UOp, TM: int = 4, TN: int = 16, ROWS: int = 32) -> UOp:
    """tiled_gemm with its row tiles walked in blocks of ROWS tiles, each block over every column tile (the loops in
    axis_id order): a block's rows of A stay in cache while the columns of B stream past."""
    M, K = A.shape
    N = B.shape[1]
    blocks, rows = M // (TM * ROWS), ROWS
    i0, j, i1 = UOp.range(blocks, 0), UOp.range(N // TN, 1), UOp.range(rows, 2)
    k = UOp.range(K, 3, axis_type=AxisType.REDUCE)
    ti, tj = UOp.range(TM, 4, axis_type=AxisType.UPCAST), UOp.range(TN, 5, axis_type=AxisType.UPCAST)
    row = (i0 * rows + i1) * TM + ti
    acc = UOp.placeholder((TM, TN), C.dtype, 0, addrspace=AddrSpace.REG)
    acc = acc[ti, tj].set(0.0, end=(ti, tj))
    acc = acc[ti, tj].set(acc.after(k)[ti, tj] + A[row, k] * B[k, j * TN + tj], end=(ti, tj, k))
    store = C[row, j * TN + tj].store(acc[ti, tj]).end(ti, tj)
    return store.end(i0, j, i1).sink(arg=KernelInfo(name=f"gemm_blocked_{TM}x{TN}", opts_to_apply=()))
