"""Where a LLaMA prefill's time goes, kernel by kernel: `python bench/bench_prefill_kernels.py [FORMAT] [TOKENS] [RUNS]`
(defaults Q8_0 512 5) prefills bench_models.py's ~100M random LLaMA (written as a GGUF of FORMAT: F32, Q8_0, Q4_K)
RUNS times under DEBUG=2 after two warm-ups, takes each launch's fastest time over the runs (the launches of one
prefill come in the same order every time), and prints the sum per kernel name, largest first. Run it with
NUM_CPU_THREADS=1: the per-launch minima then barely move with the machine's load."""

from __future__ import annotations

import collections
import contextlib
import io
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "models"))  # the GGUF model maker

from bench_models import LLAMA_SHAPE  # noqa: E402  (this script's folder is on the path)
from fusegrad import Context  # noqa: E402
from fusegrad.models.generate import prefill  # noqa: E402
from fusegrad.models.llama import Llama  # noqa: E402

LAUNCH = re.compile(r"\s*JIT (\S+)\s+arg\s+\d+ tm\s+([\d.]+)(us|ms)")


def launch_times(model: Llama, prompt: list[int]) -> list[tuple[str, float]]:
    """(kernel name, microseconds) of each replayed launch of one prefill, from DEBUG=2's lines."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), Context(DEBUG=2):
        model.reset()
        prefill(model, prompt)
    found = (LAUNCH.match(line) for line in out.getvalue().splitlines())
    return [(m.group(1), float(m.group(2)) * (1000 if m.group(3) == "ms" else 1)) for m in found if m]


def main(fmt: str, tokens: int, runs: int) -> None:
    from gguf_models import make_model, write_gguf

    ref = make_model("llama", std=0.02, **LLAMA_SHAPE)
    with tempfile.TemporaryDirectory() as d:
        write_gguf(ref, "llama", Path(d) / "m.gguf", fmt)
        model, _ = Llama.from_gguf(Path(d) / "m.gguf", progress=False)
    prompt = np.random.default_rng(0).integers(0, LLAMA_SHAPE["vocab_size"], tokens).tolist()
    for _ in range(2):
        model.reset()
        prefill(model, prompt)
    each = [launch_times(model, prompt) for _ in range(runs)]
    if len({len(r) for r in each}) != 1:
        sys.exit(f"the runs launched different kernel counts: {[len(r) for r in each]}")
    total: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for i, (name, _) in enumerate(each[0]):
        total[name] += min(r[i][1] for r in each)
        count[name] += 1
    whole = sum(total.values())
    print(f"{fmt} prefill of {tokens} tokens: {len(each[0])} launches, sum of per-launch minima {whole / 1e3:.1f} ms")
    for name, us in total.most_common():
        print(f"{us / 1e3:9.2f} ms {us / whole * 100:5.1f} % x{count[name]:4d}  {name}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "Q8_0", int(args[1]) if len(args) > 1 else 512, int(args[2]) if len(args) > 2 else 5)
