"""BERT encoder (Hugging Face `BertModel` safetensors layout) and sentence embeddings as sentence-transformers makes
them: mean of the token states over the attention mask, then L2 normalization."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusegrad import Tensor, TinyJit, dtypes, function, nn
from fusegrad.models.layer_math import layer_norm, panel_linear
from fusegrad.models.weights import PanelLinear, load_into, to_panels, transposed_linears
from fusegrad.nn.state import safe_load


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @staticmethod
    def from_json(path: str | Path) -> BertConfig:
        raw = json.loads(Path(path).read_text())
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: position_embedding_type {raw['position_embedding_type']!r} is not supported")
        return BertConfig(**{k: raw[k] for k in BertConfig.__dataclass_fields__ if k in raw})


_ACTIVATIONS = {
    "gelu": lambda x: x.gelu(approximate="none"),
    "gelu_new": lambda x: x.gelu(approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: x.gelu(approximate="tanh"),
    "relu": lambda x: x.relu(),
}


class BertSelfAttention:
    def __init__(self, cfg: BertConfig):
        self.query = PanelLinear(cfg.hidden_size, cfg.hidden_size)
        self.key = PanelLinear(cfg.hidden_size, cfg.hidden_size)
        self.value = PanelLinear(cfg.hidden_size, cfg.hidden_size)


class BertAttention:
    def __init__(self, cfg: BertConfig):
        self.self = BertSelfAttention(cfg)
        self.output = _DenseNorm(cfg.hidden_size, cfg.hidden_size, cfg.layer_norm_eps)


class _DenseNorm:
    """LayerNorm(dense(x) + residual): BERT's output block after attention and after the feed-forward layer."""

    def __init__(self, d_in: int, d_out: int, eps: float):
        self.dense = PanelLinear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=eps)


class _Intermediate:
    def __init__(self, cfg: BertConfig):
        if cfg.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported; supported: {sorted(_ACTIVATIONS)}")
        self.dense = PanelLinear(cfg.hidden_size, cfg.intermediate_size)


class BertLayer:
    def __init__(self, cfg: BertConfig):
        self.cfg = cfg
        self.attention = BertAttention(cfg)
        self.intermediate = _Intermediate(cfg)
        self.output = _DenseNorm(cfg.intermediate_size, cfg.hidden_size, cfg.layer_norm_eps)

    def __call__(self, x: Tensor, key_mask: Tensor) -> Tensor:
        att = self.attention
        linears = (att.self.query, att.self.key, att.self.value, att.output.dense, self.intermediate.dense)
        norms = (att.output.LayerNorm, self.output.LayerNorm)
        weights = tuple(t for lin in (*linears, self.output.dense) for t in (lin.weight, lin.bias))
        return _bert_layer(x, key_mask, weights + tuple(t for n in norms for t in (n.weight, n.bias)), self.cfg)


def _dense_norm(x: Tensor, residual: Tensor, w: Tensor, b: Tensor, ln_w: Tensor, ln_b: Tensor, eps: float) -> Tensor:
    # realized: both the next matmul and the next residual add read it (left lazy, each reader recomputed it)
    return layer_norm(panel_linear(x, w, b, residual.shape[-1]) + residual, ln_w, ln_b, eps).contiguous()


# traced once for all layers (same shapes): a layer's call replays the graph over its own weights
@function
def _bert_layer(x: Tensor, key_mask: Tensor, weights: tuple[Tensor, ...], cfg: BertConfig) -> Tensor:
    """x is (batch * tokens, hidden); key_mask (batch, 1, 1, tokens); weights as BertLayer.__call__ lists them."""
    qw, qb, kw, kb, vw, vb, ow, ob, iw, ib, fw, fb, ln1_w, ln1_b, ln2_w, ln2_b = weights
    b, t, d = key_mask.shape[0], key_mask.shape[-1], x.shape[-1]
    heads = cfg.num_attention_heads
    # each projection is realized row-major first: written straight into the heads layout it runs ~4x slower
    q, k, v = (
        panel_linear(x, w, bias, d).contiguous().reshape(b, t, heads, d // heads).transpose(1, 2)
        for w, bias in ((qw, qb), (kw, kb), (vw, vb))
    )
    out = q.scaled_dot_product_attention(k, v, attn_mask=key_mask)
    # realized in token-row order: the output projection's register tiles need rows it reads contiguously
    h = _dense_norm(out.transpose(1, 2).contiguous().reshape(b * t, d), x, ow, ob, ln1_w, ln1_b, cfg.layer_norm_eps)
    inner = _ACTIVATIONS[cfg.hidden_act](panel_linear(h, iw, ib, cfg.intermediate_size))
    return _dense_norm(inner, h, fw, fb, ln2_w, ln2_b, cfg.layer_norm_eps)


class BertEmbeddings:
    def __init__(self, cfg: BertConfig):
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def __call__(self, ids: Tensor, token_types: Tensor) -> Tensor:
        """ids and token_types (batch, tokens) int32: the rows are loaded through the ids on the device."""
        t = ids.shape[1]
        words, types = self.word_embeddings(ids), self.token_type_embeddings(token_types)
        return self.LayerNorm(words + types + self.position_embeddings.weight[:t].unsqueeze(0)).contiguous()


class BertModel:
    def __init__(self, cfg: BertConfig):
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = _Encoder(cfg)

    def __call__(self, ids: np.ndarray, attention_mask: np.ndarray, token_types: np.ndarray | None = None) -> Tensor:
        """Last hidden states (batch, tokens, hidden) of int arrays ids and attention_mask (1 = token, 0 = padding)."""
        self.check(ids, attention_mask)
        token_types = np.zeros_like(ids) if token_types is None else token_types
        as_tensor = lambda a: Tensor(np.asarray(a, np.int32))  # noqa: E731
        return self.forward(as_tensor(ids), as_tensor(token_types), as_tensor(attention_mask))

    def check(self, ids: np.ndarray, attention_mask: np.ndarray) -> None:
        """Raises ValueError for arrays the model cannot take (shapes, length, ids outside the vocabulary)."""
        if ids.ndim != 2 or ids.shape != attention_mask.shape:
            raise ValueError(f"ids {ids.shape} and attention_mask {attention_mask.shape} must be equal 2-D shapes")
        if ids.shape[1] > self.cfg.max_position_embeddings:
            raise ValueError(f"{ids.shape[1]} tokens exceed max_position_embeddings {self.cfg.max_position_embeddings}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(
                f"token ids span [{ids.min()}, {ids.max()}], outside the vocabulary of {self.cfg.vocab_size}"
            )

    def forward(self, ids: Tensor, token_types: Tensor, attention_mask: Tensor) -> Tensor:
        """__call__ on int32 tensors, unchecked (a TinyJit captures it once per shape)."""
        b, t = ids.shape
        # token rows stay 2-D (batch * tokens, hidden) through the layers: the codegen tiles 2-D matmuls
        x = self.embeddings(ids, token_types).reshape(b * t, -1)
        key_mask = (attention_mask != 0).reshape(b, 1, 1, t)
        for layer in self.encoder.layer:
            x = layer(x, key_mask)
        return x.reshape(b, t, -1)


class _Encoder:
    def __init__(self, cfg: BertConfig):
        self.layer = [BertLayer(cfg) for _ in range(cfg.num_hidden_layers)]


def mean_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of each sequence's token states over its (batch, tokens) mask (sentence-transformers' mean pooling)."""
    mask = attention_mask.cast(states.dtype).unsqueeze(-1)
    return (states * mask).sum(1) / mask.sum(1).maximum(1e-9)


def bert_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A BertModel's tensors from a file's: the "bert." prefix of task models dropped, position_ids (a constant
    arange torch keeps as a buffer) and task heads left out, linear weights turned to (in, out) panels (PanelLinear)."""
    named = {k.removeprefix("bert."): v for k, v in state.items()}
    keep = [k for k in named if k.startswith(("embeddings.", "encoder.")) and not k.endswith("position_ids")]
    weights = transposed_linears({k: named[k] for k in keep}, lambda k: k.startswith("encoder."))
    return {k: to_panels(v) if v.ndim == 2 and k.startswith("encoder.") else v for k, v in weights.items()}


class SentenceEncoder:
    """A sentence-transformers model directory (config.json, model.safetensors, tokenizer.json) as an encoder of
    sentences into unit-length vectors."""

    def __init__(self, model_dir: str | Path, pad_multiple: int = 8):
        from tokenizers import Tokenizer  # the `models` extra

        model_dir = Path(model_dir)
        self.model = BertModel(BertConfig.from_json(model_dir / "config.json"))
        load_into(self.model, bert_state(safe_load(model_dir / "model.safetensors")), f"loading {model_dir.name}")
        st_cfg = model_dir / "sentence_bert_config.json"
        max_len = json.loads(st_cfg.read_text()).get("max_seq_length") if st_cfg.exists() else None
        self.max_len = min(max_len or math.inf, self.model.cfg.max_position_embeddings)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(int(self.max_len))
        # lengths round up to a multiple, so batches of similar sentences replay the same capture
        self.pad_multiple = pad_multiple
        self._steps: dict[tuple[int, int], TinyJit] = {}  # one captured forward per (batch, padded length)

    def tokenize(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = self.tokenizer.encode_batch(sentences)
        longest = max(len(e.ids) for e in enc)
        t = min(-(-longest // self.pad_multiple) * self.pad_multiple, int(self.max_len))
        ids, mask = np.zeros((len(enc), t), np.int32), np.zeros((len(enc), t), np.int32)
        for i, e in enumerate(enc):
            ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
        return ids, mask

    def encode(self, sentences: list[str] | str, batch_size: int = 32) -> np.ndarray:
        """(n, hidden) float32 unit vectors, one per sentence."""
        if isinstance(sentences, str):
            sentences = [sentences]
        if not sentences:
            return np.zeros((0, self.model.cfg.hidden_size), np.float32)
        out = []
        for i in range(0, len(sentences), batch_size):
            ids, mask = self.tokenize(sentences[i : i + batch_size])
            self.model.check(ids, mask)
            step = self._steps.setdefault(ids.shape, TinyJit(self._embed))
            out.append(step(Tensor(ids), Tensor(np.zeros_like(ids)), Tensor(mask)).numpy())
        return np.concatenate(out)

    def _embed(self, ids: Tensor, token_types: Tensor, mask: Tensor) -> Tensor:
        pooled = mean_pool(self.model.forward(ids, token_types, mask), mask)
        return pooled.normalize(dim=-1).cast(dtypes.float32).realize()
