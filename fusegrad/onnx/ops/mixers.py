"""Sequence mixers of opset 27: LinearAttention (a recurrent state updated token by token), CausalConvWithState
(a depthwise causal conv that carries its last k - 1 inputs), and ai.onnx.preview's FlexAttention (attention with
score and probability modifier subgraphs)."""

from __future__ import annotations

import math

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.loader import onnx_dtype
from fusegrad.onnx.registry import T, check, op

_RULES = ("linear", "gated", "delta", "gated_delta")
_ACTIVATIONS = ("none", "silu", "swish")


@check("LinearAttention")
def _check_linear_attention(n) -> None:
    rule = n.a("update_rule", "gated_delta")
    if rule not in _RULES:
        raise NotImplementedError(f"{n}: LinearAttention update_rule {rule!r} is not one of {_RULES}")
    hq, hk = n.a("q_num_heads", 0), n.a("kv_num_heads", 0)
    if hk <= 0 or hq <= 0 or hq % hk:
        raise ValueError(f"{n}: q_num_heads {hq} must be a positive multiple of kv_num_heads {hk}")


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, H·D) → (B, T, H, D)."""
    B, L, _ = x.shape
    return x.reshape(B, L, heads, -1)


@op("LinearAttention")
def linear_attention(n, q, k, v, past=None, decay=None, beta=None):
    rule = n.a("update_rule", "gated_delta")
    hq, hk = n.a("q_num_heads"), n.a("kv_num_heads")
    out_dtype = T(q).dtype
    acc = dtypes.float64 if out_dtype == dtypes.float64 else dtypes.float32
    q, k, v = (_split_heads(T(x).cast(acc), h) for x, h in ((q, hq), (k, hk), (v, hk)))
    B, L, _, dk = k.shape
    dv = v.shape[-1]
    scale = n.a("scale", 0.0) or 1 / math.sqrt(q.shape[-1])
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if (gated and decay is None) or (delta and beta is None):
        raise ValueError(f"{n}: update_rule {rule!r} needs the {'decay' if gated and decay is None else 'beta'} input")
    # decay is per key dimension (B, T, H·dk) or per head (B, T, H): as (B, T, H, dk or 1, 1) it scales S's rows
    g = T(decay).cast(acc).exp().reshape(B, L, hk, -1, 1) if gated else None
    b = T(beta).cast(acc).reshape(B, L, -1, 1, 1) if delta else None  # (B, T, H or 1, 1, 1)
    S = T(past).cast(acc) if past is not None else Tensor.zeros(B, hk, dk, dv, dtype=acc)
    outs = []
    for t in range(L):
        kt, vt = k[:, t].unsqueeze(-1), v[:, t].unsqueeze(-2)  # (B, H, dk, 1), (B, H, 1, dv)
        if gated:
            S = S * g[:, t]
        if delta:
            recalled = (S * kt).sum(-2, keepdim=True)  # S^T k as (B, H, 1, dv)
            S = S + b[:, t] * kt * (vt - recalled)
        else:
            S = S + kt * vt
        # each kv head's state serves q_num_heads / kv_num_heads query heads
        qt = q[:, t].reshape(B, hk, hq // hk, dk)
        outs.append((qt.matmul(S) * scale).reshape(B, 1, hq * dv))
    y = outs[0].cat(*outs[1:], dim=1) if L > 1 else outs[0]
    return y.cast(out_dtype), S.cast(out_dtype)


@check("CausalConvWithState")
def _check_causal_conv(n) -> None:
    act = n.a("activation", "none")
    if act not in _ACTIVATIONS:
        raise NotImplementedError(f"{n}: CausalConvWithState activation {act!r} is not one of {_ACTIVATIONS}")


@op("CausalConvWithState")
def causal_conv_with_state(n, x, w, bias=None, past=None):
    x, w = T(x), T(w)
    B, ch, L = x.shape
    k = w.shape[-1]
    acc = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
    xs = x.cast(acc)
    prefix = T(past).cast(acc) if past is not None else Tensor.zeros(B, ch, k - 1, dtype=acc)
    full = prefix.cat(xs, dim=2) if k > 1 else xs  # (B, C, k - 1 + L)
    taps = w.cast(acc).reshape(1, ch, k)
    y = None
    for j in range(k):
        part = full[:, :, j : j + L] * taps[:, :, j : j + 1]
        y = part if y is None else y + part
    if bias is not None:
        y = y + T(bias).cast(acc).reshape(1, ch, 1)
    if n.a("activation", "none") in ("silu", "swish"):
        y = y * y.sigmoid()
    state = full[:, :, full.shape[2] - (k - 1) :] if k > 1 else Tensor.zeros(B, ch, 0, dtype=acc)
    return y.cast(x.dtype), state.cast(x.dtype)


def _modify(n, graph, x):
    """x through a one-input, one-output modifier subgraph (score_mod / prob_mod)."""
    env = dict(n.env)
    env[graph.inputs[0]] = x
    return T(n.runner.run_graph(graph, env)[0])


@op("FlexAttention", domain="ai.onnx.preview")
def flex_attention(n, q, k, v):
    q, k, v = T(q), T(k), T(v)
    hq, hk = q.shape[1], k.shape[1]
    if q.ndim != 4 or hq % hk:
        raise ValueError(f"{n}: Q {q.shape} must be rank 4 with a multiple of K's {hk} heads")
    default = dtypes.float64 if q.dtype == dtypes.float64 else dtypes.float32
    acc = onnx_dtype(n.a("softmax_precision"), str(n)) if n.a("softmax_precision") else default
    if hq != hk:  # query head h reads kv head h // (hq / hk)
        k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
    scale = n.a("scale") or 1 / math.sqrt(q.shape[-1])
    scores = q.cast(acc).matmul(k.cast(acc).transpose(-1, -2)) * scale
    if n.a("score_mod") is not None:
        scores = _modify(n, n.a("score_mod"), scores)
    probs = scores.softmax(-1)
    if n.a("prob_mod") is not None:
        probs = _modify(n, n.a("prob_mod"), probs)
    return probs.matmul(v.cast(acc)).cast(v.dtype)
