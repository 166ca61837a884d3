"""The LLVM IR renderer and the LLVM device: vectors and llvm.fma where the opts upcast, C's float semantics (no
fast-math beyond a sum's reassociation), the checksummed object cache, threads, DEBUG views and the fallback default."""

import os
import re

import numpy as np
import pytest

pytest.importorskip("llvmlite")

from fusegrad import Context, Tensor, dtypes  # noqa: E402
from fusegrad.codegen import lower_to_linear  # noqa: E402
from fusegrad.renderer.cstyle import RenderError  # noqa: E402
from fusegrad.renderer.llvmir import LLVMRenderer, render_const  # noqa: E402
from fusegrad.runtime import c_compiler, device as device_module, ops_cpu, ops_llvm  # noqa: E402
from fusegrad.runtime.device import Device  # noqa: E402
from fusegrad.schedule import create_schedule  # noqa: E402
from fusegrad.uop.ops import Ops  # noqa: E402
from tests.rendering import rendered


FAST_MATH = re.compile(r"\b(fast|nnan|ninf|nsz|arcp|afn|contract)\b")


def kernels(t: Tensor):
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    return [lower_to_linear(i.ast, Device["CPU"].renderer) for i in items if i.ast.op is Ops.SINK]


def test_upcast_matmul_renders_vectors_and_fma_without_fast_math():
    a, b = Tensor.rand(32, 16).realize(), Tensor.rand(16, 64).realize()
    (info,) = kernels(a @ b)
    assert info.opts
    ir = rendered(LLVMRenderer(LLVMRenderer.capabilities.replace(vector_bytes=64)), "k", info.lin)
    assert "<16 x float>" in ir and "call <16 x float> @llvm.fma.v16f32(" in ir
    assert "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)" in ir
    assert not FAST_MATH.search(ir) and "reassoc" not in ir
    narrow = rendered(LLVMRenderer(LLVMRenderer.capabilities.replace(vector_bytes=16)), "k", info.lin)
    assert "<4 x float>" in narrow and "<16 x float>" not in narrow
    with Context(NOOPT=1):
        (plain,) = kernels(a @ b)
    assert " x float>" not in rendered(LLVMRenderer(LLVMRenderer.capabilities.replace(vector_bytes=64)), "k", plain.lin)


def test_relu_epilogue_compares_and_selects_lane_by_lane():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 1024), dtype=np.float32), rng.standard_normal((1024, 64), dtype=np.float32)
    out = (Tensor(x) @ Tensor(w) + 0.5).relu()
    wide = LLVMRenderer(LLVMRenderer.capabilities.replace(vector_bytes=64))
    irs = [rendered(wide, "k", info.lin) for info in kernels(out)]
    assert any(re.search(r"fcmp \w+ <16 x float>", ir) and "select <16 x i1>" in ir for ir in irs)
    got = (Tensor(x, device="LLVM") @ Tensor(w, device="LLVM") + 0.5).relu().numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w + 0.5, 0), rtol=1e-4, atol=1e-3)


def test_only_an_innermost_sums_accumulator_reassociates():
    (info,) = kernels(Tensor.rand(4, 300).realize().sum(1))
    ir = rendered(LLVMRenderer(), "k", info.lin)
    assert re.findall(r"fadd reassoc float", ir) and not FAST_MATH.search(ir)
    (info,) = kernels(Tensor.rand(4, 300).realize().max(1))
    assert "reassoc" not in rendered(LLVMRenderer(), "k", info.lin)


def test_constants_are_exact_llvm_literals():
    assert render_const(0.1, dtypes.float32) == "0x3FB99999A0000000"  # 0.1f widened exactly
    assert render_const(float("nan"), dtypes.float32) == "0x7FF8000000000000"
    assert render_const(float("-inf"), dtypes.float64) == "0xFFF0000000000000"
    assert render_const(1.5, dtypes.float16) == "0xH3E00"
    assert render_const(2**32 - 1, dtypes.uint32) == "-1" and render_const(True, dtypes.bool) == "true"


def test_float_semantics_match_numpy():
    x = np.array([1.0, np.nan, -np.inf, np.inf, 0.0, -0.0, -2.5, 3.0], np.float32)
    y = np.array([np.nan, 1.0, 2.0, np.inf, 0.0, 1.0, -np.inf, 0.0], np.float32)
    a, b = Tensor(x, device="LLVM"), Tensor(y, device="LLVM")
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(a.maximum(b).numpy(), np.maximum(x, y))
        np.testing.assert_array_equal((a / b).numpy(), x / y)
        np.testing.assert_array_equal((a < b).numpy(), x < y)
        np.testing.assert_array_equal((a != b).numpy(), x != y)
        np.testing.assert_array_equal((a == b).numpy(), x == y)
        np.testing.assert_allclose(a.exp().numpy(), np.exp(x), rtol=1e-6)
        np.testing.assert_allclose(a.sqrt().numpy(), np.sqrt(x), rtol=1e-6)
        np.testing.assert_array_equal((a * 0).numpy(), x * 0)  # NaN and inf times 0 stay NaN: no nnan/ninf
        np.testing.assert_array_equal(a.cast(dtypes.bool).numpy(), x.astype(bool))


def test_integer_semantics_match_c():
    x = np.array([7, -7, -(2**31), 2**31 - 1, 0, 5], np.int32)
    d = np.array([2, 2, -1, 0, 0, -1], np.int32)
    a, b = Tensor(x, device="LLVM"), Tensor(d, device="LLVM")
    # floor division like the CPU device; x // 0 is 0; MIN / -1 wraps to MIN, x % -1 is 0 (as on the CPU device)
    np.testing.assert_array_equal((a // b).numpy(), (Tensor(x) // Tensor(d)).numpy())
    np.testing.assert_array_equal((a // b).numpy(), [3, -4, -(2**31), 0, 0, -5])
    np.testing.assert_array_equal((a % b).numpy(), (Tensor(x) % Tensor(d)).numpy())
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal((a * 3 + 1).numpy(), x * 3 + 1)  # wraps
        i8 = np.array([100, -100, 127], np.int8)
        np.testing.assert_array_equal((Tensor(i8, device="LLVM") * 2).numpy(), i8 * 2)
    u = np.array([1, 2**32 - 1], np.uint32)
    np.testing.assert_array_equal((Tensor(u, device="LLVM") >> 1).numpy(), u >> 1)


def test_fp8_is_refused_with_a_clear_error():
    t = Tensor([1.0, 2.0], device="LLVM").cast(dtypes.fp8e4m3)
    with pytest.raises(RenderError, match="LLVM renderer does not support dtypes.fp8e4m3"):
        t.realize()


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "fusegrad" / "llvm"


def test_objects_are_cached_checksummed_and_rebuilt_when_damaged(cache_home, monkeypatch):
    compiler = ops_llvm.LLVMCompiler()
    (info,) = kernels(Tensor.rand(64).realize() * 2)
    ir = rendered(LLVMRenderer(), "k", info.lin)
    compiler.load(ir, "k")
    (obj,) = [p for p in os.listdir(cache_home) if p.endswith(".o")]
    assert os.path.exists(cache_home / obj.replace(".o", ".sha256"))
    emitted = []
    real = ops_llvm.host_target

    class Counting:
        def __getattr__(self, name):
            if name == "emit_object":
                emitted.append(name)
            return getattr(real(), name)

    monkeypatch.setattr(ops_llvm, "host_target", lambda: Counting())
    compiler.load(ir, "k")
    assert emitted == []  # served from the cache
    with open(cache_home / obj, "wb") as f:
        f.write(os.urandom(100))
    engine, address = compiler.load(ir, "k")
    assert emitted == ["emit_object"] and address  # the damaged object was not loaded but rebuilt


def test_big_kernels_split_over_the_thread_pool(monkeypatch):
    submitted = []
    real = ops_cpu.thread_pool(1)

    class Counting:
        def submit(self, *args):
            submitted.append(args)
            return real.submit(*args)

    monkeypatch.setattr(ops_llvm, "thread_pool", lambda workers=1: Counting(), raising=False)
    monkeypatch.setattr(ops_cpu, "thread_pool", lambda workers=1: Counting())
    monkeypatch.setattr(ops_cpu, "split_launcher", lambda: None)  # as without the C runner: the Python pool
    x = np.random.default_rng(0).standard_normal((64, 8192)).astype(np.float32)
    with Context(NUM_CPU_THREADS=2):
        got = (Tensor(x, device="LLVM") * 2 + 1).numpy()
    np.testing.assert_array_equal(got, x * 2 + 1)
    assert submitted, "a 512k-element kernel runs its outer loop on two threads"


def test_big_kernels_split_over_the_c_runner_workers(monkeypatch):
    chunks = []
    real = ops_cpu.split_launcher()
    monkeypatch.setattr(ops_cpu, "split_launcher", lambda: lambda *args: (chunks.append(args[-1]), real(*args)))
    x = np.random.default_rng(0).standard_normal((64, 8192)).astype(np.float32)
    with Context(NUM_CPU_THREADS=3):
        got = (Tensor(x, device="LLVM") * 2 + 1).numpy()
    np.testing.assert_array_equal(got, x * 2 + 1)
    assert chunks == [3]


def test_debug_4_prints_ir_and_debug_7_assembly(capsys):
    x = Tensor(np.arange(40, dtype=np.float32) / 7, device="LLVM")
    with Context(DEBUG=4):
        (x * 3 - 1).realize()
    out = capsys.readouterr().out
    assert "define void @E_40(ptr %data0" in out and ".text" not in out
    with Context(DEBUG=7):
        (x * 5 - 2).realize()
    out = capsys.readouterr().out
    assert "define void @E_40(" in out and "E_40:" in out and "ret" in out.split("E_40:")[1]


def test_kernels_reach_constants_and_libm_by_64_bit_addresses(capsys):
    # MCJIT maps a kernel's code and its constant pool separately: in a big process they can land more than 2 GiB
    # apart, where a 32-bit %rip offset fails LLVM's relocation assert and aborts the process
    x = Tensor(np.linspace(-3, 3, 37).astype(np.float32), device="LLVM")
    with Context(DEBUG=7):
        got = (x * 1.2345 + 0.5).exp().numpy()
    asm = capsys.readouterr().out.split("E_37:")[1]
    assert "movabsq" in asm and "(%rip)" not in asm
    np.testing.assert_allclose(got, np.exp(np.linspace(-3, 3, 37).astype(np.float32) * 1.2345 + 0.5), rtol=1e-6)


def test_default_device_falls_back_to_llvm_without_a_c_compiler(monkeypatch, capsys):
    def no_compiler(requested):
        raise RuntimeError("no C compiler found for the CPU device (tried cc, clang, gcc on PATH)")

    monkeypatch.setattr(c_compiler, "_locate_compiler", no_compiler)
    device_module._host_default.cache_clear()
    try:
        with Context(DEV=""):
            assert Device.DEFAULT == "LLVM"
            assert Device.DEFAULT == "LLVM"
        assert (
            capsys.readouterr().err.count("no C compiler found for the CPU device, so the default device is LLVM") == 1
        )
        device_module._host_default.cache_clear()
        real_find_spec = device_module.importlib.util.find_spec
        monkeypatch.setattr(
            device_module.importlib.util, "find_spec", lambda n, *a: None if n == "llvmlite" else real_find_spec(n, *a)
        )
        with Context(DEV=""), pytest.raises(RuntimeError, match=r"needs a C compiler .* needs llvmlite"):
            Device.DEFAULT
    finally:
        device_module._host_default.cache_clear()


def test_a_process_without_any_c_compiler_computes_on_llvm(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("CC", "DEV")}
    env.update(
        PATH=str(tmp_path),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    code = "from fusegrad import Tensor\nt = Tensor([1.0, 2.0, 3.0])\nprint(t.device, (t * 2).sum().item())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["LLVM", "12.0"]
    assert proc.stderr.strip() == (
        "fusegrad: no C compiler found for the CPU device, so the default device is LLVM (set CC or DEV to choose)"
    )
