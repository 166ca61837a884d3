"""Speed of the CDNA3 wave emulator: lane-instructions per second on a VALU/SALU loop with all 64 lanes on, and on
a real DEV=AMD kernel (compiled by LLVM, run by the simulator).

    PYTHONPATH=. python bench/bench_amd_emu.py [--iters 20000] [--repeats 5] [--matmul 256]

It also runs a float32 and a float16 matmul (--matmul N: N x N x N) with the matrix cores (v_mfma_*, LDS tiles) and
without them (the capability off: the vector-ALU kernel the heuristics tile), interleaved in this one process:
instructions the waves executed and the emulator's seconds, median of --repeats.

The loop body, hand-assembled (CDNA3 encodings): v_fma_f32 v1, v2, v3, v1; v_add_f32 v2, 1.0, v2;
v_mul_f32 v3, v3, v4; v_xor_b32 v5, v5, v6; v_add_u32 v6, 3, v6; s_sub_u32 s0, s0, 1; s_cmp_lg_u32 s0, 0;
s_cbranch_scc1 (back to the loop start).
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time

import numpy as np

from fusegrad.runtime.support.amd.emu.standalone import run_wave

BODY = [0xD1CB0001, 0x04060702, 0x020404F2, 0x0A060903, 0x2A0A0D05, 0x680C0C83, 0x80808100, 0xBF078000]
SGPR_S0_LITERAL = [0xBE8000FF]  # s_mov_b32 s0, <literal>
ENDPGM = 0xBF810000
VALU_PER_ITER, SALU_PER_ITER = 5, 3


def loop_code(iters: int) -> bytes:
    words = [*SGPR_S0_LITERAL, iters, *BODY]
    words.append(0xBF850000 | ((-(len(BODY) + 1)) & 0xFFFF))  # s_cbranch_scc1 to the body's first instruction
    words.append(ENDPGM)
    return struct.pack(f"<{len(words)}I", *words)


def bench_loop(iters: int, repeats: int) -> tuple[float, float, int]:
    """Median lane-instructions per wall second and per CPU second of this process (the machine is shared)."""
    code = loop_code(iters)
    wall, cpu, steps = [], [], 0
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        _, steps = run_wave(code, vgprs={2: np.linspace(0, 1, 64), 3: np.ones(64), 4: np.ones(64)})
        wall.append(steps * 64 / (time.perf_counter() - start))
        cpu.append(steps * 64 / max(time.process_time() - start_cpu, 1e-9))
    return statistics.median(wall), statistics.median(cpu), steps


def bench_kernel(n: int) -> tuple[float, float, float, tuple]:
    """The emulator running a DEV=AMD elementwise kernel on n elements (n a multiple of 128, so every wave holds 64
    work-items): (instructions/s, lane-instructions/s of wall time, lane-instructions per CPU second, the dispatch's
    grid, block and waves). Lanes EXEC turns off inside the kernel still count (the kernel has no divergent branch
    for these inputs)."""
    from fusegrad import Tensor
    from fusegrad.helpers import AMD_SIM
    from fusegrad.runtime.device import Device

    if n % 128:
        raise ValueError(f"--kernel-elements must be a multiple of 128 (whole waves), got {n}")
    AMD_SIM.value = 1
    x = Tensor(np.linspace(-3, 3, n, dtype=np.float32), device="AMD").realize()
    (x * 2 + 1).exp().numpy()  # compile once
    emu = Device["AMD"].pci.sim.gpu.emu
    i0, s0, c0 = emu.instructions, emu.seconds, time.process_time()
    (x * 3 + 1).exp().numpy()
    di, ds, dc = emu.instructions - i0, emu.seconds - s0, time.process_time() - c0
    return di / ds, di * 64 / ds, di * 64 / dc, emu.last_dispatch


def bench_matmul(n: int, repeats: int) -> list[tuple[str, int, int, float, float]]:
    """(dtype, wave-instructions with MFMA, without, emulator seconds with, without) per dtype: the kernel lowered
    for the renderer with and without matrix cores, both built, then run in turns on the same buffers."""
    from fusegrad import Tensor, dtypes
    from fusegrad.codegen import lower_to_linear
    from fusegrad.helpers import AMD_SIM
    from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer
    from fusegrad.runtime.device import Device
    from fusegrad.schedule import create_schedule

    AMD_SIM.value = 1
    dev = Device["AMD"]
    emu, on = dev.pci.sim.gpu.emu, dev.renderer.capabilities
    rng = np.random.default_rng(0)
    rows = []
    for dt in (dtypes.float32, dtypes.float16):
        a = Tensor(rng.standard_normal((n, n)).astype(np.float32), device="AMD").cast(dt).realize()
        b = Tensor(rng.standard_normal((n, n)).astype(np.float32), device="AMD").cast(dt).realize()
        items, _, _ = create_schedule([(a @ b).uop], ["AMD"])
        item = items[-1]
        progs = {
            mfma: dev.build(lower_to_linear(item.ast, AMDGPURenderer(on.replace(matrix_cores=mfma), dev.arch)))
            for mfma in (True, False)
        }
        runs: dict[bool, list[tuple[int, float]]] = {True: [], False: []}
        for _ in range(repeats):
            for mfma, prog in progs.items():  # interleaved
                i0, s0 = emu.instructions, emu.seconds
                prog(list(item.buffers))
                runs[mfma].append((emu.instructions - i0, emu.seconds - s0))
        med = {k: (statistics.median(i for i, _ in v), statistics.median(s for _, s in v)) for k, v in runs.items()}
        rows.append((dt.name, int(med[True][0]), int(med[False][0]), med[True][1], med[False][1]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--kernel-elements", type=int, default=65536)
    p.add_argument("--matmul", type=int, default=256)
    a = p.parse_args()
    rate, cpu_rate, steps = bench_loop(a.iters, a.repeats)
    print(
        f"loop, 64 lanes on: {steps} instructions per run, median {rate / 1e6:.1f} M lane-instructions/s "
        f"({rate / 64 / 1e6:.2f} M instructions/s); per CPU second of this process {cpu_rate / 1e6:.1f} M"
    )
    inst_rate, lane_rate, lane_cpu, (grid, block, waves) = bench_kernel(a.kernel_elements)
    print(
        f"DEV=AMD kernel (exp(3x+1), {a.kernel_elements} elements: grid {grid} x block {block}, {waves} waves): "
        f"{inst_rate / 1e6:.3f} M instructions/s, {lane_rate / 1e6:.1f} M lane-instructions/s; per CPU second of "
        f"this process {lane_cpu / 1e6:.1f} M (compiling excluded, the driver's own work included)"
    )
    for name, i_on, i_off, s_on, s_off in bench_matmul(a.matmul, a.repeats):
        print(
            f"matmul {a.matmul}^3 {name}: matrix cores {i_on} wave-instructions in {s_on:.2f} s, vector ALUs "
            f"{i_off} in {s_off:.2f} s: {i_off / i_on:.1f}x fewer instructions, {s_off / s_on:.1f}x less emulator time"
        )


if __name__ == "__main__":
    main()
