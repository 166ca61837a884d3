"""Data parallelism: every rank starts from rank 0's parameters (broadcast_parameters) and averages its gradients with
the others' before each step (DistributedOptimizer), so every rank takes the same step as one process would with
the batches of all ranks together."""

from __future__ import annotations
from typing import Any, Callable

from fusegrad.distributed.collectives import Collective, Finish, Start, broadcast, launch, output_like, realized_buffer
from fusegrad.distributed.comm import world
from fusegrad.engine.realize import when_written
from fusegrad.runtime.buffers import Buffer, view_buffer
from fusegrad.distributed.metadata import check_parameters
from fusegrad.helpers import Context
from fusegrad.tensor import Tensor

DEFAULT_BUCKET_MB = 4.0  # flat gradient buffers of a few MB: few large messages, and a step's transfers overlap


def home_device(t: Tensor) -> str:
    """Where a tensor meets the other ranks: its device, or the first of the devices it is sharded over."""
    return t.device if isinstance(t.device, str) else t.device[0]


def one_device(t: Tensor) -> Tensor:
    """t on its home device: a sharded tensor gathered (a replicated one is already reduced over its devices)."""
    return t if isinstance(t.device, str) else t.to(t.device[0])


def placed_like(x: Tensor, t: Tensor) -> Tensor:
    """x (on t's home device) back on t's devices, sharded like t."""
    return x if isinstance(t.device, str) else x.shard_like(t)


def buckets_of(params: list[Tensor], bucket_bytes: int) -> list[list[int]]:
    """Parameter indices in buckets of one dtype and device, last parameters first (the order backward ends in)."""
    out: list[list[int]] = []
    open_: dict[tuple, tuple[list[int], list[int]]] = {}  # (dtype, device) -> (indices, [bytes])
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p.dtype, home_device(p))
        if key not in open_ or open_[key][1][0] >= bucket_bytes:
            open_[key] = ([], [0])
            out.append(open_[key][0])
        open_[key][0].append(i)
        open_[key][1][0] += p.numel() * p.dtype.itemsize
    return out


class DistributedOptimizer:
    """Wraps an optimizer: step() first replaces every parameter's .grad by its mean over all ranks. The gradients
    travel in flat buckets of about `bucket_mb` MB, one nonblocking allreduce each, all in flight together."""

    def __init__(self, optimizer: Any, bucket_mb: float = DEFAULT_BUCKET_MB):
        if not hasattr(optimizer, "params") or not hasattr(optimizer, "step"):
            raise TypeError(f"DistributedOptimizer wraps a fusegrad optimizer, got {type(optimizer).__name__}")
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
        self.optimizer, self.params = optimizer, optimizer.params
        self.buckets = buckets_of(self.params, int(bucket_mb * 2**20))
        self.checked = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)  # lr, zero_grad's friends, state: the wrapped optimizer's

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        self.average_gradients()
        self.optimizer.step()

    def schedule_step(self) -> list[Tensor]:
        self.average_gradients()
        return self.optimizer.schedule_step()

    def average_gradients(self) -> None:
        """Every parameter's .grad becomes the mean of all ranks' gradients (nothing to do for one process)."""
        w = world()
        if w is None:
            return
        for i, p in enumerate(self.params):
            if p.grad is None:
                raise RuntimeError(f"parameter {i} (shape {p.shape}) has no .grad; call backward() before step()")
        if not self.checked:
            check_parameters(w, self.params, "DistributedOptimizer's parameters")
            self.checked = True
        # a sharded parameter's gradient meets the others' on its first device (local devices, then MPI, then back),
        # divided by the group's size in its copy into the bucket, so MPI's sum is the mean and each .grad a view of it
        # (no kernel per parameter to scale it; the same values for a power-of-two group)
        scale = 1.0 / w.size
        flats = [Tensor.cat(*[one_device(self.params[i].grad).flatten() * scale for i in b]) for b in self.buckets]  # type: ignore[union-attr]
        outs = [output_like(flat.shape, flat) for flat in flats]
        colls = [
            Collective(w, "all_reduce", "sum", 0, f"all_reduce(sum) of gradient bucket {k}", flat.dtype)
            for k, flat in enumerate(flats)
        ]
        started: list[Buffer | None] = [None] * len(flats)  # each bucket's input, once its allreduce started

        def start(k: int, src: Buffer) -> None:
            # the earlier buckets' transfers progress at every start: MPI moves data only inside its calls
            launch([(Start(colls[k], colls[:k]), [outs[k][1], src])])
            started[k] = src

        def hook(k: int) -> Callable[[Buffer | None], None]:
            return lambda buf: start(k, buf) if buf is not None and buf.size == flats[k].numel() else None

        for k, flat in enumerate(flats):  # a bucket whose gradients are computed already goes first
            if (buf := view_buffer(flat.uop)) is not None and buf.size == flat.numel():
                start(k, buf)
        # one schedule for every bucket (backward's shared intermediates are computed once); each bucket's allreduce
        # starts as soon as its gradients are written, while backward computes the earlier layers' buckets
        with when_written({flat.uop: hook(k) for k, flat in enumerate(flats) if started[k] is None}):
            Tensor.realize(*flats)
        for k, flat in enumerate(flats):
            if started[k] is None:  # realized outside the schedule's hooks (a view, or the one-root fast path)
                start(k, realized_buffer(flat)[1])
        # the input stays among the wait's buffers: a TinyJit's memory plan must not reuse it while MPI reads it
        launch([(Finish(coll), [out_buf, src]) for coll, (_, out_buf), src in zip(colls, outs, started)])  # type: ignore[misc]
        for bucket, (mean, _) in zip(self.buckets, outs):
            offset = 0
            for i in bucket:
                p = self.params[i]
                p.grad = placed_like(mean[offset : offset + p.numel()].reshape(p.shape), p)
                offset += p.numel()


def broadcast_parameters(params: Any, root: int = 0) -> None:
    """Every rank's tensors (a list, or a state dict) take rank root's values in place."""
    tensors = list(params.values()) if isinstance(params, dict) else list(params)
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"broadcast_parameters: item {i} is a {type(t).__name__}, not a Tensor")
    w = world()
    if w is None:
        return
    names = [str(k) for k in params] if isinstance(params, dict) else [f"parameter {i}" for i in range(len(tensors))]
    check_parameters(w, tensors, "broadcast_parameters", names)
    with Context(FUSEGRAD_DIST_CHECK=0):  # checked above, all at once
        new = [placed_like(broadcast(one_device(t), root, name=name), t) for t, name in zip(tensors, names)]
    Tensor.realize(*[t.assign(v) for t, v in zip(tensors, new)])


__all__ = ["DistributedOptimizer", "broadcast_parameters"]
