"""What the multi-process tests run on every rank (`mpirun -n N python tests/distributed/mpi_worker.py SCENARIO OUT`).
Each scenario checks its results against numpy on every rank, and rank 0 writes what the test compares to one process
into OUT (an .npz)."""

from __future__ import annotations
import itertools
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from fusegrad import Context, Tensor, TinyJit, dtypes, nn
from fusegrad.nn.datasets import digits
from fusegrad.nn.optim import SGD, Adam
from fusegrad.nn.state import get_parameters, get_state_dict
import fusegrad.distributed as dist

# dtypes and the ops each supports; numpy computes the reference
DTYPES = {
    "float32": ("sum", "mean", "max", "min"),
    "float64": ("sum", "mean", "max", "min"),
    "float16": ("sum", "max", "min"),
    "bfloat16": ("sum", "max"),
    "int8": ("max", "min"),
    "uint8": ("sum", "max", "min"),
    "int16": ("sum", "max"),
    "int32": ("sum", "max", "min"),
    "int64": ("sum", "min"),
    "uint32": ("sum", "max"),
    "uint64": ("sum",),
    "bool": ("max", "min"),
}
SIZES = (1, 7, 1000)
LARGE = 10**7 + 3


def values(rank: int, dtype: str, n: int) -> np.ndarray:
    """Rank `rank`'s input: small integers, so sums are exact in every dtype (fp16/bf16 included)."""
    rng = np.random.default_rng(1000 * rank + n)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    return rng.integers(0, 5, n).astype(np.float32 if dtype == "bfloat16" else dtype)


def reference(op: str, xs: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(xs)
    if op in ("sum", "mean"):
        s = stack.sum(axis=0, dtype=stack.dtype if stack.dtype != bool else None)
        return s / len(xs) if op == "mean" else s
    return stack.max(axis=0) if op == "max" else stack.min(axis=0)


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.shape != want.shape or not np.array_equal(got.astype(want.dtype), want):
        raise AssertionError(f"rank {dist.rank()}: {what}: got {got.reshape(-1)[:8]}, want {want.reshape(-1)[:8]}")


def collectives(out: str) -> None:
    r, n, checked = dist.rank(), dist.size(), 0
    for dtype, ops in DTYPES.items():
        dt = getattr(dtypes, dtype)
        for size in SIZES:
            xs = [values(k, dtype, size) for k in range(n)]
            x = Tensor(xs[r], dtype=dt)
            for op in ops:
                check(dist.all_reduce(x, op).numpy(), reference(op, xs), f"all_reduce({op}) {dtype} {size}")
                checked += 1
            check(dist.broadcast(x, root=n - 1).numpy(), xs[n - 1], f"broadcast {dtype} {size}")
            check(dist.all_gather(x).numpy(), np.concatenate(xs), f"all_gather {dtype} {size}")
            blocks = [values(k, dtype, size * n) for k in range(n)]
            rs = dist.reduce_scatter(Tensor(blocks[r], dtype=dt), ops[0]).numpy()
            check(rs, reference(ops[0], blocks)[r * size : (r + 1) * size], f"reduce_scatter({ops[0]}) {dtype} {size}")
            checked += 3
    big = [np.random.default_rng(k).standard_normal(LARGE, dtype=np.float32) for k in range(n)]
    got = dist.all_reduce(Tensor(big[r]), "sum").numpy()
    np.testing.assert_allclose(got, np.sum(big, axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)
    check(dist.all_gather(Tensor(big[r][: LARGE // 8])).numpy(), np.concatenate([b[: LARGE // 8] for b in big]), "big")
    check(dist.all_reduce(Tensor(3.0 + r)).numpy(), np.float32(sum(3.0 + k for k in range(n))), "scalar all_reduce")
    check(dist.all_gather(Tensor(float(r))).numpy(), np.arange(n, dtype=np.float32), "scalar all_gather")
    check(dist.all_reduce(Tensor.zeros(0, 3)).numpy(), np.zeros((0, 3), np.float32), "empty all_reduce")
    checked += 5
    # ranks started from different seeds end equal
    Tensor.manual_seed(r)
    model = MLP()
    params = get_parameters(model)
    dist.broadcast_parameters(get_state_dict(model))
    for p in params:
        check(dist.all_gather(p).numpy(), np.concatenate([p.numpy()] * n), "broadcast_parameters")
    local = dist.all_gather(Tensor(dist.local_rank())).numpy()
    assert sorted(local.tolist()) == list(range(n)), f"one machine: the local ranks are {local}"
    # rank 0 writes, every rank resumes with its values
    path = os.path.join(os.path.dirname(os.path.abspath(out)), "ckpt.safetensors")
    dist.save_checkpoint(get_state_dict(model), path)
    fresh = get_state_dict(MLP())
    dist.load_checkpoint(fresh, path)
    for k, v in get_state_dict(model).items():
        check(fresh[k].numpy(), v.numpy(), f"checkpoint {k}")
    print(f"rank {r}: {checked} collectives match numpy", flush=True)


class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(64, 32), nn.Linear(32, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x.flatten(1)).relu())


class ConvNet:
    def __init__(self):
        self.c1, self.l1 = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4 * 4 * 4, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l1(self.c1(x).relu().max_pool2d(2).flatten(1))


def train(model_kind: str, opt_kind: str, batch: int, steps: int, jit: bool, seed: int = 0) -> list[np.ndarray]:
    """`steps` steps on the digits, each rank on its shard of every global batch; the final parameters. A "_sharded"
    optimizer kind also splits each rank's batch over two local devices, the parameters replicated on both."""
    local = ("CPU:0", "CPU:1") if opt_kind.endswith("_sharded") else None
    opt_kind = opt_kind.removesuffix("_sharded")
    X, Y, _, _ = digits()
    X = X.float() / 16.0
    Tensor.manual_seed(seed + dist.rank())  # different on every rank: broadcast_parameters makes them equal
    model = MLP() if model_kind == "mlp" else ConvNet()
    params = get_parameters(model)
    for p in params if local else []:
        p.shard_(local)
    dist.broadcast_parameters(params)
    if opt_kind == "adam_zero":  # optimizer state sharded over the ranks
        opt: Any = dist.ZeroOptimizer(params, lambda shard: Adam(shard, lr=3e-3))
    else:
        base = SGD(params, lr=0.1, momentum=0.9) if opt_kind == "sgd" else Adam(params, lr=3e-3)
        opt = dist.DistributedOptimizer(base, bucket_mb=0.004)  # 4 KB: several buckets even for these small models
    sampler = dist.DistributedSampler(int(Y.shape[0]), seed=seed)

    def step(idx: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            x, y = (X[idx].shard(local, axis=0), Y[idx].shard(local, axis=0)) if local else (X[idx], Y[idx])
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss

    run = TinyJit(step) if jit else step
    per_epoch = len(sampler) // batch
    for i in range(steps):
        sampler.set_epoch(i // per_epoch)
        idx = sampler.indices()[(i % per_epoch) * batch : (i % per_epoch + 1) * batch]
        run(Tensor(idx.astype(np.int32))).realize()
    return [p.numpy() for p in params]


CONFIGS = [
    ("mlp", "sgd"),
    ("mlp", "adam"),
    ("mlp", "adam_zero"),
    ("mlp", "sgd_sharded"),
    ("conv", "sgd"),
    ("conv", "adam"),
]


def training(out: str, batch: int, steps: int) -> None:
    results = {}
    for model_kind, opt_kind in CONFIGS:
        eager = train(model_kind, opt_kind, batch, steps, jit=False)
        jitted = train(model_kind, opt_kind, batch, steps, jit=True)
        for i, (e, j) in enumerate(zip(eager, jitted)):
            check(j, e, f"{model_kind} {opt_kind} parameter {i}: jitted == eager, bit for bit")
            # every rank holds the same weights, bit for bit
            check(dist.all_gather(Tensor(e)).numpy(), np.concatenate([e] * dist.size()), f"ranks agree on {i}")
            results[f"{model_kind}_{opt_kind}_{i}"] = e
    if dist.rank() == 0:
        np.savez(out, **results)
    print(f"rank {dist.rank()}: trained {len(CONFIGS)} configs, jit == eager", flush=True)


def overlap(out: str) -> None:
    """Each gradient bucket's allreduce starts while backward still computes the earlier layers' buckets: in an eager
    step (kernels run between the starts) and in a TinyJit capture (kernel launches recorded between them)."""
    from fusegrad import GlobalCounters
    from fusegrad.distributed import collectives

    starts: list[int] = []
    plain_start = collectives.Start.__call__

    def counting_start(self: Any, buffers: list) -> None:
        starts.append(GlobalCounters.kernel_count)
        plain_start(self, buffers)

    collectives.Start.__call__ = counting_start  # type: ignore[method-assign]
    X, Y, _, _ = digits()
    model = MLP()
    params = get_parameters(model)
    dist.broadcast_parameters(params)
    opt = dist.DistributedOptimizer(SGD(params, lr=0.1), bucket_mb=1e-4)  # 3 buckets: l2, l1.bias, l1.weight

    def step(idx: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(X[idx].float() / 16.0).sparse_categorical_crossentropy(Y[idx])
            loss.backward()
            opt.step()
        return loss

    idx = Tensor(np.arange(dist.rank() * 16, dist.rank() * 16 + 16, dtype=np.int32))
    step(idx).realize()
    assert len(starts) == len(opt.buckets) == 3, (starts, opt.buckets)
    assert starts == sorted(starts) and starts[0] < starts[-1], f"no kernel ran between the bucket starts: {starts}"
    jitted = TinyJit(step)
    for _ in range(3):
        jitted(idx).realize()
    names = {collectives.Start: "start", collectives.Finish: "wait"}
    kinds = [names.get(type(la.runner), "kernel") for la in jitted.captured.launches]  # type: ignore[union-attr]
    first, last = kinds.index("start"), len(kinds) - 1 - kinds[::-1].index("start")
    assert "kernel" in kinds[first:last] and kinds.index("wait") > last, kinds
    print(f"rank {dist.rank()}: eager starts after kernels {starts}; captured {' '.join(kinds[first : last + 2])}")


def fastpath(out: str) -> None:
    """Jitted collectives on both sides of FUSEGRAD_DIST_BLOCKING (one blocking MPI call bound at capture; a
    nonblocking call and its wait): values vs numpy on replays with new and repeated inputs, equal to the eager call."""
    from fusegrad.helpers import DIST_BLOCKING

    r, n, checked = dist.rank(), dist.size(), 0
    fns: dict[str, Any] = {
        "all_reduce(sum)": lambda x: dist.all_reduce(x, "sum"),
        "all_reduce(mean)": lambda x: dist.all_reduce(x, "mean"),
        "all_gather": lambda x: dist.all_gather(x),
        "broadcast": lambda x: dist.broadcast(x, root=n - 1),
        "reduce_scatter(max)": lambda x: dist.reduce_scatter(x, "max"),
    }
    limit = int(DIST_BLOCKING.value)
    # the input a jit argument (its memory changes per call) or the step's own buffer (x + 1: the large ones replay as
    # persistent requests)
    for count, owned in itertools.product((1, 1000, limit // 4 // n + 5), (False, True)):
        for name, fn in fns.items():
            step = (lambda x, fn=fn: fn(x + 1)) if owned else fn
            jitted, inputs = TinyJit(step), {}
            for call in (0, 1, 2, 2, 3):  # warm-up, capture, replays: a new input, the same one again, another
                xs = [values(k, "float32", count * n) + call for k in range(n)]
                x = inputs.setdefault(call, Tensor(xs[r]))
                xs = [v + 1 for v in xs] if owned else xs
                want = {
                    "all_reduce(sum)": reference("sum", xs),
                    "all_reduce(mean)": reference("mean", xs),
                    "all_gather": np.concatenate(xs),
                    "broadcast": xs[n - 1],
                    "reduce_scatter(max)": reference("max", xs)[r * count : (r + 1) * count],
                }[name]
                check(jitted(x).numpy(), want, f"jitted {name} of {count * n} call {call}")
                check(step(x).numpy(), want, f"eager {name} of {count * n} call {call}")
                checked += 2
            bound = [la.runner.persistent for la in jitted.captured.launches if hasattr(la.runner, "persistent")]  # type: ignore[union-attr]
            assert (bound[0] is not None) == (owned and count * n * 4 > limit), f"{name} of {count * n}: {bound}"
    checked += eager_results_stay(r, n)
    print(f"rank {r}: {checked} jitted and eager collectives match numpy", flush=True)


def eager_results_stay(r: int, n: int) -> int:
    """Repeated eager collectives of one shape reuse a dead result's memory for the next (bound to libmpi once): the
    live results, a lazy graph over one and a chain of results keep their values; mpi4py's calls give the same."""
    from fusegrad.distributed.comm import world

    w, checked = world(), 0
    assert w is not None and w.lib is not None, "libmpi not found: every blocking call goes through mpi4py"
    lib_found = w.lib
    for lib in (w.lib, None):
        w.lib, kept, w.eager = lib, [], {}
        for i in range(6):
            xs = [values(k, "float32", 7) + i for k in range(n)]
            y = dist.all_reduce(Tensor(xs[r]))
            lazy = y * 2 if i == 3 else None
            check(y.numpy(), reference("sum", xs), f"eager all_reduce {i}")
            if i % 2:
                kept.append((y, reference("sum", xs)))
            if lazy is not None:
                dist.all_reduce(Tensor(xs[r])).numpy()  # one more result in the memory the lazy graph does not read
                check(lazy.numpy(), 2 * reference("sum", xs), "a lazy graph over an eager result")
            checked += 2
        for y, want in kept:
            check(y.numpy(), want, "a kept eager result")
        assert lib is None or any(w.eager.values()), "the eager calls did not take the libmpi path"
        y, xs = Tensor(values(r, "float32", 5)), [values(k, "float32", 5) for k in range(n)]
        for i in range(3):  # each call's input is the previous result
            y = dist.all_reduce(y)
            check(y.numpy(), reference("sum", xs) * n**i, f"chained eager all_reduce {i}")
            checked += 1
    w.lib = lib_found
    return checked


def fault(kind: str) -> None:
    """A rank misbehaves at the third collective; the others must fail with an error naming it."""
    r = dist.rank()
    x = Tensor.ones(1 << 18 if kind == "hang_large" else 16)  # 1 MB: a blocking call only under the default limit
    dist.all_reduce(x).realize()
    dist.all_reduce(x).realize()
    if r == 1 and kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if r == 1 and kind in ("hang", "hang_large"):
        time.sleep(120)
    if kind == "hang_jit":  # a replay's blocking call: the watchdog thread ends the job
        jitted, x = TinyJit(lambda x: dist.all_reduce(x)), x.contiguous().realize()
        for _ in range(3):
            jitted(x).realize()
        if r == 1:
            time.sleep(120)
        jitted(x).realize()
    if kind == "shape":
        x = Tensor.ones(16 + (r == 1))
    if kind == "count":
        params = [Tensor.ones(3, requires_grad=True) for _ in range(2 + (r == 1))]
        dist.broadcast_parameters(params)
    dist.all_reduce(x).realize()
    print(f"rank {r}: no error", flush=True)


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    dist.init()
    if scenario == "collectives":
        collectives(out)
    elif scenario == "fastpath":
        fastpath(out)
    elif scenario == "overlap":
        overlap(out)
    elif scenario == "train":
        training(out, int(os.environ.get("BATCH", "8")), int(os.environ.get("STEPS", "20")))
    else:
        fault(scenario)


if __name__ == "__main__":
    main()
