"""codegen's lower_custom stage: a user-written kernel becomes a lowered kernel that satisfies its spec."""

import numpy as np
import pytest
from fusegrad import AddrSpace, AxisType, KernelInfo, UOp, dtypes
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.custom import CustomKernelError, lower_custom
from fusegrad.runtime.device import Buffer
from fusegrad.runtime.ops_python import PythonProgram
from fusegrad.uop.ops import Ops
from fusegrad.uop.spec import check_graph, check_linear
from fusegrad.runtime.device import Device


def _row_sum(unroll: int = 1) -> UOp:
    out, x = UOp.placeholder((3,), dtypes.float32, 0), UOp.placeholder((3, 8), dtypes.float32, 1)
    i, k = UOp.range(3, 0), UOp.range(8 // unroll, 1, axis_type=AxisType.REDUCE)
    u = UOp.range(unroll, 2, axis_type=AxisType.UNROLL)
    acc = UOp.placeholder((1,), dtypes.float32, 0, addrspace=AddrSpace.REG)
    acc = acc[0].set(1.5)
    acc = acc[0].set(acc.after(k)[0] + x[i, k * unroll + u], end=(k, u))
    return out[i].store(acc[0]).end(i).sink(x.base, arg=KernelInfo(name="row_sum"))


@pytest.mark.parametrize("unroll", [1, 4])
def test_register_sum_becomes_a_reduce_over_its_loop(unroll):
    kernel = lower_custom(_row_sum(unroll))
    check_graph(kernel, "lowered", "lower_custom")
    (store,) = kernel.src
    reduces = [u for u in kernel.toposort() if u.op is Ops.REDUCE]
    assert len(reduces) == 1 and reduces[0].arg is Ops.ADD and [r.arg for r in reduces[0].src[1:]] == [(1, "reduce")]
    assert sum(u.op is Ops.LOAD for u in reduces[0].toposort()) == unroll  # the unrolled lanes, summed in order
    info = lower_to_linear(_row_sum(unroll), Device["CPU"].renderer)
    check_linear(list(info.lin))
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    bufs = [Buffer("CPU", 3, dtypes.float32).ensure_allocated(), Buffer("CPU", 24, dtypes.float32, initial=x.ravel())]
    PythonProgram(info.lin, info.outer_size)([bufs[0], bufs[1].ensure_allocated()])
    np.testing.assert_allclose(bufs[0].numpy(), x.sum(1) + 1.5)


def test_loop_dependent_register_index_is_refused():
    out, x = UOp.placeholder((4,), dtypes.float32, 0), UOp.placeholder((4,), dtypes.float32, 1)
    i = UOp.range(4, 0)
    acc = UOp.placeholder((4,), dtypes.float32, 0, addrspace=AddrSpace.REG)
    acc = acc[i].set(x[i])
    sink = out[i].store(acc[i]).end(i).sink(arg=KernelInfo(name="by_loop"))
    with pytest.raises(CustomKernelError, match="'by_loop': register 0 is indexed by a loop index"):
        lower_custom(sink)
