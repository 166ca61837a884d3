"""Codegen opts UNROLL, THREAD and PADTO (issue 9, item 3) and blocked sums under an epilogue (item 4): invalid
applications raise OptError naming the opt, every opt and heuristic choice gives the values of NOOPT=1 and of the
PYTHON device on awkward shapes (primes, 1, sizes the amounts do not divide), the heuristics choose them where
intended, DEBUG=3 lists them and BEAM searches them."""

import contextlib
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fusegrad.codegen as codegen
import fusegrad.engine.realize as realize
from fusegrad import Context, Tensor, Variable
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import Opt, OptError, OptOps, check_opts
from fusegrad.codegen.opt.beam import actions
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops
from tests.rendering import rendered


SIZES = st.sampled_from([1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33])


def opt(op: str, axis: int, amount: int) -> Opt:
    return Opt(OptOps[op], axis, amount)


def ast_of(t: Tensor):
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    return items[-1].ast


def matmul_ast(m: int, k: int, n: int):
    return ast_of(Tensor.rand(m, k).realize() @ Tensor.rand(k, n).realize())


@contextlib.contextmanager
def forced_opts(opts: list[Opt]):
    """Every kernel compiled inside uses opts instead of the heuristics' choice (compiled programs are not reused)."""
    realize._runners.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(codegen, "hand_coded_opts", lambda value, plain, reads_output, caps: list(opts))
        yield
    realize._runners.clear()


# ---- validation


@pytest.mark.parametrize(
    "opts, message",
    [
        ([opt("THREAD", 0, 3)], "Opt(THREAD, axis=0, amount=3): amount does not divide the 8 iterations"),
        ([opt("THREAD", 0, 1)], "amount must be an int >= 2, got 1"),
        ([opt("THREAD", 0, 2), opt("THREAD", 1, 2)], "already split across threads along axis 0"),
        ([opt("THREAD", 2, 2)], "axis 2 is not an axis of the output shape (8, 6)"),
        ([opt("UPCAST", 0, 4), opt("THREAD", 0, 4)], "amount does not divide the 2 iterations of the loop of axis 0"),
        ([opt("UNROLL", 0, 2)], "axis 0 is not a reduced axis (2,) of the reduce's input (8, 6, 10)"),
        ([opt("UNROLL", 2, 3)], "amount does not divide the size 10 of reduced axis 2 of (8, 6, 10)"),
        ([opt("UNROLL", 2, 1)], "amount must be an int >= 2, got 1"),
        ([opt("UNROLL", 2, 2), opt("UNROLL", 2, 5)], "axis 2 already has a UNROLL of 2"),
        ([opt("PADTO", 1, 4)], "axis 1 is not a reduced axis (2,) of the reduce's input (8, 6, 10)"),
        ([opt("PADTO", 2, 4), opt("PADTO", 2, 8)], "axis 2 already has a PADTO of 4"),
        ([opt("UNROLL", 2, 5), opt("REDUCE_BLOCK", 2, 5)], "already cut into blocks (REDUCE_BLOCK)"),
        ([opt("UNROLL", 2, 512), opt("PADTO", 2, 512)], "512 values per reduce iteration exceed the limit of 256"),
    ],
)
def test_invalid_opts_raise_opt_error_naming_them(opts, message):
    with pytest.raises(OptError, match=re.escape(message)):
        lower_to_linear(matmul_ast(8, 10, 6), Device["CPU"].renderer, opts=tuple(opts))


def test_reduce_opts_need_a_kernel_with_one_reduce():
    x = Tensor.rand(4, 6).realize()
    with pytest.raises(OptError, match=re.escape("Opt(UNROLL, axis=1, amount=2): the kernel has no single reduce")):
        lower_to_linear(ast_of(x * 2), Device["CPU"].renderer, opts=(opt("UNROLL", 1, 2),))


def test_padto_unroll_order_does_not_matter():
    ast = matmul_ast(4, 7, 4)
    a = lower_to_linear(ast, Device["CPU"].renderer, opts=(opt("UNROLL", 2, 4), opt("PADTO", 2, 4)))
    b = lower_to_linear(ast, Device["CPU"].renderer, opts=(opt("PADTO", 2, 4), opt("UNROLL", 2, 4)))
    assert a.lin == b.lin


# ---- values


def run(fn, arrays, device="CPU"):
    return fn(*(Tensor(a, device=device) for a in arrays)).numpy()


def check_opts_values(fn, arrays, opts, rtol=1e-5, atol=1e-5):
    """fn under opts equals fn under NOOPT=1, on the CPU and on the PYTHON device."""
    with Context(NOOPT=1):
        realize._runners.clear()
        plain = run(fn, arrays)
    with forced_opts(opts):
        np.testing.assert_allclose(run(fn, arrays), plain, rtol=rtol, atol=atol)
        np.testing.assert_allclose(run(fn, arrays, "PYTHON"), plain, rtol=rtol, atol=atol)


def divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


@pytest.mark.slow  # 5 s, 25 examples; the fuzzer's random opts cover these moves in the fast run too
@settings(max_examples=25, deadline=None)
@given(data=st.data(), m=SIZES, k=SIZES, n=SIZES)
def test_unroll_padto_thread_equal_noopt_on_matmul(data, m, k, n):
    rng = np.random.default_rng(m * 10000 + k * 100 + n)
    arrays = [rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)]
    opts = []
    up = {axis: data.draw(st.sampled_from([1, 2, 4, 8])) for axis, size in ((0, m), (1, n))}
    opts += [opt("UPCAST", a, amount) for a, amount in up.items() if 1 < amount <= (m, n)[a]]
    applied = {o.axis: o.amount for o in opts}
    trips = [-(-size // applied.get(a, 1)) for a, size in ((0, m), (1, n))]
    thread_axis = data.draw(st.sampled_from([None, 0, 1]))
    if thread_axis is not None and divisors(trips[thread_axis]):
        opts.append(opt("THREAD", thread_axis, data.draw(st.sampled_from(divisors(trips[thread_axis])))))
    if k > 1:
        pad = data.draw(st.sampled_from([None, 2, 4, 8]))
        size = k if pad is None else -(-k // pad) * pad
        if pad is not None:
            opts.append(opt("PADTO", 2, pad))
        if divisors(size) and data.draw(st.booleans()):
            opts.append(opt("UNROLL", 2, data.draw(st.sampled_from([d for d in divisors(size) if d <= 64] or [size]))))
    check_opts_values(lambda a, b: a @ b, arrays, opts)


@pytest.mark.parametrize("k,pad,unroll", [(1, None, None), (3, None, 3), (7, 8, 8), (7, 4, 2), (13, 16, 4)])
@pytest.mark.parametrize("reduce", ["max", "sum", "prod"])
def test_padded_unrolled_reduce_keeps_its_identity(k, pad, unroll, reduce):
    rng = np.random.default_rng(k)
    xn = rng.standard_normal((5, k), dtype=np.float32) - 4  # every value negative: a zero pad would win a max
    xn[1, 0] = np.nan
    opts = ([opt("PADTO", 1, pad)] if pad else []) + ([opt("UNROLL", 1, unroll)] if unroll else [])
    if k == 1:
        with pytest.raises(OptError):
            lower_to_linear(ast_of(Tensor(xn).max(1)), Device["CPU"].renderer, opts=(opt("UNROLL", 1, 2),))
        return
    check_opts_values(lambda x: getattr(x, reduce)(1), [xn], opts)


def test_thread_split_runs_on_any_number_of_threads():
    xn = np.random.default_rng(1).standard_normal((3, 4096), dtype=np.float32)
    for threads in (1, 2, 3, 8):
        with Context(NUM_CPU_THREADS=threads):
            check_opts_values(lambda x: (x * 2 + 1).exp(), [xn], [opt("THREAD", 1, 8)])


def test_thread_loop_is_the_one_split_across_cores():
    x = Tensor.rand(3, 4096).realize()
    info = lower_to_linear(ast_of(x * 2), Device["CPU"].renderer, opts=(opt("THREAD", 1, 4),))
    assert info.outer_size == 4  # the chunks of axis 1, not axis 0's 3 rows


# ---- heuristics


def test_heuristics_thread_the_largest_evenly_split_loop():
    with Context(NUM_CPU_THREADS=2):
        assert lower_to_linear(ast_of(Tensor.rand(3, 4096).realize() * 2), Device["CPU"].renderer).opts == (
            opt("THREAD", 1, 2),
        )
        assert (
            lower_to_linear(ast_of(Tensor.rand(64, 64).realize() * 2), Device["CPU"].renderer).opts == ()
        )  # 64 rows split evenly
    with Context(NUM_CPU_THREADS=1):
        assert lower_to_linear(ast_of(Tensor.rand(3, 4096).realize() * 2), Device["CPU"].renderer).opts == ()


def test_heuristics_unroll_a_short_reduce_and_keep_matmul_tiles(avx512_target):
    assert lower_to_linear(ast_of(Tensor.rand(300, 3).realize().sum(1)), avx512_target).opts == (opt("UNROLL", 1, 3),)
    with Context(NUM_CPU_THREADS=2):
        opts = lower_to_linear(matmul_ast(64, 1024, 64), avx512_target).opts
    assert opts[:2] == (opt("UPCAST", 0, 8), opt("UPCAST", 1, opts[1].amount)) and opts[1].amount >= 8
    assert opt("REDUCE_BLOCK", 2, 64) in opts
    assert not [o for o in opts if o.op in (OptOps.UNROLL, OptOps.THREAD, OptOps.PADTO)]


@pytest.mark.slow  # 15 examples, each run on the PYTHON interpreter device: CI
@settings(max_examples=15, deadline=None)
@given(m=SIZES, k=SIZES, n=SIZES)
def test_heuristic_choices_equal_noopt_and_python_device(m, k, n):
    rng = np.random.default_rng(m * 7 + k * 11 + n)
    an, bn = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    for fn, arrays in (
        (lambda a, b: (a @ b).relu(), [an, bn]),
        (lambda a: a.sum(1) * 2, [an]),
        (lambda a: a.max(0), [an]),
        (lambda a: (a * 3).exp(), [an]),
    ):
        realize._runners.clear()
        got = run(fn, arrays)
        with Context(NOOPT=1):
            realize._runners.clear()
            np.testing.assert_allclose(got, run(fn, arrays), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, run(fn, arrays, "PYTHON"), rtol=1e-5, atol=1e-5)


def test_debug_3_lists_the_new_opts(capsys):
    with Context(DEBUG=3, NUM_CPU_THREADS=2):
        lower_to_linear(ast_of(Tensor.rand(3, 4096).realize() * 2), Device["CPU"].renderer)
    assert "opts: [Opt(THREAD, axis=1, amount=2)]" in capsys.readouterr().out


def test_beam_searches_unroll_thread_and_padto():
    with Context(NUM_CPU_THREADS=2):
        moves = actions(matmul_ast(8, 7, 6), Device["CPU"].renderer.capabilities)
    assert {opt("UNROLL", 2, 7), opt("PADTO", 2, 8), opt("THREAD", 0, 2), opt("THREAD", 1, 2)} <= set(moves)


# ---- blocked sums under an epilogue


@pytest.mark.slow  # 6 s of compiles; test_every_reduce_block_under_an_epilogue_equals_noopt stays in the fast run
def test_bias_epilogue_keeps_the_blocked_matmul_and_equals_noopt():
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in ((24, 512), (512, 64), (64,))]
    a, b, c = (Tensor(x).realize() for x in arrays)
    plain_opts = lower_to_linear(matmul_ast(24, 512, 64), Device["CPU"].renderer).opts
    epilogue_opts = lower_to_linear(ast_of(a @ b * 0.5 + c), Device["CPU"].renderer).opts
    assert any(o.op is OptOps.REDUCE_BLOCK for o in epilogue_opts) and epilogue_opts == plain_opts
    with Context(NOOPT=1):
        realize._runners.clear()
        plain = run(lambda a, b, c: a @ b * 0.5 + c, arrays)
    realize._runners.clear()
    np.testing.assert_allclose(run(lambda a, b, c: a @ b * 0.5 + c, arrays), plain, rtol=1e-5, atol=1e-4)
    realize._runners.clear()
    np.testing.assert_allclose(run(lambda a, b, c: a @ b * 0.5 + c, arrays, "PYTHON"), plain, rtol=1e-5, atol=1e-4)
    ref = arrays[0].astype(np.float64) @ arrays[1] * 0.5 + arrays[2]
    np.testing.assert_allclose(plain, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # 15 examples of several compiles each: CI
@settings(max_examples=15, deadline=None)
@given(data=st.data(), m=SIZES, n=SIZES, k=st.sampled_from([4, 6, 12, 64]))
def test_every_reduce_block_under_an_epilogue_equals_noopt(data, m, n, k):
    rng = np.random.default_rng(m * 100 + n + k)
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in ((m, k), (k, n), (n,))]
    block = data.draw(st.sampled_from([d for d in divisors(k) if d < k]))
    up = data.draw(st.sampled_from([d for d in [1] + divisors(m) if d <= 8]))
    opts = [opt("REDUCE_BLOCK", 2, block)] + ([opt("UPCAST", 0, up)] if up > 1 else [])
    if m == up and n == 1:  # one tile: no output loop for the blocks to run inside
        return
    check_opts_values(lambda a, b, c: -(a @ b) * 2 + c, arrays, opts, atol=1e-4)


@pytest.mark.slow  # a full blocked matmul per sign case: CI (the bias epilogue case stays)
def test_relu_epilogue_is_blocked_in_vectors_and_keeps_nan_and_zero_sign():
    rng = np.random.default_rng(6)
    an, bn, cn = (rng.standard_normal(s, dtype=np.float32) for s in ((24, 512), (512, 64), (64,)))
    an[2, 5], cn[3] = np.nan, -1e30  # a NaN row; a column far below zero (relu gives +0.0 there)
    fn = lambda a, b, c: (a @ b + c).relu()  # noqa: E731
    a, b, c = (Tensor(x).realize() for x in (an, bn, cn))
    info = lower_to_linear(ast_of(fn(a, b, c)), Device["CPU"].renderer)
    assert any(o.op is OptOps.REDUCE_BLOCK for o in info.opts)

    src = rendered(Device["CPU"].renderer, info.name, info.lin)
    assert "fg_intx" in src and " & ~vec" in src  # the compare-and-select runs on vectors
    realize._runners.clear()
    got = run(fn, [an, bn, cn])
    with Context(NOOPT=1):
        realize._runners.clear()
        plain = run(fn, [an, bn, cn])
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(plain))
    assert np.isnan(got[2]).all() and (got[:, 3][np.arange(24) != 2] == 0).all()
    realize._runners.clear()
    np.testing.assert_allclose(run(fn, [an, bn, cn], "PYTHON"), plain, rtol=1e-5, atol=1e-4)


def test_mask_lanes_read_as_zero_or_one_by_scalar_users():
    rng = np.random.default_rng(7)
    an, bn = rng.standard_normal((16, 32), dtype=np.float32), rng.standard_normal((32, 64), dtype=np.float32)
    fn = lambda a, b: ((a @ b) < 0).cast("float32") * 3  # noqa: E731
    realize._runners.clear()
    np.testing.assert_array_equal(run(fn, [an, bn]), ((an @ bn) < 0).astype(np.float32) * 3)


def test_epilogue_the_vectors_cannot_carry_is_not_blocked():
    a, b, c = Tensor.rand(16, 512).realize(), Tensor.rand(512, 64).realize(), Tensor.rand(16, 64).realize()
    assert not any(
        o.op is OptOps.REDUCE_BLOCK for o in lower_to_linear(ast_of((a @ b).maximum(c)), Device["CPU"].renderer).opts
    )
    with pytest.raises(OptError, match="not a single float sum over one axis"):
        lower_to_linear(ast_of((a @ b).maximum(c)), Device["CPU"].renderer, opts=(opt("REDUCE_BLOCK", 2, 64),))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_short_bool_reduces_unroll_to_logic(k):
    xn = np.random.default_rng(k).standard_normal((6, k)) > 0.5
    t = Tensor(xn)
    assert lower_to_linear(ast_of(t.any(1)), Device["CPU"].renderer).opts == (opt("UNROLL", 1, k),)
    np.testing.assert_array_equal(t.any(1).numpy(), xn.any(1))
    np.testing.assert_array_equal(t.all(1).numpy(), xn.all(1))
    np.testing.assert_array_equal(Tensor(xn, device="PYTHON").any(1).numpy(), xn.any(1))


@pytest.mark.parametrize("thread_axis,chunks", [(0, 2), (1, 4), (1, 8)])
def test_thread_split_with_reduce_blocks_equals_noopt(thread_axis, chunks):
    rng = np.random.default_rng(chunks)
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in ((12, 64), (64, 16), (16,))]
    opts = [opt("UPCAST", 0, 3), opt("UPCAST", 1, 2), opt("REDUCE_BLOCK", 2, 16), opt("THREAD", thread_axis, chunks)]
    check_opts_values(lambda a, b, c: (a @ b + c).relu(), arrays, opts, atol=1e-4)


def test_epilogue_reading_a_full_matrix_keeps_the_register_tile_and_equals_noopt():
    """An epilogue's load made once per output (a ReLU backward's mask over a conv's input gradient, here a full
    matrix times the product) does not count as an input the reduce walks: the matmul keeps its register tile."""
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in ((32, 48), (48, 64), (32, 64))]
    a, b, m = (Tensor(x).realize() for x in arrays)
    plain_opts = lower_to_linear(matmul_ast(32, 48, 64), Device["CPU"].renderer).opts
    epilogue_opts = lower_to_linear(ast_of((a @ b) * m), Device["CPU"].renderer).opts
    assert any(o.op is OptOps.UPCAST and o.axis == 0 for o in plain_opts) and epilogue_opts == plain_opts
    with Context(NOOPT=1):
        realize._runners.clear()
        plain = run(lambda a, b, m: (a @ b) * m, arrays)
    realize._runners.clear()
    np.testing.assert_allclose(run(lambda a, b, m: (a @ b) * m, arrays), plain, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(plain, (arrays[0].astype(np.float64) @ arrays[1]) * arrays[2], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,k,stride", [((2, 3, 8, 8), 2, 2), ((1, 2, 7, 9), 3, 2), ((3, 1, 5, 5), 2, 1)])
def test_pool_window_is_fully_unrolled_and_equals_noopt_and_torch(shape, k, stride):
    """A pool's short window (every reduced axis short, few elements together) loses all its loops."""
    import torch

    xn = np.random.default_rng(9).standard_normal(shape, dtype=np.float32)
    ast = ast_of(Tensor(xn).realize().max_pool2d(k, stride))
    unrolled = {(o.axis, o.amount) for o in lower_to_linear(ast, Device["CPU"].renderer).opts if o.op is OptOps.UNROLL}
    assert len(unrolled) == 2 and all(amount == k for _, amount in unrolled)
    realize._runners.clear()
    got = Tensor(xn).max_pool2d(k, stride).numpy()
    with Context(NOOPT=1):
        realize._runners.clear()
        np.testing.assert_array_equal(got, Tensor(xn).max_pool2d(k, stride).numpy())
    ref = torch.nn.functional.max_pool2d(torch.tensor(xn), k, stride).numpy()
    np.testing.assert_array_equal(got, ref)
    realize._runners.clear()


# ---- a matmul whose weight is packed in panels (tensor_ops/linalg.py)


@contextlib.contextmanager
def panels_for_any_size():
    import fusegrad.schedule.panels as panels_pass

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(panels_pass, "PANEL_MIN_ROWS", 1)
        mp.setattr(panels_pass, "PANEL_MIN_MACS", 1)
        yield


def is_reduce(value) -> bool:
    return any(u.op is Ops.REDUCE_AXIS for u in value.toposort())


def panel_columns() -> int:
    return 2 * Device["CPU"].renderer.capabilities.vector_bytes // 4


@pytest.mark.slow
def test_packed_matmul_gets_a_panel_tile_without_reduce_blocks(avx512_target):
    # 8 rows x 2 vectors: AVX-512's 32 registers (16 registers give 6-row tiles)
    p = panel_columns()
    with panels_for_any_size(), Context(NUM_CPU_THREADS=2):
        x, w = Tensor.rand(1024, 512).realize(), Tensor.rand(512, 8 * p).realize()
        opts = lower_to_linear(ast_of(x @ w), avx512_target).opts
    # output axes (rows, panels, columns of a panel): 8 rows x one panel in registers, 64 row tiles per block, each
    # tile over 2 panels in a row
    assert opts == (opt("UPCAST", 0, 8), opt("UPCAST", 2, p), opt("TILE", 0, 64), opt("TILE", 1, 2))
    # under an epilogue the panels merge into the output's columns: the same tile, on the merged axis
    with panels_for_any_size(), Context(NUM_CPU_THREADS=2):
        b = Tensor.rand(8 * p).realize()
        for epilogue in (lambda t: t.relu(), lambda t: (t + b).relu(), lambda t: t * 2):
            assert lower_to_linear(ast_of(epilogue(x @ w)), avx512_target).opts == (
                opt("UPCAST", 0, 8),
                opt("UPCAST", 1, p),
                opt("TILE", 0, 64),
                opt("TILE", 1, 2),
            )
    with panels_for_any_size(), Context(NUM_CPU_THREADS=2):
        opts = lower_to_linear(ast_of(Tensor.rand(48, 512).realize() @ w), avx512_target).opts
    # 6 row tiles: 3 per thread
    assert opts == (opt("UPCAST", 0, 8), opt("UPCAST", 2, p), opt("TILE", 0, 3), opt("TILE", 1, 2))
    # an odd number of panels is not walked in pairs (the last pair would overlap)
    with panels_for_any_size(), Context(NUM_CPU_THREADS=2):
        opts = lower_to_linear(ast_of(x @ Tensor.rand(512, 7 * p).realize()), avx512_target).opts
    assert opts == (opt("UPCAST", 0, 8), opt("UPCAST", 2, p), opt("TILE", 0, 64))


def test_packed_matmul_reading_heads_as_columns_gets_a_row_tile():
    """Attention's output (heads, rows, head_dim) read as (rows, heads * head_dim) by the output projection: the row
    input walks the reduce through a division and a modulo, and still takes one value per reduce step, so the panel
    tile keeps its rows (with one vector of columns only, a LLaMA chunk's projection ran at a third of the speed)."""
    p = panel_columns()
    rng = np.random.default_rng(4)
    heads = rng.standard_normal((4, 48, 32), dtype=np.float32)
    x_np, w_np = heads.transpose(1, 0, 2).reshape(48, 128), rng.standard_normal((128, 2 * p), dtype=np.float32)
    with panels_for_any_size():
        x = Tensor(heads).realize().permute(1, 0, 2).reshape(48, 128)
        out = x @ Tensor(w_np).realize()
        opts = lower_to_linear(ast_of(out), Device["CPU"].renderer).opts
        assert any(o.op is OptOps.UPCAST and o.axis == 0 and o.amount >= 4 for o in opts), opts
        np.testing.assert_allclose(out.numpy(), x_np @ w_np, rtol=1e-4, atol=1e-4)


def test_matvec_over_panels_accumulates_both_vectors_of_a_panel_in_one_pass():
    """A decode step's x @ W over a PanelLinear weight: two vector accumulators walk each panel once, where one vector
    per pass read every other cache line of the panel twice."""
    from fusegrad.models.weights import PanelLinear, to_panels

    p = panel_columns()
    rng = np.random.default_rng(3)
    xn, wn = rng.standard_normal((1, 96), dtype=np.float32), rng.standard_normal((96, 5 * p), dtype=np.float32)
    lin = PanelLinear(96, 5 * p, bias=False)
    lin.weight = to_panels(Tensor(wn)).contiguous().realize()
    x = Tensor(xn).realize()
    items, _, _ = create_schedule([lin(x).uop], [Device["CPU"]])
    matvec = next(it.ast for it in items if is_reduce(it.ast))
    assert lower_to_linear(matvec, Device["CPU"].renderer).opts[:1] == (opt("UPCAST", 2, p),)
    np.testing.assert_allclose(lin(x).numpy(), xn @ wn, rtol=1e-5, atol=1e-5)


def test_packed_matmul_past_l2_keeps_its_reduce_blocks(avx512_target):
    from fusegrad.codegen.opt import heuristic

    p = panel_columns()
    k = heuristic.PANEL_MAX_BYTES // (4 * p) * 2
    with panels_for_any_size(), Context(NUM_CPU_THREADS=2):
        opts = lower_to_linear(
            ast_of(Tensor.rand(64, k).realize() @ Tensor.rand(k, 2 * p).realize()), avx512_target
        ).opts
    assert any(o.op is OptOps.REDUCE_BLOCK for o in opts)


@pytest.mark.slow  # each example runs on the PYTHON interpreter device: CI
@settings(max_examples=8, deadline=None)  # each example compiles 6 kernels and runs 3 on the PYTHON device
@given(m=SIZES, k=SIZES, panels=st.sampled_from([2, 3]))
def test_packed_matmul_heuristics_equal_noopt_and_python_device(m, k, panels):
    rng = np.random.default_rng(m * 7 + k * 11 + panels)
    n = panels * panel_columns()
    an, bn = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    with panels_for_any_size():
        for fn in (lambda a, b: a @ b, lambda a, b: (a @ b).relu(), lambda a, b: (a @ b)[:, 1:] * 2):
            realize._runners.clear()
            got = run(fn, [an, bn])
            with Context(NOOPT=1):
                realize._runners.clear()
                np.testing.assert_allclose(got, run(fn, [an, bn]), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got, run(fn, [an, bn], "PYTHON"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("row_up,tile", [(2, 2), (7, 3), (8, None), (5, 4)])
def test_panel_tiles_equal_noopt(row_up, tile):
    rng = np.random.default_rng(row_up)
    p = panel_columns()
    arrays = [rng.standard_normal((37, 19), dtype=np.float32), rng.standard_normal((19, 3 * p), dtype=np.float32)]
    opts = [opt("UPCAST", 0, row_up), opt("UPCAST", 2, p)] + ([opt("TILE", 0, tile)] if tile else [])
    with panels_for_any_size():
        with Context(NOOPT=1):
            realize._runners.clear()
            plain = run(lambda a, b: a @ b, arrays)
        realize._runners.clear()
        with pytest.MonkeyPatch.context() as mp:
            # the matmul's kernel only (the copy into panels keeps its own); no PYTHON run: it packs no weight
            mp.setattr(
                codegen, "hand_coded_opts", lambda value, plain, reads_output, caps: opts if is_reduce(value) else []
            )
            got = run(lambda a, b: a @ b, arrays)
        realize._runners.clear()
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, arrays[0].astype(np.float64) @ arrays[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "shape, perm",
    [((1024, 512), (1, 0)), ((4, 256, 520), (0, 2, 1)), ((128, 2048), (1, 0)), ((4, 64, 32, 128), (0, 3, 2, 1))],
)
def test_transposed_copies_run_in_8x8_tiles_and_equal_numpy(shape, perm):
    """A copy that reads across rows (a transpose) gets 8 x 8 tiles: whole input cache lines once per tile, where a
    row at a time re-read each line per output row (2048x1024: 7.4 -> 0.7 ms); values as numpy's, any dtype."""
    x = Tensor.empty(*shape).permute(perm).contiguous()
    opts = lower_to_linear(ast_of(x), Device["CPU"].renderer).opts
    kept = [a for a, d in enumerate(x.shape) if d != 1]
    assert opt("UPCAST", kept[-1], 8) in opts and len([o for o in opts if o.op is OptOps.UPCAST]) == 2, opts
    rng = np.random.default_rng(len(shape))
    for dtype in (np.float32, np.int16, np.float64):
        a = (rng.standard_normal(shape) * 100).astype(dtype)
        np.testing.assert_array_equal(Tensor(a).permute(perm).contiguous().numpy(), a.transpose(perm))
    # a row-block copy (the innermost axis contiguous), a transpose added to a contiguous input and a small one: untiled
    assert not lower_to_linear(
        ast_of(Tensor.empty(8, 16, 128, 64).permute(0, 2, 1, 3).contiguous()), Device["CPU"].renderer
    ).opts
    assert not lower_to_linear(ast_of(Tensor.empty(1024, 512).T + Tensor.empty(512, 1024)), Device["CPU"].renderer).opts
    assert not lower_to_linear(ast_of(Tensor.empty(32, 64).T.contiguous()), Device["CPU"].renderer).opts


@pytest.mark.parametrize(
    "rows, k, n, lo, hi", [(128, 2048, 64, 0, 128), (1024, 1024, 64, 96, 192), (96, 4096, 64, 0, 96)]
)
def test_a_sum_added_into_its_own_storage_is_never_blocked(rows, k, n, lo, hi):
    """a[lo:hi] = a[lo:hi] + b @ c reads a through its output parameter: the partial sums of a blocked reduce would
    overwrite the values the epilogue adds (the result was off by the whole sum). The heuristic never blocks such a
    reduce, and the checker refuses a forced REDUCE_BLOCK (the kernel then runs without it); values equal numpy's."""
    rng = np.random.default_rng(rows + k)
    a_np = rng.standard_normal((rows, n)).astype(np.float32)
    b_np, c_np = rng.standard_normal((hi - lo, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    want = a_np.copy()
    want[lo:hi] += b_np.astype(np.float64) @ c_np
    for forced in (None, [opt("REDUCE_BLOCK", 2, 256)]):
        with forced_opts(forced) if forced else contextlib.nullcontext():
            a = Tensor(a_np).realize()
            a[lo:hi] = a[lo:hi] + Tensor(b_np) @ Tensor(c_np)
            np.testing.assert_allclose(a.numpy(), want, rtol=1e-4, atol=1e-3)


def scores_against_a_cache(n: int, lo: int = 8, hi: int = 500):
    """keys[:, :n] @ q, n bound in lo..hi: a prefill chunk's attention scores against a KV cache that grows."""
    rng = np.random.default_rng(n)
    keys, q = rng.standard_normal((4, hi, 64)).astype(np.float32), rng.standard_normal((4, 64, 48)).astype(np.float32)
    vb = Variable("n", lo, hi).bind(n)
    out = (Tensor(keys)[:, :vb] @ Tensor(q)).contiguous()
    return out, keys[:, :n] @ q, vb


def test_a_symbolic_row_axis_gets_a_register_tile_and_equals_numpy():
    """The rows of a matmul whose row count is a bound Variable take a register tile when the variable's smallest
    value holds a tile; the last tile moves back to end at the run-time row count (recomputing equal outputs), for
    every value, the smallest included. Before, such a kernel kept one row of scalar dot products per loop."""
    out, _, _ = scores_against_a_cache(100)
    opts = lower_to_linear(ast_of(out), Device["CPU"].renderer).opts
    assert any(o.op is OptOps.UPCAST and o.axis == 1 for o in opts), opts
    for n in (8, 9, 100, 257, 500):
        out, want, vb = scores_against_a_cache(n)
        got = out.realize().pad((None, (0, 500 - vb), None)).numpy()[:, :n]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_symbolic_axis_is_upcast_only_within_its_smallest_value():
    """check_opts takes an UPCAST of a symbolic axis no larger than the variable's smallest value and refuses a TILE,
    a larger UPCAST, and any cut of it in a kernel reading its own output, naming the axis."""
    out, _, _ = scores_against_a_cache(100)
    shape = ast_of(out).src[0].src[1].shape
    check_opts([opt("UPCAST", 1, 8)], shape, reads_output=False)
    for opts, reads in (([opt("UPCAST", 1, 9)], False), ([opt("TILE", 1, 2)], False), ([opt("UPCAST", 1, 4)], True)):
        with pytest.raises(OptError, match="axis 1 has a symbolic size"):
            check_opts(opts, shape, reads_output=reads)
