"""Pieces every decoder-only model shares: a preallocated KV cache written at a position given as a bound Variable,
the causal mask of a chunk of queries, token sampling, and the generation loop.

The position is a bound Variable, not a Python int, so every step of a chunk size runs the same kernels (under
TinyJit, the same capture) whatever the position: prefill runs in fixed-size chunks (padding rows write past the
prompt and are overwritten before they are attended), decode in chunks of one token, and attention spans the slots
written so far."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fusegrad import Tensor, Variable, dtypes
from fusegrad.helpers import DEBUG, Hooks
from fusegrad.uop.ops import UOp


class KVCache:
    """Keys and values of one attention layer: (batch, kv_heads, max_context, head_dim) each, allocated once."""

    def __init__(self, batch: int, kv_heads: int, max_context: int, head_dim: int, dtype=dtypes.float32):
        self.max_context = max_context
        self.k = Tensor.zeros(batch, kv_heads, max_context, head_dim, dtype=dtype).contiguous().realize()
        self.v = Tensor.zeros(batch, kv_heads, max_context, head_dim, dtype=dtype).contiguous().realize()

    def write(self, k: Tensor, v: Tensor, start: UOp) -> tuple[Tensor, Tensor]:
        """Stores k, v (batch, kv_heads, chunk, head_dim) at slots start .. start+chunk-1 (start a bound Variable)
        and returns the keys and values of slots 0 .. start+chunk-1."""
        chunk = k.shape[2]
        for cache, new in ((self.k, k), (self.v, v)):
            cache.shrink((None, None, (start, start + chunk), None)).assign(new)
        keys, values = (c.shrink((None, None, (0, start + chunk), None)) for c in (self.k, self.v))
        return keys, values


# grouped query rows from which attention computes its scores with the slots as rows (slots x queries): the queries
# are then the output's contiguous axis, which a register tile vectorizes, and the slots (symbolic) its rows
MIN_SLOT_ROWS_QUERIES = 16
# a causal chunk's queries attend in blocks of this many, each against the slots up to its own last query's: of the
# masked triangle above the diagonal only a block's part is scored
QUERY_BLOCK = 128


def attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
    """softmax(q keys^T / sqrt(head_dim)) values for q (batch, heads, chunk, head_dim) and keys, values (batch,
    kv_heads, slots, head_dim), heads a multiple of kv_heads (query head h reads kv head h // (heads / kv_heads)),
    mask (chunk, slots) bool or None; causal: mask is causal_mask's (query i sees the slots up to slots - chunk + i).
    The query heads of a kv head become rows of one matmul, so the cache is read as it is (repeating its heads would
    index it with divisions by the symbolic slot count)."""
    b, heads, t, hd = q.shape
    kv_heads = keys.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of the key/value heads ({kv_heads})")
    if heads // kv_heads * t >= MIN_SLOT_ROWS_QUERIES:
        if causal and mask is not None and t > QUERY_BLOCK and t % QUERY_BLOCK == 0:
            return _causal_query_blocks(q, keys, values, mask)
        return _attention_by_slots(q, keys, values, mask)
    rep, slots = heads // kv_heads, keys.shape[2]
    # realized once: fused into the scores, the query's rope would be recomputed for every slot
    grouped = q.reshape(b, kv_heads, rep * t, hd).contiguous()
    scores = grouped @ keys.transpose(-1, -2) * (1 / math.sqrt(hd))
    if mask is not None:
        # the mask is repeated to the grouped rows, not the scores split into (rep, t): a split of rows whose stride
        # is the symbolic slot count divides by it at every element
        grouped_mask = mask.reshape(1, 1, 1, t, slots).expand(b, kv_heads, rep, t, slots)
        scores = grouped_mask.reshape(b, kv_heads, rep * t, slots).where(scores, -math.inf)
    # realized once: fused into the product with the values, each exp would be recomputed for every head dim
    probs = scores.softmax(-1).contiguous()
    return (probs @ values).reshape(b, heads, t, hd)


def _causal_query_blocks(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """A causal chunk's attention in blocks of QUERY_BLOCK queries, each against the slots up to its last query's
    only: the masked slots past a block's end are never scored."""
    t, slots = q.shape[2], keys.shape[2]
    blocks = []
    for end in range(QUERY_BLOCK, t + 1, QUERY_BLOCK):
        seen = slots - (t - end)  # the block's last query's slot, plus one
        rows, cols = (end - QUERY_BLOCK, end), (0, seen)
        blocks.append(
            _attention_by_slots(
                q.shrink((None, None, rows, None)),
                keys.shrink((None, None, cols, None)),
                values.shrink((None, None, cols, None)),
                mask.shrink((rows, cols)),
            )
        )
    return blocks[0].cat(*blocks[1:], dim=2)


def _attention_by_slots(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """attention for many query rows (a prefill chunk): the scores as (slots, queries), keys @ q^T, so the queries
    (a fixed count) are the contiguous axis a register tile vectorizes and the symbolic slot count is an outer loop;
    with the slots last (q @ keys^T), no tile could cut that axis and each score was a scalar dot product (5x
    slower at 512 slots). The softmax runs down the slots: its max, its exponentials (realized once), their sum,
    and the division after the product with the values (rows x head_dim divisions, not slots x rows)."""
    b, heads, t, hd = q.shape
    kv_heads, slots = keys.shape[1], keys.shape[2]
    rep = heads // kv_heads
    # realized once, transposed: the queries contiguous (and the rope not recomputed for every slot)
    grouped = q.reshape(b, kv_heads, rep * t, hd).transpose(-1, -2).contiguous()
    scores = keys @ grouped  # (b, kv_heads, slots, rep * t)
    if mask is not None:
        slots_mask = mask.T.reshape(1, 1, slots, 1, t).expand(b, kv_heads, slots, rep, t)
        scores = slots_mask.reshape(b, kv_heads, slots, rep * t).where(scores, -math.inf)
    scores = scores.contiguous()
    # every query sees at least its own slot: the max is finite
    exps = ((scores - scores.max(-2, keepdim=True)) * (1 / math.sqrt(hd))).exp().contiguous()
    out = (exps.transpose(-1, -2) @ values) / exps.sum(-2).unsqueeze(-1)
    # realized as it is: a consumer's permuted view (the heads side by side per query) stored by the product's kernel
    # took its register tile away (80x slower)
    return out.contiguous().reshape(b, heads, t, hd)


def start_position(pos: int, chunk: int, max_context: int) -> UOp:
    """pos as a bound Variable: one compiled kernel set (one TinyJit capture) serves every position of a chunk size."""
    return Variable("start_pos", 0, max_context - chunk).bind(pos)


def causal_mask(start: UOp, chunk: int, max_context: int) -> Tensor | None:
    """(chunk, start+chunk) bool: query t (at position start+t) sees slots 0 .. start+t. None for a single query,
    which sees every slot written so far."""
    if chunk == 1:
        return None
    slots = Tensor.arange(max_context).shrink(((0, start + chunk),)).unsqueeze(0)
    return slots <= (Tensor.arange(chunk) + start).reshape(-1, 1)


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; top_k 0 and top_p 1 keep every token."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"sampling needs temperature >= 0, top_k >= 0 and 0 < top_p <= 1, got temperature "
                f"{self.temperature}, top_k {self.top_k}, top_p {self.top_p}"
            )


def sample(logits: np.ndarray, params: Sampling, rng: np.random.Generator) -> int:
    """One token id from a row of logits."""
    if params.temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / params.temperature
    order = np.argsort(-z, kind="stable")
    if params.top_k:
        order = order[: params.top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    if params.top_p < 1:
        # the smallest prefix whose mass reaches top_p (always at least the top token)
        keep = int(np.searchsorted(np.cumsum(p), params.top_p)) + 1
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])


class CausalLM(Protocol):
    max_context: int

    def forward(self, ids: np.ndarray, pos: int, row: int | None = None) -> Tensor:
        """Logits (chunk, vocab) of a chunk of token ids placed at positions pos.. (writes the KV cache); with row,
        only that row's logits (1, vocab). `row` is optional: a model without it gives all rows and prefill takes
        the last."""
        ...


# prefill chunk sizes: each chunk reads every weight once (a quantized one is dequantized once per chunk), so long
# prompts take large chunks; the smallest bounds the padding of a short prompt or a prompt's tail. 512 tokens of the
# 110M model on Zen 3, 2 threads, weights read in panels, a causal chunk's queries attending in blocks of QUERY_BLOCK:
# one chunk of 512 ran 1.03-1.04x as fast as two of 256 (Q8_0 521 -> 504 ms, Q4_K 535 -> 513, F32 578 -> 561: each
# weight dequantized or copied into panels once); without the query blocks it scored every masked slot of its own
# 512 x 512 block and was no faster. 8: a short prompt or tail takes a quantized model's matvec
# (llama.MATVEC_MAX_ROWS) instead of dequantizing every weight into panels (a 4-token prompt of the 110M model, 1
# thread: Q4_K 88 ms against 387 ms padded to 32, Q8_0 76 against 208)
PREFILL_CHUNKS = (512, 256, 128, 32, 8)


def prefill_chunks(n: int, sizes: tuple[int, ...] = PREFILL_CHUNKS) -> list[int]:
    """Chunk sizes for n tokens: the largest size that the tokens left fill, else the smallest (padded)."""
    if not sizes or min(sizes) < 1:
        raise ValueError(f"prefill chunk sizes must be positive, got {sizes}")
    out, left = [], n
    while left > 0:
        size = max((s for s in sizes if s <= left), default=min(sizes))
        out.append(size)
        left -= size
    return out


def _last_logits(model: CausalLM, ids: np.ndarray, pos: int, row: int) -> np.ndarray:
    """Row `row`'s logits of a chunk: asked of the model alone where its forward takes `row` (fusegrad's models do),
    taken from the whole chunk's logits for a model written to the protocol without it."""
    if "row" in inspect.signature(model.forward).parameters:
        return model.forward(ids, pos, row=row)[0].numpy()
    return model.forward(ids, pos)[row].numpy()


def prefill(model: CausalLM, ids: list[int], start: int = 0, chunks: tuple[int, ...] = PREFILL_CHUNKS) -> np.ndarray:
    """Runs ids through the model from position `start` in chunks of the given sizes (prefill_chunks); returns the
    last token's logits (each chunk computes only its last token's)."""
    if start + len(ids) > model.max_context:
        raise ValueError(
            f"{start + len(ids)} tokens exceed the model's context of {model.max_context} (prompt of {len(ids)})"
        )
    last, i = None, 0
    for chunk in prefill_chunks(len(ids), chunks):
        part = ids[i : i + chunk]
        size = chunk if start + i + chunk <= model.max_context else len(part)  # no padding row past the cache
        padded = np.zeros(size, np.int32)
        padded[: len(part)] = part
        last = _last_logits(model, padded, start + i, len(part) - 1)
        i += chunk
    assert last is not None, "prefill needs at least one token"
    return last


def generate(
    model: CausalLM,
    prompt: list[int],
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    seed: int | None = None,
    stop: set[int] | frozenset[int] = frozenset(),
    start: int = 0,
) -> Iterator[int]:
    """Token ids that follow the prompt, one at a time (stops early at a token in `stop`, which is yielded).
    The prompt is placed at position `start` of the cache, after tokens already there."""
    if not prompt:
        raise ValueError("generate needs a prompt of at least one token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    logits = prefill(model, prompt, start)
    t1 = time.perf_counter()
    if (hook := Hooks.trace) is not None:  # a PROFILE trace shows the request's prefill and each decoded token
        hook.slice("prefill", "llm", t0, t1, {"tokens": len(prompt), "start": start})
    if DEBUG.value >= 1:
        print(f"prefill: {len(prompt)} tokens in {t1 - t0:.3f} s, {len(prompt) / (t1 - t0):.1f} tokens/s")
    pos, produced = start + len(prompt), 0
    try:
        while produced < max_new_tokens:
            token = sample(logits, sampling, rng)
            produced += 1
            yield token
            if token in stop or produced == max_new_tokens or pos >= model.max_context:
                break
            td = time.perf_counter()
            logits = model.forward(np.array([token], np.int32), pos)[0].numpy()
            if hook is not None:
                hook.slice("decode", "llm", td, time.perf_counter(), {"position": pos})
            pos += 1
    finally:
        if DEBUG.value >= 1 and produced > 1:
            dt = time.perf_counter() - t1
            print(f"decode: {produced} tokens in {dt:.3f} s, {(produced - 1) / dt:.1f} tokens/s")
