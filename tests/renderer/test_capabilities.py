"""The target is the renderer's: every renderer derives from Renderer and carries Capabilities, each device builds its
own (the CPU device from its compiler's -march=native macros), lower_to_linear plans for the renderer it is given,
and the front end asks through the engine."""

import stat

import pytest

from fusegrad import Tensor, dtypes
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import Opt, OptOps
from fusegrad.engine.realize import device_capabilities
from fusegrad.renderer import Capabilities, Renderer
from fusegrad.renderer.c import CRenderer
from fusegrad.renderer.cstyle import CStyleRenderer
from fusegrad.renderer.gpu import CUDARenderer, OpenCLRenderer
from fusegrad.renderer.gpu import CUDAKernelRenderer, OpenCLKernelRenderer
from fusegrad.renderer.llvmir import LLVMRenderer
from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer
from fusegrad.runtime import ops_cpu
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops
from tests.rendering import rendered


RENDERERS = [
    CStyleRenderer,
    CRenderer,
    OpenCLRenderer,
    CUDARenderer,
    OpenCLKernelRenderer,
    CUDAKernelRenderer,
    LLVMRenderer,
    AMDGPURenderer,
]


@pytest.mark.parametrize("cls", RENDERERS)
def test_every_renderer_is_a_renderer_with_capabilities(cls):
    assert issubclass(cls, Renderer) and isinstance(cls().capabilities, Capabilities)
    if cls is not OpenCLKernelRenderer:  # the CL device builds that one from its half and group-reduce support
        avx512 = cls.capabilities.replace(vector_bytes=64, vector_registers=32)
        assert cls(avx512).capabilities == avx512 and cls.capabilities != avx512  # the class default stays


def test_capabilities_are_frozen_and_count_lanes():
    caps = Capabilities(vector_bytes=32)
    with pytest.raises(AttributeError):
        caps.vector_bytes = 64  # type: ignore[misc]
    assert caps.lanes(dtypes.float32) == 8 and caps.lanes(dtypes.float64) == 4 and caps.lanes(dtypes.bool) == 32
    assert Capabilities(vector_bytes=8).lanes(dtypes.float64) == 1
    assert caps.packed_bytes == 32 and caps.replace(pack_bytes=16).packed_bytes == 16


def test_the_base_renderer_describes_a_target_and_prints_nothing():
    with pytest.raises(NotImplementedError, match="Renderer only describes its target"):
        rendered(Renderer(Capabilities()), "k", ())


def fake_compiler(tmp_path, name: str, macros: list[str], exit_code: int = 0) -> str:
    """A C compiler whose `-dM -E` lists the given macros (or fails with exit_code)."""
    path = tmp_path / name
    lines = "".join(f"echo '#define {m} 1'\n" for m in macros)
    path.write_text(f"#!/bin/sh\n{lines}exit {exit_code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize(
    "macros, expected",
    [
        (["__x86_64__", "__AVX__", "__AVX2__", "__AVX512F__"], (64, 32)),
        (["__x86_64__", "__AVX__", "__AVX2__"], (32, 16)),
        (["__x86_64__", "__SSE2__"], (16, 16)),
        (["__aarch64__", "__ARM_NEON"], (16, 32)),
    ],
)
def test_the_cpu_probe_reads_the_compilers_march_native_macros(tmp_path, macros, expected):
    assert ops_cpu.vector_target(fake_compiler(tmp_path, "cc-" + "-".join(m.strip("_") for m in macros), macros)) == (
        expected
    )


def test_a_compiler_that_cannot_list_its_macros_gives_the_sse2_baseline(tmp_path):
    assert ops_cpu.vector_target(fake_compiler(tmp_path, "broken-cc", [], exit_code=1)) == (16, 16)


def capabilities_under(tmp_path, monkeypatch, macros: list[str]):
    """The CPU device's capabilities with a compiler whose -march=native predefines `macros`."""
    cc = fake_compiler(tmp_path, "cc-" + "-".join(m.strip("_") for m in macros), macros)
    monkeypatch.setattr(ops_cpu, "find_compiler", lambda: cc)
    return ops_cpu.host_capabilities()


@pytest.mark.parametrize(
    "macros, expected",
    [
        (["__x86_64__", "__AVX512F__", "__AVX512VNNI__"], True),
        (["__x86_64__", "__AVX2__", "__AVXVNNI__"], True),
        (["__aarch64__", "__ARM_FEATURE_DOTPROD"], True),
        (["__x86_64__", "__AVX512F__"], False),
    ],
)
def test_the_cpu_has_int8_dot_where_the_compiler_targets_a_dot_product_instruction(
    tmp_path, monkeypatch, macros, expected
):
    assert capabilities_under(tmp_path, monkeypatch, macros).int8_dot is expected


@pytest.mark.parametrize(
    "macros, expected",
    [
        (["__x86_64__", "__AVX__", "__AVX2__"], True),
        (["__x86_64__", "__AVX512F__", "__AVX2__"], True),
        (["__x86_64__", "__AVX__"], False),
        (["__aarch64__", "__ARM_FEATURE_DOTPROD"], False),
    ],
)
def test_the_cpu_has_int16_dot_where_the_compiler_targets_avx2(tmp_path, monkeypatch, macros, expected):
    assert capabilities_under(tmp_path, monkeypatch, macros).int16_dot is expected


@pytest.mark.parametrize(
    "macros, expected",
    [
        (["__x86_64__", "__AVX__", "__AVX2__", "__FMA__"], True),
        (["__x86_64__", "__AVX512F__", "__AVX2__", "__FMA__"], True),
        (["__x86_64__", "__AVX__", "__AVX2__"], False),
        (["__x86_64__", "__AVX__", "__FMA__"], False),
        (["__aarch64__", "__ARM_FEATURE_DOTPROD"], False),
    ],
)
def test_the_cpu_has_u8s8_pair_dot_where_the_compiler_targets_avx2_and_fma(tmp_path, monkeypatch, macros, expected):
    assert capabilities_under(tmp_path, monkeypatch, macros).u8s8_pair_dot is expected


def test_only_the_c_dialect_compiles_the_avx2_kernels(tmp_path, monkeypatch):
    # the interpreter and the NULL device plan with the host's values but compile no C: no raw C kernel for them
    cc = fake_compiler(tmp_path, "cc-avx2-fma", ["__x86_64__", "__AVX__", "__AVX2__", "__FMA__"])
    monkeypatch.setattr(ops_cpu, "find_compiler", lambda: cc)
    assert ops_cpu.host_capabilities(CRenderer.capabilities).u8s8_pair_dot
    assert not ops_cpu.host_capabilities(CRenderer.capabilities.replace(loop_vectorizer=False)).u8s8_pair_dot


def test_host_capabilities_keep_the_dialects_vector_math(monkeypatch):
    monkeypatch.setattr(ops_cpu, "vector_target", lambda cc: (64, 32))
    caps = ops_cpu.host_capabilities()
    assert (caps.vector_bytes, caps.vector_registers) == (64, 32)
    assert caps.vector_math == CRenderer.capabilities.vector_math and (Ops.EXP, dtypes.float32) in caps.vector_math
    assert not caps.parallel_loops


def test_devices_build_their_renderers_with_their_own_values():
    cpu = Device["CPU"].renderer.capabilities
    assert (cpu.vector_bytes, cpu.vector_registers) == ops_cpu.vector_target(ops_cpu.find_compiler())
    # the interpreter and the NULL device plan like the CPU device: the same kernels get the same opts
    for name in ("PYTHON", "NULL"):
        caps = Device[name].renderer.capabilities
        assert (caps.vector_bytes, caps.vector_registers) == (cpu.vector_bytes, cpu.vector_registers)
    assert OpenCLKernelRenderer().capabilities.parallel_loops and CUDAKernelRenderer().capabilities.parallel_loops
    assert OpenCLKernelRenderer(group_reduce=False).capabilities.group_reduce is False
    assert OpenCLKernelRenderer().capabilities.packed_bytes == 16  # float4 / double2


def test_the_front_end_reads_the_devices_capabilities_through_the_engine():
    assert device_capabilities("CPU") is Device["CPU"].renderer.capabilities
    assert device_capabilities("PYTHON") is Device["PYTHON"].renderer.capabilities


def matmul_ast(m: int, k: int, n: int):
    a, b = Tensor.rand(m, k).realize(), Tensor.rand(k, n).realize()
    items, _, _ = create_schedule([(a @ b).uop], [Device["CPU"]])
    return items[-1].ast


def test_lower_to_linear_plans_for_the_renderer_it_is_given():
    ast = matmul_ast(64, 256, 64)
    sse, avx2, avx512 = (CRenderer(CRenderer.capabilities.replace(vector_bytes=b)) for b in (16, 32, 64))
    columns = {r.capabilities.vector_bytes: lower_to_linear(ast, r).opts[1] for r in (sse, avx2, avx512)}
    # the register tile is two vectors of columns wide, whatever the vector
    assert columns == {b: Opt(OptOps.UPCAST, 1, 2 * b // 4) for b in (16, 32, 64)}
    # and the C source packs to the renderer's width
    info = lower_to_linear(ast, avx512)
    assert "vector_size(64)" in rendered(avx512, "k", info.lin)
