"""LLaMA-family decoders from GGUF files (llama.cpp's format): llama, qwen2 (q/k/v biases), qwen3 (q/k RMSNorm) and
their mixture-of-experts variants (llama with experts, qwen3moe). The architecture comes from the file's metadata.

Quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) stay quantized in memory, rearranged into planes a kernel reads
contiguously (nn/quantized.py); a decode step's matmul dequantizes inside its one kernel (see QuantLinear)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fusegrad import Device, Tensor, TinyJit, dtypes, function
from fusegrad.helpers import _Progress
from fusegrad.models.generate import KVCache, attention, causal_mask, start_position
from fusegrad.nn.decode_attention import decode_attention, decode_attention_serves, decode_slot
from fusegrad.nn.quantized import GGMLQuantized, QuantizedMatrix, quantize_blocks
from fusegrad.nn.quantized_avx2 import avx2_kernels, avx2_matvecs, f32_matvec, f32_matvecs
from fusegrad.nn.state import gguf_load
from fusegrad.uop.ops import UOp

# rope "norm" rotates adjacent pairs (x[2i], x[2i+1]); "neox" rotates the halves (x[i], x[i + d/2])
_ROPE_NEOX = {"llama": False, "qwen2": True, "qwen3": True, "qwen3moe": True, "qwen2moe": True}


@dataclass(frozen=True)
class LlamaConfig:
    arch: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ff_dim: int
    vocab_size: int
    norm_eps: float
    context_length: int
    rope_theta: float
    rope_dim: int
    rope_neox: bool
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_original_context: int = 0  # yarn: the context the model was trained at
    yarn_beta_fast: float = 32.0  # yarn: rotations over the original context above which a frequency extrapolates
    yarn_beta_slow: float = 1.0  # ... and below which it interpolates (divided by the factor)
    yarn_ext_factor: float = 1.0  # yarn: weight of the extrapolated frequency in the blend (llama.cpp's ext_factor)
    yarn_attn_factor: float = 1.0  # yarn: multiplies the attention magnitude scale 0.1 * ln(factor) + 1
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ff_dim: int = 0
    expert_weights_norm: bool = True

    @staticmethod
    def from_gguf(kv: dict[str, Any], vocab_size: int) -> LlamaConfig:
        arch = kv.get("general.architecture")
        if arch not in _ROPE_NEOX:
            raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {sorted(_ROPE_NEOX)}")

        def get(key: str, default: Any = None) -> Any:
            if f"{arch}.{key}" not in kv and default is None:
                raise ValueError(f"GGUF metadata lacks {arch}.{key}, which a {arch} model needs")
            return kv.get(f"{arch}.{key}", default)

        scaling = get("rope.scaling.type", "none")
        if scaling not in ("none", "linear", "yarn"):
            raise NotImplementedError(
                f"rope scaling {scaling!r} is not supported; supported: none, linear, yarn, llama3"
            )
        if get("rope.scaling.yarn_log_multiplier", 0.0):  # DeepSeek's attention-scale variant, not in these archs
            raise NotImplementedError(f"{arch}.rope.scaling.yarn_log_multiplier is not supported")
        ext_factor = get("rope.scaling.yarn_ext_factor", -1.0)  # llama.cpp writes a negative value for "default"
        dim, heads = get("embedding_length"), get("attention.head_count")
        head_dim = get("attention.key_length", dim // heads)
        n_experts = get("expert_count", 0)
        return LlamaConfig(
            arch=arch,
            dim=dim,
            n_layers=get("block_count"),
            n_heads=heads,
            n_kv_heads=get("attention.head_count_kv", heads),
            head_dim=head_dim,
            ff_dim=get("feed_forward_length", 0 if n_experts else None),
            vocab_size=get("vocab_size", vocab_size),
            norm_eps=get("attention.layer_norm_rms_epsilon"),
            context_length=get("context_length"),
            rope_theta=get("rope.freq_base", 10000.0),
            rope_dim=get("rope.dimension_count", head_dim),
            rope_neox=_ROPE_NEOX[arch],
            rope_scaling=scaling,
            rope_factor=get("rope.scaling.factor", 1.0),
            rope_original_context=get("rope.scaling.original_context_length", 0),
            yarn_beta_fast=get("rope.scaling.yarn_beta_fast", 32.0),
            yarn_beta_slow=get("rope.scaling.yarn_beta_slow", 1.0),
            yarn_ext_factor=1.0 if ext_factor < 0 else ext_factor,
            yarn_attn_factor=get("rope.scaling.yarn_attn_factor", 1.0),
            n_experts=n_experts,
            n_experts_used=get("expert_used_count", 0),
            expert_ff_dim=get("expert_feed_forward_length", get("feed_forward_length", 0)),
            expert_weights_norm=bool(get("expert_weights_norm", True)),
        )


Weight = Tensor | GGMLQuantized
# rows of x up to which a quantized matmul reads the quantized weight per row (each row dequantizes it again): a
# 2048x768 Q8_0 weight, one thread, crossed over to the float panels at ~12 rows (float matvec) and ~18 (integer), and
# dequantizing every weight into panels made a 4-token prompt cost 130 ms on the 110M model
MATVEC_MAX_ROWS = 8


class QuantLinear:
    """y = x @ W.T (+ b). A quantized W (out, in) becomes a QuantizedMatrix: a few rows of x (a decode step) read
    it in one kernel (matvec); a longer chunk (a prefill) dequantizes it into float panels once for all its rows and
    runs the panel matmul (matmul). A float W stays (out, in), as the file stores it, where the AVX2 target's decode
    kernel reads it (f32_matvecs: each output a dot product down one contiguous row), and for `rows_few` (a layer
    that multiplies a row or a few, as the output projection does for the last token's logits); a chunk's x @ W.T
    then reads it through the scheduler's panel copy, which transposes it in tiles (schedule/panels.py). Elsewhere
    it is kept transposed, (in, out), which the generated kernels run faster for a chunk."""

    def __init__(self, weight: Weight, bias: Tensor | None = None, rows_few: bool = False):
        self.bias = bias
        self.weight: Tensor | QuantizedMatrix
        # a decode row's float matvec streams the weight's (out, in) rows in the AVX2 target's C kernel
        self.rows_kernel = isinstance(weight, Tensor) and avx2_kernels(weight.device)
        self.transposed = isinstance(weight, Tensor) and not (rows_few or self.rows_kernel)
        if isinstance(weight, GGMLQuantized):
            self.weight = QuantizedMatrix.from_ggml(weight)
        else:
            w = weight.cast(dtypes.float32)
            self.weight = (w.T if self.transposed else w).contiguous().realize()

    @property
    def out_features(self) -> int:
        return self.weight.shape[1] if self.transposed else self.weight.shape[0]

    @property
    def integer_dot(self) -> bool:
        """Whether a decode row multiplies the weight in integer dot products (a sum of per-block sums)."""
        return isinstance(self.weight, QuantizedMatrix) and self.weight.integer

    @property
    def shares_blocks(self) -> bool:
        """Whether a decode row's matvec takes x quantized once for every linear reading it (`shared_blocks`)."""
        return isinstance(self.weight, QuantizedMatrix) and self.weight.shares_blocks

    @property
    def quantizes_x(self) -> bool:
        """Whether a decode row's matvec is one hand-written kernel (nn/quantized_avx2.py) that reads x as its input
        buffer (the quantized ones quantize it themselves)."""
        return self.rows_kernel or (isinstance(self.weight, QuantizedMatrix) and self.weight.avx2)

    def __call__(self, x: Tensor, blocks: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
        """blocks: x quantized by `shared_blocks` for the linears that read the same x."""
        w = self.weight
        if isinstance(w, QuantizedMatrix):
            y = w.matvec(x, blocks) if x.shape[0] <= MATVEC_MAX_ROWS else w.matmul(x)
        elif self.rows_kernel and x.shape[0] <= MATVEC_MAX_ROWS:
            y = f32_matvec(x, w)
        else:
            y = x @ (w if self.transposed else w.T)
        return y if self.bias is None else y + self.bias.cast(dtypes.float32)


def fused_matvec(
    x: Tensor,
    *linears: QuantLinear,
    swiglu: bool = False,
    norm: tuple[Tensor, float] | None = None,
    residual: Tensor | None = None,
) -> Tensor | None:
    """A decode row's matvecs of the linears reading x (bias aside) in one hand-written kernel that reads x once,
    or None where they have no such kernel in common: (rows, each linear's outputs after the previous one's), or
    with swiglu (gate, up) silu(gate(x)) * up(x); norm (weight, eps): of rms_norm(x) instead; residual: plus it.
    One launch instead of one per linear (each split over threads wakes the workers and quantizes x again in every
    chunk), and none for the norm and the residual add."""
    if x.shape[0] > MATVEC_MAX_ROWS:
        return None
    ws = [lin.weight for lin in linears]
    if all(lin.rows_kernel for lin in linears):
        return f32_matvecs(x, [w for w in ws if isinstance(w, Tensor)], swiglu, norm, residual)
    quantized = [w for w in ws if isinstance(w, QuantizedMatrix) and w.avx2]
    if len(quantized) == len(ws) and len({w.ggml_type for w in quantized}) == 1:
        return avx2_matvecs(quantized[0].ggml_type, [w.planes for w in quantized], x, swiglu, norm, residual)
    return None


def shared_blocks(x: Tensor, *linears: QuantLinear) -> tuple[Tensor, Tensor, Tensor] | None:
    """x quantized to 8-bit blocks once for the linears reading it, when each multiplies a decode row in integer dot
    products (each would otherwise quantize it again: its own kernels). Realized here: a KV-cache write realizes k
    and v before q is read, and a CONTIGUOUS realized on the way is not kept (a blocked attention's per-block
    intermediates would then all stay alive), so q's matvec would quantize x again."""
    if x.shape[0] > MATVEC_MAX_ROWS or not all(lin.shares_blocks for lin in linears):
        return None
    blocks = quantize_blocks(x, linears[0].weight.activations)  # type: ignore[union-attr]  (integer_dot: quantized)
    Tensor.realize(*blocks)
    return blocks


def decode_input(x: Tensor, *linears: QuantLinear) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor] | None]:
    """(x, its shared 8-bit blocks or None) for the linears reading x: where each matvec quantizes x itself, x is
    realized here once (as for shared_blocks, a KV-cache write would otherwise have q's matvec compute x again)."""
    if (blocks := shared_blocks(x, *linears)) is not None:
        return x, blocks
    if x.shape[0] <= MATVEC_MAX_ROWS and all(lin.quantizes_x for lin in linears):
        return x.contiguous().realize(), None
    return x, None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * weight.cast(dtypes.float32)


def rope_tables(cfg: LlamaConfig, freq_factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (context, rope_dim/2) in float32, computed like the reference implementations do."""
    inv_freq = (
        1.0 / (cfg.rope_theta ** (np.arange(0, cfg.rope_dim, 2, dtype=np.int64).astype(np.float32) / cfg.rope_dim))
    ).astype(np.float32)
    if freq_factors is not None:  # llama3-style scaling: per-frequency divisors stored in the file (rope_freqs)
        inv_freq = (inv_freq / freq_factors.astype(np.float32)).astype(np.float32)
    positions = np.arange(cfg.context_length, dtype=np.float32)
    if cfg.rope_scaling == "linear":
        positions = positions / np.float32(cfg.rope_factor)
    magnitude = np.float32(1.0)
    if cfg.rope_scaling == "yarn":
        inv_freq, magnitude = yarn_frequencies(cfg, inv_freq)
    angles = np.outer(positions, inv_freq).astype(np.float32)
    return (np.cos(angles) * magnitude).astype(np.float32), (np.sin(angles) * magnitude).astype(np.float32)


def yarn_frequencies(cfg: LlamaConfig, inv_freq: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """YaRN ("YaRN: Efficient Context Window Extension of Large Language Models"): frequencies that turn fewer than
    beta_slow times over the original context are divided by the factor (interpolated), those that turn more than
    beta_fast times are kept (extrapolated), with a linear ramp over the pair indices between; and cos/sin are scaled
    by 0.1 * ln(factor) + 1, which sharpens the attention the longer context would flatten."""
    factor, original = cfg.rope_factor, cfg.rope_original_context or cfg.context_length
    if factor <= 0:
        raise ValueError(f"yarn rope scaling needs a positive factor, got {factor}")

    def pair_index(rotations: float) -> float:  # the pair whose frequency turns `rotations` times over `original`
        return cfg.rope_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

    low = max(math.floor(pair_index(cfg.yarn_beta_fast)), 0)
    high = min(math.ceil(pair_index(cfg.yarn_beta_slow)), cfg.rope_dim - 1)
    ramp = np.clip((np.arange(len(inv_freq), dtype=np.float32) - low) / max(high - low, 0.001), 0, 1)
    keep = (1 - ramp) * np.float32(cfg.yarn_ext_factor)  # the extrapolated frequency's weight
    blended = inv_freq / np.float32(factor) * (1 - keep) + inv_freq * keep
    magnitude = cfg.yarn_attn_factor * (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return blended.astype(np.float32), np.float32(magnitude)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, rope_dim: int, neox: bool) -> Tensor:
    """x (1, heads, chunk, head_dim) rotated by angles cos/sin (chunk, rope_dim/2); dims past rope_dim pass through."""
    rot, rest = (x, None) if rope_dim == x.shape[-1] else (x[..., :rope_dim], x[..., rope_dim:])
    half = rope_dim // 2
    if neox:
        a, b = rot[..., :half], rot[..., half:]
        out = (a * cos - b * sin).cat(b * cos + a * sin, dim=-1)
    else:
        pairs = rot.reshape(*rot.shape[:-1], half, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        out = (a * cos - b * sin).unsqueeze(-1).cat((b * cos + a * sin).unsqueeze(-1), dim=-1).reshape(rot.shape)
    return out if rest is None else out.cat(rest, dim=-1)


@dataclass(frozen=True)
class Positions:
    """Where a step's tokens sit, as every layer reads it: the first position (a bound Variable), the causal mask
    (None for one token), the rope angles (chunk, rope_dim/2), and a decode row's position as the tensor the
    hand-written decode attention reads (decode_slot; None for a chunk)."""

    start: UOp
    mask: Tensor | None
    cos: Tensor
    sin: Tensor
    slot: Tensor | None


class Attention:
    def __init__(self, cfg: LlamaConfig, w: dict[str, Any]):
        self.cfg = cfg
        self.q, self.k, self.v = (QuantLinear(w[f"attn_{n}.weight"], w.get(f"attn_{n}.bias")) for n in "qkv")
        self.o = QuantLinear(w["attn_output.weight"], w.get("attn_output.bias"))
        self.q_norm, self.k_norm = w.get("attn_q_norm.weight"), w.get("attn_k_norm.weight")

    def __call__(self, x: Tensor, cache: KVCache, at: Positions) -> Tensor:
        return self.o(self._attend(*self.projections(x), cache, at))

    def with_residual(self, x: Tensor, norm: Tensor, cache: KVCache, at: Positions) -> Tensor:
        """x + self(rms_norm(x, norm)), a decode row's norm inside the q/k/v kernel and its residual add inside o's
        where the kernels take them (fused_matvec)."""
        eps = self.cfg.norm_eps
        if (qkv := self._fused_projections(x, (norm, eps))) is None:
            return x + self(rms_norm(x, norm, eps), cache, at)
        out = self._attend(*qkv, cache, at)
        if (y := fused_matvec(out, self.o, residual=x)) is None:
            return x + self.o(out)
        return y if self.o.bias is None else y + self.o.bias.cast(dtypes.float32)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache, at: Positions) -> Tensor:
        """The attention's output (chunk, heads * head_dim) for the projections q, k, v (chunk, outputs)."""
        cfg, t = self.cfg, q.shape[0]
        q = q.reshape(t, cfg.n_heads, cfg.head_dim)
        k, v = k.reshape(t, cfg.n_kv_heads, cfg.head_dim), v.reshape(t, cfg.n_kv_heads, cfg.head_dim)
        if self.q_norm is not None:
            q = rms_norm(q, self.q_norm, cfg.norm_eps)
        if self.k_norm is not None:
            k = rms_norm(k, self.k_norm, cfg.norm_eps)
        q, k, v = (y.transpose(0, 1).unsqueeze(0) for y in (q, k, v))
        q = apply_rope(q, at.cos, at.sin, cfg.rope_dim, cfg.rope_neox)
        k = apply_rope(k, at.cos, at.sin, cfg.rope_dim, cfg.rope_neox)
        keys, values = cache.write(k, v, at.start)
        # a decode row: one hand-written kernel over the cache where the target has it (nn/decode_attention.py)
        if at.slot is not None and (one := decode_attention(q, cache.k, cache.v, at.slot)) is not None:
            return one
        out = attention(q, keys, values, at.mask, causal=True)
        out = out[0].transpose(0, 1).reshape(t, cfg.n_heads * cfg.head_dim)
        # a chunk's heads stored side by side per row: read through the view, the o projection's row tile walked one
        # head's block after another 64 KB apart, all in the same L1 sets (256x768 @ 768x768 4.5 -> 3.1 ms + copy)
        return out.contiguous() if t > 1 else out

    def projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v of x (chunk, dim): a decode row's in one kernel where the three share one (fused_matvec)."""
        if (qkv := self._fused_projections(x)) is not None:
            return qkv
        x, blocks = decode_input(x, self.q, self.k, self.v)
        return self.q(x, blocks), self.k(x, blocks), self.v(x, blocks)

    def _fused_projections(
        self, x: Tensor, norm: tuple[Tensor, float] | None = None
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        linears = (self.q, self.k, self.v)
        if (qkv := fused_matvec(x, *linears, norm=norm)) is None:
            return None
        widths = [lin.out_features for lin in linears]
        q, k, v = (
            y if lin.bias is None else y + lin.bias.cast(dtypes.float32)
            for y, lin in zip(qkv.split(widths, dim=1), linears)
        )
        return q, k, v


class FeedForward:
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, gate: Weight, up: Weight, down: Weight):
        self.gate, self.up, self.down = QuantLinear(gate), QuantLinear(up), QuantLinear(down)

    def __call__(self, x: Tensor) -> Tensor:
        if (h := fused_matvec(x, self.gate, self.up, swiglu=True)) is not None:
            return self.down(h)
        if x.shape[0] <= MATVEC_MAX_ROWS:
            x, blocks = decode_input(x, self.gate, self.up)
            gate, up = self.gate(x, blocks), self.up(x, blocks)
            if self.gate.shares_blocks or self.up.shares_blocks:  # two nested sums in one kernel would split apart
                gate, up = gate.contiguous(), up.contiguous()
            h = gate.silu() * up
            # realized once where down quantizes it: its scale and values kernels would each compute silu again
            return self.down(h.contiguous() if self.down.integer_dot else h)
        # a chunk: each product realized on its own, so each runs as one register-tiled matmul (fused, the two
        # reduces share a kernel no tile serves, and the down matmul would recompute silu for every output panel)
        gate, up = self.gate(x).contiguous(), self.up(x).contiguous()
        return self.down((gate.silu() * up).contiguous())

    def with_residual(self, h: Tensor, norm: Tensor, eps: float) -> Tensor:
        """h + self(rms_norm(h, norm)), a decode row's norm inside the gate/up kernel and its residual add inside
        down's where the kernels take them (fused_matvec)."""
        if (g := fused_matvec(h, self.gate, self.up, swiglu=True, norm=(norm, eps))) is None:
            return h + self(rms_norm(h, norm, eps))
        if (y := fused_matvec(g, self.down, residual=h)) is None:
            return h + self.down(g)
        return y

    def float_weights(self) -> tuple[Tensor, Tensor, Tensor, bool] | None:
        """gate, up and down as float tensors and whether they are stored (in, out) (else (out, in)), when none is
        quantized."""
        ws = (self.gate.weight, self.up.weight, self.down.weight)
        if not all(isinstance(w, Tensor) for w in ws):
            return None
        return (*ws, self.gate.transposed)  # type: ignore[return-value]


# traced once for all layers (same shapes): a layer's call replays the graph over its own weights
@function
def _ffn_residual(
    h: Tensor, norm: Tensor, gate: Tensor, up: Tensor, down: Tensor, transposed: bool, eps: float
) -> Tensor:
    """h + FeedForward(rms_norm(h)) for float weights, stored (in, out) if transposed, else (out, in)."""
    if not transposed:  # a chunk's x @ W.T: the scheduler copies W.T's view into panels (schedule/panels.py)
        gate, up, down = gate.T, up.T, down.T
    x = rms_norm(h, norm, eps)
    if h.shape[0] <= MATVEC_MAX_ROWS:
        return h + ((x @ gate).silu() * (x @ up)) @ down
    # a chunk: as in FeedForward, each product its own register-tiled matmul (fused, the two reduces share one kernel
    # that no tile serves: 128 rows of 768 -> 2048 -> 768, one thread, 2.3x slower)
    return h + ((x @ gate).contiguous().silu() * (x @ up).contiguous()) @ down


def _expert(w: Weight, e: int) -> Weight:
    """Expert e's (out, in) weight out of an (experts, out, in) stack, still quantized if the stack is."""
    if isinstance(w, Tensor):
        return w[e]
    per_expert = w.blocks.shape[0] // w.shape[0]
    return GGMLQuantized(f"{w.name}[{e}]", w.ggml_type, w.shape[1:], w.blocks[e * per_expert : (e + 1) * per_expert])


class MoEFeedForward:
    """Top-k routing: each token's output is the routing-weighted sum of its k best experts' SwiGLU outputs
    (weights softmax-normalized over the chosen k, or the full softmax's when expert_weights_norm is off).
    Every expert runs on every token of the chunk and the unchosen ones get weight 0, which keeps the graph the
    same for every step (no host round trip for the routing)."""

    def __init__(self, cfg: LlamaConfig, w: dict[str, Any]):
        self.k, self.router, self.renormalize = (
            cfg.n_experts_used,
            QuantLinear(w["ffn_gate_inp.weight"]),
            cfg.expert_weights_norm,
        )
        self.experts = [
            FeedForward(*(_expert(w[f"ffn_{n}_exps.weight"], e) for n in ("gate", "up", "down")))
            for e in range(cfg.n_experts)
        ]

    def __call__(self, x: Tensor) -> Tensor:
        logits = self.router(x)  # (chunk, experts)
        kth = logits.topk(self.k, dim=-1)[0][:, -1:]
        chosen = logits >= kth
        weights = chosen.where(logits, -math.inf).softmax(-1) if self.renormalize else chosen * logits.softmax(-1)
        out = None
        for e, expert in enumerate(self.experts):
            y = expert(x) * weights[:, e : e + 1]
            out = y if out is None else out + y
        assert out is not None
        return out


class Block:
    def __init__(self, cfg: LlamaConfig, w: dict[str, Any]):
        self.cfg = cfg
        self.attn_norm, self.ffn_norm = w["attn_norm.weight"], w["ffn_norm.weight"]
        self.attn = Attention(cfg, w)
        if cfg.n_experts:
            self.ffn: FeedForward | MoEFeedForward = MoEFeedForward(cfg, w)
        else:
            self.ffn = FeedForward(w["ffn_gate.weight"], w["ffn_up.weight"], w["ffn_down.weight"])

    def __call__(self, x: Tensor, cache: KVCache, at: Positions) -> Tensor:
        h = self.attn.with_residual(x, self.attn_norm, cache, at)
        dense = isinstance(self.ffn, FeedForward) and isinstance(self.ffn_norm, Tensor)
        # float weights on the AVX2 target's row-streaming kernel: a decode step takes FeedForward, which calls it
        rows = x.shape[0] <= MATVEC_MAX_ROWS and isinstance(self.ffn, FeedForward) and self.ffn.gate.rows_kernel
        if dense and not rows and (weights := self.ffn.float_weights()) is not None:  # type: ignore[union-attr]
            return _ffn_residual(h, self.ffn_norm, *weights, self.cfg.norm_eps)
        if isinstance(self.ffn, FeedForward):
            return self.ffn.with_residual(h, self.ffn_norm, self.cfg.norm_eps)
        return h + self.ffn(rms_norm(h, self.ffn_norm, self.cfg.norm_eps))


def _place(value: Any) -> Any:
    """A file tensor copied to the default device and realized (quantized ones as their blocks)."""
    if isinstance(value, GGMLQuantized):
        placed = value.to(Device.DEFAULT)
        placed.blocks.realize()
        return placed
    return value.to(Device.DEFAULT).contiguous().realize()


class Llama:
    """forward(ids, pos) -> logits (chunk, vocab); the KV cache holds max_context positions."""

    def __init__(self, cfg: LlamaConfig, weights: dict[str, Any], max_context: int | None = None):
        self.cfg = cfg
        self.max_context = min(max_context or cfg.context_length, cfg.context_length)
        layer_w = [
            {k.removeprefix(f"blk.{i}."): v for k, v in weights.items() if k.startswith(f"blk.{i}.")}
            for i in range(cfg.n_layers)
        ]
        self.blocks = [Block(cfg, w) for w in layer_w]
        self.output_norm = weights["output_norm.weight"]
        self.token_embd = weights["token_embd.weight"]
        # tied to the embedding if absent; a decode step and a prefill chunk multiply one row (the logits' last)
        self.output = QuantLinear(weights.get("output.weight", self.token_embd), rows_few=True)
        freq_factors = weights.get("rope_freqs.weight")
        cos, sin = rope_tables(cfg, None if freq_factors is None else freq_factors.numpy())
        self._cos, self._sin = cos[: self.max_context], sin[: self.max_context]
        self._caches: list[KVCache] | None = None
        self._embed_rows = self._embedding_table()
        # one captured step per chunk size (prefill chunks, decode tokens) and whether it gives one row's logits
        self._steps: dict[tuple[int, bool], TinyJit] = {}

    @staticmethod
    def from_gguf(path: str | Path, max_context: int | None = None, progress: bool = True) -> tuple[Llama, dict]:
        """(model, GGUF metadata) of a file; weights are read through its memory map as they are placed."""
        kv, state = gguf_load(path, keep_quantized=True)
        vocab = len(kv.get("tokenizer.ggml.tokens", [])) or state["token_embd.weight"].shape[0]
        cfg = LlamaConfig.from_gguf(kv, vocab)
        total = sum(v.blocks.nbytes() if isinstance(v, GGMLQuantized) else v.nbytes() for v in state.values())
        bar = _Progress(total, f"loading {Path(path).name}") if progress else None
        placed = {}
        for name, value in state.items():
            placed[name] = _place(value)
            if bar is not None:
                bar.update(value.blocks.nbytes() if isinstance(value, GGMLQuantized) else value.nbytes())
        if bar is not None:
            bar.close()
        return Llama(cfg, placed, max_context), kv

    def _embedding_table(self) -> Tensor:
        """The token embedding as rows on the device: float rows, or each token's quantized blocks as one row of
        bytes (the picked rows are dequantized after the gather)."""
        emb = self.token_embd
        if isinstance(emb, GGMLQuantized):
            return emb.blocks.reshape(emb.shape[0], -1)
        return emb

    def embed(self, ids: Tensor) -> Tensor:
        """Rows of the token ids (an int tensor), loaded through the ids on the device, as float32."""
        rows = self._embed_rows[ids]  # indexing by an int tensor loads the rows through it
        emb = self.token_embd
        if isinstance(emb, GGMLQuantized):
            per_row = rows.shape[1] // emb.blocks.shape[1]
            n = ids.shape[0]
            return GGMLQuantized(emb.name, emb.ggml_type, (n, emb.shape[1]), rows.reshape(n * per_row, -1)).dequantize()
        return rows.cast(dtypes.float32)

    def reset(self) -> None:
        """Start a new sequence. The cache keeps its buffers (the captured steps write into them): slots past the
        current position are never read, and a new sequence writes every slot before it reads it."""

    def forward(self, ids: np.ndarray, pos: int, row: int | None = None) -> Tensor:
        """Logits (chunk, vocab) of the ids at positions pos..; with `row`, only that row's (1, vocab): a prefill
        chunk needs its last token's alone, and the output matmul over the vocabulary is a large part of a chunk."""
        cfg = self.cfg
        ids = np.asarray(ids, np.int32).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
            raise ValueError(f"token ids span [{ids.min()}, {ids.max()}], outside the vocabulary of {cfg.vocab_size}")
        if not 0 <= pos or pos + len(ids) > self.max_context:
            raise ValueError(f"positions {pos}..{pos + len(ids) - 1} are outside the context of {self.max_context}")
        if self._caches is None:
            self._caches = [KVCache(1, cfg.n_kv_heads, self.max_context, cfg.head_dim) for _ in self.blocks]
        t = len(ids)
        if row is not None and not 0 <= row < t:
            raise ValueError(f"row {row} is outside the chunk of {t} tokens")
        cos, sin = Tensor(self._cos[pos : pos + t]), Tensor(self._sin[pos : pos + t])
        start = start_position(pos, t, self.max_context)
        args = (Tensor(ids).realize(), start, cos.realize(), sin.realize())
        if row is None:
            return self._steps.setdefault((t, False), TinyJit(self._step))(*args)
        # the row is an input of the capture (an index tensor), so one capture serves every row
        return self._steps.setdefault((t, True), TinyJit(self._step_row))(*args, Tensor([row], dtype=dtypes.int32))

    def _hidden(self, ids: Tensor, start: UOp, cos: Tensor, sin: Tensor) -> Tensor:
        """The last block's output for a chunk's token ids at position start (a bound Variable) with its rope
        angles: the same kernels for every start."""
        assert self._caches is not None
        # one small kernel: fused, every matmul reading x would gather it again; realized here, as a CONTIGUOUS on the
        # way is not kept when a later kernel realizes the residual sum, which then gathered it again (twice a layer)
        x = self.embed(ids).contiguous().realize()
        t = x.shape[0]
        # a decode row's position for the hand-written attention kernel, realized once for every layer; none (and no
        # kernel for it) where that kernel does not serve
        cfg = self.cfg
        serves = t == 1 and decode_attention_serves(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, x.device)
        slot = decode_slot(start, x.device) if serves else None
        at = Positions(start, causal_mask(start, t, self.max_context), cos, sin, slot)
        for block, cache in zip(self.blocks, self._caches):
            x = block(x, cache, at)
            if x.shape[0] > MATVEC_MAX_ROWS:
                # a chunk's residual stream stored once a layer: left lazy, each later layer's norms added up every
                # earlier layer's outputs again (12 layers: 34 MB read again a 128-token chunk, ~8 % of its time)
                x = x.realize()
        return x

    def _logits(self, x: Tensor) -> Tensor:
        norm, eps = self.output_norm, self.cfg.norm_eps
        if (y := fused_matvec(x, self.output, norm=(norm, eps))) is not None:  # the norm inside the matvec's kernel
            return y.realize()
        return self.output(rms_norm(x, norm, eps)).realize()

    def _step(self, ids: Tensor, start: UOp, cos: Tensor, sin: Tensor) -> Tensor:
        return self._logits(self._hidden(ids, start, cos, sin))

    def _step_row(self, ids: Tensor, start: UOp, cos: Tensor, sin: Tensor, row: Tensor) -> Tensor:
        return self._logits(self._hidden(ids, start, cos, sin)[row])
