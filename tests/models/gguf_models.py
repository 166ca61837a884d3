"""Tiny random LLaMA-family models made with transformers and written to GGUF with the gguf package, the way
llama.cpp's converter lays them out; the transformers model is given back the (dequantized) weights the file holds."""

from __future__ import annotations

import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import GGML_QUANT_SIZES, dequantize, quantize

# kind -> (transformers' config and model class names, GGUF architecture); the classes are looked up when a model is
# made: importing them all costs every test worker seconds at collection
KINDS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "qwen3"),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen3moe"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "llama"),
}


def make_model(kind: str, seed: int = 0, std: float = 0.25, **cfg) -> torch.nn.Module:
    config_cls, model_cls = (getattr(transformers, name) for name in KINDS[kind][:2])
    base = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    if kind == "qwen3moe":
        base.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, head_dim=16)
    if kind == "qwen3":
        base.update(head_dim=16)
    if kind == "mixtral":
        base.update(num_local_experts=4, num_experts_per_tok=2)
    base.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    base.update(cfg)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**base)).eval()
    with torch.no_grad():  # larger than the default init, so greedy decoding does not settle on one token
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0, std)
    return model


def _permute_rows(n_rows: int, heads: int) -> np.ndarray:
    """Row order of llama.cpp's q/k layout (rope on adjacent pairs) from transformers' (rope on halves):
    file row i holds transformers row perm[i]."""
    return np.arange(n_rows).reshape(heads, 2, n_rows // heads // 2).swapaxes(1, 2).reshape(-1)


def _random_k_blocks(rows: int, cols: int, qtype: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """Valid random blocks of a K-quant type (gguf.quants cannot quantize to those): random quants and scales, and
    small float16 super-block scales; Q4_K's minimums equal its scales times 7.5 so values centre on 0."""
    block, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * cols // block, nbytes), dtype=np.uint8)
    if qtype == GGMLQuantizationType.Q4_K:
        d = rng.uniform(0.0005, 0.002, (len(raw), 1))
        raw[:, 0:4] = np.concatenate([d, d * 7.5], axis=1).astype(np.float16).view(np.uint8)
        raw[:, 8:12] = raw[:, 4:8]  # sub-blocks 0-3: the 6-bit mins equal the scales
        raw[:, 12:16] = (raw[:, 12:16] & 0xF) * 0x11  # sub-blocks 4-7: high nibble (min) = low nibble (scale)
    elif qtype == GGMLQuantizationType.Q6_K:
        raw[:, 208:210] = rng.uniform(0.00005, 0.0002, (len(raw), 1)).astype(np.float16).view(np.uint8)
    else:
        raise ValueError(f"no random block maker for {qtype.name}")
    return raw.reshape(rows, -1)


def _stored(
    w: np.ndarray, qtype: GGMLQuantizationType | None, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(what the file stores, the float weight it means) for a 2-D weight of rows of values."""
    if qtype is None or w.shape[-1] % GGML_QUANT_SIZES[qtype][0]:
        return w, w
    if qtype in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K):
        raw = _random_k_blocks(w.shape[0], w.shape[1], qtype, rng)
    else:
        raw = quantize(w, qtype)
    return raw, dequantize(raw, qtype).reshape(w.shape).astype(np.float32)


def write_gguf(
    model: torch.nn.Module, kind: str, path, qtype: str | None = None, seed: int = 0, rope_freqs=None, tokenizer=None
) -> None:
    """Write the model to GGUF (matmul weights in qtype when their rows fill whole blocks) and load the file's
    dequantized weights back into the model, so both hold the same numbers."""
    cfg = model.config
    arch = KINDS[kind][2]
    qt = None if qtype is None else GGMLQuantizationType[qtype]
    rng = np.random.default_rng(seed)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer = GGUFWriter(str(path), arch)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = getattr(cfg, "rope_parameters", None) or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    if rope.get("rope_type") == "llama3":  # llama.cpp stores llama3 scaling as per-frequency divisors, rope_freqs
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        scaled = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")[0].numpy()
        base = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        rope_freqs = (base / scaled).astype(np.float32)
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    if rope.get("rope_type") == "yarn":  # as llama.cpp's converter writes it; the betas only when not the defaults
        writer.add_rope_scaling_type(__import__("gguf").RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        if "beta_fast" in rope:
            writer.add_rope_scaling_yarn_beta_fast(float(rope["beta_fast"]))
        if "beta_slow" in rope:
            writer.add_rope_scaling_yarn_beta_slow(float(rope["beta_slow"]))
    writer.add_vocab_size(cfg.vocab_size)
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        writer.add_expert_weights_norm(bool(getattr(cfg, "norm_topk_prob", True)))
    if kind == "qwen3moe":
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    else:
        writer.add_feed_forward_length(cfg.intermediate_size)
    for key, value in (tokenizer or {}).items():  # GGUFWriter method name -> value, e.g. add_token_list
        getattr(writer, key)(value)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))

    new_sd: dict[str, np.ndarray] = {}

    def put(gguf_name: str, hf_name: str, w: np.ndarray, perm_heads: int | None = None, quantized: bool = True):
        perm = _permute_rows(w.shape[0], perm_heads) if perm_heads and arch == "llama" else np.arange(w.shape[0])
        if w.ndim == 1:
            writer.add_tensor(gguf_name, w[perm].astype(np.float32))
            new_sd[hf_name] = w
            return
        raw, meant = _stored(w[perm], qt if quantized else None, rng)
        writer.add_tensor(gguf_name, raw, raw_dtype=qt if raw.dtype == np.uint8 else None)
        restored = np.empty_like(meant)
        restored[perm] = meant
        new_sd[hf_name] = restored

    put("token_embd.weight", "model.embed_tokens.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", "model.norm.weight", sd["model.norm.weight"])
    if "lm_head.weight" in sd and not cfg.tie_word_embeddings:
        put("output.weight", "lm_head.weight", sd["lm_head.weight"])
    elif "lm_head.weight" in sd:  # tied: the file has no output.weight, the reader multiplies by token_embd
        new_sd["lm_head.weight"] = new_sd["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        put(gg + "attn_norm.weight", hf + "input_layernorm.weight", sd[hf + "input_layernorm.weight"])
        put(gg + "ffn_norm.weight", hf + "post_attention_layernorm.weight", sd[hf + "post_attention_layernorm.weight"])
        heads = {"q": cfg.num_attention_heads, "k": cfg.num_key_value_heads, "v": None, "o": None}
        for n, h in heads.items():
            name = "attn_output" if n == "o" else f"attn_{n}"
            put(f"{gg}{name}.weight", f"{hf}self_attn.{n}_proj.weight", sd[f"{hf}self_attn.{n}_proj.weight"], h)
            if f"{hf}self_attn.{n}_proj.bias" in sd:
                put(f"{gg}{name}.bias", f"{hf}self_attn.{n}_proj.bias", sd[f"{hf}self_attn.{n}_proj.bias"], h)
        for n in "qk":
            if f"{hf}self_attn.{n}_norm.weight" in sd:
                put(f"{gg}attn_{n}_norm.weight", f"{hf}self_attn.{n}_norm.weight", sd[f"{hf}self_attn.{n}_norm.weight"])
        if experts:
            put(gg + "ffn_gate_inp.weight", hf + "mlp.gate.weight", sd[hf + "mlp.gate.weight"], quantized=False)
            gate_up, down = sd[hf + "mlp.experts.gate_up_proj"], sd[hf + "mlp.experts.down_proj"]
            ff = gate_up.shape[1] // 2
            stacks = {"gate": gate_up[:, :ff], "up": gate_up[:, ff:], "down": down}
            restored = {}
            for n, w in stacks.items():
                raws, means = zip(*(_stored(w[e], qt, rng) for e in range(experts)))
                raw = np.stack(raws)
                writer.add_tensor(f"{gg}ffn_{n}_exps.weight", raw, raw_dtype=qt if raw.dtype == np.uint8 else None)
                restored[n] = np.stack(means)
            new_sd[hf + "mlp.experts.gate_up_proj"] = np.concatenate([restored["gate"], restored["up"]], axis=1)
            new_sd[hf + "mlp.experts.down_proj"] = restored["down"]
        else:
            for n in ("gate", "up", "down"):
                put(f"{gg}ffn_{n}.weight", f"{hf}mlp.{n}_proj.weight", sd[f"{hf}mlp.{n}_proj.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    missing = set(sd) - set(new_sd)
    assert not missing, f"weights not written: {missing}"
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in new_sd.items()}, strict=False)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def bpe_tokenizer(vocab_size: int = 320) -> dict:
    """GGUF tokenizer metadata (GGUFWriter method -> value) of a byte-level BPE trained on a small corpus, with the
    ChatML markers as control tokens and a ChatML chat template."""
    import json

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    from fusegrad.models.gguf_tokenizer import PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS["qwen2"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    corpus = ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?"] * 10
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=specials
    )
    tok.train_from_iterator(corpus, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    tokens += [f"<unused{i}>" for i in range(vocab_size - len(tokens))]  # the corpus is too small to fill the vocab
    return {
        "add_tokenizer_model": "gpt2",
        "add_tokenizer_pre": "qwen2",
        "add_token_list": tokens,
        "add_token_types": [3 if t in specials else 5 if t.startswith("<unused") else 1 for t in tokens],
        "add_token_merges": [" ".join(m) for m in model["merges"]],
        "add_eos_token_id": 2,
        "add_bos_token_id": 0,
        "add_add_bos_token": False,
        "add_chat_template": CHATML,
    }
