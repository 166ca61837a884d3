"""The AVX2 decode matvecs (nn/quantized_avx2.py) of Q8_0 and Q4_K weights: values against numpy over the
dequantized weights, the instruction they rely on (vpmaddubsw, assembled for a named AVX2 CPU), the target choice
(`Capabilities.u8s8_pair_dot`) and a raw kernel's rows split over threads."""

import platform
import subprocess

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the test extra installs gguf")

from test_quant_dot import _integer_matrix  # noqa: E402

from fusegrad import GlobalCounters, Tensor  # noqa: E402
from fusegrad.dtype import dtypes  # noqa: E402
from fusegrad.engine.realize import u8s8_pair_dot  # noqa: E402
from fusegrad.helpers import Context  # noqa: E402
from fusegrad.nn.quantized_avx2 import (  # noqa: E402
    KERNELS,
    avx2_matvecs,
    dot_rows,
    f32_matvec,
    f32_matvecs,
    matvec_source,
)  # noqa: E402
from fusegrad.runtime import ops_cpu  # noqa: E402
from fusegrad.runtime.ops_cpu import find_compiler  # noqa: E402
from fusegrad.uop.kernel import RawKernel  # noqa: E402

needs_avx2 = pytest.mark.skipif(not u8s8_pair_dot("CPU"), reason="the CPU device's target has no AVX2")


SPANS = {"Q8_0": 32, "Q4_K": 256}  # values of x sharing one scale in each kernel's quantized activations


def _numpy_spans(x: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """x quantized to 8 bits with one scale per `span` values, rounded as _numpy_blocks does per 32."""
    xb = x.reshape(x.shape[0], -1, span).astype(np.float32)
    xs = np.abs(xb).max(-1) * np.float32(1 / 127)
    scaled = np.divide(xb, xs[..., None], out=np.zeros_like(xb), where=xs[..., None] > 0)
    return np.trunc(scaled + np.where(scaled < 0, -0.5, 0.5)).astype(np.int8), xs


def _avx2_matrix(qtype: str, rows: int, cols: int, seed: int = 0):
    q, meant = _integer_matrix(rows, cols, "CPU", seed=seed, qtype=qtype, activations=dtypes.int16, avx2=True)
    assert q.avx2 and not q.shares_blocks
    return q, meant


@needs_avx2
@pytest.mark.parametrize(
    "qtype, n, rows, cols",
    [("Q8_0", 1, 48, 768), ("Q8_0", 3, 37, 64), ("Q8_0", 8, 5, 2048), ("Q4_K", 1, 48, 768), ("Q4_K", 3, 37, 256)]
    + [("Q4_K", 8, 5, 2048), ("Q8_0", 1, 1000, 96)],
)
def test_the_avx2_matvec_equals_numpy_on_the_dequantized_weights(qtype, n, rows, cols):
    q, meant = _avx2_matrix(qtype, rows, cols, seed=rows)
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    x[0, :32] = 0  # an all-zero block: scale 0, values 0
    got = q.matvec(Tensor(x)).numpy()
    # the same activations quantized in numpy (llama.cpp's rounding; Q4_K's x per 256, as llama.cpp's Q8_K): only
    # float32 rounding apart
    span = SPANS[qtype]
    xq, xs = _numpy_spans(x, span)
    w = meant.astype(np.float64).reshape(rows, -1, span)
    exact = np.einsum("nbl,rbl,nb->nr", xq.astype(np.float64), w, xs.astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-5 * np.abs(exact).max())
    # against unquantized x: each value is off by at most half a step (scale / 2) of its span
    want = x.astype(np.float64) @ meant.T.astype(np.float64)
    bound = np.einsum("rbl,nb->nr", np.abs(w), xs.astype(np.float64) / 2)
    assert np.all(np.abs(got - want) <= bound + 1e-5 * np.abs(want).max())


@needs_avx2
def test_q8_0_weights_of_minus_128_do_not_saturate():
    # |w| = 128 is what vpmaddubsw reads as unsigned: its pair sums still fit 16 bits against |xq| = 127
    q, _ = _avx2_matrix("Q8_0", 8, 64)
    w = np.full((8, 64), -128, np.int8)
    scales = np.full((8, 2), 0.5, np.float32)
    planes = (Tensor(w).realize(), Tensor(scales).realize())
    x = np.full((1, 64), -3.0, np.float32)  # every block's values quantize to -127, scale 3/127
    q.planes = planes
    got = q.matvec(Tensor(x)).numpy()
    np.testing.assert_allclose(got, np.full((1, 8), 64 * 128 * 127 * 0.5 * np.float32(3 / 127)), rtol=1e-6)


@needs_avx2
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_the_avx2_matvec_is_one_kernel_right_when_split_over_threads(qtype):
    q, meant = _avx2_matrix(qtype, 1024, 768)
    x = np.random.default_rng(2).standard_normal((1, 768)).astype(np.float32)
    xt = Tensor(x).realize()
    GlobalCounters.reset()
    with Context(NUM_CPU_THREADS=2):
        out = q.matvec(xt).realize()
    assert GlobalCounters.kernel_count == 1  # x quantized inside it: no kernels of its own
    want = x.astype(np.float64) @ meant.T.astype(np.float64)
    np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=2e-2 * np.abs(want).max())


@needs_avx2
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n, k, rows", [(1, 768, 2048), (3, 770, 601), (8, 64, 1537), (2, 3, 5), (5, 17, 9), (1, 8, 3)])
def test_the_f32_matvec_equals_numpy(n, k, rows, threads):
    # w (out, in): rows past the last whole step of dot_rows, k past the last whole vector, several rows of x
    rng = np.random.default_rng(k)
    x, w = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((rows, k)).astype(np.float32)
    with Context(NUM_CPU_THREADS=threads):
        got = f32_matvec(Tensor(x), Tensor(w)).numpy()
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("n", range(1, 9))
def test_a_step_of_f32_dot_products_fits_the_registers(n):
    # R rows * n accumulators, R weight vectors and one of x within AVX2's 16 (a spill would reload in the loop)
    assert 1 <= dot_rows(n) and dot_rows(n) * (n + 1) + 1 <= 16
    swiglu = dot_rows(n, swiglu=True)  # a gate row and its up row in each pair
    assert swiglu >= 2 and swiglu % 2 == 0


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


@needs_avx2
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("qtype, n, cols", [("Q8_0", 1, 768), ("Q8_0", 3, 64), ("Q4_K", 1, 768), ("Q4_K", 2, 512)])
def test_the_stacked_avx2_matvec_equals_each_matrix_own(qtype, n, cols, threads):
    # q, k and v of one x in one kernel: each matrix's outputs after the previous one's, as its own kernel gives them
    mats = [_avx2_matrix(qtype, rows, cols, seed=rows)[0] for rows in (96, 32, 40)]
    x = Tensor(np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)).realize()
    with Context(NUM_CPU_THREADS=threads):
        out = avx2_matvecs(mats[0].ggml_type, [m.planes for m in mats], x)
        GlobalCounters.reset()
        got = out.realize().numpy()
        assert GlobalCounters.kernel_count == 1
        want = np.concatenate([m.matvec(x).numpy() for m in mats], axis=1)
    np.testing.assert_array_equal(got, want)  # the same rounding of x and the same sums: the same floats


@needs_avx2
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("qtype, n, cols", [("Q8_0", 1, 768), ("Q8_0", 4, 96), ("Q4_K", 1, 768), ("Q4_K", 3, 256)])
def test_the_swiglu_avx2_matvec_equals_numpy(qtype, n, cols, threads):
    (gate, gate_w), (up, up_w) = (_avx2_matrix(qtype, 200, cols, seed=s) for s in (1, 2))
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    with Context(NUM_CPU_THREADS=threads):
        got = avx2_matvecs(gate.ggml_type, [gate.planes, up.planes], Tensor(x), swiglu=True).numpy()
        g, u = gate.matvec(Tensor(x)).numpy(), up.matvec(Tensor(x)).numpy()
    # against the two kernels' own products: silu in float32 apart
    np.testing.assert_allclose(got, _silu(g.astype(np.float64)) * u, rtol=1e-5, atol=1e-6 * np.abs(got).max())
    # and against numpy on the dequantized weights (x quantized to 8 bits: a percent of the largest value)
    want = _silu(x.astype(np.float64) @ gate_w.T.astype(np.float64)) * (x.astype(np.float64) @ up_w.T)
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-2 * np.abs(want).max())


@needs_avx2
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n, k, rows", [(1, 768, (768, 256, 256)), (3, 70, (101, 37)), (2, 9, (5,) * 3), (1, 16, (1, 2))]
)
def test_the_stacked_f32_matvec_equals_numpy(n, k, rows, threads):
    # a step of rows that straddles two matrices reads each row from its own
    rng = np.random.default_rng(k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    ws = [rng.standard_normal((r, k)).astype(np.float32) for r in rows]
    xt, wts = Tensor(x).realize(), [Tensor(w).realize() for w in ws]
    with Context(NUM_CPU_THREADS=threads):
        GlobalCounters.reset()
        got = f32_matvecs(xt, wts).realize().numpy()
        assert GlobalCounters.kernel_count == 1
    want = np.concatenate([x.astype(np.float64) @ w.T for w in ws], axis=1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_avx2
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n, k, rows", [(1, 768, 2048), (2, 66, 701), (8, 5, 3), (3, 12, 1)])
def test_the_swiglu_f32_matvec_equals_numpy(n, k, rows, threads):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((n, k)).astype(np.float32)
    gate, up = (rng.standard_normal((rows, k)).astype(np.float32) for _ in range(2))
    with Context(NUM_CPU_THREADS=threads):
        got = f32_matvecs(Tensor(x), [Tensor(gate), Tensor(up)], swiglu=True).numpy()
    want = _silu(x.astype(np.float64) @ gate.T) * (x.astype(np.float64) @ up.T)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


@needs_avx2
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "qtype, n, swiglu", [("Q8_0", 1, False), ("Q8_0", 3, True), ("Q4_K", 1, True), ("Q4_K", 2, False)]
)
def test_the_avx2_matvec_with_the_norm_and_the_residual_inside_equals_numpy(qtype, n, swiglu, threads):
    # rms_norm(x) in the prologue, the residual added to the outputs: as the kernel of the normalized x plus it
    mats = [_avx2_matrix(qtype, 64, 512, seed=s)[0] for s in (3, 4)[: 1 + swiglu]]
    rng = np.random.default_rng(n)
    x, w = rng.standard_normal((n, 512)).astype(np.float32) * 3, rng.random(512).astype(np.float32) + 0.5
    res = rng.standard_normal((n, 64)).astype(np.float32)
    planes = [m.planes for m in mats]
    with Context(NUM_CPU_THREADS=threads):
        got = avx2_matvecs(mats[0].ggml_type, planes, Tensor(x), swiglu, (Tensor(w), 1e-5), Tensor(res)).numpy()
        normed = Tensor(_rms_norm(x, w, 1e-5).astype(np.float32))
        want = avx2_matvecs(mats[0].ggml_type, planes, normed, swiglu).numpy() + res
    # the normalized x apart by float32 rounding, which can move a value across a rounding step of its 8 bits
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * np.abs(want).max())


@needs_avx2
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n, k, rows, swiglu",
    [(1, 768, (768, 256, 256), False), (3, 70, (100,), False), (2, 66, (41, 41), True), (1, 768, (2048, 2048), True)],
)
def test_the_f32_matvec_with_the_norm_and_the_residual_inside_equals_numpy(n, k, rows, swiglu, threads):
    rng = np.random.default_rng(k)
    x, w = rng.standard_normal((n, k)).astype(np.float32), rng.random(k).astype(np.float32) + 0.5
    ws = [rng.standard_normal((r, k)).astype(np.float32) for r in rows]
    res = rng.standard_normal((n, rows[0] if swiglu else sum(rows))).astype(np.float32)
    with Context(NUM_CPU_THREADS=threads):
        got = f32_matvecs(Tensor(x), [Tensor(m) for m in ws], swiglu, (Tensor(w), 1e-6), Tensor(res)).numpy()
    xn = _rms_norm(x, w, 1e-6)
    ys = [xn @ m.T for m in ws]
    want = (_silu(ys[0]) * ys[1] if swiglu else np.concatenate(ys, axis=1)) + res
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


# each item is written with the start of the chunk it was computed in
CHUNK_STARTS = "void starts(float* o, long long s, long long e) { for (long long i = s; i < e; i++) o[i] = s; }"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_raw_kernel_with_items_computes_them_in_the_devices_chunks(threads):
    raw = RawKernel(CHUNK_STARTS, "starts", items=4096, ops=1 << 20)
    with Context(NUM_CPU_THREADS=threads):
        (out,) = Tensor.custom_kernel(Tensor.empty(4096), fxn=lambda *_: raw)
        got = out.numpy()
    starts = np.unique(got)
    assert starts[0] == 0 and (len(starts) > 1) is (threads > 1)
    # every chunk is one run of items from its start
    assert all(np.all(got[int(s) : int(s) + np.count_nonzero(got == s)] == s) for s in starts)


def _assembly(src: str, x86_target: str) -> str:
    cc = find_compiler()
    flags = [f for f in ops_cpu.CFLAGS if not f.startswith("-march=")] + [f"-march={x86_target}"]
    proc = subprocess.run([cc, *flags, "-S", "-x", "c", "-", "-o", "-"], input=src, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AVX2 is an x86 instruction set")
@pytest.mark.parametrize("ggml_type", sorted(KERNELS))
def test_the_kernels_multiply_bytes_in_vpmaddubsw_for_haswell(ggml_type):
    src = matvec_source(ggml_type, "k", 2, 512, (64,))
    asm = _assembly(src, "haswell")  # AVX2 + FMA, no AVX-512: assembled only, so the host need not have it
    assert "vpmaddubsw" in asm and "vpmaddwd" in asm and "vfmadd" in asm


@needs_avx2
@pytest.mark.parametrize("qtype", [pytest.param("Q8_0", marks=pytest.mark.slow), "Q4_K"])  # Q8_0: CI's slow part
def test_a_llama_decode_step_through_the_fused_kernels_equals_the_kernel_per_linear(tmp_path, monkeypatch, qtype):
    # the q/k/v, gate/up and output matvecs with their norms, o and down with their residual adds: one kernel each,
    # against the same model with a kernel per linear and the norms and adds their own (fused_matvec off): the norm's
    # float rounding apart, which can move an activation across an 8-bit step
    pytest.importorskip("transformers", reason="the test extra installs transformers")
    from gguf_models import make_model, write_gguf

    from fusegrad.models import llama

    write_gguf(make_model("llama", hidden_size=256, intermediate_size=512), "llama", tmp_path / "m.gguf", qtype)
    logits = {}
    for fused in (False, True):
        if not fused:
            monkeypatch.setattr(llama, "fused_matvec", lambda *args, **kwargs: None)
        else:
            monkeypatch.undo()
        model, _ = llama.Llama.from_gguf(tmp_path / "m.gguf", max_context=32, progress=False)
        model.forward(np.array([3, 1, 4], np.int32), 0)
        logits[fused] = [model.forward(np.array([t], np.int32), 3 + i).numpy() for i, t in enumerate([5, 9, 2])]
        launches = model._steps[(1, False)].captured.launches
        names = [la.runner.info.name for la in launches if la.runner is not None]
        assert len([n for n in names if "_norm_" in n or "_res_" in n]) == (4 * len(model.blocks) + 1) * fused
    for got, want in zip(logits[True], logits[False]):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-2 * np.abs(want).max())
