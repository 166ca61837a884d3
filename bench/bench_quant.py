"""Decode-shaped quantized matvec against float matvecs of the same shape, measured in one process:
`python bench/bench_quant.py [Q8_0,Q4_0,...] [rows cols ...]`.

fusegrad runs x (1, cols) @ W.T with W a QuantizedMatrix (its planes, dequantized inside the one kernel), captured
by TinyJit as a decode step is; numpy and torch (on as many threads) run the same matvec on the dequantized float32
weight, which reads 4 bytes per weight where the quantized one reads 0.5-1.1. The cases run interleaved in rounds
(a change in the machine's load touches them alike); each figure is a median, the ratio reference / fusegrad
(>1 means fusegrad is faster), GB/s counts the quantized bytes fusegrad reads. Where the target has integer dot
products (Q8_0 and Q4_K on a VNNI CPU, or on AVX2 with the 8-bit values held in int16) fusegrad's matvec quantizes
x to 8 bits per block; "float path" is the same matrix multiplied in float (QUANT_DOT=0), and "vs float" its time
over the default's (>1: the default is faster)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "models"))  # the random block maker

from fusegrad import Tensor, TinyJit  # noqa: E402
from fusegrad.helpers import NUM_CPU_THREADS  # noqa: E402
from fusegrad.nn.quantized import GGMLQuantized, QuantizedMatrix  # noqa: E402

SHAPES = ((3072, 768), (768, 3072), (2048, 768), (768, 2048))  # (rows, cols): a 768-wide model's q/ffn matmuls


def interleaved_medians(fns, rounds: int = 9, per_round: int = 5) -> list[float]:
    """Median seconds per call of each fn; a round runs each fn per_round times in turn (the first call of a turn
    is not counted: the other library's threads may still be spinning)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            for k in range(per_round + 1):
                st = time.perf_counter()
                fn()
                if k:
                    times[i].append(time.perf_counter() - st)
    return [statistics.median(t) for t in times]


def bench(qtype: str, rows: int, cols: int) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import GGML_QUANT_SIZES
    from gguf_models import _stored

    qt = GGMLQuantizationType[qtype]
    rng = np.random.default_rng(0)
    raw, meant = _stored(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, qt, rng)
    blocks = Tensor(raw.reshape(-1, GGML_QUANT_SIZES[qt][1])).realize()
    matrix = QuantizedMatrix.from_ggml(GGMLQuantized("w", int(qt), (rows, cols), blocks))
    xn = rng.standard_normal((1, cols)).astype(np.float32)
    x = Tensor(xn).realize()
    floats = QuantizedMatrix.from_ggml(GGMLQuantized("w", int(qt), (rows, cols), blocks), int8=False)
    step = TinyJit(lambda x: matrix.matvec(x).realize())
    float_step = TinyJit(lambda x: floats.matvec(x).realize())
    for _ in range(3):
        got = step(x).numpy()
        float_step(x)
    want = xn.astype(np.float64) @ meant.T.astype(np.float64)
    err = np.abs(got - want).max() / np.abs(want).max()
    wt, xt = torch.from_numpy(meant.copy()), torch.from_numpy(xn)
    ours, t_float, t_np, t_torch = interleaved_medians(
        [lambda: step(x), lambda: float_step(x), lambda: xn @ meant.T, lambda: xt @ wt.T]
    )
    print(
        f"{qtype:5s} 1x{cols:<5d}@ {cols}x{rows:<6d} {ours * 1e6:8.0f} us {matrix.nbytes() / ours / 1e9:6.2f} GB/s"
        f" {t_float * 1e6:8.0f} us {t_float / ours:6.2f}x"
        f" {t_np * 1e6:8.0f} us {t_torch * 1e6:8.0f} us {t_np / ours:6.2f}x {t_torch / ours:6.2f}x  rel err {err:.1e}",
        flush=True,
    )


def main() -> None:
    torch.set_num_threads(int(NUM_CPU_THREADS.value))
    qtypes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["Q8_0", "Q4_0", "Q4_K", "Q6_K"]
    dims = [int(a) for a in sys.argv[2:]]
    shapes = list(zip(dims[::2], dims[1::2])) or SHAPES
    print(f"threads: {NUM_CPU_THREADS.value}")
    print(
        f"{'case':28s} {'fusegrad':>11s} {'':>11s} {'float path':>11s} {'vs float':>8s} {'numpy':>11s} {'torch':>11s}"
        f" {'vs np':>7s} {'vs torch':>7s}"
    )
    for qtype in qtypes:
        for rows, cols in shapes:
            bench(qtype, rows, cols)


if __name__ == "__main__":
    main()
