"""`import fusegrad.torch_backend` registers the torch device `fuse`, whose tensors compute with fusegrad.

    model.to("fuse"); x = torch.randn(8, 4, device="fuse"); loss = model(x).sum(); loss.backward()

Ops build fusegrad's lazy graph; values are computed when torch needs them (`.cpu()`, `.item()`, printing).
"""

from __future__ import annotations

import functools
import types

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from fusegrad.tensor import Tensor

from .dispatch import FACTORIES, compute, copy_from, empty_storage
from .tensor import FuseTensor, fuse_device_name, sync

BACKEND_NAME = "fuse"


def _get_rng_state(device: object = None) -> torch.Tensor:
    """fusegrad's counter-based generator state: the seed and the number of draws made since it was set."""
    return torch.tensor([Tensor._seed, Tensor._rng_calls], dtype=torch.int64)


def _set_rng_state(state: torch.Tensor, device: object = None) -> None:
    Tensor._seed, Tensor._rng_calls = (int(v) for v in state.tolist())


def _device_module() -> types.ModuleType:
    mod = types.ModuleType("torch.fuse", "the fuse device: torch tensors computed by fusegrad")
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.current_device = lambda: 0
    mod.is_initialized = lambda: True
    mod._is_in_bad_fork = lambda: False
    mod.manual_seed = lambda seed: Tensor.manual_seed(int(seed))
    mod.manual_seed_all = lambda seed: Tensor.manual_seed(int(seed))
    mod.get_rng_state = _get_rng_state
    mod.set_rng_state = _set_rng_state
    mod.synchronize = lambda device=None: sync()
    mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    mod.fusegrad_device = fuse_device_name
    return mod


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() == BACKEND_NAME:
        return
    _setup_privateuseone_for_python_backend(BACKEND_NAME, backend_module=_device_module())

    @torch.library.impl("aten::empty.memory_format", "PrivateUse1")
    def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return empty_storage(tuple(size), dtype, device)

    @torch.library.impl("aten::empty_strided", "PrivateUse1")
    def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        return empty_storage(tuple(size), dtype, device)

    torch.library.impl("aten::_copy_from", "PrivateUse1")(copy_from)
    # factories whose generic kernels would resize an out tensor compute directly (a fuse tensor never resizes)
    for op in FACTORIES:
        torch.library.impl(op.name(), "PrivateUse1")(functools.partial(compute, op))


_register()
# an optimizer step's writes are realized when it ends, so a training loop's graph never spans steps
register_optimizer_step_post_hook(lambda optimizer, args, kwargs: sync())

__all__ = ["BACKEND_NAME", "FuseTensor", "fuse_device_name", "sync"]
