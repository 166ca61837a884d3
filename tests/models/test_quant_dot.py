"""The integer dot-product matvec of Q8_0 and Q4_K weights (activations quantized to 8 bits per block of 32, as
llama.cpp's Q8 activations, held in int8 or int16) against numpy, and the C kernel it renders to: plain signed sums
of integer products, which GCC turns into vpdpbusd where the target has VNNI (int8 activations) and into vpmaddwd on
AVX2 (int16 activations)."""

import platform
import subprocess

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the test extra installs gguf")

from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import GGML_QUANT_SIZES  # noqa: E402
from gguf_models import _stored  # noqa: E402

from fusegrad import GlobalCounters, Tensor  # noqa: E402
from fusegrad.codegen import lower_to_linear  # noqa: E402
from fusegrad.dtype import dtypes  # noqa: E402
from fusegrad.helpers import Context  # noqa: E402
from fusegrad.nn.quantized import GGMLQuantized, QuantizedMatrix, dot_activations, quantize_blocks  # noqa: E402
from fusegrad.runtime.device import Device  # noqa: E402
from fusegrad.runtime.ops_cpu import find_compiler, kernel_flags  # noqa: E402
from fusegrad.schedule import create_schedule  # noqa: E402
from fusegrad.uop.ops import Ops  # noqa: E402


def _integer_matrix(
    rows: int, cols: int, device: str, seed: int = 0, qtype: str = "Q8_0", activations=dtypes.int8, avx2: bool = False
) -> tuple[QuantizedMatrix, np.ndarray]:
    """A matrix of random weights in qtype (Q8_0: quantized by gguf; K-quants: random blocks) on its integer planes,
    its matvec's activations held in `activations`; avx2: its matvec the AVX2 kernel where the target has one (off:
    the generated one, which these tests check on every target)."""
    qt = GGMLQuantizationType[qtype]
    rng = np.random.default_rng(seed)
    raw, meant = _stored(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, qt, rng)
    blocks = Tensor(raw.reshape(-1, GGML_QUANT_SIZES[qt][1]), device=device).realize()
    w = GGMLQuantized("w", int(qt), (rows, cols), blocks)
    with Context(AVX2_MATVEC=int(avx2)):
        return QuantizedMatrix.from_ggml(w, int8=True, activations=activations), meant


def _numpy_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q8 activations in numpy: per block of 32, scale = max|x| / 127, values rounded half away from 0."""
    xb = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    xs = np.abs(xb).max(-1) * np.float32(1 / 127)
    scaled = np.divide(xb, xs[..., None], out=np.zeros_like(xb), where=xs[..., None] > 0)
    return np.trunc(scaled + np.where(scaled < 0, -0.5, 0.5)).astype(np.int8), xs


@pytest.mark.parametrize("device, dtype", [("CPU", dtypes.int8), ("CPU", dtypes.int16), ("LLVM", dtypes.int8)])
def test_quantize_blocks_equals_numpy(device, dtype):
    if device == "LLVM":
        pytest.importorskip("llvmlite")
    x = np.random.default_rng(0).standard_normal((2, 96)).astype(np.float32)
    x[1, 32:64] = 0  # an all-zero block: scale 0, values 0
    xq, xs, xsum = quantize_blocks(Tensor(x, device=device), dtype)
    want_q, want_s = _numpy_blocks(x)
    assert xq.dtype == dtype
    np.testing.assert_array_equal(xq.numpy(), want_q)
    np.testing.assert_allclose(xs.numpy(), want_s, rtol=1e-7)
    np.testing.assert_array_equal(xsum.numpy(), want_q.astype(np.int64).sum(-1))
    assert np.abs(xq.numpy()).max() <= 127


CASES = [("Q8_0", 1, 48, 768), ("Q8_0", 2, 37, 64), ("Q8_0", 1, 5, 2048), ("Q4_K", 1, 48, 768), ("Q4_K", 3, 37, 256)]


@pytest.mark.parametrize(
    "device, activations, qtype, n, rows, cols",
    [("CPU", dtypes.int8, *c) for c in CASES]
    + [("CPU", dtypes.int16, *c) for c in CASES]
    + [("CPU", dtypes.int8, "Q4_K", 1, 5, 2048), ("CPU", dtypes.int16, "Q4_K", 1, 5, 2048)]
    + [("LLVM", dtypes.int8, *c) for c in CASES[:2] + CASES[4:]]
    + [pytest.param("LLVM", dtypes.int8, *c, marks=pytest.mark.slow) for c in CASES[2:4]],
)
def test_integer_matvec_equals_dequantized_float_math_within_the_activation_error(
    device, activations, qtype, n, rows, cols
):
    if device == "LLVM":
        pytest.importorskip("llvmlite")
    q, meant = _integer_matrix(rows, cols, device, seed=rows, qtype=qtype, activations=activations)
    assert q.integer
    np.testing.assert_array_equal(q.dequantize().numpy(), meant)  # the unsigned planes still mean the same weight
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    got = q.matvec(Tensor(x, device=device)).numpy()
    # the same activations quantized in numpy: only float32 rounding apart
    xq, xs = _numpy_blocks(x)
    w = meant.astype(np.float64).reshape(rows, -1, 32)
    exact = np.einsum("nbl,rbl,nb->nr", xq.astype(np.float64), w, xs.astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-5 * np.abs(exact).max())
    # against unquantized x: each value is off by at most half a step (scale / 2) of its block
    want = x.astype(np.float64) @ meant.T.astype(np.float64)
    bound = np.einsum("rbl,nb->nr", np.abs(w), xs.astype(np.float64) / 2)
    assert np.all(np.abs(got - want) <= bound + 1e-5 * np.abs(want).max())


@pytest.mark.parametrize("activations", [dtypes.int8, dtypes.int16])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize("n", [1, 8])
def test_the_integer_matvec_is_one_kernel_after_the_activations_ones(qtype, n, activations):
    # 8 rows (a short prompt's chunk) of a weight large enough that the scheduler would realize an unpacked copy of
    # it rather than unpack it again per row: the matvec still reads the packed bytes
    q, _ = _integer_matrix(1024, 1536, "CPU", qtype=qtype, activations=activations)
    x = Tensor(np.random.default_rng(1).standard_normal((n, 1536)).astype(np.float32)).realize()
    GlobalCounters.reset()
    q.matvec(x).realize()
    # scale, values (and value sums, but for Q8_0's signed weights against 16-bit activations) of x; the matvec
    sums = not (qtype == "Q8_0" and activations == dtypes.int16)
    assert GlobalCounters.kernel_count == 3 + sums


def _matvec_source(qtype: str = "Q8_0", activations=dtypes.int8) -> str:
    q, _ = _integer_matrix(64, 512, "CPU", qtype=qtype)
    xq, xs, xsum = (t.realize() for t in quantize_blocks(Tensor.ones(1, 512).contiguous().realize(), activations))
    out = q.matvec(Tensor.ones(1, 512), (xq, xs, xsum))
    (item,) = [i for i in create_schedule([out.uop], [Device["CPU"]])[0] if i.ast.op is Ops.SINK]
    return Device["CPU"].render(lower_to_linear(item.ast, Device["CPU"].renderer))


@pytest.mark.parametrize("activations", [dtypes.int8, dtypes.int16])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_the_sum_of_8_bit_products_renders_as_plain_signed_c(qtype, activations):
    # no unsigned wrapping and no simd pragma on it: GCC's loop vectorizer then finds the dot product
    src = _matvec_source(qtype, activations)
    lines = [ln for ln in src.splitlines() if ln.strip().startswith(("acc1 = ", "acc2 = "))]
    assert lines and all("unsigned" not in ln and "*" in ln for ln in lines), lines
    assert "reduction(+:acc" not in src


def _assembly(src: str, x86_target: str) -> str:
    """The kernel's assembly for an x86 CPU that has the instruction (only assembled, never run, so the machine that
    runs the test need not have it); elsewhere for this machine."""
    cc = find_compiler()
    flags = list(kernel_flags(cc, src))
    if platform.machine() in ("x86_64", "AMD64"):
        flags = [f for f in flags if not f.startswith("-march=")] + [f"-march={x86_target}"]
    elif not Device["CPU"].renderer.capabilities.int8_dot:
        pytest.skip("this CPU has no 8-bit dot product instruction")
    return subprocess.run(
        [cc, *flags, "-S", "-x", "c", "-", "-o", "-"], input=src, capture_output=True, text=True
    ).stdout


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_the_c_kernel_runs_vpdpbusd_where_the_target_has_vnni(qtype):
    asm = _assembly(_matvec_source(qtype), "icelake-server")  # AVX512-VNNI
    assert "vpdpbusd" in asm or "sdot" in asm or "udot" in asm  # x86 VNNI, Arm's dot products


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_the_c_kernel_runs_vpmaddwd_on_16_bit_activations_where_the_target_has_int16_dot(qtype):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("vpmaddwd is an x86 instruction")
    assert "vpmaddwd" in _assembly(_matvec_source(qtype, dtypes.int16), "haswell")  # AVX2


def _matrix(qtype: str, int8: bool | None) -> QuantizedMatrix:
    qt = GGMLQuantizationType[qtype]
    rng = np.random.default_rng(0)
    raw, _ = _stored(rng.standard_normal((4, 256)).astype(np.float32), qt, rng)
    blocks = Tensor(raw.reshape(-1, GGML_QUANT_SIZES[qt][1])).realize()
    return QuantizedMatrix.from_ggml(GGMLQuantized("w", int(qt), (4, 256), blocks), int8=int8)


def test_formats_without_an_integer_path_keep_the_float_one():
    assert _matrix("Q6_K", int8=True).integer is False


@pytest.mark.parametrize(
    "int8_dot, int16_dot, activations",
    [(True, True, dtypes.int8), (True, False, dtypes.int8), (False, True, dtypes.int16), (False, False, None)],
)
def test_the_activations_dtype_follows_the_targets_integer_products(int8_dot, int16_dot, activations, monkeypatch):
    from fusegrad.engine import realize

    monkeypatch.setattr(realize, "int8_dot", lambda device: int8_dot)
    monkeypatch.setattr(realize, "int16_dot", lambda device: int16_dot)
    assert dot_activations("CPU") == activations
    q = _matrix("Q8_0", int8=None)
    assert q.integer is (activations is not None)
    if activations is not None:
        assert q.activations == activations


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_a_target_without_integer_dot_products_keeps_the_float_path(qtype, monkeypatch):
    from fusegrad.engine import realize

    monkeypatch.setattr(realize, "int8_dot", lambda device: False)
    monkeypatch.setattr(realize, "int16_dot", lambda device: False)
    q = _matrix(qtype, int8=None)
    assert q.integer is False
    x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    want = x.astype(np.float64) @ q.dequantize().numpy().T.astype(np.float64)
    np.testing.assert_allclose(q.matvec(Tensor(x)).numpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("qtype, cols", [("Q8_0", 64), ("Q4_K", 512)])
def test_a_prefill_chunk_over_the_integer_planes_is_float_math(qtype, cols):
    q, meant = _integer_matrix(37, cols, "CPU", qtype=qtype)
    x = np.random.default_rng(3).standard_normal((5, cols)).astype(np.float32)
    want = x.astype(np.float64) @ meant.T.astype(np.float64)
    np.testing.assert_allclose(q.matmul(Tensor(x)).numpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())
