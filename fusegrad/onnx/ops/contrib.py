"""com.microsoft ops that exported transformer models commonly hold (onnxruntime's contrib domain)."""

from __future__ import annotations

import math

from fusegrad import Tensor
from fusegrad.onnx.registry import T, op

MS = "com.microsoft"


@op("Gelu", domain=MS)
def gelu(n, x):
    return T(x).gelu(approximate="none")


@op("FastGelu", domain=MS)
def fast_gelu(n, x, bias=None):
    x = T(x) if bias is None else T(x) + T(bias)
    return x.gelu(approximate="tanh")


@op("BiasGelu", domain=MS)
def bias_gelu(n, x, bias):
    return (T(x) + T(bias)).gelu(approximate="none")


@op("QuickGelu", domain=MS)
def quick_gelu(n, x):
    x = T(x)
    return x * (x * n.a("alpha", 1.702)).sigmoid()


@op("FusedMatMul", domain=MS)
def fused_matmul(n, a, b):
    a, b = T(a), T(b)
    if n.a("transA", 0):
        a = a.transpose(-1, -2)
    if n.a("transB", 0):
        b = b.transpose(-1, -2)
    return a.matmul(b) * n.a("alpha", 1.0)


def _layer_norm(x: Tensor, gamma, beta, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    m = x.mean(-1, keepdim=True)
    d = x - m
    inv = ((d * d).mean(-1, keepdim=True) + eps).rsqrt()
    y = d * inv * T(gamma)
    return (y + T(beta) if beta is not None else y), m, inv


@op("SkipLayerNormalization", domain=MS)
def skip_layer_norm(n, x, skip, gamma, beta=None, bias=None):
    s = T(x) + T(skip)
    if bias is not None:
        s = s + T(bias)
    y, m, inv = _layer_norm(s, gamma, beta, n.a("epsilon", 1e-12))
    return y, m, inv, s


@op("LayerNormalization", "SimplifiedLayerNormalization", domain=MS)
def layer_norm(n, x, gamma, beta=None):
    x = T(x)
    if n.op_type == "SimplifiedLayerNormalization":
        inv = ((x * x).mean(-1, keepdim=True) + n.a("epsilon", 1e-5)).rsqrt()
        return x * inv * T(gamma), inv
    return _layer_norm(x, gamma, beta, n.a("epsilon", 1e-5))


@op("Attention", domain=MS)
def attention(n, x, w, b=None, mask=None, past=None, bias=None):
    x = T(x)
    B, S, _ = x.shape
    heads = n.a("num_heads")
    qkv = x.matmul(T(w))
    if b is not None:
        qkv = qkv + T(b)
    sizes = n.a("qkv_hidden_sizes") or [qkv.shape[-1] // 3] * 3
    q, k, v = qkv.split(sizes, dim=-1)
    q, k, v = (t.reshape(B, S, heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
    scale = n.a("scale") or 1 / math.sqrt(q.shape[-1])
    scores = q.matmul(k.transpose(-1, -2)) * scale
    if mask is not None:
        m = T(mask)
        if m.ndim == 2:  # (B, S) 1 = attend, 0 = masked
            m = m.reshape(B, 1, 1, -1)
        scores = scores + (1 - m.float()) * -10000.0
    if n.a("unidirectional", 0):
        causal = Tensor.arange(S).reshape(1, S) <= Tensor.arange(S).reshape(S, 1)
        scores = causal.where(scores, -10000.0)
    y = scores.softmax(-1).matmul(v)
    return y.permute(0, 2, 1, 3).reshape(B, S, -1)
