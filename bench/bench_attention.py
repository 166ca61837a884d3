"""scaled_dot_product_attention against torch CPU, in one process: `python bench/bench_attention.py`.

batch x heads 8, head dim 64, float32, sequence 1024 and 4096, causal and not; the forward alone and the forward with
the gradients of q, k and v from an output gradient, under TinyJit (the per-step Python is not timed). Single-threaded
on both sides by default (`NUM_CPU_THREADS=1` for fusegrad, `torch.set_num_threads(1)`). Prints median ms per step of
interleaved runs and fusegrad's speed as a ratio to torch (>1: faster), and checks the values first. `ONLY=1024` picks
cases by name substring; `DEBUG=2` shows each kernel's time."""

from __future__ import annotations
import os

os.environ.setdefault("NUM_CPU_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from fusegrad import Tensor, TinyJit  # noqa: E402
from fusegrad.helpers import NUM_CPU_THREADS  # noqa: E402
from bench_train import steps_per_second  # noqa: E402  (this script's folder is on the path)

HEADS, HEAD_DIM = 8, 64
SEQS = (1024, 4096)


def fusegrad_step(arrays: list[np.ndarray], causal: bool, backward: bool):
    q, k, v, g = (Tensor(a).realize() for a in arrays)
    for t in (q, k, v):
        t.requires_grad = backward

    @TinyJit
    def step(q: Tensor, k: Tensor, v: Tensor, g: Tensor):
        q.grad = k.grad = v.grad = None
        out = q.scaled_dot_product_attention(k, v, is_causal=causal)
        if not backward:
            return out.realize()
        out.backward(g)
        Tensor.realize(out, q.grad, k.grad, v.grad)  # one schedule: the blocks the gradients share are computed once
        return out, q.grad, k.grad, v.grad

    return lambda: step(q, k, v, g)


def torch_step(arrays: list[np.ndarray], causal: bool, backward: bool):
    q, k, v = (torch.tensor(a, requires_grad=backward) for a in arrays[:3])
    g = torch.tensor(arrays[3])

    def step():
        q.grad = k.grad = v.grad = None
        if not backward:
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(g)
        return out

    return step


def check(arrays: list[np.ndarray], causal: bool) -> None:
    """fusegrad's output and gradients equal torch's (a wrong kernel is not timed)."""
    ours = [t.numpy() for t in fusegrad_step(arrays, causal, True)()]
    q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(torch.tensor(arrays[3]))
    for a, b in zip(ours, (out, q.grad, k.grad, v.grad)):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-3, atol=1e-4)


def main() -> None:
    torch.set_num_threads(int(NUM_CPU_THREADS.value))
    only = [s for s in os.environ.get("ONLY", "").split(",") if s]
    rng = np.random.default_rng(0)
    threads = f"{torch.get_num_threads()} thread(s), fusegrad NUM_CPU_THREADS={NUM_CPU_THREADS.value}"
    print(f"torch {torch.__version__}, {threads}; fg/torch is fusegrad's speed over torch's (>1: faster)")
    print(f"{'case':32s} {'torch ms':>9s} {'fg ms':>9s} {'fg/torch':>9s}")
    for seq in SEQS:
        arrays = [rng.standard_normal((1, HEADS, seq, HEAD_DIM), dtype=np.float32) for _ in range(4)]
        for causal in (False, True):
            if only and not any(o in f"{seq} {'causal' if causal else ''}" for o in only):
                continue
            check(arrays, causal)
            for backward in (False, True):
                name = f"seq {seq}{' causal' if causal else ''} {'fwd+bwd' if backward else 'fwd'}"
                ms = {
                    n: 1e3 / r
                    for n, r in steps_per_second(
                        {
                            "torch": torch_step(arrays, causal, backward),
                            "fg": fusegrad_step(arrays, causal, backward),
                        },
                        runs=5,
                        seconds=0.3,
                    ).items()
                }
                print(f"{name:32s} {ms['torch']:9.2f} {ms['fg']:9.2f} {ms['torch'] / ms['fg']:9.2f}", flush=True)


if __name__ == "__main__":
    main()
