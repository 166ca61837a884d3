"""Random ops (seeded through Tensor.manual_seed), Attention, RotaryEmbedding, windows and MelWeightMatrix."""

from __future__ import annotations

import math

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.loader import onnx_dtype
from fusegrad.onnx.registry import C, T, dtype_of, ints, op


def _seeded(n):
    if n.a("seed") is not None:
        Tensor.manual_seed(int(n.a("seed")))


def _dt(n, like=None):
    if n.a("dtype") is not None:
        return onnx_dtype(n.a("dtype"), str(n))
    return dtype_of(like) if like is not None else dtypes.float32


@op("RandomUniform", "RandomUniformLike")
def random_uniform(n, like=None):
    _seeded(n)
    shape = tuple(like.shape) if like is not None else tuple(n.a("shape"))
    lo, hi = n.a("low", 0.0), n.a("high", 1.0)
    return (Tensor.rand(*shape) * (hi - lo) + lo).cast(_dt(n, like))


@op("RandomNormal", "RandomNormalLike")
def random_normal(n, like=None):
    _seeded(n)
    shape = tuple(like.shape) if like is not None else tuple(n.a("shape"))
    return (Tensor.randn(*shape) * n.a("scale", 1.0) + n.a("mean", 0.0)).cast(_dt(n, like))


@op("Bernoulli")
def bernoulli(n, p):
    _seeded(n)
    p = T(p)
    return (Tensor.rand(*p.shape) < p).cast(_dt(n, p))


@op("Multinomial")
def multinomial(n, x):
    _seeded(n)
    probs = T(x).exp()
    dt = onnx_dtype(n.a("dtype"), str(n)) if n.a("dtype") is not None else dtypes.int32
    return probs.multinomial(n.a("sample_size", 1), replacement=True).cast(dt)


def _heads(x: Tensor, h: int) -> Tensor:
    """(B, S, h·D) → (B, h, S, D); a 4-D input is already (B, H, S, D)."""
    if x.ndim == 4:
        return x
    B, S, _ = x.shape
    return x.reshape(B, S, h, -1).permute(0, 2, 1, 3)


@op("Attention")
def attention(n, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
    q3 = T(q).ndim == 3
    q = _heads(T(q), n.a("q_num_heads", 0))
    k = _heads(T(k), n.a("kv_num_heads", 0))
    v = _heads(T(v), n.a("kv_num_heads", 0))
    if past_k is not None:
        k = T(past_k).cat(k, dim=2)
    if past_v is not None:
        v = T(past_v).cat(v, dim=2)
    present_k, present_v = k, v
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
    scale = n.a("scale") or 1 / math.sqrt(q.shape[-1])
    acc = dtypes.float32 if q.dtype != dtypes.float64 else q.dtype
    qk = (q.cast(acc) * math.sqrt(scale)).matmul((k.cast(acc) * math.sqrt(scale)).transpose(-1, -2))
    raw = qk
    S, L = q.shape[2], k.shape[2]
    bias = None
    if mask is not None:
        m = T(mask)
        if m.shape[-1] < L:
            fill = False if m.dtype == dtypes.bool else -np.inf
            m = m.pad(((0, 0),) * (m.ndim - 1) + ((0, L - m.shape[-1]),), value=fill)
        bias = m.where(0.0, -np.inf) if m.dtype == dtypes.bool else m.cast(acc)
    B = q.shape[0]
    key = Tensor.arange(L).reshape(1, 1, 1, L)
    # the absolute position of each query: after the past keys, or at the end of each sample's valid keys
    if nonpad is not None:
        valid = T(nonpad).cast(dtypes.int32).reshape(B, 1, 1, 1)
        pos = Tensor.arange(S).reshape(1, 1, S, 1) + valid - S
        keep = key < valid
    else:
        pos = Tensor.arange(S).reshape(1, 1, S, 1) + (T(past_k).shape[2] if past_k is not None else 0)
        keep = None
    left, right = n.a("left_window_size", -1), n.a("right_window_size", -1)
    if n.a("is_causal", 0):
        right = 0
    for ok in ((key <= pos + right) if right >= 0 else None, (key >= pos - left) if left >= 0 else None):
        if ok is not None:
            keep = ok if keep is None else keep & ok
    if keep is not None:
        allowed = keep.where(0.0, -np.inf)
        bias = allowed if bias is None else bias + allowed
    cap = n.a("softcap", 0.0)
    # the softcap bounds the scores before the mask is added, so a -inf mask stays -inf
    soft = raw if not cap else (raw / cap).tanh() * cap
    capped = soft if bias is None else soft + bias
    p = capped.softmax(-1)
    p = p.isnan().where(0, p)  # a fully masked row attends to nothing
    y = p.matmul(v.cast(acc)).cast(T(v).dtype)
    if q3:
        B, H, S_, D = y.shape
        y = y.permute(0, 2, 1, 3).reshape(B, S_, H * D)
    mode = n.a("qk_matmul_output_mode", 0)
    # modes: 0 the raw scores, 1 after the softcap (no mask), 2 softcap and mask, 3 the softmax
    qk_out = [raw, soft, capped, p][mode].cast(T(v).dtype)
    return y, present_k, present_v, qk_out


@op("RotaryEmbedding")
def rotary_embedding(n, x, cos, sin, pos=None):
    x = T(x)
    four = x.ndim == 4
    if four:
        xs = x.permute(0, 2, 1, 3)
    else:
        B, S, Hd = x.shape
        xs = x.reshape(B, S, n.a("num_heads"), -1)
    cos, sin = T(cos), T(sin)
    if pos is not None:
        p = T(pos).cast(dtypes.int32)
        cos, sin = cos[p], sin[p]
    D = xs.shape[-1]
    rd = n.a("rotary_embedding_dim", 0) or D
    cos, sin = cos[..., : rd // 2].unsqueeze(2), sin[..., : rd // 2].unsqueeze(2)
    rot, rest = xs[..., :rd], xs[..., rd:]
    if n.a("interleaved", 0):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = (x1 * cos - x2 * sin).unsqueeze(-1).cat((x2 * cos + x1 * sin).unsqueeze(-1), dim=-1).reshape(rot.shape)
    else:
        x1, x2 = rot[..., : rd // 2], rot[..., rd // 2 :]
        out = (x1 * cos - x2 * sin).cat(x2 * cos + x1 * sin, dim=-1)
    y = out.cat(rest, dim=-1) if rd < D else out
    return y.permute(0, 2, 1, 3) if four else y.reshape(x.shape)


def _window(n, size, fn):
    N = int(C(size).reshape(-1)[0])
    dt = onnx_dtype(n.a("output_datatype", 1), str(n))
    denom = N - 1 if not n.a("periodic", 1) else N
    k = np.arange(N, dtype=np.float64)
    return Tensor(fn(k, max(denom, 1)).astype(np.float32)).cast(dt) if N else Tensor.empty(0, dtype=dt)


@op("HannWindow")
def hann_window(n, size):
    return _window(n, size, lambda k, d: 0.5 - 0.5 * np.cos(2 * np.pi * k / d))


@op("HammingWindow")
def hamming_window(n, size):
    return _window(n, size, lambda k, d: 25 / 46 - 21 / 46 * np.cos(2 * np.pi * k / d))


@op("BlackmanWindow")
def blackman_window(n, size):
    return _window(n, size, lambda k, d: 0.42 - 0.5 * np.cos(2 * np.pi * k / d) + 0.08 * np.cos(4 * np.pi * k / d))


def _mel(hz):
    return 2595 * np.log10(1 + hz / 700)


@op("MelWeightMatrix")
def mel_weight_matrix(n, num_mel_bins, dft_length, sample_rate, lower_hz, upper_hz):
    """(dft_length // 2 + 1, num_mel_bins) triangles with peak 1, on whole spectrogram bins. The edges are
    (upper - lower) / (num_mel_bins + 2) apart in mel and a frequency f falls in bin floor((dft_length + 1)·f /
    sample_rate): the spacing and rounding the backend case's expected matrix pins down."""
    mels, dft, rate = int(C(num_mel_bins)), int(C(dft_length)), float(C(sample_rate))
    lo, hi = _mel(float(C(lower_hz))), _mel(float(C(upper_hz)))
    edges_mel = lo + (hi - lo) / (mels + 2) * np.arange(mels + 2)
    edges_hz = 700 * (10 ** (edges_mel / 2595) - 1)
    bins = np.floor((dft + 1) * edges_hz / rate).astype(np.int64)
    spec = dft // 2 + 1
    W = np.zeros((spec, mels))
    j = np.arange(spec)
    for i in range(mels):
        lo_b, mid, up = bins[i], bins[i + 1], bins[i + 2]
        rise = (j - lo_b) / max(mid - lo_b, 1)
        fall = (up - j) / max(up - mid, 1)
        W[:, i] = np.where((j >= lo_b) & (j < mid), rise, np.where((j > mid) & (j <= up), fall, 0.0))
        if mid < spec:
            W[mid, i] = 1.0
    return Tensor(W.astype(np.float32)).cast(onnx_dtype(n.a("output_datatype", 1), str(n)))


@op("Adagrad", domain="ai.onnx.preview.training")
def adagrad(n, r, t, *xs):
    half = len(xs) // 3
    ws, gs, hs = xs[:half], xs[half : 2 * half], xs[2 * half :]
    lr = T(r) / (T(t).cast(dtypes.float32) * n.a("decay_factor", 0.0) + 1)
    eps, norm = n.a("epsilon", 0.0), n.a("norm_coefficient", 0.0)
    new_w, new_h = [], []
    for w, g, h in zip(ws, gs, hs):
        g = T(g) + T(w) * norm
        h2 = T(h) + g * g
        new_w.append((T(w) - lr * g / (h2.sqrt() + eps)).cast(T(w).dtype))
        new_h.append(h2.cast(T(h).dtype))
    return tuple(new_w + new_h)


@op("Momentum", domain="ai.onnx.preview.training")
def momentum(n, r, t, *xs):
    half = len(xs) // 3
    ws, gs, vs = xs[:half], xs[half : 2 * half], xs[2 * half :]
    alpha, beta, norm, mode = n.a("alpha"), n.a("beta"), n.a("norm_coefficient"), n.a("mode")
    first = int(C(t).reshape(-1)[0]) == 0
    new_w, new_v = [], []
    for w, g, v in zip(ws, gs, vs):
        g = T(g) + T(w) * norm
        v2 = T(v) * alpha + g * (1.0 if first else beta)
        w2 = T(w) - T(r) * v2 if mode == "standard" else T(w) - T(r) * (g + v2 * alpha)
        new_w.append(w2.cast(T(w).dtype))
        new_v.append(v2.cast(T(v).dtype))
    return tuple(new_w + new_v)


@op("Adam", domain="ai.onnx.preview.training")
def adam(n, r, t, *xs):
    q = len(xs) // 4
    ws, gs, vs, hs = xs[:q], xs[q : 2 * q], xs[2 * q : 3 * q], xs[3 * q :]
    a, b, eps = n.a("alpha", 0.9), n.a("beta", 0.999), n.a("epsilon", 0.0)
    norm, norm_post = n.a("norm_coefficient", 0.0), n.a("norm_coefficient_post", 0.0)
    step = int(C(t).reshape(-1)[0])
    r_ = float(C(r).reshape(-1)[0])
    lr = r_ * np.sqrt(1 - b**step) / (1 - a**step) if step > 0 else r_
    out_w, out_v, out_h = [], [], []
    for w, g, v, h in zip(ws, gs, vs, hs):
        w_t = T(w)
        g = T(g) + w_t * norm
        v2 = T(v) * a + g * (1 - a)
        h2 = T(h) * b + g * g * (1 - b)
        w2 = w_t - v2 / (h2.sqrt() + eps) * float(lr)
        w2 = w2 - w2 * norm_post
        out_w.append(w2.cast(w_t.dtype))
        out_v.append(v2.cast(T(v).dtype))
        out_h.append(h2.cast(T(h).dtype))
    return tuple(out_w + out_v + out_h)


@op("AffineGrid")
def affine_grid(n, theta, size):
    theta = T(theta)
    dims = ints(size)
    N, spatial = dims[0], dims[2:]
    align = bool(n.a("align_corners", 0))
    axes = []
    for s in spatial:
        a = np.arange(s, dtype=np.float64)
        a = (2 * a / (s - 1) - 1) if align else ((2 * a + 1) / s - 1) if s > 1 or not align else np.zeros(1)
        axes.append(a if s > 1 else np.zeros(1) if align else a)
    mesh = np.meshgrid(*axes, indexing="ij")  # order (D,) H, W
    coords = [m.reshape(-1) for m in mesh[::-1]]  # x (W) first, as ONNX lists them
    base = np.stack(coords + [np.ones_like(coords[0])], -1).astype(np.float32)  # (P, nd+1)
    grid = Tensor(base).cast(theta.dtype).unsqueeze(0).matmul(theta.transpose(1, 2))  # (N, P, nd)
    return grid.reshape(N, *spatial, len(spatial))


def _steps_of(steps, node):
    """The step list of the (sub)graph that holds `node` (`steps` or one below it, searched through every subgraph
    attribute)."""
    for st in steps:
        if st.node is node:
            return steps
        for v in st.node.attrs.values():
            if hasattr(v, "steps") and (found := _steps_of(v.steps, node)) is not None:
                return found
    return None


def _path_to(steps, y: str, leaves: set[str]) -> list:
    """The steps that compute y from the leaves (and outer values), in their graph order."""
    producer = {o: i for i, st in enumerate(steps) for o in st.outputs if o}
    need, todo = set(), [y]
    while todo:
        name = todo.pop()
        i = producer.get(name)
        if name in leaves or i is None or i in need:
            continue
        need.add(i)
        todo.extend(x for x in steps[i].inputs if x)
    return [steps[i] for i in sorted(need)]


@op("Gradient", domain="ai.onnx.preview.training")
def gradient(n, *values):
    """d y / d x for each x of `xs`: the subgraph from xs and zs to y is run again on this node's inputs (the point
    where the gradient is taken), then differentiated; a non-scalar y is seeded with ones (the gradient of its sum)."""
    xs, zs, y = list(n.a("xs")), list(n.a("zs") or []), n.a("y")  # names: the loader decodes string attributes
    # the runner's graph, or the unfolded one it runs when a feed overrides an initializer
    steps = _steps_of(n.runner.graph.steps, n) or _steps_of(n.runner.all_steps(), n)
    if steps is None:
        raise NotImplementedError(f"{n}: Gradient outside the graph the runner holds is not supported")
    env = dict(n.env)
    leaves = {}
    for name, v in zip(xs + zs, values):
        leaves[name] = T(v)
        env[name] = leaves[name]
    out = T(n.runner.run_steps(_path_to(steps, y, set(leaves)), [y], env)[0])
    seed = None if out.ndim == 0 else out.ones_like()
    return tuple(out.gradient(*[leaves[x] for x in xs], gradient=seed))
