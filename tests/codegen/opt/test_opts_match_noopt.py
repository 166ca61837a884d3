"""Codegen opts (issue 9, stage 1): Opt validation, the heuristics' choices, the vector C of an upcast kernel, and
values equal to NOOPT=1 (and to the PYTHON device) for every opt and every heuristic choice on awkward shapes."""

import contextlib
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fusegrad.codegen as codegen
import fusegrad.engine.realize as realize
from fusegrad import Context, Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import Opt, OptError, OptOps, check_opts
from fusegrad.codegen.opt.packs import find_packs
from fusegrad.schedule import create_schedule
from fusegrad.runtime.device import Device
from fusegrad.dtype import dtypes
from fusegrad.uop.ops import Ops, UOp
from tests.rendering import rendered


def vector_bytes() -> int:
    return Device["CPU"].renderer.capabilities.vector_bytes


SIZES = st.sampled_from([1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 37])


def matmul_ast(m: int, k: int, n: int):
    a, b = Tensor.rand(m, k).realize(), Tensor.rand(k, n).realize()
    items, _, _ = create_schedule([(a @ b).uop], [Device["CPU"]])
    return items[-1].ast


def upcast(axis: int, amount: int) -> Opt:
    return Opt(OptOps.UPCAST, axis, amount)


def tile(axis: int, amount: int) -> Opt:
    return Opt(OptOps.TILE, axis, amount)


@contextlib.contextmanager
def forced_opts(opts: list[Opt]):
    """Every kernel compiled inside uses opts instead of the heuristics' choice."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(codegen, "hand_coded_opts", lambda value, plain, reads_output, caps: list(opts))
        yield


# ---- validation


@pytest.mark.parametrize(
    "opts, shape, reads_output, message",
    [
        ([upcast(2, 4)], (8, 8), False, "axis 2 is not an axis of the output shape (8, 8)"),
        ([upcast(0, 1)], (8, 8), False, "amount must be an int >= 2, got 1"),
        ([upcast(0, 9)], (8, 8), False, "amount 9 exceeds the size 8 of axis 0"),
        ([upcast(1, 4), upcast(1, 2)], (8, 8), False, "axis 1 of shape (8, 8) is already upcast by 4"),
        ([upcast(0, 3)], (8, 8), True, "amount 3 does not divide the size 8 of axis 0"),
        ([upcast(0, 64), upcast(1, 32)], (64, 32), False, "2048 outputs per iteration exceed the limit of 1024"),
        (["UPCAST"], (8, 8), False, "not an Opt: 'UPCAST'"),
        (
            [upcast(0, 4), tile(0, 3)],
            (8, 8),
            False,
            "Opt(TILE, axis=0, amount=3): amount exceeds the 2 tiles of axis 0",
        ),
        ([tile(1, 2), tile(1, 4)], (8, 8), False, "axis 1 of shape (8, 8) is already tiled by 2"),
        ([tile(1, 3)], (8, 8), True, "amount does not divide the 8 tiles of axis 1"),
        ([tile(0, 0)], (8, 8), False, "amount must be an int >= 2, got 0"),
    ],
)
def test_invalid_opt_raises_opt_error_naming_it(opts, shape, reads_output, message):
    with pytest.raises(OptError, match=re.escape(message)):
        check_opts(opts, shape, reads_output)


def test_invalid_opt_given_to_lower_to_linear_raises():
    with pytest.raises(OptError, match="exceeds the size 5"):
        lower_to_linear(matmul_ast(5, 3, 4), Device["CPU"].renderer, opts=(upcast(0, 6),))


def test_overlapping_tile_allowed_when_the_output_is_not_read():
    assert check_opts([upcast(0, 3)], (8, 8), reads_output=False).upcasts == {0: 3}


# ---- choices


def test_matmul_gets_a_register_tile_of_rows_and_vectors_of_columns():
    width = vector_bytes() // 4
    info = lower_to_linear(matmul_ast(64, 64, 64), Device["CPU"].renderer)
    rows = [o for o in info.opts if o.axis == 0 and o.op is OptOps.UPCAST]
    assert [o for o in info.opts if o.axis == 1] == [upcast(1, 2 * width)]
    assert len(rows) == 1 and 4 <= rows[0].amount <= 8
    # one store per output of the tile: the lanes are separately named values
    assert sum(1 for u in info.lin if u.op.name == "STORE") == rows[0].amount * 2 * width


def test_large_matmul_walks_row_tiles_in_blocks_one_per_thread_at_least():
    width = vector_bytes() // 4
    with Context(NUM_CPU_THREADS=2):
        info = lower_to_linear(matmul_ast(256, 256, 4 * width), Device["CPU"].renderer)
    blocks = [o for o in info.opts if o.op is OptOps.TILE]
    assert len(blocks) == 1 and blocks[0].axis == 0
    row_tiles = 256 // next(o.amount for o in info.opts if o.op is OptOps.UPCAST and o.axis == 0)
    assert 2 <= blocks[0].amount <= row_tiles // 2


def test_noopt_applies_none():
    with Context(NOOPT=1):
        info = lower_to_linear(matmul_ast(64, 64, 64), Device["CPU"].renderer)
    assert info.opts == ()
    assert sum(1 for u in info.lin if u.op.name == "STORE") == 1


def test_elementwise_kernel_gets_no_opts():
    x = Tensor.rand(64, 64).realize()
    items, _, _ = create_schedule([(x * 2 + 1).uop], [Device["CPU"]])
    assert lower_to_linear(items[-1].ast, Device["CPU"].renderer).opts == ()


def test_debug_3_lists_the_opts(capsys):
    with Context(DEBUG=3):
        lower_to_linear(matmul_ast(16, 8, 16), Device["CPU"].renderer)
    assert "r_16_16_8 opts: [Opt(UPCAST, axis=0" in capsys.readouterr().out


def test_upcast_kernel_renders_vector_types_and_plain_kernel_does_not():
    width = vector_bytes() // 4
    ast = matmul_ast(32, 16, 2 * width)
    src = rendered(Device["CPU"].renderer, "k", lower_to_linear(ast, Device["CPU"].renderer).lin)
    assert f"typedef float fg_floatx{width} __attribute__((vector_size({vector_bytes()})));" in src
    assert f"fg_floatx{width} vec" in src and "__builtin_memcpy(&vec" in src
    with Context(NOOPT=1):
        plain = rendered(Device["CPU"].renderer, "k", lower_to_linear(ast, Device["CPU"].renderer).lin)
    assert "vector_size" not in plain and "fg_floatx" not in plain


# ---- values


def run_matmul(an: np.ndarray, bn: np.ndarray, device: str = "CPU") -> np.ndarray:
    realize._runners.clear()  # a program compiled under forced opts (not part of its key) must not be reused
    return (Tensor(an, device=device) @ Tensor(bn, device=device)).relu().numpy()


@pytest.mark.slow  # 25 examples, each run on the PYTHON interpreter device: CI
@settings(max_examples=25, deadline=None)
@given(m=SIZES, k=SIZES, n=SIZES, seed=st.integers(0, 2**31 - 1))
def test_heuristic_opts_equal_noopt_and_python_device(m, k, n, seed):
    rng = np.random.default_rng(seed)
    an, bn = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    got = run_matmul(an, bn)
    with Context(NOOPT=1):
        plain = run_matmul(an, bn)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, run_matmul(an, bn, "PYTHON"), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, np.maximum(an.astype(np.float64) @ bn, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # 20 examples of several compiles each: CI
@settings(max_examples=20, deadline=None)
@given(data=st.data(), m=SIZES, k=SIZES, n=SIZES)
def test_every_upcast_equals_noopt(data, m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    an, bn = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    with Context(NOOPT=1):
        plain = run_matmul(an, bn)
    opts = [upcast(axis, data.draw(st.integers(2, size))) for axis, size in ((0, m), (1, n)) if size >= 2]
    opts = data.draw(st.sampled_from([opts, opts[:1], opts[1:]]))
    for axis, size in ((0, m), (1, n)):
        tiles = -(-size // next((o.amount for o in opts if o.axis == axis), 1))
        if tiles >= 2 and data.draw(st.booleans()):
            opts.append(tile(axis, data.draw(st.integers(2, tiles))))
    with forced_opts(opts):
        np.testing.assert_allclose(run_matmul(an, bn), plain, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(run_matmul(an, bn, "PYTHON"), plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("amount", [2, 3, 16, 17])
def test_upcast_column_sum_and_elementwise_kernels(amount):
    xn = np.random.default_rng(amount).standard_normal((9, 17), dtype=np.float32)
    realize._runners.clear()
    with forced_opts([upcast(0, amount)]):  # the sum's output is (17,)
        np.testing.assert_allclose(Tensor(xn).sum(0).numpy(), xn.sum(0), rtol=1e-5, atol=1e-5)
    with forced_opts([upcast(1, amount)]):
        np.testing.assert_allclose((Tensor(xn) * 3 - 1).numpy(), xn * 3 - 1, rtol=1e-6, atol=1e-6)


def test_nan_and_inf_propagate_through_the_vector_tile():
    width = vector_bytes() // 4
    an = np.ones((8, 4), np.float32)
    bn = np.ones((4, 2 * width), np.float32)
    an[1, 2], bn[3, 5], bn[0, 7] = np.nan, np.inf, -np.inf
    got = (Tensor(an) @ Tensor(bn)).numpy()
    np.testing.assert_array_equal(got, an @ bn)


# ---- REDUCE_BLOCK


def reduce_block(amount: int, axis: int = 2) -> Opt:
    return Opt(OptOps.REDUCE_BLOCK, axis, amount)


@pytest.mark.parametrize(
    "opts, message",
    [
        ([reduce_block(16, axis=1)], "axis 1 is not the reduced axis 2 of the reduce's input (8, 8, 64)"),
        ([reduce_block(24)], "amount must divide the reduced size 64 into more than one block"),
        ([reduce_block(64)], "amount must divide the reduced size 64 into more than one block"),
        ([reduce_block(16), reduce_block(32)], "a kernel's reduce is blocked once"),
        ([reduce_block(16), upcast(0, 3)], "amount 3 does not divide the size 8 of axis 0"),
    ],
)
def test_invalid_reduce_block_raises_opt_error(opts, message):
    with pytest.raises(OptError, match=re.escape(message)):
        lower_to_linear(matmul_ast(8, 64, 8), Device["CPU"].renderer, opts=tuple(opts))


def test_reduce_block_needs_a_plain_sum():
    a, b, c = Tensor.rand(8, 64).realize(), Tensor.rand(64, 8).realize(), Tensor.rand(8, 8).realize()
    # a maximum with another tensor is an epilogue the vectors cannot carry (a relu or a bias now can)
    items, _, _ = create_schedule([(a @ b).maximum(c).uop], [Device["CPU"]])
    with pytest.raises(OptError, match="not a single float sum over one axis"):
        lower_to_linear(items[-1].ast, Device["CPU"].renderer, opts=(reduce_block(16),))


def test_long_matmul_reduce_is_blocked_and_short_one_is_not(avx512_target):
    # 32 registers: the blocks' tiles have enough accumulators (on 16, test_register_tiles.py)
    opts = lower_to_linear(matmul_ast(64, 1024, 64), avx512_target).opts
    assert [o for o in opts if o.op is OptOps.REDUCE_BLOCK] == [reduce_block(64)]
    assert not [o for o in lower_to_linear(matmul_ast(64, 256, 64), avx512_target).opts if o.op is OptOps.REDUCE_BLOCK]


def divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


@pytest.mark.slow  # 20 examples of three compiles each: CI (the other opts-vs-noopt cases stay)
@settings(max_examples=20, deadline=None)
@given(data=st.data(), m=SIZES, k=st.sampled_from([4, 6, 12, 30, 64]), n=SIZES)
def test_reduce_block_equals_noopt(data, m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    an, bn = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    with Context(NOOPT=1):
        plain = (Tensor(an) @ Tensor(bn)).numpy()
    opts = [reduce_block(data.draw(st.sampled_from([d for d in divisors(k) if d < k] + [1])))]
    amounts = {
        axis: data.draw(st.sampled_from([1] + [d for d in divisors(size) if d <= 16]))
        for axis, size in ((0, m), (1, n))
    }
    opts += [upcast(axis, amount) for axis, amount in amounts.items() if amount > 1]
    realize._runners.clear()
    with forced_opts(opts):
        if m == amounts[0] and n == amounts[1]:  # one tile: no output loop for the blocks to run inside
            with pytest.raises(OptError, match="needs a loop of more than one tile"):
                lower_to_linear(matmul_ast(m, k, n), Device["CPU"].renderer, opts=tuple(opts))
            # as the heuristics' choice, the refused opt is dropped: the values stay right
            np.testing.assert_allclose((Tensor(an) @ Tensor(bn)).numpy(), plain, rtol=1e-5, atol=1e-5)
            return
        np.testing.assert_allclose((Tensor(an) @ Tensor(bn)).numpy(), plain, rtol=1e-5, atol=1e-5)
        realize._runners.clear()
        got = (Tensor(an, device="PYTHON") @ Tensor(bn, device="PYTHON")).numpy()
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)


def test_reduce_block_changes_no_zero_sign_or_nan():
    an = np.full((24, 512), -0.0, np.float32)
    bn = np.ones((512, 64), np.float32)
    an[3, 300] = np.nan
    assert any(
        o.op is OptOps.REDUCE_BLOCK for o in lower_to_linear(matmul_ast(24, 512, 64), Device["CPU"].renderer).opts
    )
    got = (Tensor(an) @ Tensor(bn)).numpy()
    with Context(NOOPT=1):
        realize._runners.clear()
        plain = (Tensor(an) @ Tensor(bn)).numpy()
    np.testing.assert_array_equal(got, plain)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(plain))
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, axis=0)).any()


# ---- vector packs


def straight_or_reversed_copy(reverse: bool, width: int | None = None):
    """data0[16*i + j] = 2 * data0[16*i + j] over one vector of lanes (or `width` lanes); reversed, lane j stores the
    element lane width-1-j loads, so a load after a store may read what the store wrote."""
    width = vector_bytes() // 4 if width is None else width
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, 4 * width))
    r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 4),), (0, "global"))
    base = r * width
    index = [base if j == 0 else base + j for j in range(width)]
    lin: list[UOp] = [buf, r, base]
    for j in range(width):
        load = UOp(Ops.LOAD, dtypes.float32, (buf, index[j]))
        doubled = load * UOp.const(dtypes.float32, 2.0)
        lin += [index[j]] * (j > 0) + [
            load,
            doubled,
            UOp(Ops.STORE, src=(buf, index[width - 1 - j if reverse else j], doubled)),
        ]
    return tuple(lin + [UOp(Ops.ENDRANGE, src=(r,))])


def test_in_place_kernel_packs_when_each_element_is_read_before_written():
    lin = straight_or_reversed_copy(reverse=False)
    packed = find_packs(lin, vector_bytes())
    assert {u.op for u in packed} == {Ops.LOAD, Ops.MUL, Ops.STORE}


def test_packs_that_would_reorder_a_read_and_a_write_of_one_element_are_refused():
    assert find_packs(straight_or_reversed_copy(reverse=True), vector_bytes()) == {}


@pytest.mark.parametrize(
    "vector_bytes_, lanes, widths",
    [
        (64, 8, [8]),  # an 8-column tile of floats under AVX-512: half a register
        (64, 24, [16, 8]),  # a full vector first, then a half one from what is left
        (32, 4, [4]),
        (16, 2, []),  # half of a 16-byte register is too narrow to pack
        (64, 4, []),  # a quarter of a register is not packed
    ],
)
def test_lanes_that_fill_half_a_vector_pack_as_a_half_width_vector(vector_bytes_, lanes, widths):
    packed = find_packs(straight_or_reversed_copy(reverse=False, width=lanes), vector_bytes_)
    packs = {pack for pack, _ in packed.values()}
    assert sorted((len(p.lanes) for p in packs if p.lanes[0].op is Ops.LOAD), reverse=True) == widths
    if widths:
        assert {u.op for u in packed} == {Ops.LOAD, Ops.MUL, Ops.STORE}
        assert all(len(p.lanes) in widths for p in packs)


@pytest.mark.parametrize("rows", [8, 16])
def test_tile_rows_read_consecutively_stay_broadcast_scalars(rows):
    """relu(A.T) @ B with A's columns (the tile's rows) consecutive in memory: the rows' loads form a vector, but the
    products broadcast each row's value, so its ReLU must stay a scalar (a vector there was multiplied whole into
    every row of the tile)."""
    width = vector_bytes() // 4
    rng = np.random.default_rng(1)
    an, bn = rng.standard_normal((12, rows), dtype=np.float32), rng.standard_normal((12, width), dtype=np.float32)
    with forced_opts([upcast(0, 8), upcast(1, width // 2 if width >= 8 else width)]):
        realize._runners.clear()
        got = (Tensor(an).T.relu() @ Tensor(bn)).numpy()
        realize._runners.clear()
    np.testing.assert_allclose(got, np.maximum(an.T, 0) @ bn, rtol=1e-5, atol=1e-5)


def test_tile_rows_read_consecutively_pack_products_along_the_columns():
    """A.T @ B (a weight gradient: A's columns, the tile's rows, are consecutive in memory): the rows' run of loads
    goes back to scalar loads shared by the column vectors, so the products are vectors. They were scalar products of
    lanes of both runs (`vec0[r]*vec1[c]`: 256 scalar accumulators, 20 GFLOPS in an MLP's weight gradient)."""
    width = vector_bytes() // 4
    rng = np.random.default_rng(2)
    an, bn = rng.standard_normal((12, 8), dtype=np.float32), rng.standard_normal((12, 2 * width), dtype=np.float32)
    a, b = Tensor(an).realize(), Tensor(bn).realize()
    items, _, _ = create_schedule([(a.T @ b).uop], [Device["CPU"]])
    with forced_opts([upcast(0, 8), upcast(1, 2 * width)]):
        src = rendered(Device["CPU"].renderer, "k", lower_to_linear(items[-1].ast, Device["CPU"].renderer).lin)
        realize._runners.clear()
        got = (Tensor(an).T @ Tensor(bn)).numpy()
        realize._runners.clear()
    assert re.search(r"vec\d+\[\d+\]\*", src) is None and f"fg_floatx{width} vec" in src
    np.testing.assert_allclose(got, an.T @ bn, rtol=1e-5, atol=1e-5)


def test_half_width_register_tile_is_vector_c_and_equals_numpy():
    """A register tile half a vector wide (8 columns of floats under AVX-512) is emitted as vectors of that width: its
    scalar accumulators would otherwise be vectorized by the C compiler along the reduce, as gathers."""
    half = vector_bytes() // 4 // 2
    if half < 4:
        pytest.skip(f"{vector_bytes()}-byte vectors have no half-width float vector of 16+ bytes")
    an, bn = np.random.default_rng(0).random((2, 16, 24), dtype=np.float32)
    a, b = Tensor(an).realize(), Tensor(bn.T.copy()).realize()
    out = a @ b
    items, _, _ = create_schedule([out.uop], [Device["CPU"]])
    with forced_opts([upcast(0, 8), upcast(1, half)]):
        src = rendered(Device["CPU"].renderer, "k", lower_to_linear(items[-1].ast, Device["CPU"].renderer).lin)
        realize._runners.clear()
        got = (Tensor(an) @ Tensor(bn.T.copy())).numpy()
        realize._runners.clear()
    assert f"fg_floatx{half} vec" in src and "omp simd" not in src
    np.testing.assert_allclose(got, an @ bn.T, rtol=1e-5)


def test_a_row_value_compared_with_its_columns_is_shared_not_read_as_a_vector():
    # x == rowmax under a 4 x 4 register tile: each compare lane reads the row's one value (the mask pack once read
    # the row values of four rows as its vector, so max's gradient missed the maxima: found by the fuzzer)
    x_np = np.random.default_rng(41107).standard_normal((5, 7)).astype(np.float32)
    x = Tensor(x_np).realize()
    rowmax = x.max(axis=1, keepdim=True).realize()
    with forced_opts([upcast(1, 4), upcast(0, 4)]):
        got = ((x == rowmax).where(x, 0.0) * 3.0).numpy()
    np.testing.assert_array_equal(got, np.where(x_np == x_np.max(axis=1, keepdims=True), x_np * 3.0, 0.0))


def test_a_row_value_subtracted_in_an_epilogue_is_shared_and_the_epilogue_stays_vectors():
    # m * (a @ b - r), r one value per row (attention's backward: P * (dO·Vᵀ - rowsum(dO·O))): -r packed along the
    # rows before the tile's columns asked for it, and the whole epilogue went lane by lane (scalar loads and stores)
    rng = np.random.default_rng(3)
    an, bn, rn, mn = (rng.standard_normal(s, dtype=np.float32) for s in ((24, 64), (64, 64), (24, 1), (24, 64)))
    a, b, r, m = (Tensor(x).realize() for x in (an, bn, rn, mn))
    items, _, _ = create_schedule([(m * (a @ b - r)).uop], [Device["CPU"]])
    info = lower_to_linear(items[-1].ast, Device["CPU"].renderer)
    src = rendered(Device["CPU"].renderer, info.name, info.lin)
    if any(o.op is OptOps.UPCAST and o.axis == 0 for o in info.opts) and vector_bytes() >= 32:
        assert re.search(r"vec\d+\[\d+\]", src) is None
    realize._runners.clear()
    got = (Tensor(mn) * (Tensor(an) @ Tensor(bn) - Tensor(rn))).numpy()
    np.testing.assert_allclose(got, mn * (an.astype(np.float64) @ bn - rn), rtol=1e-4, atol=1e-4)
