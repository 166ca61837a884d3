"""The CPU compiler's flags: a float16 probe drops AVX512-FP16 where the assembler refuses it, decided once per machine
and kept on disk; casts between every pair of dtypes build and run on the CPU device."""

import subprocess

import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.runtime import ops_cpu

REFUSED = "{standard input}: Assembler messages:\n{standard input}:12: Error: unsupported masking for `vmovsh'\n"


@pytest.fixture
def fresh_flags(tmp_path, monkeypatch):
    """A cache directory of its own and no decision in memory, before and after the test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for f in (ops_cpu.compiler_flags, ops_cpu.compiler_identity):
        f.cache_clear()
    yield tmp_path
    for f in (ops_cpu.compiler_flags, ops_cpu.compiler_identity):
        f.cache_clear()


def fake_old_assembler(monkeypatch) -> list[str]:
    """Every float16 build under -march=native without -mno-avx512fp16 fails as Debian 12's binutils does."""
    calls: list[str] = []
    real = ops_cpu.run_compiler

    def run(argv, stdin, what):
        calls.append(what)
        if "_Float16" in stdin and "-march=native" in argv and "-mno-avx512fp16" not in argv:
            return subprocess.CompletedProcess(argv, 1, "", REFUSED)
        return real(argv, stdin, what)

    monkeypatch.setattr(ops_cpu, "run_compiler", run)
    return calls


def test_probe_falls_back_when_the_assembler_refuses_avx512fp16(fresh_flags, monkeypatch):
    calls = fake_old_assembler(monkeypatch)
    cc = ops_cpu.find_compiler()
    assert ops_cpu.compiler_flags(cc)[-1] == "-mno-avx512fp16"
    assert calls.count("building the float16 probe") == 2  # the flags as they are, then the fallback
    # a user kernel in float16 builds with the fallback (a value no other test computes: a fresh kernel)
    x = np.array([1.5, -2.25, 3.0, 0.125], np.float16)
    got = (Tensor(x) * Tensor(np.float16(1.8125))).cast(dtypes.float32).numpy()
    np.testing.assert_array_equal(got, (x * np.float16(1.8125)).astype(np.float32))
    # the decision is kept on disk with the compiler's identity: a new process (no memory of it) does not probe
    ops_cpu.compiler_flags.cache_clear()
    calls.clear()
    assert ops_cpu.compiler_flags(cc)[-1] == "-mno-avx512fp16"
    assert "building the float16 probe" not in calls


def test_probe_keeps_the_flags_when_the_assembler_accepts_them(fresh_flags):
    cc = ops_cpu.find_compiler()
    assert ops_cpu.compiler_flags(cc) == ops_cpu.CFLAGS  # this machine's assembler builds the probe as it is
    assert "-mno-avx512fp16" not in ops_cpu.compiler_identity(cc)


EVERY = [dtypes.bool, *dtypes.ints, *dtypes.floats]
VALUES = np.array([0.0, 1.0, 2.0, 3.0, 7.0, 0.5, 96.0, -0.0])  # held exactly by every dtype (ints truncate 0.5)


def _as(x: np.ndarray, dt) -> np.ndarray:
    """x (float64) as dt holds it, back in float64."""
    return (x != 0).astype(np.float64) if dt is dtypes.bool else np.trunc(x) if dtypes.is_int(dt) else x


@pytest.mark.parametrize("src", EVERY, ids=lambda d: d.name)
def test_casts_between_every_pair_of_dtypes_run_on_cpu(src):
    x = Tensor(VALUES, device="CPU").cast(src)
    got = Tensor.stack(*[x.cast(dst).cast(dtypes.float64) for dst in EVERY]).numpy()
    want = np.stack([_as(_as(VALUES, src), dst) for dst in EVERY])
    np.testing.assert_array_equal(got, want)
