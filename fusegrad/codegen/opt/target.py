"""What the CPU the kernels are compiled for offers: the width of its vector registers and how many there are."""

from __future__ import annotations
import functools


@functools.cache
def _vector_target() -> tuple[int, int]:
    """(vector bytes, vector registers) of `-march=native`, read from the C compiler's predefined macros once."""
    from fusegrad.runtime.ops_cpu import find_compiler, run_compiler  # the CPU device's compiler, only when asked

    try:
        macros = run_compiler([find_compiler(), "-march=native", "-dM", "-E", "-x", "c", "-"], "", "listing macros")
    except (OSError, RuntimeError):
        return 16, 16  # no compiler: SSE2-sized vectors, the x86-64 baseline
    defined = set(line.split()[1] for line in macros.stdout.splitlines() if line.startswith("#define "))
    if "__AVX512F__" in defined:
        return 64, 32
    if "__AVX__" in defined:
        return 32, 16
    return 16, 16 if "__x86_64__" in defined else 32  # aarch64 NEON: 32 registers of 16 bytes


def vector_bytes() -> int:
    return _vector_target()[0]


def vector_registers() -> int:
    return _vector_target()[1]
