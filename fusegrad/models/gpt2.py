"""GPT-2 (Hugging Face `GPT2LMHeadModel` safetensors layout) with a KV cache, for greedy and sampled generation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusegrad import Tensor, TinyJit, dtypes, function, nn
from fusegrad.models.generate import KVCache, attention, causal_mask, start_position
from fusegrad.models.layer_math import layer_norm, panel_linear
from fusegrad.models.weights import PanelLinear, load_into, panel_matmul, to_panels
from fusegrad.nn.state import safe_load
from fusegrad.uop.ops import UOp

_ACTIVATIONS = {
    "gelu_new": lambda x: x.gelu(approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: x.gelu(approximate="tanh"),
    "gelu": lambda x: x.gelu(approximate="none"),
    "relu": lambda x: x.relu(),
}


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False

    @staticmethod
    def from_json(path: str | Path) -> GPT2Config:
        raw = json.loads(Path(path).read_text())
        cfg = GPT2Config(**{k: raw[k] for k in GPT2Config.__dataclass_fields__ if k in raw})
        if cfg.activation_function not in _ACTIVATIONS:
            raise ValueError(f"{path}: activation_function {cfg.activation_function!r} is not supported")
        if not cfg.scale_attn_weights or cfg.scale_attn_by_inverse_layer_idx:
            raise ValueError(f"{path}: only attention scaled by 1/sqrt(head_dim) is supported")
        return cfg


# the Conv1D weights of a file's state, (in, out) each
LINEARS = ("c_attn.weight", "c_proj.weight", "c_fc.weight")


class Conv1D(PanelLinear):
    """GPT-2's linear layer: the file stores the weight (in, out); it is kept in panels (to_panels)."""


class Attention:
    def __init__(self, cfg: GPT2Config):
        self.heads, self.head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
        self.c_attn, self.c_proj = Conv1D(cfg.n_embd, 3 * cfg.n_embd), Conv1D(cfg.n_embd, cfg.n_embd)

    def __call__(self, qkv: Tensor, cache: KVCache, start: UOp, mask: Tensor | None) -> Tensor:
        """The heads' outputs (1, heads, t, head_dim) of a chunk's realized q, k, v rows (t, 3 * n_embd)."""
        t, d = qkv.shape[0], qkv.shape[1] // 3
        # q, k and v viewed as heads of their rows, realized by the caller (not left to the cache's writes: each
        # write is its own schedule, which would compute them again)
        q, k, v = (y.reshape(t, self.heads, self.head_dim).transpose(0, 1).unsqueeze(0) for y in qkv.split(d, -1))
        keys, values = cache.write(k, v, start)
        return attention(q, keys, values, mask, causal=True)


class MLP:
    def __init__(self, cfg: GPT2Config):
        inner = cfg.n_inner or 4 * cfg.n_embd
        self.c_fc, self.c_proj = Conv1D(cfg.n_embd, inner), Conv1D(inner, cfg.n_embd)


# The pure parts of a block, traced once for all layers (same shapes): a layer's call replays the graph over its own
# weights instead of running the Python of layer norms, matmuls and activations. The KV-cache writes and the
# attention over the cache (a bound Variable in its shapes) stay outside.
@function
def _qkv(x: Tensor, ln_w: Tensor, ln_b: Tensor, w: Tensor, b: Tensor, cfg: GPT2Config) -> Tensor:
    return panel_linear(layer_norm(x, ln_w, ln_b, cfg.layer_norm_epsilon), w, b, 3 * cfg.n_embd)


@function
def _attention_residual(x: Tensor, heads: Tensor, w: Tensor, b: Tensor, cfg: GPT2Config) -> Tensor:
    t, d = x.shape
    # the heads realized in token-row order: the projection's register tiles need rows it reads contiguously
    return x + panel_linear(heads[0].transpose(0, 1).contiguous().reshape(t, d), w, b, d)


@function
def _mlp_residual(
    h: Tensor, ln_w: Tensor, ln_b: Tensor, fc_w: Tensor, fc_b: Tensor, proj_w: Tensor, proj_b: Tensor, cfg: GPT2Config
) -> Tensor:
    inner = panel_linear(layer_norm(h, ln_w, ln_b, cfg.layer_norm_epsilon), fc_w, fc_b, cfg.n_inner or 4 * cfg.n_embd)
    return h + panel_linear(_ACTIVATIONS[cfg.activation_function](inner), proj_w, proj_b, cfg.n_embd)


class Block:
    def __init__(self, cfg: GPT2Config):
        self.cfg = cfg
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def __call__(self, x: Tensor, cache: KVCache, start: UOp, mask: Tensor | None) -> Tensor:
        a, m, cfg = self.attn, self.mlp, self.cfg
        qkv = _qkv(x, self.ln_1.weight, self.ln_1.bias, a.c_attn.weight, a.c_attn.bias, cfg).realize()
        # the residual stream realized: left lazy, each later schedule (the cache writes) computed it again
        h = _attention_residual(x, a(qkv, cache, start, mask), a.c_proj.weight, a.c_proj.bias, cfg).realize()
        ln, fc, proj = self.ln_2, m.c_fc, m.c_proj
        return _mlp_residual(h, ln.weight, ln.bias, fc.weight, fc.bias, proj.weight, proj.bias, cfg).realize()


class GPT2:
    """forward(ids, pos) -> logits; the KV cache holds max_context positions (n_positions unless smaller)."""

    def __init__(self, cfg: GPT2Config, max_context: int | None = None):
        self.cfg = cfg
        self.max_context = min(max_context or cfg.n_positions, cfg.n_positions)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = [Block(cfg) for _ in range(cfg.n_layer)]
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self._caches: list[KVCache] | None = None
        # one captured step per chunk size (prefill chunks, decode tokens) and whether it gives one row's logits
        self._steps: dict[tuple[int, bool], TinyJit] = {}
        self._lm_head: Tensor | None = None  # wte transposed into panels (to_panels): x @ W runs faster than x @ W.T

    @staticmethod
    def from_pretrained(model_dir: str | Path, max_context: int | None = None) -> GPT2:
        model_dir = Path(model_dir)
        model = GPT2(GPT2Config.from_json(model_dir / "config.json"), max_context)
        state = {k.removeprefix("transformer."): v for k, v in safe_load(model_dir / "model.safetensors").items()}
        # lm_head is tied to wte; the attention bias buffers of old checkpoints are the causal mask
        state = {
            k: to_panels(v) if k.endswith(LINEARS) else v
            for k, v in state.items()
            if k != "lm_head.weight" and not k.endswith((".attn.bias", "masked_bias"))
        }
        load_into(model, state, f"loading {model_dir.name}")
        return model

    def reset(self) -> None:
        """Start a new sequence. The cache keeps its buffers (the captured steps write into them): slots past the
        current position are never read, and a new sequence writes every slot before it reads it."""

    def forward(self, ids: np.ndarray, pos: int, row: int | None = None) -> Tensor:
        """Logits (chunk, vocab) of the ids at positions pos..; with `row`, only that row's (1, vocab)."""
        ids = np.asarray(ids, np.int32).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(
                f"token ids span [{ids.min()}, {ids.max()}], outside the vocabulary of {self.cfg.vocab_size}"
            )
        if not 0 <= pos or pos + len(ids) > self.max_context:
            raise ValueError(f"positions {pos}..{pos + len(ids) - 1} are outside the context of {self.max_context}")
        if self._caches is None:
            hd = self.cfg.n_embd // self.cfg.n_head
            self._caches = [KVCache(1, self.cfg.n_head, self.max_context, hd) for _ in self.h]
        if self._lm_head is None:
            self._lm_head = to_panels(self.wte.weight.T).contiguous().realize()
        if row is not None and not 0 <= row < len(ids):
            raise ValueError(f"row {row} is outside the chunk of {len(ids)} tokens")
        places = np.arange(pos, pos + len(ids), dtype=np.int32)
        args = (Tensor(ids).realize(), Tensor(places).realize(), start_position(pos, len(ids), self.max_context))
        if row is None:
            return self._steps.setdefault((len(ids), False), TinyJit(self._step))(*args)
        # the row is an input of the capture (an index tensor), so one capture serves every row
        step = self._steps.setdefault((len(ids), True), TinyJit(self._step_row))
        return step(*args, Tensor([row], dtype=dtypes.int32))

    def _hidden(self, ids: Tensor, places: Tensor, start: UOp) -> Tensor:
        """The last block's output for a chunk's token ids at positions `places` starting at start (a bound
        Variable): the same kernels for every start. The embedding rows are loaded through the ids inside the step's
        first kernel."""
        assert self._caches is not None
        x = (self.wte(ids) + self.wpe(places)).contiguous()  # one small kernel, not a gather inside each reader
        mask = causal_mask(start, x.shape[0], self.max_context)
        for block, cache in zip(self.h, self._caches):
            x = block(x, cache, start, mask)
        return x

    def _logits(self, x: Tensor) -> Tensor:
        assert self._lm_head is not None
        return panel_matmul(self.ln_f(x), self._lm_head, self.cfg.vocab_size).realize()

    def _step(self, ids: Tensor, places: Tensor, start: UOp) -> Tensor:
        return self._logits(self._hidden(ids, places, start))

    def _step_row(self, ids: Tensor, places: Tensor, start: UOp, row: Tensor) -> Tensor:
        return self._logits(self._hidden(ids, places, start)[row])
