"""UOp's kernel-building surface (uop/kernel.py): what each call builds, and the mistakes it refuses at once."""

import pytest
from fusegrad import AddrSpace, AxisType, KernelInfo, UOp, dtypes
from fusegrad.uop.ops import Ops
from fusegrad.uop.symbolic import sym_eval


def test_placeholders_views_and_indexing():
    C = UOp.placeholder((4, 6), dtypes.float32, 0)
    assert C.shape == (4, 6) and C.dtype is dtypes.float32 and C.base.op is Ops.DEFINE_GLOBAL
    assert C.base.arg == (0, 24) and C.flatten().shape == (24,) and C.reshape(6, 4).shape == (6, 4)
    assert C[1:3].shape == (2, 6) and C[:, 2:5].shape == (4, 3)
    reg = UOp.placeholder((2, 2), dtypes.float32, 1, addrspace=AddrSpace.REG)
    assert reg.base.op is Ops.DEFINE_REG and reg.shape == (2, 2)
    i = UOp.range(4, 0)
    e = C[i, 5]
    assert e.op is Ops.INDEX and e.dtype is dtypes.float32 and e.shape == () and e.src[1] is i


def test_ranges_and_index_arithmetic():
    i, k = UOp.range(8, 0), UOp.range(3, 1, axis_type=AxisType.REDUCE)
    assert i.arg == (0, AxisType.LOOP) and k.arg == (1, AxisType.REDUCE) and i.vmin == 0 and i.vmax == 7
    expr = (i * 3 + k) // 3
    assert sym_eval(expr, {i: 5, k: 2}) == 5 and sym_eval((i > 4).where(i, 0), {i: 3}) == 0
    assert sym_eval(i <= 4, {i: 4}) is True and (i * 1 + 0).simplify() is i


def test_stores_sets_and_sinks():
    C, A = UOp.placeholder((4,), dtypes.float32, 0), UOp.placeholder((4,), dtypes.float32, 1)
    i = UOp.range(4, 0)
    st = C[i].store(A[i] + 1)
    assert st.op is Ops.STORE and st.end(i).op is Ops.END and st.end() is st
    sink = st.end(i).sink(arg=KernelInfo(name="k", opts_to_apply=()))
    assert sink.op is Ops.SINK and sink.arg.name == "k"
    acc = UOp.placeholder((1,), dtypes.float32, 0, addrspace=AddrSpace.REG)
    after = acc[0].set(2.0)
    assert after.op is Ops.AFTER and after.src[0] is acc and after.src[1].src[1].arg == 2.0
    assert UOp.group(st, st).op is Ops.GROUP and acc.after(i).src == (acc, i)


def test_refused_at_once():
    C = UOp.placeholder((4, 6), dtypes.float32, 0)
    i = UOp.range(4, 0)
    with pytest.raises(IndexError, match=r"3 indices into a placeholder of shape \(4, 6\)"):
        C[i, i, i]
    with pytest.raises(IndexError, match="slice steps by 1"):
        C[::2]
    with pytest.raises(TypeError, match="an index is an int or an integer UOp"):
        C[1.5, 0]
    with pytest.raises(TypeError, match="store writes an indexed placeholder"):
        C.store(1.0)
    with pytest.raises(ValueError, match="counts to a non-negative int"):
        UOp.range(-1, 0)
    with pytest.raises(NotImplementedError, match="AddrSpace.LOCAL"):
        UOp.placeholder((4,), dtypes.float32, 0, addrspace=AddrSpace.LOCAL)
    with pytest.raises(TypeError, match="end closes ranges"):
        C[i, 0].store(1.0).end(C)
    with pytest.raises(TypeError, match="not iterable"):
        list(i)
