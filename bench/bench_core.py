"""Core pipeline benchmarks against numpy and torch, measured in one process: `python bench/bench_core.py`.

Prints the median of several runs for each case and fusegrad's speed as a ratio to numpy and to torch on as many
threads (>1 means faster); the fresh-output cases compare with and without a preallocated `out=`."""

from __future__ import annotations
import os
import statistics
import sys
import time
import numpy as np
import torch
from fusegrad import Context, Tensor
from fusegrad.helpers import NUM_CPU_THREADS, GlobalCounters


def median_time(fn, repeats: int = 7, clock=time.perf_counter) -> float:
    fn()  # warm-up: compiles and allocates
    times = []
    for _ in range(repeats):
        st = clock()
        fn()
        times.append(clock() - st)
    return statistics.median(times)


def print_rows(rows: list, gflops: list[str]) -> None:
    print(f"{'case':34s} {'fusegrad':>12s} {'numpy':>12s} {'torch':>12s} {'vs numpy':>9s} {'vs torch':>9s}")
    for name, fg, npt, tt in rows:
        print(f"{name:34s} {fg * 1e3:10.2f}ms {npt * 1e3:10.2f}ms {tt * 1e3:10.2f}ms {npt / fg:8.2f}x {tt / fg:8.2f}x")
    print(f"matmul GFLOPS: {'; '.join(gflops)}")


def matmul_rows(rng, rows: list) -> list[str]:
    """matmul 512/1024/2048 with the heuristics' opts and with BEAM=2, against numpy and torch; GFLOPS lines."""
    gflops = []
    for m in (512, 1024, 2048):
        xn, yn = rng.standard_normal((m, m), dtype=np.float32), rng.standard_normal((m, m), dtype=np.float32)
        x, y = Tensor(xn).realize(), Tensor(yn).realize()
        xt, yt = torch.from_numpy(xn), torch.from_numpy(yn)
        out_mm = Tensor.empty(m, m).realize()

        def fg_beam(x=x, y=y, out_mm=out_mm):
            with Context(BEAM=2):
                out_mm.assign(x @ y).realize()

        # in turns, so load that comes and goes hits every contender alike; the BEAM warm-up searches (or finds the
        # search's winner in the disk cache), the runs use the winner
        times = interleaved_median_times(
            {
                "fg": lambda: out_mm.assign(x @ y).realize(),
                "beam": fg_beam,
                "np": lambda: xn @ yn,
                "torch": lambda: xt @ yt,
            },
            repeats=5,
        )
        t_fg, t_np, t_torch = times["fg"], times["np"], times["torch"]
        rows.append((f"matmul {m}x{m} f32", t_fg, t_np, t_torch))
        rows.append((f"matmul {m}x{m} f32 BEAM=2", times["beam"], t_np, t_torch))
        if m == 1024:
            bn_ = rng.standard_normal(m, dtype=np.float32)
            bias = Tensor(bn_).realize()
            t_np_epi = median_time(lambda: np.maximum(xn @ yn + bn_, 0), repeats=3)
            t_epi = median_time(lambda: out_mm.assign((x @ y + bias).relu()).realize(), repeats=3)
            bt_ = torch.from_numpy(bn_)
            t_torch_epi = median_time(lambda: torch.relu(xt @ yt + bt_), repeats=3)
            rows.append((f"(x @ w + b).relu() {m}x{m} f32", t_epi, t_np_epi, t_torch_epi))
        gflops.append(
            f"{m}: fusegrad {2 * m**3 / t_fg / 1e9:.1f}, BEAM=2 {2 * m**3 / times['beam'] / 1e9:.1f},"
            f" numpy {2 * m**3 / t_np / 1e9:.1f}"
        )

    return gflops


def main(matmul_only: bool = False) -> None:
    n = 16 * 1024 * 1024
    rng = np.random.default_rng(0)
    an, bn, cn = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    a, b, c = (Tensor(x).realize() for x in (an, bn, cn))
    torch.set_num_threads(int(NUM_CPU_THREADS.value))  # torch on as many threads as fusegrad
    at, bt, ct = (torch.from_numpy(x) for x in (an, bn, cn))
    rows = []  # (case, fusegrad, numpy, torch) seconds
    if matmul_only:
        print_rows(rows, matmul_rows(rng, rows))
        return

    # results are assigned into an output buffer: a repeated identical expression would otherwise be served from
    # the realized-value cache without running anything
    out = Tensor.empty(n).realize()
    t_np = median_time(lambda: np.maximum(an * bn + cn, 0))
    t_fg = median_time(lambda: out.assign((a * b + c).relu()).realize())
    t_torch = median_time(lambda: torch.relu(at * bt + ct))
    rows.append(("fused (a*b+c).relu(), 16M f32", t_fg, t_np, t_torch))

    out_sum = Tensor.empty(()).realize()
    # in blocks per contender, several rounds: in per-call turns torch's threads, still spinning after its call, took a
    # core from fusegrad's next call
    sums = {"fg": lambda: out_sum.assign(a.sum()).realize(), "np": lambda: an.sum(), "torch": lambda: at.sum()}
    t = block_median_times(sums, rounds=5, repeats=31)
    rows.append(("a.sum(), 16M f32", t["fg"], t["np"], t["torch"]))

    gflops = matmul_rows(rng, rows)
    print_rows(rows, gflops)
    fresh_output_rows(rng, an, bn, cn, a, b, c)
    conv_row(rng)
    llvm_rows(rng)

    small = Tensor(rng.standard_normal(16, dtype=np.float32)).realize()
    out_small = Tensor.empty(16).realize()

    def chain():
        t = small
        for _ in range(5):
            t = t * 1.5 + 0.5
        return out_small.assign(t).realize()

    t_chain = median_time(chain, repeats=51)
    print(
        f"python overhead: build + realize a 10-op chain on 16 elements: {t_chain * 1e6 / 10:.1f} us per op"
        f" ({t_chain * 1e6:.0f} us total)"
    )


def llvm_rows(rng) -> None:
    """The LLVM device (llvmlite, in-process) against the C backend on the same data, with numpy for scale."""
    try:
        import llvmlite  # noqa: F401
    except ImportError:
        print("LLVM column skipped: llvmlite is not installed (pip install llvmlite)")
        return
    n = 16 * 1024 * 1024
    an, bn, cn = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    cases = [
        (
            "(a*b+c).relu() 16M f32",
            (an, bn, cn),
            lambda a, b, c: (a * b + c).relu(),
            lambda: np.maximum(an * bn + cn, 0),
        ),
        ("a.sum() 16M f32", (an,), lambda a: a.sum(), lambda: an.sum()),
    ]
    for m in (512, 1024):
        xn, yn = rng.standard_normal((m, m), dtype=np.float32), rng.standard_normal((m, m), dtype=np.float32)
        cases.append((f"matmul {m}x{m} f32", (xn, yn), lambda x, y: x @ y, lambda xn=xn, yn=yn: xn @ yn))
    print(f"{'LLVM vs C backend':34s} {'CPU (C)':>10s} {'LLVM':>10s} {'numpy':>10s} {'LLVM / C time':>14s}")
    for name, inputs, expr, np_fn in cases:
        runs = {}
        for device in ("CPU", "LLVM"):
            tensors = [Tensor(x, device=device).realize() for x in inputs]
            # assigned into one output: an identical expression would otherwise be served from the realized cache
            out = Tensor.empty(*expr(*tensors).shape, device=device).realize()
            runs[device] = lambda out=out, tensors=tensors: out.assign(expr(*tensors)).realize()
        runs["numpy"] = np_fn
        times = interleaved_median_times(runs, repeats=9)
        print(
            f"{name:34s} {times['CPU'] * 1e3:8.2f}ms {times['LLVM'] * 1e3:8.2f}ms {times['numpy'] * 1e3:8.2f}ms"
            f" {times['LLVM'] / times['CPU']:13.2f}x"
        )


def interleaved_median_times(fns: dict, repeats: int) -> dict:
    """Median time of each function, run in turns (one of each per round), so load that comes and goes during the
    measurement hits every contender alike."""
    for fn in fns.values():
        fn()  # warm-up: compiles and allocates
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            st = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - st)
    return {name: statistics.median(t) for name, t in times.items()}


def runs_a_kernel(fn) -> bool:
    before = GlobalCounters.kernel_count
    fn()
    return GlobalCounters.kernel_count > before


def fresh_output_rows(rng, an, bn, cn, a, b, c) -> None:
    """Each call allocates its result, as users write it (no assign): the cost of fresh memory shows here."""
    torch.set_num_threads(int(NUM_CPU_THREADS.value))
    print_fresh_rows([relu_row(an, bn, cn, a, b, c), axpy_row(rng)])


def relu_row(an, bn, cn, a, b, c) -> tuple:
    at, bt, ct = (torch.from_numpy(x) for x in (an, bn, cn))
    n = an.size
    out_np, out_t = np.empty(n, np.float32), torch.empty(n)

    def np_relu_out():
        np.multiply(an, bn, out=out_np)
        np.add(out_np, cn, out=out_np)
        np.maximum(out_np, 0, out=out_np)

    def torch_relu_out():
        torch.addcmul(ct, at, bt, out=out_t)
        torch.relu_(out_t)

    def fg_relu():
        return (a * b + c).relu().realize()

    assert runs_a_kernel(fg_relu) and runs_a_kernel(fg_relu), "the fresh-output case must run its kernel every call"
    return (
        "fresh (a*b+c).relu(), 16M f32",
        4 * 4 * n,
        median_time(fg_relu),
        median_time(lambda: np.maximum(an * bn + cn, 0)),
        median_time(np_relu_out),
        median_time(lambda: torch.relu(torch.addcmul(ct, at, bt))),
        median_time(torch_relu_out),
    )


def axpy_row(rng) -> tuple:
    m = 64 * 1024 * 1024
    srcn, dn = rng.standard_normal(m, dtype=np.float32), rng.standard_normal(m, dtype=np.float32)
    src, d = Tensor(srcn).realize(), Tensor(dn).realize()
    srct, dt = torch.from_numpy(srcn), torch.from_numpy(dn)
    out_np, out_t = np.empty(m, np.float32), torch.empty(m)

    def np_axpy_out():
        np.multiply(dn, 3, out=out_np)
        np.add(srcn, out_np, out=out_np)

    def fg_axpy():
        return (src + 3 * d).realize()

    assert runs_a_kernel(fg_axpy) and runs_a_kernel(fg_axpy), "the fresh-output case must run its kernel every call"
    return (
        "fresh src + 3*c, 64M f32",
        3 * 4 * m,
        median_time(fg_axpy),
        median_time(lambda: srcn + 3 * dn),
        median_time(np_axpy_out),
        median_time(lambda: torch.add(srct, dt, alpha=3)),
        median_time(lambda: torch.add(srct, dt, alpha=3, out=out_t)),
    )


def conv_row(rng, batch: int = 32, channels: int = 64, size: int = 56) -> None:
    """conv2d forward + backward (input and weight gradients) of a batch x 64 x 56 x 56 input with 64 3x3 filters,
    padding 1, against torch on the same number of threads."""
    torch.set_num_threads(int(NUM_CPU_THREADS.value))
    xn = rng.standard_normal((batch, channels, size, size), dtype=np.float32)
    wn = rng.standard_normal((channels, channels, 3, 3), dtype=np.float32) * 0.05
    gn = rng.standard_normal((batch, channels, size, size), dtype=np.float32)
    x, w, g = Tensor(xn).realize(), Tensor(wn).realize(), Tensor(gn).realize()
    xt, wt, gt = (torch.from_numpy(v).clone() for v in (xn, wn, gn))
    xt.requires_grad_(True)
    wt.requires_grad_(True)

    def fg_step():
        x.grad = w.grad = None
        x.requires_grad, w.requires_grad = True, True
        out = x.conv2d(w, padding=1)
        out.backward(g)
        Tensor.realize(out, x.grad, w.grad)
        return out

    def torch_step():
        xt.grad = wt.grad = None
        out = torch.nn.functional.conv2d(xt, wt, padding=1)
        out.backward(gt)
        return out

    out, ref = fg_step(), torch_step()
    for ours, theirs in ((out, ref), (x.grad, xt.grad), (w.grad, wt.grad)):
        scale = float(theirs.detach().abs().max())
        assert np.abs(ours.numpy() - theirs.detach().numpy()).max() <= 1e-4 * scale, "conv values differ from torch"
    t_fg, t_torch = median_time(fg_step, repeats=5), median_time(torch_step, repeats=5)
    flops = 3 * 2 * batch * channels * channels * 9 * size * size  # forward, input gradient, weight gradient
    print(
        f"conv2d fwd+bwd {batch}x{channels}x{size}x{size}, {channels} 3x3 filters, padding 1 (torch on"
        f" {torch.get_num_threads()} threads): fusegrad {t_fg * 1e3:.1f}ms ({flops / t_fg / 1e9:.0f} GFLOPS),"
        f" torch {t_torch * 1e3:.1f}ms ({flops / t_torch / 1e9:.0f} GFLOPS), speed vs torch {t_torch / t_fg:.2f}x"
    )


def print_fresh_rows(rows: list[tuple]) -> None:
    print(f"fresh outputs, GB/s moved (torch on {torch.get_num_threads()} threads); ratios are fusegrad's speed")
    print(
        f"{'case':34s} {'fusegrad':>9s} {'np':>7s} {'np out=':>8s} {'torch':>7s} {'t out=':>7s}"
        f" {'vs np':>6s} {'vs np out=':>10s} {'vs torch':>8s} {'vs t out=':>9s}"
    )
    for name, nbytes, fg, np_fresh, np_out, t_fresh, t_out in rows:
        gbs = [nbytes / t / 1e9 for t in (fg, np_fresh, np_out, t_fresh, t_out)]
        ratios = [t / fg for t in (np_fresh, np_out, t_fresh, t_out)]
        print(
            f"{name:34s} {gbs[0]:9.1f} {gbs[1]:7.1f} {gbs[2]:8.1f} {gbs[3]:7.1f} {gbs[4]:7.1f}"
            f" {ratios[0]:5.2f}x {ratios[1]:9.2f}x {ratios[2]:7.2f}x {ratios[3]:8.2f}x"
        )


def cl_rows() -> None:
    """The CL device (OpenCL; PoCL on a CPU-only machine) on the core cases, against the CPU backend and numpy."""
    from fusegrad.runtime.device import Device

    try:
        cl = Device["CL"]
    except Exception as e:  # noqa: BLE001 (no pyopencl or no OpenCL driver: nothing to measure)
        print(f"CL: not measured ({e})")
        return
    rng = np.random.default_rng(0)
    n = 16 * 1024 * 1024
    an, bn, cn = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    cases: list[tuple[str, object, object]] = [
        ("fused (a*b+c).relu(), 16M f32", lambda a, b, c: (a * b + c).relu(), lambda: np.maximum(an * bn + cn, 0)),
        ("a.sum(), 16M f32", lambda a, b, c: a.sum(), lambda: an.sum()),
    ]
    print(f"CL on {cl.cl_device.platform.name} / {cl.cl_device.name}: median ms (CL, CPU backend, numpy)")
    for name, fn, np_fn in cases:
        times = []
        for device in ("CL", "CPU"):
            a, b, c = (Tensor(x, device=device).realize() for x in (an, bn, cn))
            out = fn(a, b, c).realize()
            outbuf = Tensor.empty(*out.shape, device=device).realize()
            times.append(median_time(lambda: (outbuf.assign(fn(a, b, c)).realize(), Device[device].synchronize())))
        times.append(median_time(np_fn))
        print(f"{name:34s} {times[0] * 1e3:9.2f} {times[1] * 1e3:9.2f} {times[2] * 1e3:9.2f}")
    for m in (512, 1024):
        xn, yn = rng.standard_normal((m, m), dtype=np.float32), rng.standard_normal((m, m), dtype=np.float32)
        times = []
        for device in ("CL", "CPU"):
            x, y = Tensor(xn, device=device).realize(), Tensor(yn, device=device).realize()
            out_mm = Tensor.empty(m, m, device=device).realize()
            times.append(median_time(lambda: (out_mm.assign(x @ y).realize(), Device[device].synchronize()), repeats=3))
        times.append(median_time(lambda: xn @ yn, repeats=3))
        gflops = ", ".join(f"{2 * m**3 / t / 1e9:.1f}" for t in times)
        ms = " ".join(f"{t * 1e3:9.2f}" for t in times)
        print(f"{f'matmul {m}x{m} f32':34s} {ms}  GFLOPS {gflops}")


def block_median_times(fns: dict, rounds: int = 3, repeats: int = 15, clock=time.perf_counter) -> dict:
    """Median time of each function timed in blocks of its own calls (`rounds` blocks each, a pause before each
    block): in per-call turns the worker threads torch (OpenMP) and numpy (OpenBLAS) leave spinning after a call take
    the cores from whoever runs next."""
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(0.5)  # the previous block's threads go idle
            times[name].append(median_time(fn, repeats=repeats, clock=clock))
    return {name: statistics.median(t) for name, t in times.items()}


def matmul_block_rows() -> None:
    """matmul GFLOPS with each contender timed in a block of its own calls (3 rounds, a pause before each block): in
    per-call turns the worker threads torch (OpenMP) and numpy (OpenBLAS) leave spinning after a call take the cores
    from whoever runs next, which halved fusegrad's 1024^2 figure in `matmul_rows`. fusegrad runs with the heuristics'
    opts and with BEAM=2, whose search (or its disk cache) runs once before the timing. With `--cpu-time` (for a
    loaded machine; run with NUM_CPU_THREADS=1 OPENBLAS_NUM_THREADS=1) every contender runs on the calling thread
    and is timed by that thread's CPU time, which other processes' load does not count."""
    clock = time.perf_counter
    if "--cpu-time" in sys.argv[1:]:
        if int(NUM_CPU_THREADS.value) != 1 or os.environ.get("OPENBLAS_NUM_THREADS") != "1":
            raise SystemExit("--cpu-time times one thread: run with NUM_CPU_THREADS=1 OPENBLAS_NUM_THREADS=1")
        clock = time.thread_time
    torch.set_num_threads(int(NUM_CPU_THREADS.value))
    rng = np.random.default_rng(0)
    for m in (512, 1024, 2048):
        an, bn = rng.standard_normal((m, m), dtype=np.float32), rng.standard_normal((m, m), dtype=np.float32)
        a, b, at, bt = Tensor(an).realize(), Tensor(bn).realize(), torch.from_numpy(an), torch.from_numpy(bn)

        def beam_matmul(a=a, b=b):
            with Context(BEAM=2):
                return (a @ b).realize()

        searched = time.perf_counter()
        beam_matmul()  # the search, or its winner from the disk cache
        searched = time.perf_counter() - searched
        fns = {
            "fusegrad": lambda: (a @ b).realize(),
            "BEAM=2": beam_matmul,
            "numpy": lambda: an @ bn,
            "torch": lambda: at @ bt,
        }
        times = block_median_times(fns, repeats=15 if m < 2048 else 5, clock=clock)
        rate = {name: 2 * m**3 / t / 1e9 for name, t in times.items()}
        print(
            f"matmul {m}x{m} f32, blocks: fusegrad {rate['fusegrad']:.0f} GFLOPS, BEAM=2 {rate['BEAM=2']:.0f},"
            f" numpy {rate['numpy']:.0f}, torch {rate['torch']:.0f}: {rate['fusegrad'] / rate['numpy']:.2f}x numpy"
            f" (BEAM=2 {rate['BEAM=2'] / rate['numpy']:.2f}x), {rate['fusegrad'] / rate['torch']:.2f}x torch"
            f" (BEAM=2 {rate['BEAM=2'] / rate['torch']:.2f}x); BEAM warm-up {searched:.1f}s"
        )


def sum_block_rows(rounds: int = 5) -> None:
    """a.sum() of 16M float32 with each contender timed in blocks of its own calls, and fusegrad's value checked
    against a float64 sum; then a.max() of the same, and the sum of a length no chunk count divides (16M + 7)."""
    torch.set_num_threads(int(NUM_CPU_THREADS.value))
    n = 16 * 1024 * 1024
    an = np.random.default_rng(0).standard_normal(n + 7, dtype=np.float32)
    out = Tensor.empty(()).realize()  # assigned: an identical expression would be served from the realized cache
    for name, length, op in (("a.sum() 16M", n, "sum"), ("a.max() 16M", n, "max"), ("a.sum() 16M+7", n + 7, "sum")):
        x = an[:length]
        a, at = Tensor(x).realize(), torch.from_numpy(x)
        fns = {
            "fusegrad": lambda a=a, op=op: out.assign(getattr(a, op)()).realize(),
            "numpy": getattr(x, op),
            "torch": getattr(at, op),
        }
        t = block_median_times(fns, rounds=rounds, repeats=31)
        exact = float(getattr(x.astype(np.float64), op)())
        print(
            f"{name} f32, blocks: fusegrad {t['fusegrad'] * 1e3:.2f}ms ({4 * length / t['fusegrad'] / 1e9:.1f} GB/s),"
            f" numpy {t['numpy'] * 1e3:.2f}ms, torch {t['torch'] * 1e3:.2f}ms: {t['numpy'] / t['fusegrad']:.2f}x"
            f" numpy, {t['torch'] / t['fusegrad']:.2f}x torch; |fusegrad - float64| {abs(out.item() - exact):.3g}"
        )


if __name__ == "__main__":
    if "--matmul" in sys.argv[1:]:  # only the matmul rows (numpy and torch in turns with fusegrad)
        main(matmul_only=True)
    elif "--matmul-blocks" in sys.argv[1:]:  # matmul rows timed in blocks per contender (and --cpu-time)
        matmul_block_rows()
    elif "--sum-blocks" in sys.argv[1:]:  # the sum row timed in blocks per contender
        sum_block_rows()
    else:
        main()
        cl_rows()
