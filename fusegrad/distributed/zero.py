"""ZeRO stage 1: the optimizer's state sharded over the ranks. The gradients are reduce-scattered (each rank gets the
mean of its 1/p slice of the flat gradient), each rank updates its slice of the flat weights with its own optimizer
state, and the slices are all-gathered back into every parameter: the traffic of one allreduce, 1/p of the state."""

from __future__ import annotations
from typing import Any, Callable

from fusegrad.distributed.collectives import all_gather, reduce_scatter
from fusegrad.distributed.comm import rank, size
from fusegrad.tensor import Tensor


class ZeroOptimizer:
    """make_optimizer(list of one Tensor) builds the per-rank optimizer of this rank's slice; its update must be
    elementwise (SGD, Adam, AdamW: not LARS/LAMB, which need each whole tensor's norm). Start every rank from the same
    parameters (broadcast_parameters) before building it."""

    def __init__(self, params: list[Tensor], make_optimizer: Callable[[list[Tensor]], Any]):
        self.params = list(dict.fromkeys(params))
        if not self.params:
            raise ValueError("ZeroOptimizer needs at least one parameter")
        if len(dts := {p.dtype for p in self.params}) != 1 or len({str(p.device) for p in self.params}) != 1:
            raise ValueError(
                f"ZeroOptimizer's parameters must share one dtype and device, got dtypes {sorted(map(str, dts))}"
            )
        for p in self.params:
            p.requires_grad = True
        self.total, n = sum(p.numel() for p in self.params), size()
        self.chunk = -(-self.total // n)
        start = rank() * self.chunk
        self.shard = self.flat([p.detach() for p in self.params])[start : start + self.chunk].contiguous().realize()
        self.shard.requires_grad = True
        self.optimizer = make_optimizer([self.shard])
        if getattr(self.optimizer, "per_tensor", False):
            raise ValueError(f"{type(self.optimizer).__name__} scales each whole tensor: it cannot update a slice")

    def flat(self, tensors: list[Tensor]) -> Tensor:
        """The tensors as one vector, zero-padded to a whole number of slices."""
        flat = Tensor.cat(*[t.flatten() for t in tensors])
        pad = self.chunk * size() - self.total
        return flat.pad((0, pad)) if pad else flat

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                raise RuntimeError(f"parameter {i} (shape {p.shape}) has no .grad; call backward() before step()")
        self.shard.grad = reduce_scatter(self.flat([p.grad for p in self.params]), "mean", name="the flat gradient")  # type: ignore[misc]
        self.optimizer.step()
        full, offset, updates = all_gather(self.shard, name="the updated weights"), 0, []
        for p in self.params:
            updates.append(p.assign(full[offset : offset + p.numel()].reshape(p.shape)))
            offset += p.numel()
        Tensor.realize(*updates)


__all__ = ["ZeroOptimizer"]
