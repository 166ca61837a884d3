"""Dtype correspondences between fusegrad, numpy and torch, shared by the op tests."""

import numpy as np
import torch
from fusegrad import dtypes

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
