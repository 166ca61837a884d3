"""ONNX models on fusegrad against onnxruntime (2 threads): median latency per batch and kernels per run.

python bench/bench_onnx.py [--runs N] [--block B] [--interleaved] [--models resnet50,squeezenet,...,bert]
                           [--threads T] [--best]

The models are ONNX's "light" copies of the classic vision nets (real architectures, small random weights) that ship
inside the onnx package, each with its declared input shape filled with a fixed ramp, and a BERT-style encoder
(transformers' BertModel, random weights, 4 layers of width 256, 128 tokens) exported with torch.onnx.export.

The plain call is what a user writes, `runner(feeds)`: from the second call with the same input shapes it replays the
kernels the runner captured (docs/onnx.md); the kernel count is a call's with ONNX_REPLAY=0 (the model's own kernels).
The TinyJit column wraps the call in the user's own TinyJit.

Each engine (onnxruntime, a plain fusegrad call, fusegrad under TinyJit) runs in blocks: a pause of SETTLE_S, one
untimed warm-up call, then B timed calls back to back; N rounds alternate the three blocks (a shared machine's load
moves all of them alike) and each engine's time is the median of its N * B calls. A user runs one engine, not two in
turn: onnxruntime's intra-op pool keeps a thread spinning after each run (its default
`session.intra_op.allow_spinning`: about 35 ms of the process's CPU time in the 50 ms after a run while the caller
sleeps), holding the second core, so a fusegrad call started right after an onnxruntime run gets one core (squeezenet
under TinyJit, medians: 6.4 ms back to back, 9.8 ms right after each onnxruntime run, 6.5 ms right after a session set
not to spin). onnxruntime keeps its default settings here. --interleaved times the three one call each per round,
no pause, no warm-up (the old way, which charged that spin to fusegrad).

On a machine other work shares, `--threads 1 --best` compares what each engine does with one core: both run on one
thread (onnxruntime's intra-op pool and fusegrad's NUM_CPU_THREADS) and each reports its fastest call instead of the
median, which load on the other core moves least."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

from fusegrad import GlobalCounters, Tensor, TinyJit
from fusegrad.helpers import Context
from fusegrad.onnx import OnnxRunner

# the pause before each block: longer than onnxruntime's pool spins after a run (about 35 ms)
SETTLE_S = 0.1
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _bert(folder: str) -> tuple[str, dict[str, np.ndarray]]:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "onnx"))
    from bert_export import export_bert

    path = os.path.join(folder, "bert.onnx")
    export_bert(path, hidden=256, layers=4, seq=128)
    ids = np.random.default_rng(0).integers(0, 1000, (1, 128)).astype(np.int64)
    return path, {"input_ids": ids, "attention_mask": np.ones((1, 128), np.int64)}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for v in model.graph.input:
        if v.name in inits:
            continue
        shape = [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
        feeds[v.name] = (np.arange(int(np.prod(shape))) / np.prod(shape)).astype(np.float32).reshape(shape)
    return feeds


def _times_ms(fns, runs: int, block: int, best: bool = False) -> list[float]:
    """Each fn's median (best: fastest) time over `runs` rounds of a block each: a pause of SETTLE_S, one warm-up
    call, then `block` timed calls (block 0: the fns interleaved one timed call each, no pause, no warm-up)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times):
            if block:
                time.sleep(SETTLE_S)  # the engine before goes idle (onnxruntime's pool stops spinning)
                fn()
            for _ in range(max(block, 1)):
                st = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - st)
    return [(min(ts) if best else statistics.median(ts)) * 1e3 for ts in times]


def load(name: str, folder: str, threads: int = 2):
    """(model, its feeds, an onnxruntime session on `threads` threads) of a light model or "bert" (exported into
    folder)."""
    if name == "bert":
        path, feeds = _bert(folder)
        model = onnx.load(path)
    else:
        path = os.path.join(LIGHT, f"light_{name}.onnx")
        model = onnx.load(path)
        feeds = _feeds(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return model, feeds, ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def bench(name: str, runs: int, block: int, folder: str, threads: int = 2, best: bool = False) -> None:
    model, feeds, sess = load(name, folder, threads)
    runner = OnnxRunner(model)
    names = list(feeds)

    def fg():
        return [t.numpy() for t in runner(feeds).values()]

    # fixed input shapes: the runner's call replays under TinyJit (captured on the second call)
    step = TinyJit(lambda *xs: [t.realize() for t in runner(dict(zip(names, xs))).values()])

    def fg_jit():
        return [t.numpy() for t in step(*[Tensor(v) for v in feeds.values()])]

    ref, got = sess.run(None, feeds), fg()  # the first call compiles
    err = max(float(np.abs(a - b).max()) for a, b in zip(ref, got))
    with Context(ONNX_REPLAY=0):
        GlobalCounters.reset()
        fg()
        kernels = GlobalCounters.kernel_count
    for _ in range(3):
        jit_out = fg_jit()
    err_jit = max(float(np.abs(a - b).max()) for a, b in zip(ref, jit_out))
    t_ort, t_fg, t_jit = _times_ms([lambda: sess.run(None, feeds), fg, fg_jit], runs, block, best)
    print(
        f"{name:14s} onnxruntime {t_ort:8.2f} ms | fusegrad {t_fg:9.2f} ms ({t_ort / t_fg:4.2f}x) | "
        f"TinyJit {t_jit:9.2f} ms ({t_ort / t_jit:4.2f}x) | kernels {kernels:4d} | max|diff| {max(err, err_jit):.1e}",
        flush=True,
    )


def main() -> None:
    names = sorted(f[len("light_") : -len(".onnx")] for f in os.listdir(LIGHT) if f.endswith(".onnx")) + ["bert"]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds")
    ap.add_argument("--block", type=int, default=5, help="timed calls per engine per round, after a warm-up call")
    ap.add_argument("--interleaved", action="store_true", help="one call per engine per round, no warm-up (old way)")
    ap.add_argument("--models", default=",".join(names), help=f"comma-separated, from {names}")
    ap.add_argument("--threads", type=int, default=2, help="threads of each engine")
    ap.add_argument("--best", action="store_true", help="each engine's fastest call instead of its median")
    args = ap.parse_args()
    chosen = args.models.split(",")
    if args.block < 1:
        raise SystemExit(f"--block must be at least 1, got {args.block}")
    for name in chosen:
        if name not in names:
            raise SystemExit(f"unknown model {name!r}; choose from {names}")
    if args.threads < 1:
        raise SystemExit(f"--threads must be at least 1, got {args.threads}")
    with tempfile.TemporaryDirectory() as folder, Context(NUM_CPU_THREADS=args.threads):
        for name in chosen:
            bench(name, args.runs, 0 if args.interleaved else args.block, folder, args.threads, args.best)


if __name__ == "__main__":
    main()
