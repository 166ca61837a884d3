"""Shared by the tests: dtype correspondences between fusegrad, numpy and torch, the reference checkers, and the float
sum accuracy bound."""

import math

import numpy as np
import torch
from fusegrad import Tensor, dtypes

TORCH2FG = {
    torch.bool: dtypes.bool,
    torch.int8: dtypes.int8,
    torch.uint8: dtypes.uint8,
    torch.int16: dtypes.int16,
    torch.uint16: dtypes.uint16,
    torch.int32: dtypes.int32,
    torch.uint32: dtypes.uint32,
    torch.int64: dtypes.int64,
    torch.uint64: dtypes.uint64,
    torch.float16: dtypes.float16,
    torch.bfloat16: dtypes.bfloat16,
    torch.float32: dtypes.float32,
    torch.float64: dtypes.float64,
}
NP2FG = {
    np.dtype(k): v
    for k, v in {
        np.bool_: dtypes.bool,
        np.int8: dtypes.int8,
        np.uint8: dtypes.uint8,
        np.int16: dtypes.int16,
        np.uint16: dtypes.uint16,
        np.int32: dtypes.int32,
        np.uint32: dtypes.uint32,
        np.int64: dtypes.int64,
        np.uint64: dtypes.uint64,
        np.float16: dtypes.float16,
        np.float32: dtypes.float32,
        np.float64: dtypes.float64,
    }.items()
}
FG2NP = {v: k for k, v in NP2FG.items()}
NP_TYPES = [d.type for d in NP2FG]  # every numpy scalar type fusegrad stores

FWD_TOL = {
    dtypes.float32: (1e-6, 1e-3),
    dtypes.float64: (1e-6, 1e-3),
    dtypes.float16: (1e-3, 2e-3),
    dtypes.bfloat16: (1e-2, 1e-2),
}


def check_torch(out, ref, atol=None, rtol=None):
    """out (a Tensor) matches ref (a torch tensor) in dtype, shape and values (floats within FWD_TOL, else exact)."""
    assert isinstance(out, Tensor), f"expected a Tensor, got {type(out).__name__}"
    assert out.dtype == TORCH2FG[ref.dtype], f"dtype {out.dtype} != torch {ref.dtype}"
    assert out.shape == tuple(ref.shape), f"shape {out.shape} != torch {tuple(ref.shape)}"
    ref_np = ref.detach().float().numpy() if ref.dtype == torch.bfloat16 else ref.detach().numpy()
    if out.dtype in FWD_TOL:
        d_atol, d_rtol = FWD_TOL[out.dtype]
        np.testing.assert_allclose(out.numpy(), ref_np, atol=atol or d_atol, rtol=rtol or d_rtol)
    else:
        np.testing.assert_array_equal(out.numpy(), ref_np)


def check_values(t, ref, dtype=None, atol=1e-6, rtol=1e-3, f16_tol=(1e-3, 2e-3)):
    """t (Tensor) equals ref (numpy array / torch tensor / scalar) in shape, dtype and values (NaN == NaN).
    float16 results get at least f16_tol (atol, rtol), bfloat16 at least 1e-2; atol=rtol=0 asks for exact values."""
    if isinstance(ref, torch.Tensor):
        exp_dt = TORCH2FG[ref.dtype]
        ref = ref.detach().float().numpy() if ref.dtype == torch.bfloat16 else ref.detach().numpy()
    else:
        ref = np.asarray(ref)
        exp_dt = NP2FG[ref.dtype]
    if dtype is not None:
        exp_dt = dtype
    assert isinstance(t, Tensor), f"expected a Tensor, got {type(t)}"
    assert t.dtype == exp_dt, f"dtype {t.dtype} != expected {exp_dt}"
    assert t.shape == ref.shape, f"shape {t.shape} != expected {ref.shape}"
    out = t.numpy()
    assert out.shape == ref.shape
    assert out.dtype == (np.dtype(np.float32) if exp_dt is dtypes.bfloat16 else FG2NP[exp_dt]), (
        f"numpy dtype {out.dtype}"
    )
    if dtypes.is_float(exp_dt):
        exact = atol == 0 and rtol == 0  # atol=rtol=0 asks for bit-exact values (up to NaN payloads)
        if exp_dt is dtypes.float16 and not exact:
            atol, rtol = max(atol, f16_tol[0]), max(rtol, f16_tol[1])
        if exp_dt is dtypes.bfloat16 and not exact:
            atol, rtol = max(atol, 1e-2), max(rtol, 1e-2)
        np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True)
        # the sign of infinities and the position of NaNs must match exactly
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref.astype(np.float64)))
    else:
        np.testing.assert_array_equal(out, ref.astype(out.dtype) if ref.dtype != out.dtype else ref)


# Float sum accuracy (tests/tensor_ops/test_reduce_accuracy.py explains the bound)
# worst measured below with 8-lane AVX2: 0.32 (1000 x 0.1); 4-lane SIMD adds twice as many values per lane, hence 2.
# Before blocking the 16M case was off by 10**5 ulps
C_ULPS = 2.0
# 256 serial adds of 0.1 lose ~32 ulps (ratio 4 at n=257); a few 1e4 among 1e-3 values up to ~14 (at n ~ 300)
C_ULPS_SERIAL = 16.0


def ulp(x: float, np_dtype=np.float32) -> float:
    return float(np.spacing(np_dtype(abs(x)))) if math.isfinite(x) else math.inf


def assert_sum_accurate(
    got: float, exact: float, abs_sum: float, n: int, out_dtype=np.float32, c_ulps: float = C_ULPS
) -> None:
    """|got - exact| <= c_ulps * ulp32(sum |x|) * log2(n), plus half an ulp of the result's own dtype."""
    rounding = 0.5 * ulp(exact, out_dtype) if out_dtype is not np.float32 else 0.0
    bound = c_ulps * ulp(abs_sum) * max(math.log2(n), 1.0) + rounding
    err = abs(float(got) - exact)
    assert err <= bound, f"n={n}: got {float(got)!r}, exact {exact!r}, error {err:.3g} > bound {bound:.3g}"
