"""Per-kernel times of an ONNX model's TinyJit replay: `python bench/bench_onnx_kernels.py MODEL [--replays N]`.

MODEL: a light model's name, or bert for bench_onnx.py's encoder. Each kernel's time is the C runner's clock around
its launch inside the replay's batch (fusegrad.profile()), the minimum over N replays; prints the sum of those
minimums, onnxruntime's median time (2 threads) over the same number of runs interleaved with the replays, and the
kernels taking the most time with their GFLOPS (--top K)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


from fusegrad import Tensor, TinyJit, profile
from fusegrad.onnx import OnnxRunner
from fusegrad.viz.trace import LAUNCH

sys.path.insert(0, os.path.dirname(__file__))
from bench_onnx import load  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    folder = tempfile.mkdtemp()
    model, feeds, sess = load(args.model, folder)  # bert: bench_onnx.py's BERT-style encoder
    runner, names = OnnxRunner(model), list(feeds)
    step = TinyJit(lambda *xs: [t.realize() for t in runner(dict(zip(names, xs))).values()])
    xs = [Tensor(v).realize() for v in feeds.values()]
    for _ in range(3):
        step(*xs)
    per_launch: list[list[float]] = []
    ort_ms: list[float] = []
    with tempfile.TemporaryDirectory() as folder, profile(os.path.join(folder, "t.json")) as session:
        for _ in range(args.replays):
            st = time.perf_counter()
            sess.run(None, feeds)
            ort_ms.append((time.perf_counter() - st) * 1e3)
            start = len(session.events)
            step(*xs)
            launches = [e for e in session.events[start:] if e[0] == LAUNCH]
            per_launch.append([(e[4] - e[3]) * 1e3 for e in launches])
            meta = [(e[1], e[6]) for e in launches]
    mins = [min(ts) for ts in zip(*per_launch)]
    print(
        f"{args.model}: {len(mins)} kernels, sum of per-kernel min {sum(mins):.2f} ms over {args.replays} replays; "
        f"onnxruntime median {statistics.median(ort_ms):.2f} ms"
    )
    for i in sorted(range(len(mins)), key=lambda i: -mins[i])[: args.top]:
        name, a = meta[i]
        gflops = a.get("ops", 0) / (mins[i] * 1e-3) / 1e9 if mins[i] else 0.0
        print(f"  {i:4d} {name:40s} {mins[i] * 1e3:9.1f} us {gflops:7.1f} GFLOPS {a.get('bytes', 0) / 1e6:7.2f} MB")


if __name__ == "__main__":
    main()
