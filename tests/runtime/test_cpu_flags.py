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


def fake_compiler(monkeypatch, refuse) -> list[str]:
    """run_compiler failing every build that refuse(argv, stdin) names, with its message; the others run."""
    calls: list[str] = []
    real = ops_cpu.run_compiler

    def run(argv, stdin, what):
        calls.append(what)
        if (err := refuse(argv, stdin)) is not None:
            return subprocess.CompletedProcess(argv, 1, "", err)
        return real(argv, stdin, what)

    monkeypatch.setattr(ops_cpu, "run_compiler", run)
    return calls


def old_assembler(argv, stdin):
    """Debian 12's binutils on Sapphire Rapids: float16 code built with AVX512-FP16 fails to assemble."""
    return REFUSED if "_Float16" in stdin and "-march=native" in argv and "-mno-avx512fp16" not in argv else None


def no_such_option(argv, stdin):
    """A compiler for another architecture: -mno-avx512fp16 is an unknown option."""
    return "cc: error: unrecognized command-line option '-mno-avx512fp16'\n" if "-mno-avx512fp16" in argv else None


def test_probe_drops_avx512fp16_where_the_assembler_refuses_it(fresh_flags, monkeypatch):
    calls = fake_compiler(monkeypatch, old_assembler)
    cc = ops_cpu.find_compiler()
    assert ops_cpu.compiler_flags(cc)[-1] == "-mno-avx512fp16"
    # a user kernel in float16 builds (a value no other test computes: a fresh kernel)
    x = np.array([1.5, -2.25, 3.0, 0.125], np.float16)
    got = (Tensor(x) * Tensor(np.float16(1.8125))).cast(dtypes.float32).numpy()
    np.testing.assert_array_equal(got, (x * np.float16(1.8125)).astype(np.float32))
    # the decision is kept on disk with the compiler's identity: a new process (no memory of it) does not probe
    ops_cpu.compiler_flags.cache_clear()
    calls.clear()
    assert ops_cpu.compiler_flags(cc)[-1] == "-mno-avx512fp16"
    assert "building the float16 probe" not in calls


def test_probe_falls_back_to_the_plain_flags_where_the_option_is_unknown(fresh_flags, monkeypatch):
    calls = fake_compiler(monkeypatch, no_such_option)
    cc = ops_cpu.find_compiler()
    flags = ops_cpu.compiler_flags(cc)
    assert "-mno-avx512fp16" not in flags and flags[: len(ops_cpu.CFLAGS)] == ops_cpu.CFLAGS
    assert calls.count("building the float16 probe") == len(ops_cpu.OPTIONAL_FLAGS) + 2  # optional, option, plain
    x = np.array([0.5, -7.0], np.float16)
    np.testing.assert_array_equal((Tensor(x) - 0.3125).numpy(), x - np.float16(0.3125))


def test_gcc_rounds_a_float16_cast_of_a_float32_value():
    # gcc's default excess precision keeps (float)(_Float16)x at float precision; the probe adds the standard one
    x = np.array([1.0009765625 + 2**-12, 3.14159], np.float32)
    got = Tensor(x).cast(dtypes.float16).cast(dtypes.float32).numpy()
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))


def test_a_vectorized_float16_matmul_rounds_its_result_to_half():
    # gcc 12 with AVX512-FP16 dropped this rounding (float)(_Float16)acc: the result kept float32 digits
    rng = np.random.default_rng(5)
    a, b = rng.random((17, 33)).astype(np.float16), rng.random((33, 9)).astype(np.float16)
    got = (Tensor(a) @ Tensor(b)).cast(dtypes.float32).numpy()
    assert not (got.view(np.uint32) & 0x1FFF).any()  # a float16 value has 13 low zero bits in float32
    np.testing.assert_allclose(got, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16), rtol=2e-3)


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


def test_a_float32_kernel_builds_without_the_float16_probe(fresh_flags, monkeypatch):
    # the probe's compiles would sit on the path of every cold first kernel; only _Float16 sources need its flags
    calls = fake_compiler(monkeypatch, lambda argv, stdin: None)
    x = np.array([0.75, -1.5, 2.0], np.float32)
    np.testing.assert_array_equal((Tensor(x) * 1.4375 - 0.0625).numpy(), x * np.float32(1.4375) - np.float32(0.0625))
    assert "building the float16 probe" not in calls and any(c.startswith("compiling kernel") for c in calls)


@pytest.fixture
def fresh_link(tmp_path, monkeypatch):
    """A cache directory of its own and no link decision in memory, before and after the test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ops_cpu.link_flags.cache_clear()
    yield tmp_path
    ops_cpu.link_flags.cache_clear()


def test_kernels_link_without_the_c_runtime_where_the_probe_loads(fresh_link, monkeypatch):
    calls = fake_compiler(monkeypatch, lambda argv, stdin: None)
    cc = ops_cpu.find_compiler()
    assert ops_cpu.link_flags(cc) == ops_cpu.FAST_LINK
    # a kernel calling libm (sin, log) and the float16 conversions builds with them, loads and computes
    x = np.array([0.25, 1.5, 3.75, 7.0], np.float32)
    got = (Tensor(x).sin() * Tensor(x).log()).cast(dtypes.float16).cast(dtypes.float32).numpy()
    np.testing.assert_allclose(got, (np.sin(x) * np.log(x)).astype(np.float16).astype(np.float32), rtol=1e-3)
    # kept on disk: a new process does not probe again
    ops_cpu.link_flags.cache_clear()
    calls.clear()
    assert ops_cpu.link_flags(cc) == ops_cpu.FAST_LINK and "building the link probe" not in calls


def test_kernels_link_plainly_where_the_fast_link_fails(fresh_link, monkeypatch):
    # a platform without libgcc (macOS's clang): the probe's link fails, and kernels link with libm alone
    fake_compiler(monkeypatch, lambda argv, stdin: "ld: library not found for -lgcc\n" if "-lgcc" in argv else None)
    cc = ops_cpu.find_compiler()
    assert ops_cpu.link_flags(cc) == ops_cpu.PLAIN_LINK
    x = np.array([0.5, 2.0, 9.5], np.float32)
    np.testing.assert_allclose((Tensor(x).exp() * 1.0625).numpy(), np.exp(x) * 1.0625, rtol=1e-6)
