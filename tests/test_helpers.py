"""Context variables: every documented name exists, bad names and values are refused, dtype objects are accepted, and an
override in one thread never leaks into another; realize can be called from several threads at once."""

import os
import subprocess
import sys
import threading
import numpy as np
import pytest
import torch
from fusegrad import Context, Tensor, dtypes
from fusegrad.helpers import DEBUG, TRAINING, ContextVar
from fusegrad.nn.optim import SGD

# tinygrad's names (the ≤v0.12 device-selection flags CPU=1, CUDA=1, ... are device names, not context variables)
SECTION_8 = (
    "DEBUG DEV BEAM JITBEAM NOOPT JIT JIT_BATCH_SIZE TRAINING DEFAULT_FLOAT DEFAULT_INT SUM_DTYPE OPTIM_DTYPE "
    "FUSE_OPTIM CONST_LR IMAGE FLOAT16 WINO TC ALLOW_TF32 EMULATED_DTYPES CHECK_OOB TRANSCENDENTAL CACHELEVEL "
    "CACHEDB CCACHE IGNORE_BEAM_CACHE DISABLE_HTTP_CACHE VIZ PROFILE VALIDATE_WITH_CPU NUM_CPU_THREADS PARALLEL "
    "MAX_BUFFER_SIZE NO_MEMORY_PLANNER USE_ATOMICS TRACEMETA CUDA_PATH WEBGPU_BACKEND HCQ_VISIBLE_DEVICES"
).split()


@pytest.mark.parametrize("name", SECTION_8)
def test_every_section_8_variable_is_a_context_variable(name):
    var = ContextVar.registry[name]
    new = "x" if isinstance(var.value, str) else 3
    with Context(**{name: new}):
        assert var.value == new
    assert var.value != new


def test_unknown_name_is_refused_and_named():
    with pytest.raises(KeyError, match="NOT_A_FLAG"):
        Context(NOT_A_FLAG=1)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="DEBUG='abc'"):
        Context(DEBUG="abc")
    with Context(DEBUG="3"):
        assert DEBUG.value == 3
    out = subprocess.run(
        [sys.executable, "-c", "import fusegrad"], env={**os.environ, "BEAM": "wide"}, capture_output=True, text=True
    )
    assert out.returncode != 0 and "ValueError" in out.stderr and "BEAM='wide'" in out.stderr


def test_dtype_objects_are_accepted():
    with Context(DEFAULT_FLOAT=dtypes.float16, DEFAULT_INT=dtypes.int64):
        assert Tensor([1.5]).dtype is dtypes.float16 and dtypes.default_float is dtypes.float16
        assert Tensor([1]).dtype is dtypes.int64
    assert Tensor([1.5]).dtype is dtypes.float32 and Tensor([1]).dtype is dtypes.int32
    with pytest.raises(ValueError, match="DEFAULT_FLOAT"):
        with Context(DEFAULT_FLOAT=dtypes.int8):
            Tensor([1.5])
    # 4096 half ones accumulate exactly only in a wider accumulator (half counts stop at 2048)
    ones = Tensor.ones(4096, dtype=dtypes.float16)
    with Context(SUM_DTYPE=dtypes.float32):
        wide = ones.sum().float().item()
    with Context(SUM_DTYPE="float32"):
        assert ones.sum().float().item() == wide
    assert wide == torch.ones(4096, dtype=torch.float16).sum(dtype=torch.float32).item()
    w = Tensor([1.0, 2.0], requires_grad=True)
    with Context(OPTIM_DTYPE=dtypes.float16):
        assert SGD([w], lr=0.1, momentum=0.9).state_dtype is dtypes.float16


def test_override_in_one_thread_does_not_change_another():
    entered, checked = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def half_thread():
        with Context(DEFAULT_FLOAT="float16"):
            seen["inside"] = Tensor([1.0]).dtype
            entered.set()
            checked.wait(10)

    t = threading.Thread(target=half_thread)
    t.start()
    entered.wait(10)
    seen["other"] = Tensor([1.0]).dtype
    checked.set()
    t.join()
    assert seen == {"inside": dtypes.float16, "other": dtypes.float32}


def test_interleaved_blocks_in_threads_restore_their_own_values():
    # A enters, B enters, A leaves, B leaves: with one process-wide value B's exit restored A's setting (left on)
    steps = [threading.Event() for _ in range(4)]
    seen: dict[str, int] = {}

    def worker(name: str, enter_after: int, exit_after: int):
        steps[enter_after].wait(10)
        with Context(TRAINING=1):
            seen[name + "_in"] = TRAINING.value
            steps[enter_after + 1].set()
            steps[exit_after].wait(10)
        seen[name + "_out"] = TRAINING.value
        if exit_after + 1 < len(steps):
            steps[exit_after + 1].set()

    a, b = threading.Thread(target=worker, args=("a", 0, 2)), threading.Thread(target=worker, args=("b", 1, 3))
    a.start(), b.start()
    steps[0].set()
    a.join(), b.join()
    assert seen == {"a_in": 1, "b_in": 1, "a_out": 0, "b_out": 0} and TRAINING.value == 0


def test_context_decorator_nests_and_recurses():
    @Context(DEBUG=0)
    def depth(n: int) -> list:
        inner = depth(n - 1) if n else []
        return [DEBUG.value, *inner]

    with Context(DEBUG=1):
        assert depth(3) == [0, 0, 0, 0]
        assert DEBUG.value == 1
    assert DEBUG.value == 0


def test_assignment_outside_context_sets_the_default_inside_lasts_the_block():
    before = dtypes.default_float
    try:
        with Context(DEFAULT_FLOAT="float16"):
            dtypes.default_float = dtypes.float64
            assert Tensor([1.0]).dtype is dtypes.float64
        assert dtypes.default_float is before
        dtypes.default_float = dtypes.float16
        seen = []
        t = threading.Thread(target=lambda: seen.append(Tensor([1.0]).dtype))
        t.start(), t.join()
        assert seen == [dtypes.float16]  # the process default, seen by every thread
    finally:
        dtypes.default_float = before


def test_realize_from_several_threads():
    rng = np.random.default_rng(0)
    shared_np = rng.standard_normal((64, 32), dtype=np.float32)
    shared = Tensor(shared_np)
    lazy_shared = (shared * 2).relu().sum(axis=1)  # one unrealized graph realized by all threads at once
    errors: list[BaseException] = []
    results: dict[int, list] = {}

    def work(i: int):
        try:
            out = []
            for j in range(6):
                a = rng_np[i][j]
                t = Tensor(a)
                out.append((((t @ t.T) * (i + 1) + j).softmax(axis=1).sum(axis=0).numpy(), a, i, j))
            out.append(lazy_shared.numpy())
            results[i] = out
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    rng_np = [[rng.standard_normal((8, 5), dtype=np.float32) for _ in range(6)] for _ in range(6)]
    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    expected_shared = torch.relu(torch.from_numpy(shared_np) * 2).sum(1).numpy()
    for i in range(6):
        *kernels, shared_out = results[i]
        for got, a, ii, j in kernels:
            ta = torch.from_numpy(a)
            ref = torch.softmax((ta @ ta.T) * (ii + 1) + j, dim=1).sum(0).numpy()
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(shared_out, expected_shared, rtol=1e-6)
