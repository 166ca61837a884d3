"""Speed of the CDNA3 wave emulator: lane-instructions per second on a VALU/SALU loop with all 64 lanes on, and on
a real DEV=AMD kernel (compiled by LLVM, run by the simulator).

    PYTHONPATH=. python bench/bench_amd_emu.py [--iters 20000] [--repeats 5]

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--kernel-elements", type=int, default=65536)
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


if __name__ == "__main__":
    main()
