"""Dtype correspondences between fusegrad, numpy and torch, shared by the op tests."""

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
