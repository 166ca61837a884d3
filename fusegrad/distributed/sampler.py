"""Which samples each rank trains on: one permutation per epoch from one seed (the same on every rank), dealt out
round-robin, so the ranks' batches at a step together are the batch one process would draw."""

from __future__ import annotations
from typing import Iterator

import numpy as np

from fusegrad.distributed.comm import rank as world_rank, size as world_size


class DistributedSampler:
    """Indices of a dataset of n samples for one rank. With drop_last=False the permutation is padded by its own
    start to a multiple of the rank count (every rank gets as many), else its tail is dropped."""

    def __init__(
        self,
        n: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
    ):
        self.num_replicas = world_size() if num_replicas is None else num_replicas
        self.rank = world_rank() if rank is None else rank
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"dataset size must be an int >= 0, got {n!r}")
        if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {self.num_replicas!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must be in 0..{self.num_replicas - 1}, got {self.rank!r}")
        if drop_last and n < self.num_replicas:
            raise ValueError(f"drop_last with {n} samples for {self.num_replicas} ranks leaves every rank none")
        self.n, self.shuffle, self.seed, self.drop_last, self.epoch = n, shuffle, seed, drop_last, 0
        per = n // self.num_replicas if drop_last else -(-n // self.num_replicas)
        self.num_samples = per

    def set_epoch(self, epoch: int) -> None:
        """Each epoch its own permutation (seed + epoch): call it before iterating an epoch."""
        self.epoch = epoch

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch, as int64."""
        order = np.random.default_rng(self.seed + self.epoch).permutation(self.n) if self.shuffle else np.arange(self.n)
        total = self.num_samples * self.num_replicas
        if total > self.n:
            order = np.resize(order, total) if self.n else order  # np.resize repeats the permutation from its start
        return order[:total][self.rank :: self.num_replicas].astype(np.int64)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["DistributedSampler"]
