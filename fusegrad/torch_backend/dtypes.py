"""The torch dtypes a `fuse` tensor can have, and their fusegrad counterparts."""

from __future__ import annotations

import numpy as np
import torch

from fusegrad.dtype import DType, dtypes

TORCH_TO_FUSE: dict[torch.dtype, DType] = {
    torch.float32: dtypes.float32,
    torch.float64: dtypes.float64,
    torch.float16: dtypes.float16,
    torch.bfloat16: dtypes.bfloat16,
    torch.float8_e4m3fn: dtypes.fp8e4m3,
    torch.float8_e5m2: dtypes.fp8e5m2,
    torch.int8: dtypes.int8,
    torch.int16: dtypes.int16,
    torch.int32: dtypes.int32,
    torch.int64: dtypes.int64,
    torch.uint8: dtypes.uint8,
    torch.uint16: dtypes.uint16,
    torch.uint32: dtypes.uint32,
    torch.uint64: dtypes.uint64,
    torch.bool: dtypes.bool,
}
FUSE_TO_TORCH: dict[DType, torch.dtype] = {v: k for k, v in TORCH_TO_FUSE.items()}

# dtypes numpy cannot hold travel through their bits
_BITS_OF = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def to_fuse_dtype(dt: torch.dtype) -> DType:
    if dt not in TORCH_TO_FUSE:
        supported = ", ".join(str(d).removeprefix("torch.") for d in TORCH_TO_FUSE)
        raise TypeError(f"the fuse device has no dtype {dt} (it supports {supported})")
    return TORCH_TO_FUSE[dt]


def to_torch_dtype(dt: DType) -> torch.dtype:
    return FUSE_TO_TORCH[dt]


def to_numpy(t: torch.Tensor) -> tuple[np.ndarray, DType | None]:
    """A CPU tensor's values as an array, and the fusegrad dtype to bitcast them to when numpy lacks the dtype."""
    t = t.detach().contiguous()
    if t.dtype in _BITS_OF:
        return t.view(_BITS_OF[t.dtype]).numpy(), to_fuse_dtype(t.dtype)
    to_fuse_dtype(t.dtype)
    return t.numpy(), None


def from_numpy(arr: np.ndarray, dt: torch.dtype) -> torch.Tensor:
    """A CPU tensor of dtype `dt` from the array fusegrad's numpy() gave (narrow floats come back as float32)."""
    return torch.from_numpy(np.ascontiguousarray(arr).reshape(arr.shape)).to(dt)
