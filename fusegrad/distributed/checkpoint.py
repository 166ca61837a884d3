"""Checkpoints of a data-parallel run: rank 0 writes (atomically: a crash leaves the old file or none), every rank
resumes from the same values, read by rank 0 and broadcast (no shared filesystem needed)."""

from __future__ import annotations
import os
from typing import Any

from fusegrad.distributed.comm import barrier, rank, world
from fusegrad.distributed.optimizer import broadcast_parameters
from fusegrad.nn.state import safe_load, safe_save
from fusegrad.tensor import Tensor


def save_checkpoint(state: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, Any] | None = None) -> None:
    """Rank 0 writes `state` as safetensors (to a temporary file renamed into place); returns once it is on disk."""
    if rank() == 0:
        safe_save(state, path, metadata)
    barrier()


def load_checkpoint(state: dict[str, Tensor], path: str | os.PathLike) -> None:
    """`state`'s tensors take the values saved at `path` (read on rank 0, then broadcast to every rank)."""
    if rank() == 0:
        saved = safe_load(path)
        missing = sorted(set(state) - set(saved))
        if missing:
            raise KeyError(f"{path} lacks {missing}")
        for k, t in state.items():
            if saved[k].shape != t.shape or saved[k].dtype != t.dtype:
                raise ValueError(f"{path}: {k} is {saved[k].dtype} {saved[k].shape}, the model's {t.dtype} {t.shape}")
        Tensor.realize(*[t.assign(saved[k].to(t.device)) for k, t in state.items()])
    if world() is not None:
        broadcast_parameters(state)


__all__ = ["load_checkpoint", "save_checkpoint"]
