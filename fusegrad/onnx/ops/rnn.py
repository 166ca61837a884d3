"""RNN, GRU and LSTM: the time loop is unrolled in Python (one lazy graph), each direction on its own."""

from __future__ import annotations

from fusegrad import Tensor
from fusegrad.onnx.registry import C, T, op


def _activation(name: str, alpha: float | None, beta: float | None):
    name = name.lower()
    table = {
        "sigmoid": Tensor.sigmoid,
        "tanh": Tensor.tanh,
        "relu": Tensor.relu,
        "softsign": Tensor.softsign,
        "softplus": lambda x: (x.exp() + 1).log(),
        "affine": lambda x: x * (1.0 if alpha is None else alpha) + (0.0 if beta is None else beta),
        "leakyrelu": lambda x: (x < 0).where(x * (0.01 if alpha is None else alpha), x),
        "thresholdedrelu": lambda x: (x > (1.0 if alpha is None else alpha)).where(x, 0),
        "scaledtanh": lambda x: (x * (1.0 if beta is None else beta)).tanh() * (1.0 if alpha is None else alpha),
        "hardsigmoid": lambda x: (x * (0.2 if alpha is None else alpha) + (0.5 if beta is None else beta)).clip(0, 1),
        "elu": lambda x: (x > 0).where(x, (x.exp() - 1) * (1.0 if alpha is None else alpha)),
    }
    if name not in table:
        raise NotImplementedError(f"RNN activation {name!r} is not supported")
    return table[name]


def _activations(n, defaults: list[str], dirs: int):
    names = n.a("activations") or defaults * dirs
    if len(names) == len(defaults):
        names = names * dirs
    alphas, betas = n.a("activation_alpha") or [], n.a("activation_beta") or []
    out, k = [], 0
    for i, name in enumerate(names):
        alpha = alphas[i] if i < len(alphas) else None
        beta = betas[i] if i < len(betas) else None
        out.append(_activation(name, alpha, beta))
        k += 1
    per = len(defaults)
    return [out[d * per : (d + 1) * per] for d in range(dirs)]


def _recurrent(n, x, w, r, b, lens, h0, c0, p, kind: str):
    x = T(x)
    layout = n.a("layout", 0)
    if layout:
        x = x.transpose(0, 1)
    S, B, _ = x.shape
    direction = n.a("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    H = n.a("hidden_size") or T(r).shape[-1]
    gates = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    acts = _activations(
        n, {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"], "lstm": ["Sigmoid", "Tanh", "Tanh"]}[kind], dirs
    )
    clip = n.a("clip")
    w, r = T(w), T(r)
    b = T(b) if b is not None else Tensor.zeros(dirs, 2 * gates * H, dtype=x.dtype)
    lens_np = C(lens).reshape(-1) if lens is not None else None
    mask = None
    if lens_np is not None and (lens_np != S).any():
        mask = Tensor(lens_np.astype("int32")).reshape(1, B) > Tensor.arange(S).reshape(S, 1)  # (S, B)
    h_init = T(h0) if h0 is not None else Tensor.zeros(dirs, B, H, dtype=x.dtype)
    c_init = T(c0) if c0 is not None else Tensor.zeros(dirs, B, H, dtype=x.dtype)
    if layout and h0 is not None:
        h_init = h_init.transpose(0, 1)
    if layout and c0 is not None:
        c_init = c_init.transpose(0, 1)
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        W, R = w[d], r[d]
        Wb, Rb = b[d][: gates * H], b[d][gates * H :]
        xw = x.matmul(W.T) + Wb  # (S, B, gates·H) computed for every step at once
        h, c = h_init[d], c_init[d]
        f, g, hh = (acts[d] + [None, None])[:3]
        out = [None] * S
        order = range(S - 1, -1, -1) if reverse else range(S)
        for t in order:
            pre = xw[t]
            if kind == "rnn":
                gi = pre + h.matmul(R.T) + Rb
                nh = f(gi.clip(-clip, clip) if clip else gi)
                nc = c
            elif kind == "gru":
                rz = pre[:, : 2 * H] + h.matmul(R[: 2 * H].T) + Rb[: 2 * H]
                rz = rz.clip(-clip, clip) if clip else rz
                z, rr = f(rz[:, :H]), f(rz[:, H:])
                if n.a("linear_before_reset", 0):
                    hc = pre[:, 2 * H :] + rr * (h.matmul(R[2 * H :].T) + Rb[2 * H :])
                else:
                    hc = pre[:, 2 * H :] + (rr * h).matmul(R[2 * H :].T) + Rb[2 * H :]
                hc = g(hc.clip(-clip, clip) if clip else hc)
                nh, nc = (1 - z) * hc + z * h, c
            else:
                gs = pre + h.matmul(R.T) + Rb
                gs = gs.clip(-clip, clip) if clip else gs
                gi, go, gf, gc = gs[:, :H], gs[:, H : 2 * H], gs[:, 2 * H : 3 * H], gs[:, 3 * H :]
                if p is not None:
                    P = T(p)[d]
                    gi, gf = gi + P[:H] * c, gf + P[2 * H :] * c
                i_, f_ = f(gi), f(gf)
                if n.a("input_forget", 0):
                    f_ = 1 - i_
                nc = f_ * c + i_ * g(gc)
                if p is not None:
                    go = go + T(p)[d][H : 2 * H] * nc
                nh = f(go) * hh(nc)
            if mask is not None:
                m = mask[t].reshape(B, 1)
                nh, nc = m.where(nh, h), m.where(nc, c)
                out[t] = m.where(nh, 0)
            else:
                out[t] = nh
            h, c = nh, nc
        ys.append(out[0].stack(*out[1:]) if S > 1 else out[0].unsqueeze(0))
        hs.append(h)
        cs.append(c)
    Y = ys[0].stack(*ys[1:], dim=1) if dirs > 1 else ys[0].unsqueeze(1)  # (S, dirs, B, H)
    Yh, Yc = (
        hs[0].stack(*hs[1:]) if dirs > 1 else hs[0].unsqueeze(0),
        cs[0].stack(*cs[1:]) if dirs > 1 else cs[0].unsqueeze(0),
    )
    if layout:
        Y, Yh, Yc = Y.permute(2, 0, 1, 3), Yh.transpose(0, 1), Yc.transpose(0, 1)
    res = (Y, Yh, Yc) if kind == "lstm" else (Y, Yh)
    return tuple(v.cast(x.dtype) for v in res)


@op("RNN")
def rnn(n, x, w, r, b=None, lens=None, h0=None):
    return _recurrent(n, x, w, r, b, lens, h0, None, None, "rnn")


@op("GRU")
def gru(n, x, w, r, b=None, lens=None, h0=None):
    return _recurrent(n, x, w, r, b, lens, h0, None, None, "gru")


@op("LSTM")
def lstm(n, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    return _recurrent(n, x, w, r, b, lens, h0, c0, p, "lstm")
