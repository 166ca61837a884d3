"""Data-parallel training across processes over MPI (mpi4py): run a program under `mpirun -n N`; run plainly it is a
group of one. Collectives take and return Tensors; DistributedOptimizer averages gradients before every step."""

from fusegrad.distributed.checkpoint import load_checkpoint, save_checkpoint
from fusegrad.distributed.collectives import all_gather, all_reduce, broadcast, reduce_scatter
from fusegrad.distributed.comm import DistributedError, barrier, init, local_rank, rank, size
from fusegrad.distributed.optimizer import DistributedOptimizer, broadcast_parameters
from fusegrad.distributed.sampler import DistributedSampler
from fusegrad.distributed.zero import ZeroOptimizer

__all__ = [
    "DistributedError",
    "DistributedOptimizer",
    "DistributedSampler",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "broadcast_parameters",
    "init",
    "load_checkpoint",
    "local_rank",
    "rank",
    "reduce_scatter",
    "save_checkpoint",
    "size",
    "ZeroOptimizer",
]
