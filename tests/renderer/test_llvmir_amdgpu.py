"""The AMDGPU dialect of the LLVM renderer: amdgpu_kernel, global buffers in address space 1, allocas in 5, one
work-item; and the host dialect's text is what it was before the AMD renderer became its subclass."""

import re
from pathlib import Path

import pytest

from fusegrad import Tensor, dtypes
from fusegrad.codegen import lower_to_linear
from fusegrad.renderer.cstyle import RenderError
from fusegrad.renderer.llvmir import LLVMRenderer
from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer
from fusegrad.runtime.device import Device
from fusegrad.runtime.support.amd.codeobj import compile_ir, parse_code_object
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops, UOp
from tests.rendering import rendered


GOLDEN = Path(__file__).parent / "llvmir_golden"
UNQUALIFIED_PTR = re.compile(r"\bptr %")  # a pointer in the default address space 0


def kernels(t: Tensor):
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    return [lower_to_linear(i.ast, Device["CPU"].renderer) for i in items if i.ast.op is Ops.SINK]


def const(dt, v):
    return UOp(Ops.CONST, dt, (), v)


def elementwise() -> tuple[UOp, ...]:
    """out[i] = sqrt((i < 6 ? x[i] : 0) * 2 + 1) for i < 8: a gated load, an fma, an intrinsic."""
    out, x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, 8)), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 6))
    i = UOp(Ops.RANGE, dtypes.int32, (const(dtypes.int32, 8),), (0, "global"))
    gate = UOp(Ops.CMPLT, dtypes.bool, (i, const(dtypes.int32, 6)))
    load = UOp(Ops.LOAD, dtypes.float32, (x, i, gate))
    prod = UOp(Ops.MUL, dtypes.float32, (load, const(dtypes.float32, 2.0)))
    fma = UOp(Ops.ADD, dtypes.float32, (prod, const(dtypes.float32, 1.0)))
    root = UOp(Ops.SQRT, dtypes.float32, (fma,))
    store = UOp(Ops.STORE, dtypes.void, (out, i, root))
    body = (gate.src[1], gate, load, prod.src[1], prod, fma.src[1], fma, root, store)
    return (out, x, i.src[0], i, *body, UOp(Ops.ENDRANGE, dtypes.void, (i,)))


def reduce() -> tuple[UOp, ...]:
    """out[i] = sum over j < 4 of x[4*i + j], for i < 3."""
    out, x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, 3)), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 12))
    four = const(dtypes.int32, 4)
    i = UOp(Ops.RANGE, dtypes.int32, (const(dtypes.int32, 3),), (0, "global"))
    base = UOp(Ops.MUL, dtypes.int32, (i, four))
    acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (const(dtypes.float32, 0.0),), 0)
    j = UOp(Ops.RANGE, dtypes.int32, (four,), (1, "reduce"))
    idx = UOp(Ops.ADD, dtypes.int32, (j, base))
    load = UOp(Ops.LOAD, dtypes.float32, (x, idx))
    update = UOp(Ops.ACC_UPDATE, dtypes.float32, (acc, load, j), Ops.ADD)
    store = UOp(Ops.STORE, dtypes.void, (out, i, update))
    body = (four, base, acc, j, idx, load, update, UOp(Ops.ENDRANGE, dtypes.void, (j,)), store)
    return (out, x, i.src[0], i, *body, UOp(Ops.ENDRANGE, dtypes.void, (i,)))


@pytest.mark.parametrize("program", [elementwise, reduce])
def test_host_llvm_text_is_unchanged(program):
    # the golden files are the host renderer's output from before AMDGPURenderer existed
    assert rendered(LLVMRenderer(), "k", program()) == (GOLDEN / f"{program.__name__}.ll").read_text()


def assert_amdgpu_abi(ir: str, name: str, nbufs: int) -> None:
    params = ", ".join(f"ptr addrspace(1) %data{i}" for i in range(nbufs))
    assert ir.startswith('target triple = "amdgcn-amd-amdhsa"\n')
    assert f"define amdgpu_kernel void @{name}({params}) nounwind {{" in ir  # kernarg: one pointer per buffer
    allocas = re.findall(r"= alloca .*", ir)
    assert allocas and all(a.endswith(", addrspace(5)") for a in allocas)
    assert not UNQUALIFIED_PTR.search(ir) and "core_start" not in ir
    for line in ir.splitlines():
        if " load " in line or line.lstrip().startswith("store "):
            assert re.search(r"ptr addrspace\([15]\) %", line), line


@pytest.mark.parametrize("program", [elementwise, reduce])
def test_amdgpu_dialect_of_hand_written_kernels(program):
    ir = rendered(AMDGPURenderer(), "k", program())
    assert_amdgpu_abi(ir, "k", 2)
    loops = re.findall(r"icmp slt i32 %v\d+, (\w+)", ir)
    assert loops[0] == {"elementwise": "8", "reduce": "3"}[program.__name__]  # the outer loop runs from 0 to its end
    host = rendered(LLVMRenderer(), "k", program())
    for instr in ("\n  store ", " = load ", " = alloca ", "call float @llvm.", " = fadd ", " = phi "):
        assert ir.count(instr) == host.count(instr), instr  # the same program, only the ABI differs


@pytest.mark.parametrize("build", [lambda x: (x + 1) * x.exp(), lambda x: x.sum(1), lambda x: x.max(1) - x.mean(1)])
def test_amdgpu_dialect_of_pipeline_kernels_compiles_with_registers_only(build, amdgpu_target):
    x = Tensor.rand(6, 40).realize()
    for info in kernels(build(x)):
        ir = rendered(AMDGPURenderer(), info.name, info.lin)
        assert_amdgpu_abi(ir, info.name, info.nparams)
        kd = parse_code_object(compile_ir(ir, amdgpu_target), info.name)
        assert kd.kernarg_size == 8 * info.nparams and kd.private_segment == 0


def test_amdgpu_dialect_refuses_float64_transcendentals_and_fp8():
    (info,) = kernels(Tensor([1.0, 2.0], dtype=dtypes.float64).exp2())
    with pytest.raises(RenderError, match="exp2 on dtypes.float64"):
        rendered(AMDGPURenderer(), info.name, info.lin)
    (info,) = kernels(Tensor([1.0, 2.0], dtype=dtypes.float64).sqrt())
    assert "@llvm.sqrt.f64" in rendered(AMDGPURenderer(), info.name, info.lin)  # sqrt has an amdgcn lowering
    (info,) = kernels(Tensor([1.0, 2.0]).cast(dtypes.fp8e4m3))
    with pytest.raises(RenderError, match="does not support dtypes.fp8e4m3"):
        rendered(AMDGPURenderer(), info.name, info.lin)
