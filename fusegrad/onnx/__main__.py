"""python -m fusegrad.onnx MODEL.onnx [--input name=file.npy ...] [--bench N]: prints each output's shape and dtype,
or the median time of N runs. Inputs not given are filled with zeros of the shape the model declares."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import to_numpy_dtype
from fusegrad.onnx import OnnxRunner


def _inputs(runner: OnnxRunner, given: list[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--input {item!r}: expected name=file.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ValueError(f"--input {name}: cannot read {path!r} as a .npy file ({e})") from None
    unknown = [k for k in feeds if k not in runner.input_specs]
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; the model takes {runner.required}")
    for name in runner.required:
        if name in feeds:
            continue
        spec = runner.input_specs[name]
        if spec.dims is None or any(not isinstance(d, int) or d <= 0 for d in spec.dims):
            raise ValueError(f"input {name!r} has shape {spec.dims} with free dims: give it with --input {name}=x.npy")
        feeds[name] = np.zeros(spec.dims, dtype=to_numpy_dtype(spec.dtype))
    return feeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusegrad.onnx", description="Run an ONNX model on fusegrad")
    ap.add_argument("model", help="path to the .onnx file")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input from a .npy file")
    ap.add_argument("--bench", type=int, default=0, metavar="N", help="time N runs and print the median")
    args = ap.parse_args(argv)
    if args.bench < 0:
        ap.error(f"--bench must be at least 0, got {args.bench}")
    try:
        runner = OnnxRunner(args.model)
        feeds = _inputs(runner, args.input)
        outs = runner(feeds)
        Tensor.realize(*[t for t in outs.values() if isinstance(t, Tensor)])
    except (ValueError, NotImplementedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for name, t in outs.items():
        if isinstance(t, list):
            print(f"{name}: sequence of {len(t)}: " + ", ".join(f"shape={tuple(x.shape)} dtype={x.dtype}" for x in t))
        else:
            print(f"{name}: shape={tuple(t.shape)} dtype={t.dtype}")
    if args.bench:
        times = []
        for _ in range(args.bench):
            st = time.perf_counter()
            outs = runner(feeds)
            Tensor.realize(*[t for t in outs.values() if isinstance(t, Tensor)])
            for t in outs.values():
                for x in t if isinstance(t, list) else [t]:
                    x.numpy()
            times.append(time.perf_counter() - st)
        print(f"median of {args.bench} runs: {np.median(times) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
