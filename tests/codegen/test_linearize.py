"""Linearizing nested reduce loops: accumulators over the same loops share one loop nest only where they vary with the
same enclosing loops (a blocked long sum is a reduce over blocks around a reduce within a block; an unrolled copy
whose body does not read the block index sums within blocks outside the loop over blocks)."""

import numpy as np
import pytest

import fusegrad.codegen as codegen
import fusegrad.engine.realize as realize
from fusegrad import Context, Tensor, Variable
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import Opt, OptOps
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops


@pytest.fixture
def upcast_first_axis(monkeypatch):
    """Every kernel compiled in the test upcasts its first output axis by 2 (compiled programs are not reused)."""
    realize._runners.clear()
    monkeypatch.setattr(codegen, "hand_coded_opts", lambda value, plain, reads_output, caps: [Opt(OptOps.UPCAST, 0, 2)])
    yield
    realize._runners.clear()


def periodic_and_dense_rows(n: int = 768) -> tuple[Tensor, np.ndarray]:
    """Two rows summed in one kernel: row 0 repeats 256 values (its index within a 256-block is its whole index),
    row 1 reads all n; with the rows upcast, one reduce's two lanes differ in whether they read the block index."""
    rng = np.random.default_rng(0)
    y, x = rng.standard_normal(256).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    periodic = Tensor(y).reshape(1, 256).expand(n // 256, 256).reshape(1, n)
    rows = periodic.cat(Tensor(x).reshape(1, n), dim=0)
    return rows, np.stack([np.tile(y, n // 256), x])


def test_lanes_of_a_blocked_sum_that_skip_the_block_index_get_their_own_loops():
    rows, _ = periodic_and_dense_rows()
    total = rows.sum(-1)
    items, _, _ = create_schedule([total.uop], [Device["CPU"]])
    with Context(SPEC=1):  # the instruction list's spec: every RANGE opens once and closes innermost-first
        info = lower_to_linear(items[-1].ast, Device["CPU"].renderer, opts=(Opt(OptOps.UPCAST, 0, 2),))
    Device["CPU"].build(info)  # was: "expected declaration or statement at end of input" (a loop never closed)


def test_blocked_sum_with_upcast_lanes_equals_numpy(upcast_first_axis):
    rows, want = periodic_and_dense_rows()
    np.testing.assert_allclose(rows.sum(-1).numpy(), want.sum(-1), rtol=1e-5, atol=1e-4)


def test_kv_cache_write_of_a_projection_at_a_variable_position_equals_numpy():
    """The decode step's cache write: a 768-long projection, rotated by cat of its halves, stored at a bound
    Variable's slot of a preallocated cache (the kernel shape that did not compile)."""
    rng = np.random.default_rng(0)
    heads, slots, hd, dim = 4, 16, 8, 768
    x, w = rng.standard_normal((1, dim)).astype(np.float32), rng.standard_normal((dim, heads * hd)).astype(np.float32)
    cos, sin = (rng.standard_normal((1, hd // 2)).astype(np.float32) for _ in range(2))
    cache = Tensor.zeros(1, heads, slots, hd).contiguous().realize()
    want = np.zeros((1, heads, slots, hd), np.float32)
    pos = Variable("start_pos", 0, slots - 1)
    for p in (3, 9):
        k = (Tensor(x) @ Tensor(w)).reshape(1, heads, hd).transpose(0, 1).unsqueeze(0)  # (1, heads, 1, hd)
        a, b = k[..., : hd // 2], k[..., hd // 2 :]
        rotated = (a * Tensor(cos) - b * Tensor(sin)).cat(b * Tensor(cos) + a * Tensor(sin), dim=-1)
        start = pos.bind(p)
        cache.shrink((None, None, (start, start + 1), None)).assign(rotated)
        kn = (x @ w).reshape(heads, hd)
        an, bn = kn[:, : hd // 2], kn[:, hd // 2 :]
        want[0, :, p] = np.concatenate([an * cos - bn * sin, bn * cos + an * sin], -1)
        np.testing.assert_allclose(cache.numpy(), want, rtol=1e-4, atol=1e-3)


def test_each_accumulator_update_follows_its_own_value():
    """A register tile's update of each accumulator comes right after the instructions only it needs: values computed
    first and added last kept every product live at once, and an 8x8 tile's spilled on a 16-register target (a 1x1
    conv, 1000x169x512, ran 1.8x slower on AVX2)."""
    a, b = Tensor.rand(64, 128).realize(), Tensor.rand(128, 64).realize()
    items, _, _ = create_schedule([(a @ b).uop], [Device["CPU"]])
    opts = (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 8))
    lin = lower_to_linear(items[-1].ast, Device["CPU"].renderer, opts=opts).lin
    updates = [i for i, u in enumerate(lin) if u.op is Ops.ACC_UPDATE and u.src[2:]]
    assert len(updates) >= 32  # 4 x 8 lanes, each its own accumulator before packing
    for j in updates:
        # right after the last instruction of its own value (a product, a load), not after another update
        assert lin[j - 1] in lin[j].src[1].toposort(), (lin[j - 1].op, j)
