"""fusegrad.distributed in one process (a group of one, as a program run without mpirun sees it): the API, its errors,
the sampler's split, the gradient buckets and checkpoints. The multi-process runs are in test_distributed_mpi.py."""

import itertools
import sys

import numpy as np
import pytest

import fusegrad.distributed as dist
from fusegrad import Context, Tensor, dtypes
from fusegrad.distributed import comm
from fusegrad.distributed.collectives import host_array
from fusegrad.distributed.metadata import describe, encode
from fusegrad.distributed.optimizer import buckets_of
from fusegrad.nn.optim import SGD
from fusegrad.runtime.buffers import view_buffer


def test_group_of_one_without_mpirun():
    dist.init()
    dist.init()  # a second call changes nothing
    assert (dist.rank(), dist.size(), dist.local_rank()) == (0, 1, 0)
    dist.barrier()


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_collectives_of_one_rank_are_the_input(op):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(dist.all_reduce(Tensor(x), op).numpy(), x)
    np.testing.assert_array_equal(dist.reduce_scatter(Tensor(x), op).numpy(), x)
    np.testing.assert_array_equal(dist.broadcast(Tensor(x)).numpy(), x)
    np.testing.assert_array_equal(dist.all_gather(Tensor(x)).numpy(), x)
    assert dist.all_gather(Tensor(2.0)).shape == (1,)


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda: dist.all_reduce(Tensor([1.0]), "prod"), ValueError, "op must be one of"),
        (lambda: dist.all_reduce(Tensor([True]), "sum"), TypeError, "bool tensor"),
        (lambda: dist.all_reduce(Tensor([1, 2]), "mean"), TypeError, "op='mean' of a dtypes.int"),
        (lambda: dist.broadcast(Tensor([1.0]), root=1), ValueError, r"root must be a rank in 0..0, got 1"),
        (lambda: dist.all_reduce(np.ones(3)), TypeError, "expects a Tensor, got ndarray"),
        (lambda: dist.reduce_scatter(Tensor(1.0)), ValueError, r"axis 0 of shape \(\) must split into 1"),
        (lambda: dist.all_gather(Tensor.ones(4).shard(("CPU:0", "CPU:1"))), ValueError, "sharded over"),
    ],
)
def test_bad_input_is_named(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_init_without_mpi4py_names_the_extra(monkeypatch):
    monkeypatch.setattr(comm, "_world", [])
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")  # as under mpirun
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py fails
    with pytest.raises(ImportError, match=r"pip install 'fusegrad\[mpi\]'"):
        dist.init()


def test_bad_timeout_is_named(monkeypatch):
    monkeypatch.setattr(comm, "_world", [])
    with Context(FUSEGRAD_DIST_TIMEOUT=-1.0), pytest.raises(ValueError, match="FUSEGRAD_DIST_TIMEOUT must be"):
        dist.init()


def test_host_buffers_are_shared_with_mpi_not_copied():
    t = Tensor(np.arange(5, dtype=np.float32)).realize()
    buf = view_buffer(t.uop)
    arr = host_array(buf)
    arr[0] = 42.0  # MPI writes its results into exactly this memory
    assert t.numpy()[0] == 42.0


@pytest.mark.parametrize("n, ranks, drop_last", [(10, 3, False), (10, 3, True), (12, 4, False), (5, 1, False)])
def test_sampler_deals_one_permutation_to_the_ranks(n, ranks, drop_last):
    shards = [dist.DistributedSampler(n, seed=3, drop_last=drop_last, num_replicas=ranks, rank=r) for r in range(ranks)]
    assert len({len(s) for s in shards}) == 1
    got = np.stack([s.indices() for s in shards], axis=1).reshape(-1)  # step i's samples of all ranks together
    perm = np.random.default_rng(3).permutation(n)
    want = perm[: len(got)] if drop_last else np.resize(perm, len(got))
    np.testing.assert_array_equal(got, want)
    assert len(set(got.tolist())) == (len(got) if drop_last else n)


def test_sampler_reshuffles_per_epoch_alike_on_every_rank():
    a, b = (
        dist.DistributedSampler(100, seed=1, num_replicas=2, rank=0),
        dist.DistributedSampler(100, seed=1, num_replicas=2, rank=1),
    )
    first = a.indices()
    a.set_epoch(1)
    b.set_epoch(1)
    assert not np.array_equal(first, a.indices())
    assert sorted(np.concatenate([a.indices(), b.indices()]).tolist()) == list(range(100))
    assert list(dist.DistributedSampler(4, shuffle=False)) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n": -1}, "dataset size"),
        ({"n": 4, "num_replicas": 0}, "num_replicas"),
        ({"n": 4, "num_replicas": 2, "rank": 2}, "rank must be in 0..1"),
        ({"n": 1, "num_replicas": 2, "rank": 0, "drop_last": True}, "leaves every rank none"),
    ],
)
def test_sampler_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dist.DistributedSampler(**kwargs)


def test_buckets_hold_one_dtype_last_parameters_first():
    params = [Tensor.empty(256), Tensor.empty(256), Tensor.empty(10, dtype=dtypes.float16), Tensor.empty(256)]
    # 1 KB buckets of float32: each 256-float parameter fills one
    assert buckets_of(params, 1024) == [[3], [2], [1], [0]]
    assert buckets_of(params, 4096) == [[3, 1, 0], [2]]


def test_hooks_run_as_soon_as_their_root_is_written():
    # the schedule runs in pieces: each hook sees its root's values written while later kernels have not run yet
    from fusegrad import GlobalCounters
    from fusegrad.engine.realize import when_written

    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
    first = (x * 2).sum(axis=1)
    second = (x.exp() @ x.T).relu().sum(axis=0)
    seen: list[tuple[str, np.ndarray, int]] = []

    def hook(name):
        return lambda buf: seen.append((name, buf.numpy().copy(), GlobalCounters.kernel_count))

    GlobalCounters.reset()
    with when_written({first.uop: hook("first"), second.uop: hook("second")}):
        Tensor.realize(first, second)
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert [name for name, _, _ in seen] == ["first", "second"]
    np.testing.assert_allclose(seen[0][1], (xs * 2).sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(seen[1][1], np.maximum(np.exp(xs) @ xs.T, 0).sum(axis=0), rtol=1e-5)
    assert seen[0][2] < seen[1][2] <= GlobalCounters.kernel_count


def test_distributed_optimizer_of_one_rank_steps_like_its_optimizer():
    def run(wrap):
        Tensor.manual_seed(0)
        w = Tensor.randn(4, 3, requires_grad=True)
        opt = SGD([w], lr=0.1)
        opt = dist.DistributedOptimizer(opt) if wrap else opt
        with Context(TRAINING=1):
            for _ in range(3):
                opt.zero_grad()
                (w * w).sum().backward()
                opt.step()
        return w.numpy()

    np.testing.assert_array_equal(run(True), run(False))
    with pytest.raises(TypeError, match="wraps a fusegrad optimizer"):
        dist.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        dist.DistributedOptimizer(SGD([Tensor.ones(2, requires_grad=True)], lr=0.1), bucket_mb=0)


def test_checkpoint_round_trip_and_mismatch(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    state = {"w": Tensor([1.0, 2.0]).contiguous().realize(), "b": Tensor([3]).contiguous().realize()}
    dist.save_checkpoint(state, path)
    fresh = {
        "w": Tensor.zeros(2).contiguous().realize(),
        "b": Tensor.zeros(1, dtype=dtypes.int32).contiguous().realize(),
    }
    dist.load_checkpoint(fresh, path)
    assert fresh["w"].tolist() == [1.0, 2.0] and fresh["b"].tolist() == [3]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"]  # no temporary file left
    with pytest.raises(ValueError, match=r"w is dtypes.float32 \(2,\), the model's dtypes.float32 \(3,\)"):
        dist.load_checkpoint({"w": Tensor.zeros(3).contiguous().realize()}, path)
    with pytest.raises(KeyError, match="lacks"):
        dist.load_checkpoint({"v": Tensor.zeros(2).contiguous().realize()}, path)


def test_metadata_rows_describe_the_call():
    row = np.array(encode(4, "broadcast", "", 2, dtypes.int16, (3, 5)))
    assert describe(row) == "broadcast(root=2) of int16 (3, 5) as collective #5"
    long = np.array(encode(0, "all_reduce", "sum", 0, dtypes.float32, (2,) * 10))
    assert describe(long).startswith("all_reduce(sum) of float32 (2, 2, 2, 2, 2, 2, 2, 8)")
    # a parameter check's first row (as long as a collective's, so the two meet in one all-gather) names its count
    header = np.array(encode(6, "parameters", "", -1, dtypes.int64, (3,)))
    assert describe(header) == "a check of 3 tensors as collective #7"


def test_differing_rows_name_the_first_rank_and_tensor():
    from fusegrad.distributed.metadata import check_table

    rows = [encode(0, "parameters", "", 0, dtypes.float32, s) for s in ((4, 3), (3,))]
    table = np.array([rows, rows, [rows[0], encode(0, "parameters", "", 0, dtypes.float32, (2,))]])
    check_table(table[:2], "x", lambda i: "")  # equal: nothing raised
    with pytest.raises(dist.DistributedError, match=r"in x on 'b': rank 0 calls parameters of float32 \(3,\).*rank 2"):
        check_table(table, "x", lambda i: f" on {'ab'[i]!r}")


def test_zero_optimizer_of_one_rank_steps_like_its_optimizer():
    from fusegrad.nn.optim import LAMB, Adam

    def run(zero):
        Tensor.manual_seed(0)
        a, b = Tensor.randn(3, 5, requires_grad=True), Tensor.randn(7, requires_grad=True)
        opt = dist.ZeroOptimizer([a, b], lambda shard: Adam(shard, lr=0.01)) if zero else Adam([a, b], lr=0.01)
        with Context(TRAINING=1):
            for _ in range(3):
                opt.zero_grad()
                ((a * a).sum() + (b * 3).sum()).backward()
                opt.step()
        return np.concatenate([a.numpy().reshape(-1), b.numpy()])

    np.testing.assert_array_equal(run(True), run(False))
    with pytest.raises(ValueError, match="LAMB scales each whole tensor"):
        dist.ZeroOptimizer([Tensor.ones(2)], lambda shard: LAMB(shard))
    with pytest.raises(ValueError, match="share one dtype and device"):
        dist.ZeroOptimizer([Tensor.ones(2), Tensor.ones(2, dtype=dtypes.float16)], lambda shard: Adam(shard))


def test_collectives_over_comm_self_call_libmpi_and_match_numpy(monkeypatch):
    # a group of one that still runs every collective through MPI (COMM_SELF): the bound libmpi calls, eager (the
    # cached call and its reused output memory) and in a TinyJit replay, against numpy
    MPI = pytest.importorskip("mpi4py.MPI")
    from fusegrad import TinyJit

    w = comm.World(MPI, MPI.COMM_SELF)
    assert w.lib is not None, "the libmpi mpi4py loaded was not found"
    monkeypatch.setattr(comm, "_world", [w])
    shim = w.lib.shim
    assert shim is not None, "the C shim of the bound calls did not build"
    for dt, use_shim in itertools.product((np.float32, np.float64, np.int32, np.int8, np.uint16), (True, False)):
        monkeypatch.setattr(w.lib, "shim", shim if use_shim else None)  # without it: ctypes calls libmpi itself
        x = np.arange(7, dtype=dt)
        for kind, op in (
            ("all_reduce", MPI.SUM),
            ("all_gather", None),
            ("reduce_scatter", MPI.MAX),
            ("broadcast", None),
        ):
            out = x.copy() if kind == "broadcast" else np.zeros_like(x)  # (a root's input is its output)
            call = w.lib.bind(kind, w.data, op, 0, out, x)
            how = f"{kind} of {dt.__name__} {'through the shim' if use_shim else 'through ctypes'}"
            assert call is not None and call() == 0, how
            assert (call.func is shim) == use_shim, how
            np.testing.assert_array_equal(out, x, err_msg=how)
    monkeypatch.setattr(w.lib, "shim", shim)
    kept = []
    for i in range(5):
        y = dist.all_reduce(Tensor(np.full(3, i, np.float32)), "sum")
        np.testing.assert_array_equal(y.numpy(), np.full(3, i, np.float32))
        if i % 2:
            kept.append((i, y))  # alive: the next output must not take its memory
    for i, y in kept:
        np.testing.assert_array_equal(y.numpy(), np.full(3, i, np.float32))
    assert any(w.eager.values()), "the eager calls did not take the bound libmpi path"
    np.testing.assert_array_equal(dist.all_gather(Tensor([1.0, 2.0])).numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(dist.broadcast(Tensor([True, False])).numpy(), [True, False])
    jitted = TinyJit(lambda t: dist.all_reduce(t, "max"))
    for i in range(4):
        np.testing.assert_array_equal(jitted(Tensor(np.arange(4, dtype=np.int32) + i)).numpy(), np.arange(4) + i)
    assert dist.all_reduce(Tensor([True, False]), "max").numpy().tolist() == [True, False]


def test_a_jitted_allreduce_on_the_c_lane_calls_the_shim_watched(monkeypatch):
    # TinyJit's C lane calls the shim's function itself (the thunk's c_call), keeping World.watched's books
    MPI = pytest.importorskip("mpi4py.MPI")
    from fusegrad import TinyJit
    from fusegrad.engine import native_lane

    if native_lane.built_class(TinyJit) is None:
        pytest.skip("the C lane does not build on this machine (no compiler or no Python headers)")
    w = comm.World(MPI, MPI.COMM_SELF)
    monkeypatch.setattr(comm, "_world", [w])
    x = Tensor(np.arange(5, dtype=np.float32)).realize()
    jitted = TinyJit(lambda t: dist.all_reduce(t, "sum") * 2)
    for _ in range(3):
        jitted(x)
    jitted._known.lane.countdown = 1
    jitted(x)
    assert type(jitted).native_lane, "the repeated call did not switch to the C lane"
    thunks = jitted._known.c_lane[3]
    assert any(type(t) is tuple and len(t) == 6 for t in thunks), "the collective's thunk is not a c_call"
    calls = w.calls
    for i in range(5):
        x.assign(Tensor(np.full(5, i, np.float32))).realize()
        np.testing.assert_array_equal(jitted(x).numpy(), np.full(5, 2 * i, np.float32))
    assert w.calls == calls + 5 and w.busy is None


def test_without_a_compiler_the_bound_calls_go_through_ctypes(monkeypatch):
    # the shim does not build (no C compiler, or its cache unwritable): libmpi is called with the arguments themselves
    MPI = pytest.importorskip("mpi4py.MPI")
    from fusegrad.distributed import cmpi
    from fusegrad.runtime.c_compiler import CompileError
    from fusegrad.runtime.device import Device

    def no_compiler(*_):
        raise CompileError("no C compiler here")

    monkeypatch.setattr(cmpi, "_shims", {})
    monkeypatch.setattr(Device["CPU"].compiler, "load", no_compiler)
    lib = cmpi.libmpi(MPI)
    assert lib is not None and lib.shim is None
    x, out = np.arange(5, dtype=np.float32), np.zeros(5, np.float32)
    call = lib.bind("all_reduce", MPI.COMM_SELF, MPI.SUM, 0, out, x)
    assert call is not None and call() == 0
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("nbytes, naps", [(0, True), (8 << 20, False)])
def test_a_wait_yields_through_its_messages_transfer_time_before_napping(monkeypatch, nbytes, naps):
    # a request completing after ~3 ms: an 8 MB message's wait (8 ms of yielding) never sleeps; a small one's naps
    MPI = pytest.importorskip("mpi4py.MPI")
    import time

    w = comm.World(MPI, MPI.COMM_SELF)
    slept, yielded = [], []
    monkeypatch.setattr(comm.time, "sleep", lambda s: slept.append(s) or time.perf_counter())
    monkeypatch.setattr(comm.os, "sched_yield", lambda: yielded.append(1))

    class Request:
        done_at = time.perf_counter() + 3e-3

        def Test(self):
            return time.perf_counter() >= self.done_at

    w.wait([Request()], "a test request", nbytes)
    assert bool(slept) == naps and yielded
    assert w.where == "" and w.waited_s > 0
