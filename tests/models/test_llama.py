"""LLaMA-family models from GGUF against transformers on the same (dequantized) weights: tiny random llama, qwen2,
qwen3, qwen3moe and mixtral configs written to GGUF with the gguf package, float and quantized."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the test extra installs transformers")

from gguf_models import make_model, write_gguf  # noqa: E402

from fusegrad import Context, Device, GlobalCounters, Tensor  # noqa: E402
from fusegrad.models.generate import generate  # noqa: E402
from fusegrad.models.llama import MATVEC_MAX_ROWS, Llama, QuantLinear  # noqa: E402
from fusegrad.nn.quantized import GGMLQuantized, QuantizedMatrix  # noqa: E402
from fusegrad.nn.quantized_avx2 import avx2_kernels  # noqa: E402

CONTEXT = 64  # KV cache positions: past the 40-token prompt and the 6 + 20 of generation
WIDE = dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=256, head_dim=64)  # K-quant rows: 256 wide

CASES = {
    "llama-f32": ("llama", None, {}),
    "llama-linear-rope-q8_0": ("llama", "Q8_0", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama-llama3-rope": (
        "llama",
        None,
        dict(
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            )
        ),
    ),
    "llama-yarn-rope": (  # positions run past the 16 the model was trained at, to 4x that
        "llama",
        None,
        dict(
            max_position_embeddings=64,
            rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16),
        ),
    ),
    "qwen2-yarn-rope-betas-q8_0": (  # betas and base that put the ramp mid-way through the 8 frequencies
        "qwen2",
        "Q8_0",
        dict(
            max_position_embeddings=64,
            rope_theta=100.0,
            rope_scaling=dict(
                rope_type="yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=1.0, beta_slow=0.1
            ),
        ),
    ),
    "qwen2-bias-q4_0": ("qwen2", "Q4_0", {}),
    "qwen3-qknorm-q8_0": ("qwen3", "Q8_0", {}),
    "qwen3moe-f32": ("qwen3moe", None, {}),
    "mixtral-q4_0": ("mixtral", "Q4_0", {}),
    "llama-q4_k": ("llama", "Q4_K", {k: v for k, v in WIDE.items() if k in ("hidden_size", "intermediate_size")}),
    "qwen3moe-q6_k": ("qwen3moe", "Q6_K", WIDE),
}


# CI only, each covered in the fast run by its parts: llama-q4_k (Q4_K's decode and prefill kernels in test_quant_dot.py
# and test_quant_gemm.py, the model in llama-f32), qwen3moe-q6_k (the MoE in qwen3moe-f32, Q6_K's values in the
# quantized-matrix tests below), mixtral-q4_0 (the MoE again; Q4_0's values below), the linear and
# betas-yarn RoPE scalings (llama3 and yarn rope run fast) and qwen2-bias-q4_0 (qwen3's attention, Q4_0's values)
SLOW_CASES = {
    "qwen3-qknorm-q8_0",
    "llama-q4_k",
    "qwen3moe-q6_k",
    "mixtral-q4_0",
    "llama-linear-rope-q8_0",
    "qwen2-yarn-rope-betas-q8_0",
    "qwen2-bias-q4_0",
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in CASES])
def test_logits_and_greedy_tokens_match_transformers(tmp_path, case):
    kind, qtype, cfg = CASES[case]
    ref = make_model(kind, **cfg)
    write_gguf(ref, kind, tmp_path / "m.gguf", qtype)
    # one cache size for every case (the yarn ones are trained for 64): models of one shape share their kernels; the
    # weights exactly as float math (8-bit activations may flip a near tie of greedy tokens: test_quant_dot's bounds)
    with Context(QUANT_DOT=0):
        model, meta = Llama.from_gguf(tmp_path / "m.gguf", max_context=CONTEXT, progress=False)
    if qtype is not None:  # matmul weights stay quantized
        assert isinstance(model.blocks[0].attn.q.weight, QuantizedMatrix)
        assert model.blocks[0].attn.q.weight.type_name == qtype
    ids = np.random.default_rng(1).integers(0, ref.config.vocab_size, 40)  # over one 32-token prefill chunk
    with torch.no_grad():
        want = ref(torch.tensor(ids[None])).logits[0].numpy()
    tol = 1e-4 if qtype is None else 5e-4
    np.testing.assert_allclose(model.forward(ids, 0).numpy(), want, atol=tol * np.abs(want).max(), rtol=1e-4)
    model.reset()
    prompt = ids[:6]
    with torch.no_grad():
        greedy = ref.generate(torch.tensor(prompt[None]), max_new_tokens=20, do_sample=False)[0, 6:].tolist()
    assert list(generate(model, prompt.tolist(), 20)) == greedy


@pytest.mark.slow  # ~8 s: CI's slow part
def test_decode_replays_one_capture_for_every_position(tmp_path):
    """The position is a bound Variable: after the decode step is captured, later positions compile nothing and
    replay the same capture."""
    ref = make_model("qwen2")
    write_gguf(ref, "qwen2", tmp_path / "m.gguf", "Q8_0")
    model, _ = Llama.from_gguf(tmp_path / "m.gguf", max_context=CONTEXT, progress=False)
    tokens = generate(model, [3, 1, 4, 1, 5], 20)
    first = [next(tokens) for _ in range(4)]  # prefill, then decode steps run eagerly and captured
    decode_step = model._steps[(1, False)]
    captured, compiled = decode_step.captured, GlobalCounters.compile_count
    assert captured is not None
    assert len(first + list(tokens)) == 20
    assert GlobalCounters.compile_count == compiled
    assert decode_step.captured is captured and decode_step.cnt == 19


def _quantized_weight(qtype: str, rows: int, cols: int):
    """(GGMLQuantized weight, the float weight gguf.quants dequantizes it to) of random values."""
    from gguf import GGMLQuantizationType
    from gguf.quants import GGML_QUANT_SIZES, dequantize
    from gguf_models import _stored

    qt = GGMLQuantizationType[qtype]
    rng = np.random.default_rng(0)
    raw, meant = _stored(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, qt, rng)
    np.testing.assert_array_equal(meant, dequantize(raw, qt))
    return GGMLQuantized("w", int(qt), (rows, cols), Tensor(raw.reshape(-1, GGML_QUANT_SIZES[qt][1])).realize()), meant


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])
def test_quantized_matmul_is_one_kernel_over_the_blocks(qtype):
    """A decode-shaped matmul reads the quantized planes directly: one kernel, no dequantized weight in memory."""
    weight, meant = _quantized_weight(qtype, 64, 512)
    linear = QuantLinear(weight)  # the planes are made once, when the model loads
    linear.weight = QuantizedMatrix.from_ggml(weight, int8=False)  # the float path (test_quant_dot: the integer one)
    assert isinstance(linear.weight, QuantizedMatrix) and linear.weight.type_name == qtype
    x = np.random.default_rng(1).standard_normal((1, 512)).astype(np.float32)
    GlobalCounters.reset()
    y = linear(Tensor(x)).numpy()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(y, x @ meant.T, atol=1e-4 * np.abs(x @ meant.T).max())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_quantized_matrix_values_match_gguf_dequantize(qtype, n):
    """matvec (decode rows) and the dequantize-then-matmul path (prefill chunks) equal gguf.quants' dequantization."""
    weight, meant = _quantized_weight(qtype, 48, 768)
    q = QuantizedMatrix.from_ggml(weight, int8=False)
    np.testing.assert_array_equal(q.dequantize().numpy(), meant)
    x = np.random.default_rng(2).standard_normal((n, 768)).astype(np.float32)
    want = x.astype(np.float64) @ meant.T.astype(np.float64)
    np.testing.assert_allclose(q.matvec(Tensor(x)).numpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())
    linear = QuantLinear(weight)
    # a target with 8-bit dot products quantizes x per block of 32 (test_quant_dot bounds that error)
    tol = 1e-2 if linear.integer_dot and n <= MATVEC_MAX_ROWS else 1e-5
    np.testing.assert_allclose(linear(Tensor(x)).numpy(), want, rtol=0, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("kernels", [1, 0])
@pytest.mark.parametrize("rows_few", [False, True])
@pytest.mark.parametrize("n", [1, 3, 40])
def test_a_float_linear_in_either_layout_equals_numpy(rows_few, n, kernels):
    """A float W kept as stored, (out, in), where the AVX2 decode kernel reads it or for a layer of a few rows (the
    output projection), else (in, out) for chunks: x @ W.T + b either way."""
    rng = np.random.default_rng(n)
    w, b = rng.standard_normal((96, 160)).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    with Context(AVX2_MATVEC=kernels):  # 0: the generated kernels, as on a target without the AVX2 ones
        linear = QuantLinear(Tensor(w), Tensor(b), rows_few=rows_few)
        stored = rows_few or avx2_kernels(Device.DEFAULT)
        assert linear.transposed != stored and linear.weight.shape == ((96, 160) if stored else (160, 96))
        assert linear.out_features == 96
        x = rng.standard_normal((n, 160)).astype(np.float32)
        got = linear(Tensor(x)).numpy()
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("qtype,cols", [("Q8_0", 1600), ("Q8_0", 2048), ("Q4_0", 1600), ("Q4_K", 2048)])
def test_quantized_matvec_folds_groups_of_any_count(qtype, cols):
    """Groups fold into the inner loop by the largest divisor of their count that fits MAX_PARTS (50 groups of 32: 25,
    64: 32): the sum equals the dequantized weight's whatever the fold."""
    weight, meant = _quantized_weight(qtype, 24, cols)
    x = np.random.default_rng(3).standard_normal((1, cols)).astype(np.float32)
    want = x.astype(np.float64) @ meant.T.astype(np.float64)
    got = QuantizedMatrix.from_ggml(weight, int8=False).matvec(Tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_quantized_matrix_refuses_bad_shapes():
    weight, _ = _quantized_weight("Q8_0", 4, 64)
    q = QuantizedMatrix.from_ggml(weight)
    with pytest.raises(ValueError, match=r"x of shape \(1, 32\) cannot multiply a weight of shape \(4, 64\)"):
        q.matvec(Tensor.zeros(1, 32))
    flat = GGMLQuantized("v", weight.ggml_type, (256,), weight.blocks)
    with pytest.raises(ValueError, match="is 2-D"):
        QuantizedMatrix.from_ggml(flat)
    with pytest.raises(ValueError, match="not a supported quantized type"):
        GGMLQuantized("f", 0, (4, 64), weight.blocks)


def test_unsupported_architecture_and_bad_ids_raise(tmp_path):
    ref = make_model("llama", num_hidden_layers=1)
    write_gguf(ref, "llama", tmp_path / "m.gguf")
    model, _ = Llama.from_gguf(tmp_path / "m.gguf", progress=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.forward(np.array([0, 128]), 0)
    with pytest.raises(ValueError, match="context of 128"):
        model.forward(np.zeros(4, np.int32), 126)
    from fusegrad.models.llama import LlamaConfig

    with pytest.raises(ValueError, match="not supported"):
        LlamaConfig.from_gguf({"general.architecture": "mamba"}, 10)


@pytest.mark.parametrize(
    "rope", [dict(factor=4.0), dict(factor=8.0, beta_fast=1.0, beta_slow=0.1), dict(factor=2.0, beta_fast=0.5)]
)
def test_yarn_rope_tables_equal_transformers(rope):
    """cos and sin of every position (YaRN's blended frequencies times its magnitude scale) against transformers'
    rotary embedding of the same config, read back from the GGUF keys llama.cpp writes."""
    from fusegrad.models.llama import LlamaConfig, rope_tables

    scaling = dict(rope_type="yarn", original_max_position_embeddings=16, **rope)
    ref = make_model("llama", num_hidden_layers=1, rope_theta=100.0, max_position_embeddings=64, rope_scaling=scaling)
    kv = {"general.architecture": "llama", "llama.rope.freq_base": 100.0, "llama.rope.scaling.type": "yarn"}
    kv.update({f"llama.{k}": v for k, v in dict(block_count=1, context_length=64, embedding_length=64).items()})
    kv.update({"llama.attention.head_count": 4, "llama.attention.layer_norm_rms_epsilon": 1e-5})
    kv.update({"llama.feed_forward_length": 96, "llama.rope.scaling.original_context_length": 16})
    kv.update({f"llama.rope.scaling.{k if k == 'factor' else 'yarn_' + k}": v for k, v in rope.items()})
    cos, sin = rope_tables(LlamaConfig.from_gguf(kv, 128), None)
    with torch.no_grad():
        want_cos, want_sin = ref.model.rotary_emb(torch.zeros(1, 64, 64), torch.arange(64)[None])
    np.testing.assert_allclose(cos, want_cos[0, :, :8].numpy(), atol=2e-6)  # transformers repeats the 8 halves
    np.testing.assert_allclose(sin, want_sin[0, :, :8].numpy(), atol=2e-6)


def test_yarn_variants_outside_these_models_raise():
    from fusegrad.models.llama import LlamaConfig

    kv = {"general.architecture": "llama", "llama.rope.scaling.type": "yarn"}
    with pytest.raises(NotImplementedError, match="yarn_log_multiplier"):
        LlamaConfig.from_gguf({**kv, "llama.rope.scaling.yarn_log_multiplier": 0.1}, 10)
    with pytest.raises(NotImplementedError, match="'longrope' is not supported"):
        LlamaConfig.from_gguf({**kv, "llama.rope.scaling.type": "longrope"}, 10)


@pytest.mark.slow
def test_a_chunk_stores_its_residual_stream_once_a_layer(tmp_path):
    """Left lazy, each layer's norms would add up every earlier layer's outputs again: a kernel of the last layer
    read all of them. Stored once a layer, no kernel reads more buffers in a 3-layer model than in a 1-layer one; the
    logits equal transformers'."""
    widest = []
    for layers in (1, 3):
        ref = make_model("llama", num_hidden_layers=layers)
        write_gguf(ref, "llama", tmp_path / f"m{layers}.gguf", None)
        model, _ = Llama.from_gguf(tmp_path / f"m{layers}.gguf", progress=False)
        ids = np.arange(MATVEC_MAX_ROWS + 8) * 7 % 128
        for _ in range(3):  # the third call replays the capture
            model.reset()
            got = model.forward(ids, 0).numpy()
        captured = model._steps[(len(ids), False)].captured
        widest.append(max(len(launch.buffers) for launch in captured.launches))
        with torch.no_grad():
            want = ref(torch.tensor([ids.tolist()])).logits[0].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert widest[1] == widest[0], widest


@pytest.mark.parametrize("tied", [False, True])
def test_f32_decode_logits_match_transformers(tmp_path, tied):
    """Each decode step's logits (one token at a time: the f32 dot-product kernels on an AVX2 target, the output
    projection through the tied embedding's rows where the file has no output.weight) equal transformers' for the
    whole sequence."""
    ref = make_model("llama", tie_word_embeddings=tied, hidden_size=72, intermediate_size=100)
    write_gguf(ref, "llama", tmp_path / "m.gguf", None)
    model, _ = Llama.from_gguf(tmp_path / "m.gguf", max_context=CONTEXT, progress=False)
    assert model.output.weight.shape == (128, 72)  # (out, in): the vocabulary's rows
    assert model.output.rows_kernel == model.blocks[0].ffn.gate.rows_kernel == avx2_kernels(Device.DEFAULT)
    if tied:
        np.testing.assert_array_equal(model.output.weight.numpy(), model.token_embd.numpy())
    ids = np.random.default_rng(2).integers(0, ref.config.vocab_size, 12)
    with torch.no_grad():
        want = ref(torch.tensor(ids[None])).logits[0].numpy()
    got = [model.forward(ids[:4], 0).numpy()[-1]] + [model.forward(ids[i : i + 1], i).numpy()[0] for i in range(4, 12)]
    np.testing.assert_allclose(np.stack(got), want[3:], atol=1e-4 * np.abs(want).max(), rtol=1e-4)


@pytest.mark.slow  # ~12 s: CI's slow part (the blocks against numpy: test_generate_attention.py)
@pytest.mark.parametrize("qtype", [None, "Q8_0"])
def test_a_long_chunk_in_causal_query_blocks_matches_transformers(tmp_path, qtype):
    """Chunks past QUERY_BLOCK queries attend block by block (generate.attention, causal): a 384-token chunk at
    position 0 and a 256-token one after it (3 and 2 blocks over a growing cache) give transformers' logits."""
    ref = make_model("llama", max_position_embeddings=640)
    write_gguf(ref, "llama", tmp_path / "m.gguf", qtype)
    model, _ = Llama.from_gguf(tmp_path / "m.gguf", max_context=640, progress=False)
    ids = np.random.default_rng(2).integers(0, ref.config.vocab_size, 640)
    with torch.no_grad():
        want = ref(torch.tensor(ids[None])).logits[0].numpy()
    got = np.concatenate([model.forward(ids[:384], 0).numpy(), model.forward(ids[384:], 384).numpy()])
    tol = 1e-4 if qtype is None else 5e-4
    np.testing.assert_allclose(got, want, atol=tol * np.abs(want).max(), rtol=1e-4)
