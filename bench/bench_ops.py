"""Common tensor ops on a 2048x1024 float32 input against torch CPU (2 threads), in one process:
`python bench/bench_ops.py`.

Each op is timed as users write it: fusegrad builds the op and realizes it into an existing output (`assign`: an
identical expression would be served from the realized cache), torch returns a fresh tensor. Both are timed in turns,
medians of rounds of 9 calls; the last column is torch's time over fusegrad's (above 1: fusegrad is faster)."""

from __future__ import annotations
import statistics
import time
import numpy as np
import torch
import torch.nn.functional as F
from fusegrad import Tensor
from fusegrad.helpers import NUM_CPU_THREADS

ROWS, COLS = 2048, 1024


def cases() -> dict:
    rng = np.random.default_rng(0)
    xn = rng.standard_normal((ROWS, COLS), dtype=np.float32)
    pn = np.abs(xn) + 0.1
    labels = rng.integers(0, COLS, ROWS)
    x, p, y = Tensor(xn).realize(), Tensor(pn).realize(), Tensor(labels.astype(np.int32)).realize()
    xt, pt, yt = torch.from_numpy(xn), torch.from_numpy(pn), torch.from_numpy(labels)
    return {
        "exp": (lambda: x.exp(), lambda: xt.exp()),
        "log": (lambda: p.log(), lambda: pt.log()),
        "sigmoid": (lambda: x.sigmoid(), lambda: xt.sigmoid()),
        "silu": (lambda: x.silu(), lambda: F.silu(xt)),
        "gelu (tanh)": (lambda: x.gelu(), lambda: F.gelu(xt, approximate="tanh")),
        "softmax(1)": (lambda: x.softmax(1), lambda: xt.softmax(1)),
        "log_softmax(1)": (lambda: x.log_softmax(1), lambda: xt.log_softmax(1)),
        "cross entropy": (lambda: x.sparse_categorical_crossentropy(y), lambda: F.cross_entropy(xt, yt)),
        "layernorm": (lambda: x.layernorm(), lambda: F.layer_norm(xt, (COLS,))),
        "max(1)": (lambda: x.max(1), lambda: xt.amax(1)),
        "max(0)": (lambda: x.max(0), lambda: xt.amax(0)),
        "max()": (lambda: x.max(), lambda: xt.max()),
        "sum(1)": (lambda: x.sum(1), lambda: xt.sum(1)),
        "argmax(1)": (lambda: x.argmax(1), lambda: xt.argmax(1)),
        "cumsum(1)": (lambda: x.cumsum(1), lambda: xt.cumsum(1)),
        ".T.contiguous()": (lambda: x.T.contiguous(), lambda: xt.T.contiguous()),
    }


def median_time(fn, rounds: int = 5, calls: int = 9) -> float:
    fn()
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(calls):
            st = time.perf_counter()
            fn()
            times.append(time.perf_counter() - st)
        medians.append(statistics.median(times))
    return statistics.median(medians)


def main() -> None:
    torch.set_num_threads(int(NUM_CPU_THREADS.value))
    print(f"{'op, 2048x1024 float32':24s} {'fusegrad':>10s} {'torch':>10s} {'torch / fusegrad':>17s}")
    for name, (fg_op, torch_op) in cases().items():
        first = fg_op()
        out = Tensor.empty(*first.shape, dtype=first.dtype).realize()
        fg = median_time(lambda fg_op=fg_op, out=out: out.assign(fg_op()).realize())
        th = median_time(torch_op)
        print(f"{name:24s} {fg * 1e6:8.0f}us {th * 1e6:8.0f}us {th / fg:16.2f}x")


if __name__ == "__main__":
    main()
