"""Allreduce bandwidth and latency of fusegrad.distributed against raw mpi4py and torch.distributed (gloo), and the
training throughput of 2 ranks against 1, all on loopback.

Run: python bench/bench_distributed.py   (it starts `mpirun --oversubscribe -n 2` and `-n 4` itself; env: MAX_MB,
REPS, STEPS, ROUNDS, BUCKET_MB, ONLY=allreduce|train). Each size runs every peer in the same processes, medians of REPS
calls: raw mpi4py, the jitted replay's collective call alone ("call"), the jitted all_reduce, eager, gloo, the
jitted and eager ones again with FUSEGRAD_DIST_BLOCKING=0 ("nb": every collective nonblocking, the earlier path), and
the jitted one captured with no limit ("blk": every size one blocking MPI call).
Training runs 1 rank and 2 ranks alternately ROUNDS times (separate processes: they cannot share one run) and reports
the medians, each round's ratio and the load average, since the cores are shared."""

from __future__ import annotations
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
ENV = {"PYTHONPATH": ROOT, "NUM_CPU_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def median_time(fn, reps: int, barrier) -> float:
    times = []
    for _ in range(reps):
        barrier()
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def allreduce_sizes(max_mb: int) -> list[int]:
    sizes, n = [], 4
    while n <= max_mb * 2**20:
        sizes.append(n)
        n *= 16 if n < 1024 else 4
    return sizes


def worker_allreduce(out: str) -> None:
    import torch
    import torch.distributed as tdist
    from mpi4py import MPI

    from fusegrad import Context, Tensor, TinyJit
    import fusegrad.distributed as dist

    dist.init()
    comm, r, n = MPI.COMM_WORLD, dist.rank(), dist.size()
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['BENCH_PORT']}", rank=r, world_size=n)
    jitted = TinyJit(lambda x: dist.all_reduce(x))
    nonblocking = TinyJit(lambda x: dist.all_reduce(x))  # captured with FUSEGRAD_DIST_BLOCKING=0: the earlier path
    blocking = TinyJit(lambda x: dist.all_reduce(x))  # captured with no limit: one blocking call at every size

    def eager_nb() -> None:
        with Context(FUSEGRAD_DIST_BLOCKING=0):
            dist.all_reduce(x).realize()

    rows = []
    for nbytes in allreduce_sizes(int(os.environ.get("MAX_MB", "256"))):
        count = nbytes // 4
        small = nbytes <= 2**20  # latency-bound: more calls
        reps = max(3, min(int(os.environ.get("REPS", "500" if small else "50")), int(2e8 // nbytes)))
        a, b = np.ones(count, np.float32), np.empty(count, np.float32)
        x, tt = Tensor(a).realize(), torch.ones(count)
        for _ in range(3):
            jitted(x)  # captured on the second call
            with Context(FUSEGRAD_DIST_BLOCKING=0):
                nonblocking(x)
            with Context(FUSEGRAD_DIST_BLOCKING=1 << 40):
                blocking(x)
        for j in (jitted, nonblocking, blocking):
            assert np.all(j(x).numpy() == n), "wrong allreduce result"
        call = jitted.captured.launches[0]  # type: ignore[union-attr]  # the replay's collective call alone
        peers = {
            "mpi4py": lambda: comm.Allreduce(a, b),
            "eager": lambda: dist.all_reduce(x).realize(),
            "eager_nb": eager_nb,
            "call": lambda: call.runner(call.buffers),
            "jit": lambda: jitted(x),
            "jit_nb": lambda: nonblocking(x),
            "jit_blk": lambda: blocking(x),
            "gloo": lambda: tdist.all_reduce(tt),
        }
        times: dict[str, list[float]] = {k: [] for k in peers}
        # the peers alternate in 3 rounds at every size: at 256 MB one round's 3 calls per peer measured the order
        # they ran in (and whatever else the 2 cores did meanwhile) more than the peers
        for _ in range(3):
            for k, fn in peers.items():
                times[k].append(median_time(fn, reps, comm.Barrier))
        jitted.reset()
        nonblocking.reset()
        blocking.reset()
        rows.append({"bytes": nbytes, **{k: statistics.median(v) for k, v in times.items()}})
    tdist.destroy_process_group()
    if r == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


def worker_train(out: str) -> None:
    from fusegrad import Context, Tensor, TinyJit, nn
    from fusegrad.nn.datasets import digits
    from fusegrad.nn.optim import Adam
    from fusegrad.nn.state import get_parameters
    import fusegrad.distributed as dist

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from train_digits import ConvNet

    class MLP:
        def __init__(self):
            self.l1, self.l2, self.l3 = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 10)

        def __call__(self, x: Tensor) -> Tensor:
            return self.l3(self.l2(self.l1(x.flatten(1)).relu()).relu())

    dist.init()
    X, Y, _, _ = digits()
    # data, not a parameter: marked so backward does not fill X.grad, a one-hot scatter-add over all 1438 rows that
    # took 45% of the MLP's step and accumulated every step
    X = (X.float() / 16.0).requires_grad_(False)
    batch, steps, rows = 128, int(os.environ.get("STEPS", "100")), {}
    for name, make in (("mlp", MLP), ("digits convnet", ConvNet)):
        model = make()
        params = get_parameters(model)
        dist.broadcast_parameters(params)
        opt = dist.DistributedOptimizer(Adam(params, lr=1e-3), bucket_mb=float(os.environ.get("BUCKET_MB", "4")))
        sampler = dist.DistributedSampler(int(Y.shape[0]))

        @TinyJit
        def step(idx: Tensor) -> Tensor:
            with Context(TRAINING=1):
                opt.zero_grad()
                loss = model(X[idx]).sparse_categorical_crossentropy(Y[idx])
                loss.backward()
                opt.step()
            return loss

        idx = Tensor(sampler.indices()[:batch].astype(np.int32)).realize()
        for _ in range(3):
            step(idx).realize()
        w = dist.comm.world()
        waited = w.waited_s if w else 0.0
        dist.barrier()
        st, cpu, times = time.perf_counter(), time.process_time(), []
        for _ in range(steps):
            t0 = time.perf_counter()
            step(idx).realize()
            times.append(time.perf_counter() - t0)
        dist.barrier()
        elapsed, cpu = time.perf_counter() - st, time.process_time() - cpu
        comm_s = (w.waited_s - waited) if w else 0.0
        # every rank's step ends at the same allreduce, so rank 0's median step is the group's; the CPU seconds a rank
        # used per step (its waits spin only briefly) say what a core of its own would give
        cpu_step = w.mpi.COMM_WORLD.allreduce(cpu / steps, op=w.mpi.MAX) if w else cpu / steps
        rows[name] = {
            "samples_per_s": dist.size() * batch / statistics.median(times),
            "mean_samples_per_s": dist.size() * batch * steps / elapsed,
            "cpu_samples_per_s": dist.size() * batch / cpu_step,
            "comm_fraction": comm_s / elapsed,
        }
    if dist.rank() == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


def launch(ranks: int, what: str, out: str) -> None:
    launcher = shutil.which("mpirun")
    assert launcher, "mpirun not found: pip install 'fusegrad[mpi]'"
    cmd = [launcher, "--oversubscribe", "-n", str(ranks), sys.executable, __file__, what, out]
    env = {**os.environ, **ENV, "BENCH_PORT": str(29500 + ranks + os.getpid() % 1000)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")


def fmt_bytes(n: int) -> str:
    return f"{n >> 20} MB" if n >= 2**20 else f"{n >> 10} KB" if n >= 1024 else f"{n} B"


def fit_ring(rows: dict[int, list[dict]], peer: str) -> tuple[float, float]:
    """alpha (s) and B (bytes/s) of the ring model t = 2(p-1)*alpha + 2(p-1)/p * n/B, least squares over every size and
    rank count, each row weighted by 1/t so small and large messages count alike."""
    a, y = [], []
    for p, table in rows.items():
        for row in table:
            t = row[peer]
            a.append([2 * (p - 1) / t, 2 * (p - 1) / p * row["bytes"] / t])
            y.append(1.0)
    (alpha, inv_b), *_ = np.linalg.lstsq(np.array(a), np.array(y), rcond=None)
    return float(alpha), 1.0 / float(inv_b)


def main() -> None:
    tmp, only = tempfile.mkdtemp(prefix="bench_distributed-"), os.environ.get("ONLY", "allreduce,train").split(",")
    if "allreduce" in only:
        allreduce_tables(tmp)
    if "train" in only:
        train_scaling(tmp)
    shutil.rmtree(tmp)


def allreduce_tables(tmp: str) -> None:
    tables: dict[int, list[dict]] = {}
    for ranks in (2, 4):
        out = os.path.join(tmp, f"allreduce{ranks}.json")
        launch(ranks, "allreduce", out)
        print(f"\nallreduce of float32 on {ranks} ranks (loopback), median latency and bus bandwidth 2(p-1)/p*n/t")
        print(
            f"{'size':>8s} {'mpi4py':>10s} {'call':>10s} {'jit':>10s} {'jit nb':>10s} {'jit blk':>10s} {'eager':>10s} "
            f"{'gloo':>10s}  "
            f"{'mpi GB/s':>8s} {'jit GB/s':>8s}  {'jit/mpi':>7s} {'nb/mpi':>7s} {'jit/gloo':>8s} {'eager/mpi':>9s} "
            f"{'nb/mpi':>9s} {'blk/mpi':>7s}"
        )
        tables[ranks] = json.load(open(out))
        for row in tables[ranks]:
            bus = 2 * (ranks - 1) / ranks * row["bytes"] / 1e9
            print(
                f"{fmt_bytes(row['bytes']):>8s} {row['mpi4py'] * 1e6:8.1f}us {row['call'] * 1e6:8.1f}us "
                f"{row['jit'] * 1e6:8.1f}us "
                f"{row['jit_nb'] * 1e6:8.1f}us {row['jit_blk'] * 1e6:8.1f}us {row['eager'] * 1e6:8.1f}us "
                f"{row['gloo'] * 1e6:8.1f}us  "
                f"{bus / row['mpi4py']:8.3f} {bus / row['jit']:8.3f}  {row['mpi4py'] / row['jit']:6.2f}x "
                f"{row['mpi4py'] / row['jit_nb']:6.2f}x {row['gloo'] / row['jit']:7.2f}x "
                f"{row['mpi4py'] / row['eager']:8.2f}x {row['mpi4py'] / row['eager_nb']:8.2f}x "
                f"{row['mpi4py'] / row['jit_blk']:6.2f}x"
            )
    print("\nring model t = 2(p-1)*alpha + 2(p-1)/p * n/B fitted to both rank counts:")
    for peer in ("mpi4py", "jit", "gloo"):
        alpha, bw = fit_ring(tables, peer)
        print(f"{peer:>8s}: alpha = {alpha * 1e6:8.2f} us, B = {bw / 1e9:6.2f} GB/s")


def train_scaling(tmp: str) -> None:
    rounds, runs, loads = int(os.environ.get("ROUNDS", "3")), {1: [], 2: []}, []  # type: ignore[var-annotated]
    for _ in range(rounds):
        loads.append(os.getloadavg()[0])
        for ranks in (1, 2):
            out = os.path.join(tmp, f"train{ranks}.json")
            launch(ranks, "train", out)
            runs[ranks].append(json.load(open(out)))
    loads.append(os.getloadavg()[0])
    bucket = os.environ.get("BUCKET_MB", "4")
    print(f"\ntraining throughput (Adam, batch 128 per rank, jitted steps, 1 thread per rank, {bucket} MB buckets),")
    print(f"medians of {rounds} alternating rounds; 1-minute load average {', '.join(f'{x:.1f}' for x in loads)}")
    for name in runs[1][0]:
        print(f"{name}, 2 ranks vs 1 (medians over rounds; each round's ratio in brackets):")
        for key, what in (
            ("samples_per_s", "median step"),
            ("mean_samples_per_s", "mean step"),
            ("cpu_samples_per_s", "CPU time per step"),
        ):
            one = statistics.median(r[name][key] for r in runs[1])
            two = statistics.median(r[name][key] for r in runs[2])
            ratios = ", ".join(f"{b[name][key] / a[name][key]:.2f}" for a, b in zip(runs[1], runs[2]))
            print(f"  {what:>18s}: 1 rank {one:8.0f}, 2 ranks {two:8.0f} samples/s = {two / one:.2f}x [{ratios}]")
        comm = statistics.median(r[name]["comm_fraction"] for r in runs[2])
        print(f"  {comm * 100:.0f}% of the 2-rank wall time waiting on communication (median over rounds)")


if __name__ == "__main__":
    if len(sys.argv) == 3:
        {"allreduce": worker_allreduce, "train": worker_train}[sys.argv[1]](sys.argv[2])
    else:
        main()
