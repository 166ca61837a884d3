"""The quantized GEMM of prefill chunks (QuantizedMatrix.matmul: the weight dequantized once into float panels, then
the panel matmul) against numpy's dequantize-then-matmul, and the chunking of a prefill."""

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the test extra installs gguf")

from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import GGML_QUANT_SIZES, dequantize  # noqa: E402
from gguf_models import _stored  # noqa: E402

from fusegrad import Context, Tensor  # noqa: E402
from fusegrad.codegen import lower_to_linear  # noqa: E402
from fusegrad.engine.realize import u8s8_pair_dot  # noqa: E402
from fusegrad.codegen.opt import OptOps  # noqa: E402
from fusegrad.models.generate import prefill_chunks  # noqa: E402
from fusegrad.nn.quantized import GGMLQuantized, QuantizedMatrix  # noqa: E402
from fusegrad.runtime.device import Device  # noqa: E402
from fusegrad.nn.panels_avx2 import avx2_panels, panels_fit  # noqa: E402
from fusegrad.schedule import create_schedule  # noqa: E402
from fusegrad.uop.kernel import RawKernel  # noqa: E402


def _quantized(qtype: str, rows: int, cols: int, seed: int = 0) -> tuple[QuantizedMatrix, np.ndarray]:
    """(QuantizedMatrix of random values, the float weight gguf.quants dequantizes its blocks to)."""
    qt = GGMLQuantizationType[qtype]
    rng = np.random.default_rng(seed)
    raw, meant = _stored(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, qt, rng)
    np.testing.assert_array_equal(meant, dequantize(raw, qt))
    blocks = Tensor(raw.reshape(-1, GGML_QUANT_SIZES[qt][1])).realize()
    return QuantizedMatrix.from_ggml(GGMLQuantized("w", int(qt), (rows, cols), blocks)), meant


# odd row counts of x and of W (the last panel padded), one and several blocks per row
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("n, rows, blocks", [(3, 37, 1), (67, 45, 3), (33, 96, 2)])
def test_quantized_gemm_equals_numpy_dequantize_then_matmul(qtype, n, rows, blocks):
    cols = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0] * blocks
    q, meant = _quantized(qtype, rows, cols, seed=n + rows)
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    want = x.astype(np.float64) @ meant.T.astype(np.float64)
    got = q.matmul(Tensor(x)).numpy()
    assert got.shape == (n, rows)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q6_K"])
def test_quantized_gemm_panels_hold_the_dequantized_rows(qtype):
    q, meant = _quantized(qtype, 37, 256)
    panels = q.panels().numpy()
    count, cols, width = panels.shape
    assert cols == 256 and count == -(-37 // width)
    flat = panels.transpose(0, 2, 1).reshape(count * width, cols)
    np.testing.assert_array_equal(flat[:37], meant)
    np.testing.assert_array_equal(flat[37:], 0)  # zero rows pad the last panel


@pytest.mark.parametrize("qtype, int8", [("Q8_0", False), ("Q8_0", True), ("Q4_K", False)])
def test_panels_are_written_in_transposed_tiles(qtype, int8):
    """The panels are W transposed: the dequantizing kernel reads and writes 8 x 8 tiles (its block scales step
    along the read rows by a division, which once kept it from the tile: 1.5 -> 1.0-1.1 ms at 2048 x 768; Q4_K's
    bytes step by one within runs of 32, k % 32 + k // 64 * 32: 1.7 -> 0.8 ms at 2048 x 768)."""
    qt = GGMLQuantizationType[qtype]
    rng = np.random.default_rng(0)
    raw, meant = _stored(rng.standard_normal((512, 768)).astype(np.float32) * 0.1, qt, rng)
    blocks = Tensor(raw.reshape(-1, GGML_QUANT_SIZES[qt][1])).realize()
    q = QuantizedMatrix.from_ggml(GGMLQuantized("w", int(qt), (512, 768), blocks), int8=int8)
    items, _, _ = create_schedule([q.panels().uop], [Device["CPU"]])
    if q.avx2:  # the AVX2 decode planes take the raw kernel, which transposes in registers
        assert isinstance(items[-1].ast.arg, RawKernel) and items[-1].ast.arg.entry.startswith(
            f"fg_{qtype.lower()}_panels"
        )
    else:
        info = lower_to_linear(items[-1].ast, Device["CPU"].renderer)
        assert [(o.op, o.amount) for o in info.opts if o.op is OptOps.UPCAST] == [(OptOps.UPCAST, 8)] * 2, info.opts
    panels = q.panels().numpy()
    np.testing.assert_array_equal(panels.transpose(0, 2, 1).reshape(512, 768), meant)


@pytest.mark.skipif(not u8s8_pair_dot("CPU"), reason="the CPU device's target has no AVX2")
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize("rows, cols, panel", [(16, 256, 16), (48, 768, 16), (64, 512, 32), (2048, 768, 16)])
@pytest.mark.parametrize("threads", [1, 2])
def test_avx2_panels_equal_gguf_dequantize(qtype, rows, cols, panel, threads):
    """The raw AVX2 kernel's panels (QuantizedMatrix.panels of the AVX2 decode planes) hold gguf's dequantized rows
    bit for bit (Q4_K's nibble times scale plus offset in one FMA: within an ulp), each panel written by one item of
    a launch split over the threads."""
    qt = GGMLQuantizationType[qtype]
    rng = np.random.default_rng(rows + cols)
    raw, meant = _stored(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, qt, rng)
    blocks = Tensor(raw.reshape(-1, GGML_QUANT_SIZES[qt][1])).realize()
    q = QuantizedMatrix.from_ggml(GGMLQuantized("w", int(qt), (rows, cols), blocks), int8=True)
    assert q.avx2 and panels_fit(int(qt), rows, cols, panel)
    with Context(NUM_CPU_THREADS=threads):
        panels = avx2_panels(int(qt), q.planes, q.shape, panel).numpy()
    assert panels.shape == (rows // panel, cols, panel)
    np.testing.assert_allclose(panels.transpose(0, 2, 1).reshape(rows, cols), meant, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"no panels of 16 for a weight of type \d+ and shape \(40, 256\)"):
        avx2_panels(int(qt), q.planes, (40, 256), 16)


def test_quantized_gemm_refuses_bad_shapes():
    q, _ = _quantized("Q8_0", 4, 64)
    with pytest.raises(ValueError, match=r"x of shape \(5, 32\) cannot multiply a weight of shape \(4, 64\)"):
        q.matmul(Tensor.zeros(5, 32))


@pytest.mark.parametrize(
    "n, want, sizes",
    [
        (1, [32], (128, 32)),
        (32, [32], (128, 32)),
        (33, [32, 32], (128, 32)),
        (128, [128], (128, 32)),
        (200, [128, 32, 32, 32], (128, 32)),
        (44, [32, 8, 8], (128, 32, 8)),
        (700, [512, 128, 32, 32], (512, 128, 32)),
    ],
)
def test_prefill_chunks_take_the_largest_size_the_tokens_fill(n, want, sizes):
    assert prefill_chunks(n, sizes) == want
    assert sum(want) - n < 32  # padding only in the last chunk, less than the smallest size


def test_prefill_chunks_refuse_bad_sizes():
    with pytest.raises(ValueError, match=r"positive, got \(0, 8\)"):
        prefill_chunks(5, (0, 8))


def test_forward_row_gives_that_rows_logits(tmp_path):
    """forward(ids, pos, row=r) (a prefill chunk's last token) equals row r of the whole chunk's logits."""
    pytest.importorskip("transformers", reason="the test extra installs transformers")
    from gguf_models import make_model, write_gguf

    from fusegrad.models.llama import Llama

    write_gguf(make_model("llama"), "llama", tmp_path / "m.gguf", "Q8_0")
    with Context(QUANT_DOT=0):  # one row's logits would otherwise multiply 8-bit activations, the chunk's floats
        model, _ = Llama.from_gguf(tmp_path / "m.gguf", progress=False)
    ids = np.arange(6) * 7 % 128
    whole = model.forward(ids, 0).numpy()
    for r in (5, 2):  # one capture serves every row
        np.testing.assert_allclose(model.forward(ids, 0, row=r).numpy(), whole[r : r + 1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="row 6 is outside the chunk of 6 tokens"):
        model.forward(ids, 0, row=6)


class ShiftLM:
    """A CausalLM written to the protocol without `row`: the logits of token t put their largest entry at t + 1,
    and each call records the chunk it was given."""

    max_context = 300

    def __init__(self):
        self.chunks: list[int] = []

    def forward(self, ids: np.ndarray, pos: int) -> Tensor:
        self.chunks.append(len(ids))
        return Tensor(np.eye(512, dtype=np.float32)[(ids + 1) % 512])


def test_prefill_takes_the_last_row_from_a_model_without_row():
    from fusegrad.models.generate import prefill

    model = ShiftLM()
    ids = list(range(1, 141))  # chunks of 128 and 8, then 4 tokens padded to 8: the last real row is 3, not 7
    last = prefill(model, ids)
    assert model.chunks == [128, 8, 8]
    assert int(np.argmax(last)) == ids[-1] + 1 and last.shape == (512,)
