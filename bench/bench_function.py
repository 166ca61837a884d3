"""What @function saves in GPT-2, measured in one process: `python bench/bench_function.py`.

GPT-2-shaped blocks (n_embd 768, 12 heads; a small vocabulary, which no block reads) run an eager prefill of a
CHUNK-token chunk (no TinyJit: every call runs the Python of the step) with the block parts as @functions and as
the plain functions they wrap, taking turns; prints the median time per layer of each, the median time of
building one MLP residual's graph (the Python a call replays instead of running), transformers' GPT2Model (torch
eager, no_grad, 1 thread) per layer as the peer, and the kernels compiled by a 1- and a 12-layer forward from empty
caches, with and without @function. `LAYERS` (default 12), `CHUNK` (32) and `RUNS` (7) change the sizes."""

from __future__ import annotations
import os
import statistics
import time
from contextlib import contextmanager
import numpy as np
from fusegrad import GlobalCounters, Tensor
from fusegrad.engine import realize
from fusegrad.models import gpt2
from fusegrad.models.generate import start_position
from fusegrad.models.gpt2 import GPT2, GPT2Config
from fusegrad.schedule.cache import clear_schedule_cache

PARTS = ("_qkv", "_attention_residual", "_mlp_residual")
LAYERS, CHUNK, RUNS = int(os.getenv("LAYERS", "12")), int(os.getenv("CHUNK", "32")), int(os.getenv("RUNS", "7"))


def config(n_layer: int) -> GPT2Config:
    return GPT2Config(vocab_size=512, n_positions=256, n_embd=768, n_layer=n_layer, n_head=12)


@contextmanager
def plain_parts(plain: bool):
    """The block parts as the functions @function wraps (plain=True), or as they are."""
    traced = {name: getattr(gpt2, name) for name in PARTS}
    if plain:
        for name, fn in traced.items():
            setattr(gpt2, name, fn.fxn)
    try:
        yield
    finally:
        for name, fn in traced.items():
            setattr(gpt2, name, fn)


def eager_prefill(model: GPT2) -> float:
    """Seconds of one eager prefill step of CHUNK tokens at position 0."""
    ids = Tensor(np.arange(CHUNK, dtype=np.int32) % model.cfg.vocab_size).realize()
    places = Tensor(np.arange(CHUNK, dtype=np.int32)).realize()
    st = time.perf_counter()
    model._step(ids, places, start_position(0, CHUNK, model.max_context)).numpy()
    return time.perf_counter() - st


def prepare(model: GPT2) -> None:
    """forward()'s lazy set-up (the caches and the head's panels), without its TinyJit step."""
    model.forward(np.arange(1), 0).numpy()


def graph_build_seconds(model: GPT2, n: int = 50) -> float:
    """Median seconds to build one MLP residual's graph (not realized) over layer 0's weights."""
    block = model.h[0]
    h = Tensor.randn(CHUNK, model.cfg.n_embd).realize()
    ln, fc, proj = block.ln_2, block.mlp.c_fc, block.mlp.c_proj
    times = []
    for _ in range(n):
        st = time.perf_counter()
        gpt2._mlp_residual(h, ln.weight, ln.bias, fc.weight, fc.bias, proj.weight, proj.bias, model.cfg)
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def compiles(n_layer: int, plain: bool) -> int:
    realize._runners.clear()
    clear_schedule_cache()
    with plain_parts(plain):
        model = GPT2(config(n_layer), max_context=64)
        before = GlobalCounters.compile_count
        model.forward(np.arange(8), 0).numpy()
        return GlobalCounters.compile_count - before


def torch_per_layer() -> float | None:
    try:
        import torch
        import transformers
    except ImportError:
        return None
    torch.set_num_threads(1)  # on a shared 2-core machine its 2 threads measured 2-4x slower than 1
    cfg = transformers.GPT2Config(
        vocab_size=512, n_positions=256, n_embd=768, n_layer=LAYERS, n_head=12, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2Model(cfg).eval()
    ids = torch.arange(CHUNK)[None] % 512
    times = []
    with torch.no_grad():
        model(ids)
        for _ in range(RUNS):
            st = time.perf_counter()
            model(ids)
            times.append(time.perf_counter() - st)
    return statistics.median(times) / LAYERS


def main() -> None:
    model = GPT2(config(LAYERS))
    prepare(model)
    times: dict[bool, list[float]] = {False: [], True: []}
    for plain in (False, True):  # warm-up: traces, compiles, schedule templates
        with plain_parts(plain):
            eager_prefill(model)
    for _ in range(RUNS):
        for plain in (False, True):
            with plain_parts(plain):
                times[plain].append(eager_prefill(model))
    traced, plain = (statistics.median(times[p]) / LAYERS for p in (False, True))
    build_traced = graph_build_seconds(model)
    with plain_parts(True):
        build_plain = graph_build_seconds(model)
    print(f"eager prefill of {CHUNK} tokens, {LAYERS} GPT-2-shaped layers, median of {RUNS}, per layer:")
    print(f"  @function   {traced * 1e3:8.2f} ms")
    print(
        f"  plain       {plain * 1e3:8.2f} ms   (@function saves {(plain - traced) * 1e3:.2f} ms, "
        f"plain / @function {plain / traced:.3f}x)"
    )
    if (peer := torch_per_layer()) is not None:
        print(f"  torch eager {peer * 1e3:8.2f} ms   (time ratio fusegrad @function / torch: {traced / peer:.2f}x)")
    print(
        f"building one MLP residual's graph: @function {build_traced * 1e6:.0f} us, plain {build_plain * 1e6:.0f} us "
        f"({build_plain / build_traced:.1f}x)"
    )
    counts = {(n, p): compiles(n, p) for n in (1, 12) for p in (False, True)}
    print("kernels compiled by one forward from empty caches:")
    for p in (False, True):
        print(f"  {'plain    ' if p else '@function'}  1 layer: {counts[1, p]:3d}   12 layers: {counts[12, p]:3d}")


if __name__ == "__main__":
    main()
