"""A custom kernel that cannot run as written raises a clear error where custom_kernel is called, before any launch."""

import pytest
from fusegrad import AddrSpace, AxisType, Device, KernelInfo, Tensor, UOp, dtypes
from fusegrad.helpers import GlobalCounters


def _run(fxn, *shapes, dtype=dtypes.float32, device=None):
    ins = [Tensor.empty(*s, dtype=dtype, device=device) for s in shapes]
    return Tensor.custom_kernel(*ins, fxn=fxn)


def test_index_past_the_placeholder_shape():
    def past_end(B, A):
        i = UOp.range(A.shape[0] + 1, 0)
        return B[i].store(A[i]).end(i).sink(arg=KernelInfo(name="past_end"))

    GlobalCounters.reset()
    with pytest.raises(ValueError, match=r"'past_end': index 0 of a placeholder of shape \(4,\) reaches \[0, 4\]"):
        _run(past_end, (4,), (4,))
    assert GlobalCounters.kernel_count == 0


def test_writing_an_input_it_was_not_given():
    def stray(B, A):
        i = UOp.range(4, 0)
        other = UOp.placeholder((4,), dtypes.float32, 5)
        return other[i].store(A[i]).end(i).sink(arg=KernelInfo(name="stray"))

    with pytest.raises(ValueError, match="'stray' uses placeholder slot 5 .* no input \\(it was given 2\\)"):
        _run(stray, (4,), (4,))


def test_a_placeholder_unlike_its_input():
    def wrong_shape(B, A):
        i = UOp.range(8, 0)
        bigger = UOp.placeholder((8,), dtypes.float32, 0)
        return bigger[i].store(A[i % 4]).end(i).sink(arg=KernelInfo(name="wrong_shape"))

    with pytest.raises(ValueError, match=r"slot 0 \(dtypes.float32 x 8\), the input is dtypes.float32 x 4"):
        _run(wrong_shape, (4,), (4,))


def test_a_kernel_that_stores_nothing():
    with pytest.raises(ValueError, match="'nothing' stores into no input"):
        _run(lambda B, A: UOp.group().sink(arg=KernelInfo(name="nothing")), (4,), (4,))


def test_wrong_number_of_indices_and_wrong_store_dtype():
    C = UOp.placeholder((2, 3), dtypes.float32, 0)
    with pytest.raises(IndexError, match=r"1 indices into a placeholder of shape \(2, 3\)"):
        C[UOp.range(2, 0)]
    i, j = UOp.range(2, 0), UOp.range(3, 1)
    with pytest.raises(TypeError, match="storing a dtypes.int32 value into a dtypes.float32 buffer"):
        C[i, j].store(i * 3 + j)


def test_a_range_the_store_does_not_end():
    def unended(B, A):
        i = UOp.range(4, 0)
        return B[i].store(A[i]).sink(arg=KernelInfo(name="unended"))

    with pytest.raises(ValueError, match="'unended': the store into slot 0 uses range 0 but does not .end\\(\\) it"):
        _run(unended, (4,), (4,))


def test_a_register_set_in_a_loop_to_something_not_a_fold():
    def decay(B, A):
        i, k = UOp.range(4, 0), UOp.range(3, 1, axis_type=AxisType.REDUCE)
        acc = UOp.placeholder((1,), dtypes.float32, 0, addrspace=AddrSpace.REG)
        acc = acc[0].set(0.0)
        acc = acc[0].set(acc.after(k)[0] * 0.5 + A[i, k], end=k)
        return B[i].store(acc[0]).end(i).sink(arg=KernelInfo(name="decay"))

    with pytest.raises(ValueError, match="'decay': register 0 element 0 is set inside a REDUCE loop"):
        _run(decay, (4,), (4, 3))


def test_a_register_read_before_it_is_set():
    def unset(B, A):
        i = UOp.range(4, 0)
        acc = UOp.placeholder((1,), dtypes.float32, 0, addrspace=AddrSpace.REG)
        return B[i].store(acc[0] + A[i]).end(i).sink(arg=KernelInfo(name="unset"))

    with pytest.raises(ValueError, match="register 0 element 0 is read before anything is stored into it"):
        _run(unset, (4,), (4,))


def test_opts_to_apply_is_refused():
    def with_opts(B, A):
        i = UOp.range(4, 0)
        return B[i].store(A[i]).end(i).sink(arg=KernelInfo(name="with_opts", opts_to_apply=("UPCAST",)))

    with pytest.raises(ValueError, match=r"'with_opts': opts_to_apply \('UPCAST',\) \(custom kernels take no opts\)"):
        _run(with_opts, (4,), (4,))


def test_a_dtype_the_device_lacks():
    try:
        Device["CL"]
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no CL device: {e}")

    def copy(B, A):
        i = UOp.range(4, 0)
        return B[i].store(A[i]).end(i).sink(arg=KernelInfo(name="copy_fp8"))

    GlobalCounters.reset()
    with pytest.raises(Exception, match="fp8"):
        _run(copy, (4,), (4,), dtype=dtypes.fp8e4m3, device="CL")
    assert GlobalCounters.kernel_count == 0


def test_bad_fxn_results():
    with pytest.raises(TypeError, match="returns a sink"):
        Tensor.custom_kernel(Tensor.empty(2), fxn=lambda B: 3)
    with pytest.raises(TypeError, match="needs fxn"):
        Tensor.custom_kernel(Tensor.empty(2))


def test_inputs_on_different_devices():
    from custom_kernel_examples import add_one

    with pytest.raises(RuntimeError, match="custom_kernel inputs are on different devices"):
        Tensor.custom_kernel(Tensor.empty(4), Tensor.empty(4, device="PYTHON"), fxn=add_one)
