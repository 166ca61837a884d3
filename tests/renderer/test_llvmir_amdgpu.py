"""The AMDGPU dialect of the LLVM renderer: amdgpu_kernel, global buffers in address space 1, allocas in 5, global
loops on workgroups and work-items as codegen/gpu_dims.py maps them, split reductions through LDS with barriers; and the
host dialect's text is what it was before the AMD renderer became its subclass."""

import re
from pathlib import Path

import pytest

from fusegrad import Tensor, dtypes
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.gpu_dims import launch_dims
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
    # kernarg: one pointer per buffer; the group size is the launch's
    assert re.search(rf"define amdgpu_kernel void @{name}\({re.escape(params)}\) nounwind .*!reqd_work_group_size", ir)
    allocas = re.findall(r"= alloca .*", ir)
    assert all(a.endswith(", addrspace(5)") for a in allocas)
    assert not UNQUALIFIED_PTR.search(ir) and "core_start" not in ir
    for line in ir.splitlines():
        if " load " in line or line.lstrip().startswith("store "):
            assert re.search(r"ptr addrspace\([135]\) [%@]", line), line  # global, LDS or private


@pytest.mark.parametrize("program", [elementwise, reduce])
def test_amdgpu_dialect_of_hand_written_kernels(program):
    ir = rendered(AMDGPURenderer(), "k", program())
    assert_amdgpu_abi(ir, "k", 2)
    end = {"elementwise": 8, "reduce": 3}[program.__name__]
    # the global loop is the work-item id, checked against its end (the group is that end rounded up to 2^k)
    assert re.search(rf"%(v\d+) = call i32 @llvm.amdgcn.workitem.id.x\(\)\n  %v\d+ = icmp slt i32 %\1, {end}\n", ir)
    assert f"!0 = !{{i32 {1 << (end - 1).bit_length()}, i32 1, i32 1}}" in ir
    host = rendered(LLVMRenderer(), "k", program())
    for instr in ("load float", "store float", "call float @llvm.", " = fadd ", " = phi "):
        assert ir.count(instr) == host.count(instr), instr  # the same program, only the ABI and the loop differ


def grid_kernel(rows: int, cols: int) -> tuple[UOp, ...]:
    """out[i, j] = x[i, j] + 1 over two global loops."""
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, rows * cols))
    x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, rows * cols))
    i = UOp(Ops.RANGE, dtypes.int32, (const(dtypes.int32, rows),), (0, "global"))
    j = UOp(Ops.RANGE, dtypes.int32, (const(dtypes.int32, cols),), (1, "global"))
    idx = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.MUL, dtypes.int32, (i, const(dtypes.int32, cols))), j))
    value = UOp(Ops.ADD, dtypes.float32, (UOp(Ops.LOAD, dtypes.float32, (x, idx)), const(dtypes.float32, 1.0)))
    store = UOp(Ops.STORE, dtypes.void, (out, idx, value))
    body = (idx.src[0].src[1], idx.src[0], idx, value.src[0], value.src[1], value, store)
    end = UOp(Ops.ENDRANGE, dtypes.void, (j,)), UOp(Ops.ENDRANGE, dtypes.void, (i,))
    return (out, x, i.src[0], i, j.src[0], j, *body, *end)


def test_two_global_loops_read_workgroup_and_work_item_ids_of_two_dimensions():
    lin = grid_kernel(300, 5)
    dims = launch_dims(lin)
    assert dims.local_size == (8, 16, 1) and dims.groups == (1, 19, 1)
    ir = rendered(AMDGPURenderer(), "k", lin)
    assert "@llvm.amdgcn.workitem.id.x()" in ir and "@llvm.amdgcn.workitem.id.y()" in ir
    assert "@llvm.amdgcn.workgroup.id.y()" in ir and "workgroup.id.x" not in ir  # one group along x: id 0
    assert re.search(r"mul nuw i32 %v\d+, 16", ir)  # group id * local size
    assert '"amdgpu-flat-work-group-size"="1,128"' in ir and "!0 = !{i32 8, i32 16, i32 1}" in ir


def test_a_split_reduction_combines_lanes_in_lds_between_barriers():
    (info,) = kernels(Tensor.rand(4, 1000).realize().max(1))
    dims = launch_dims(info.lin)
    assert dims.grouped is not None and dims.lanes == 128
    ir = rendered(AMDGPURenderer(), info.name, info.lin)
    assert re.search(r"@fg_red\d+ = internal addrspace\(3\) global \[128 x float\] poison", ir)
    # one barrier after the lanes store their accumulators, one after each of the log2(128) = 7 tree steps
    assert ir.count("call void @llvm.amdgcn.s.barrier()") == 8
    assert ir.count('fence syncscope("workgroup") release') == 8
    assert re.search(r"icmp ne i32 %v\d+, 0\n  br i1 %v\d+, label %lane_done\d+", ir)  # only lane 0 stores


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


def many_sums(accs: int, dt=dtypes.float64) -> tuple[UOp, ...]:
    """out[i * accs + k] = sum over j < 128 of x[j] * (k + 1), for i < 2: `accs` accumulators in one reduce loop."""
    out, x = UOp(Ops.DEFINE_GLOBAL, dt, (), (0, 2 * accs)), UOp(Ops.DEFINE_GLOBAL, dt, (), (1, 128))
    i = UOp(Ops.RANGE, dtypes.int32, (const(dtypes.int32, 2),), (0, "global"))
    defs = [UOp(Ops.DEFINE_ACC, dt, (const(dt, 0.0),), k) for k in range(accs)]
    j = UOp(Ops.RANGE, dtypes.int32, (const(dtypes.int32, 128),), (1, "reduce"))
    load = UOp(Ops.LOAD, dt, (x, j))
    terms = [UOp(Ops.MUL, dt, (load, const(dt, k + 1.0))) for k in range(accs)]
    updates = [UOp(Ops.ACC_UPDATE, dt, (a, t, j), Ops.ADD) for a, t in zip(defs, terms)]
    base = UOp(Ops.MUL, dtypes.int32, (i, const(dtypes.int32, accs)))
    idx = [UOp(Ops.ADD, dtypes.int32, (base, const(dtypes.int32, k))) for k in range(accs)]
    stores = [UOp(Ops.STORE, dtypes.void, (out, ix, u)) for ix, u in zip(idx, updates)]
    consts = [c for t in terms for c in t.src[1:]] + [ix.src[1] for ix in idx]
    return (
        (out, x, i.src[0], i, *defs, j.src[0], j, load, *terms, *updates, UOp(Ops.ENDRANGE, dtypes.void, (j,)), base)
        + tuple(consts)
        + (*idx, *stores, UOp(Ops.ENDRANGE, dtypes.void, (i,)))
    )


def test_a_split_reduction_whose_lds_arrays_would_not_fit_is_not_split():
    fits, too_big = many_sums(64), many_sums(65)  # 128 lanes * 8 bytes * 64 accumulators = 64 KiB exactly
    assert launch_dims(fits).grouped is not None and launch_dims(too_big).grouped is not None
    renderer = AMDGPURenderer()
    assert renderer.launch_dims(fits).lanes == 128
    assert renderer.launch_dims(too_big).grouped is None  # one work-item per output, no LDS
    assert "addrspace(3)" not in rendered(renderer, "k", too_big)
    assert rendered(renderer, "k", fits).count("addrspace(3) global [128 x double]") == 64
