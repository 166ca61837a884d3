"""Devices, compiler detection and caching, the engine's counters and debug output, buffer lifetime."""

import gc
from collections import OrderedDict
import os
import subprocess
import sys
import numpy as np
import pytest
from fusegrad import Context, Device, GlobalCounters, Tensor
from fusegrad.runtime import c_compiler
from fusegrad.runtime.ops_cpu import ClangCompiler, CompileError


def test_default_device_and_canonicalize():
    assert Device.DEFAULT == "CPU"
    assert Device.canonicalize("cpu:0") == "CPU" and Device.canonicalize("cpu:1") == "CPU:1"
    with pytest.raises(RuntimeError, match="NOPE"):
        Device.canonicalize("NOPE")
    with pytest.raises(RuntimeError, match="'nope'"):
        Tensor([1, 2], device="nope")


def test_dev_env_selects_python_device():
    code = (
        "from fusegrad import Tensor, Device; t = Tensor([1.0, 2.0]) * 3; print(Device.DEFAULT, t.device, t.tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "DEV": "PYTHON"}, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["PYTHON", "PYTHON", "[3.0,", "6.0]"]


def test_bad_env_value_is_named():
    out = subprocess.run(
        [sys.executable, "-c", "import fusegrad"], env={**os.environ, "DEBUG": "lots"}, capture_output=True, text=True
    )
    assert out.returncode != 0 and "DEBUG='lots'" in out.stderr


def test_missing_compiler_says_what_was_tried(monkeypatch):
    monkeypatch.setattr(c_compiler.shutil, "which", lambda name: None)
    c_compiler._locate_compiler.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="tried cc, clang, gcc"):
            c_compiler.find_compiler()
    finally:
        c_compiler._locate_compiler.cache_clear()


def test_compile_error_shows_message_and_source():
    with pytest.raises(CompileError) as e:
        ClangCompiler().compile("void broken(float* data0) { data0[0] = undefined_name; }")
    assert "undefined_name" in str(e.value) and "--- source ---" in str(e.value)


def test_second_process_compiles_nothing(tmp_path):
    code = (
        "import numpy as np; from fusegrad import Tensor; from fusegrad.runtime import ops_cpu;"
        "calls = []; real = ops_cpu.run_compiler;"
        "ops_cpu.run_compiler = lambda *a, **k: (calls.append(a[0]), real(*a, **k))[1];"
        "(Tensor(np.ones(5, np.float32)) * 7 + 1).sum().numpy(); print(sum(1 for c in calls if '-shared' in c))"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    first = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    second = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert int(first) >= 1 and int(second) == 0
    assert any(p.suffix == ".so" for p in (tmp_path / "fusegrad" / "cpu").iterdir())


def test_debug2_prints_one_line_per_kernel(capsys):
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
    with Context(DEBUG=2):
        (a.sum(axis=1) * 2).realize()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("***")]
    assert len(lines) == 1 and "r_3_4" in lines[0] and "GFLOPS" in lines[0] and "GB/s" in lines[0]


def test_global_counters_count_kernels_ops_and_bytes():
    a = Tensor(np.ones((64, 64), np.float32)).realize()
    GlobalCounters.reset()
    (a * 2 + 1).realize()
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.global_ops >= 2 * 64 * 64
    assert GlobalCounters.global_mem >= 2 * 64 * 64 * 4
    GlobalCounters.reset()
    assert GlobalCounters.kernel_count == 0 and GlobalCounters.global_ops == 0


def test_buffers_are_freed_when_unreferenced():
    gc.collect()
    before = GlobalCounters.mem_used
    t = (Tensor.ones(1024, 256) * 3).realize()
    assert GlobalCounters.mem_used >= before + 1024 * 256 * 4
    del t
    gc.collect()
    assert GlobalCounters.mem_used <= before


def test_failed_realize_leaves_other_tensors_valid(monkeypatch):
    good = Tensor(np.arange(4, dtype=np.float32)) + 1
    bad = Tensor(np.arange(4, dtype=np.float32)).exp()

    def broken_compile(self, src, name):
        raise CompileError("simulated compiler failure")

    monkeypatch.setattr(ClangCompiler, "compile", broken_compile)
    from fusegrad.engine import realize as engine

    monkeypatch.setattr(engine, "_runners", OrderedDict())
    with pytest.raises(CompileError):
        bad.realize()
    monkeypatch.undo()
    np.testing.assert_allclose(good.numpy(), np.arange(4) + 1)
    np.testing.assert_allclose(bad.numpy(), np.exp(np.arange(4, dtype=np.float32)), rtol=1e-6)


REPRESENTATIVE = {
    "fused_elementwise": lambda a, b: (a * b + 1).relu() - a.exp() / (b.abs() + 1),
    "reduce_axis": lambda a, b: (a * b).sum(axis=0) + a.max(axis=0),
    "matmul": lambda a, b: a @ b.T,
    "movement": lambda a, b: a.T.flip(0)[1:, ::-1].pad(((1, 0), (0, 2))) + 1,
    "softmax": lambda a, b: (
        (a - a.max(axis=1, keepdim=True)).exp() / (a - a.max(axis=1, keepdim=True)).exp().sum(axis=1, keepdim=True)
    ),
    "int_math": lambda a, b: ((a * 10).cast("int32") // 3) % 4 + (b * 10).cast("int32"),
    "half": lambda a, b: (a.half() * b.half()).sum(axis=1).float(),
    "bfloat16": lambda a, b: (a.bfloat16() + b.bfloat16()).float(),
    "where_compare": lambda a, b: (a < b).where(a, b * 2) + (a >= 0).cast("float32"),
}


@pytest.mark.parametrize("name", list(REPRESENTATIVE))
def test_python_backend_matches_cpu(name):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 6), dtype=np.float32), rng.standard_normal((5, 6), dtype=np.float32)
    fn = REPRESENTATIVE[name]
    cpu = fn(Tensor(a), Tensor(b)).numpy()
    py = fn(Tensor(a, device="PYTHON"), Tensor(b, device="PYTHON")).numpy()
    assert cpu.dtype == py.dtype and cpu.shape == py.shape
    np.testing.assert_allclose(py, cpu, rtol=2e-3 if name in ("half", "bfloat16") else 1e-5, atol=1e-5)


def test_copy_between_devices():
    a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).T
    b = a.to("PYTHON") * 2
    assert b.device == "PYTHON"
    np.testing.assert_array_equal(b.to("CPU").numpy(), np.arange(6).reshape(2, 3).T * 2)
    with pytest.raises(RuntimeError, match="different devices"):
        (a + b).realize()
