"""Bad or unusual input to construction, creation and movement: values and exception types follow torch."""

import decimal
import fractions

import numpy as np
import pytest
import torch

from fusegrad import GlobalCounters, Tensor, dtypes
from reference import TORCH2FG
from reference import check_torch as check

FG = {v: k for k, v in TORCH2FG.items()}


# ---------------------------------------------------------------------------------------------------------------------
# construction from Python values


@pytest.mark.parametrize(
    "data,kind",
    [
        (["a"], "str"),
        ([None], "NoneType"),
        ([1 + 2j], "complex"),
        ([1, "a"], "str"),
        ([[1.0], [None]], "NoneType"),
        ([decimal.Decimal(1)], "Decimal"),
        ([fractions.Fraction(1, 2)], "Fraction"),
        ([object()], "object"),
        ("abc", "str"),
        (1 + 2j, "complex"),
    ],
)
def test_construct_refuses_non_numbers(data, kind):
    with pytest.raises(TypeError, match=kind):
        Tensor(data)


@pytest.mark.parametrize("data", [2**31, [2**31], [2**40], -(2**31) - 1, [1, -(2**63)], [[1, 2], [3, 2**62]]])
def test_construct_ints_past_int32_become_int64(data):
    check(Tensor(data), torch.tensor(data))  # torch: int64 values, exactly


def test_construct_ints_within_int32_stay_default_int():
    t = Tensor([[1, -(2**31)], [2**31 - 1, True]])
    assert t.dtype == dtypes.int32
    assert t.tolist() == [[1, -(2**31)], [2**31 - 1, 1]]


@pytest.mark.parametrize("data", [2**63, [2**70], 2**70, [-(2**63) - 1], [2**64 - 1], [True, 2**63]])
def test_construct_ints_past_int64_raise(data):
    with pytest.raises(Exception):
        torch.tensor(data)  # torch refuses these too
    with pytest.raises(OverflowError, match=str(data if isinstance(data, int) else data[-1])):
        Tensor(data)


def test_construct_mixed_floats_take_big_ints():
    check(Tensor([1.5, 2**70]), torch.tensor([1.5, 2**70]))
    check(Tensor([2**1023], dtype=dtypes.float16), torch.tensor([2**1023], dtype=torch.float16))
    for data, dtype in [([1.5, 2**1100], None), ([2**1100], torch.float32)]:
        with pytest.raises(OverflowError):
            torch.tensor(data, dtype=dtype)
        with pytest.raises(OverflowError, match=str(2**1100)[:30]):
            Tensor(data, dtype=None if dtype is None else TORCH2FG[dtype])


@pytest.mark.parametrize(
    "data,dtype",
    [
        ([-1, 255, -128, -129], torch.uint8),
        ([-1], torch.uint16),
        ([-1], torch.uint32),
        ([-128, 127], torch.int8),
        ([2**64 - 1, 2**63], torch.uint64),
        ([1.7, -1.7, 2.9], torch.int32),
        ([2, 0, 2**70], torch.bool),
        ([1e40, -1e40, 2**70], torch.float16),
        ([2**70], torch.float32),
        (2**70, torch.float32),
        (255, torch.uint8),
    ],
)
def test_construct_explicit_dtype_values_torch_accepts(data, dtype):
    check(Tensor(data, dtype=TORCH2FG[dtype]), torch.tensor(data, dtype=dtype))


@pytest.mark.parametrize(
    "data,dtype,error",
    [
        ([300], torch.uint8, RuntimeError),
        ([-129], torch.int8, RuntimeError),
        ([255], torch.int8, RuntimeError),
        ([2**31], torch.int32, RuntimeError),
        (2**31, torch.int32, RuntimeError),
        ([2**32], torch.uint32, RuntimeError),
        ([1e10], torch.int32, RuntimeError),
        ([float("nan")], torch.int32, RuntimeError),
        ([float("inf")], torch.int64, RuntimeError),
        ([-1], torch.uint64, OverflowError),
        ([2**64], torch.uint64, OverflowError),
        ([2**63], torch.int64, OverflowError),  # torch: ValueError "Overflow when unpacking long long"
    ],
)
def test_construct_explicit_dtype_refuses_what_it_cannot_hold(data, dtype, error):
    with pytest.raises((error, ValueError) if error is OverflowError else error):
        torch.tensor(data, dtype=dtype)
    value = data if not isinstance(data, list) else data[0]
    with pytest.raises(error, match=str(value)):
        Tensor(data, dtype=TORCH2FG[dtype])


def test_construct_numpy_values_inside_lists_count_by_kind():
    # numpy scalars and arrays inside lists are numbers of their kind (fusegrad's defaults, not numpy's widths)
    check(Tensor([np.float32(1.5), 2]), torch.tensor([1.5, 2.0]))
    check(Tensor([np.float64(1.5), np.int8(2)]), torch.tensor([1.5, 2.0]))
    check(Tensor([np.int64(3), 2]), torch.tensor([3, 2], dtype=torch.int32))
    check(Tensor([np.bool_(True), np.bool_(False)]), torch.tensor([True, False]))
    check(Tensor([np.array(1.0), 2.0]), torch.tensor([1.0, 2.0]))
    check(Tensor([np.array([1, 2]), np.array([3, 4])]), torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    check(Tensor([np.int64(2**40)]), torch.tensor([2**40]))


def test_construct_range_and_tensor_lists():
    check(Tensor(range(2, 7, 2)), torch.tensor(range(2, 7, 2), dtype=torch.int32))
    with pytest.raises(TypeError, match="stack"):
        Tensor([Tensor(1.0), Tensor(2.0)])
    with pytest.raises(ValueError, match="ragged"):
        Tensor([[1], [1, 2]])


def test_full_checks_its_value_like_construction():
    check(Tensor.full((2,), 2**40), torch.full((2,), 2**40))
    check(Tensor.full((2,), -1, dtype=dtypes.uint8), torch.full((2,), -1, dtype=torch.uint8))
    for value, dtype, error in [(300, torch.uint8, RuntimeError), (2**31, torch.int32, RuntimeError)]:
        with pytest.raises(error):
            torch.full((2,), value, dtype=dtype)
        with pytest.raises(error, match=str(value)):
            Tensor.full((2,), value, dtype=TORCH2FG[dtype])
    with pytest.raises(OverflowError, match=str(2**70)):
        Tensor.full((2,), 2**70)
    for bad in ["a", None, 1 + 2j]:
        with pytest.raises(TypeError, match=type(bad).__name__):
            Tensor.full((2,), bad)


def test_pad_value_is_checked_like_construction():
    x, tx = Tensor([1, 2], dtype=dtypes.uint8), torch.tensor([1, 2], dtype=torch.uint8)
    check(x.pad((1, 1), value=255), torch.nn.functional.pad(tx, (1, 1), value=255))
    check(x.pad((1, 1), value=1.5), torch.nn.functional.pad(tx, (1, 1), value=1.5))
    with pytest.raises(RuntimeError):
        torch.nn.functional.pad(tx, (1, 1), value=300)
    with pytest.raises(RuntimeError, match="300"):
        x.pad((1, 1), value=300)
    with pytest.raises(TypeError, match="str"):
        x.pad((1, 1), value="a")


def test_randint_range_must_fit_the_dtype():
    with pytest.raises(RuntimeError):
        torch.randint(0, 2**40, (3,), dtype=torch.int32)
    with pytest.raises(RuntimeError, match=str(2**40)):
        Tensor.randint(3, high=2**40, dtype=dtypes.int32)
    with pytest.raises(RuntimeError, match="uint8"):
        Tensor.randint(3, low=-1, high=5, dtype=dtypes.uint8)
    x = Tensor.randint(1000, low=-(2**40), high=2**40, dtype=dtypes.int64).numpy()
    assert x.min() >= -(2**40) and x.max() < 2**40 and x.min() < -(2**30) and x.max() > 2**30


# ---------------------------------------------------------------------------------------------------------------------
# random creators


NARROW_FLOATS = [dtypes.float16, dtypes.bfloat16]


@pytest.mark.parametrize("dt", NARROW_FLOATS + list(dtypes.fp8s))
def test_rand_stays_below_one_in_narrow_floats(dt):
    Tensor.manual_seed(3)
    x = Tensor.rand(1 << 16, dtype=dt).cast(dtypes.float32).numpy()
    assert x.min() >= 0.0 and x.max() < 1.0, x.max()
    assert len(np.unique(x)) > 4  # still a spread of values


@pytest.mark.parametrize("dt", NARROW_FLOATS)
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-1.0, 1.0), (-2.0, -1.0), (-0.3, 0.7)])
def test_uniform_stays_below_high_in_narrow_floats(dt, low, high):
    Tensor.manual_seed(5)
    x = Tensor.uniform(1 << 15, low=low, high=high, dtype=dt).cast(dtypes.float32).numpy()
    assert x.max() < high, x.max()
    assert x.min() >= np.float32(torch.tensor(low, dtype=FG[dt]).float().item()) - 1e-2


def test_rand_float32_is_unchanged_by_rounding():
    # float32 draws are k / 2**23 exactly: nothing is rounded away
    Tensor.manual_seed(0)
    x = Tensor.rand(4096).numpy().astype(np.float64)
    np.testing.assert_array_equal(x * 2**23, np.floor(x * 2**23))


RANDOM_CREATORS = {
    "rand": lambda **kw: Tensor.rand(3, 4, **kw),
    "randn": lambda **kw: Tensor.randn(3, 4, **kw),
    "randint": lambda **kw: Tensor.randint(3, 4, low=0, high=5, **kw),
    "normal": lambda **kw: Tensor.normal(3, 4, mean=1.0, std=2.0, **kw),
    "uniform": lambda **kw: Tensor.uniform(3, 4, low=-1.0, high=2.0, **kw),
    "scaled_uniform": lambda **kw: Tensor.scaled_uniform(3, 4, **kw),
    "glorot_uniform": lambda **kw: Tensor.glorot_uniform(3, 4, **kw),
    "kaiming_uniform": lambda **kw: Tensor.kaiming_uniform(3, 4, a=0.1, **kw),
    "kaiming_normal": lambda **kw: Tensor.kaiming_normal(3, 4, a=0.1, **kw),
    "rand_like": lambda **kw: Tensor.ones(3, 4).rand_like(**kw),
    "randn_like": lambda **kw: Tensor.ones(3, 4).randn_like(**kw),
}


@pytest.mark.parametrize("name", sorted(RANDOM_CREATORS))
def test_random_creators_take_documented_keywords(name):
    make = RANDOM_CREATORS[name]
    Tensor.manual_seed(1)
    lazy = make(contiguous=False, device="CPU", requires_grad=False)
    Tensor.manual_seed(1)
    eager = make()
    assert lazy.shape == (3, 4) and lazy.device == "CPU" and lazy.is_param is False
    np.testing.assert_array_equal(lazy.numpy(), eager.numpy())  # contiguous= only decides materialization
    with pytest.raises(TypeError, match="bogus"):
        make(bogus=1)


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: Tensor.randperm(4, **kw),
        lambda **kw: Tensor.zeros(2, **kw),
        lambda **kw: Tensor.ones(2, **kw),
        lambda **kw: Tensor.empty(2, **kw),
        lambda **kw: Tensor.full((2,), 1.0, **kw),
        lambda **kw: Tensor.arange(3, **kw),
        lambda **kw: Tensor.linspace(0, 1, 3, **kw),
        lambda **kw: Tensor.eye(2, **kw),
        lambda **kw: Tensor.ones(2).full_like(3, **kw),
        lambda **kw: Tensor.ones(2).zeros_like(**kw),
    ],
)
def test_creators_refuse_unknown_keywords(make):
    assert make(requires_grad=False).is_param is False
    with pytest.raises(TypeError, match="colour"):
        make(colour="red")


def test_random_creators_need_float_dtypes():
    for make in (Tensor.rand, Tensor.randn, Tensor.normal, Tensor.uniform):
        with pytest.raises(ValueError, match="int32"):
            make(3, dtype=dtypes.int32)
    with pytest.raises(ValueError, match="int32"):
        Tensor.ones(3, dtype=dtypes.int32).randn_like()


@pytest.mark.parametrize(
    "make,torch_make",
    [
        (Tensor.empty, torch.empty),
        (Tensor.zeros, torch.zeros),
        (Tensor.rand, torch.rand),
        (Tensor.kaiming_uniform, None),
        (Tensor.kaiming_normal, None),
        (Tensor.glorot_uniform, None),
        (Tensor.scaled_uniform, None),
    ],
)
def test_shape_as_nested_tuple(make, torch_make):
    assert make((3, 4)).shape == (3, 4) and make([3, 4]).shape == (3, 4)
    if torch_make is not None:
        with pytest.raises(TypeError):
            torch_make(((3, 4),))
    with pytest.raises(TypeError, match=r"\(3, 4\)"):
        make(((3, 4),))


# ---------------------------------------------------------------------------------------------------------------------
# argument types: what torch raises


BAD_INTS = [2.0, "2", None, np.float32(2.0), 1.5]
SHAPE_FUNCTIONS = {
    "reshape": lambda v: Tensor.ones(2, 3).reshape(3, v) if v is not None else Tensor.ones(2, 3).reshape("x", 2),
    "expand": lambda v: Tensor.ones(1, 3).expand(v, 3) if v is not None else Tensor.ones(1, 3).expand("x", 3),
    "zeros": lambda v: Tensor.zeros(v, 3),
    "ones": lambda v: Tensor.ones(v),
    "empty": lambda v: Tensor.empty(v),
    "full": lambda v: Tensor.full((v,), 1.0),
    "rand": lambda v: Tensor.rand(v),
    "randn": lambda v: Tensor.randn(2, v),
    "randint": lambda v: Tensor.randint(v),
    "eye": lambda v: Tensor.eye(v),
    "eye_m": lambda v: Tensor.eye(2, v) if v is not None else Tensor.eye("2"),
    "randperm": lambda v: Tensor.randperm(v),
    "linspace": lambda v: Tensor.linspace(0, 1, v),
    "chunk": lambda v: Tensor.ones(4).chunk(v),
    "split": lambda v: Tensor.ones(4).split(v),
    "repeat": lambda v: Tensor.ones(2).repeat(v),
    "pad": lambda v: Tensor.ones(2).pad((v, 1)),
    "pad_pairs": lambda v: Tensor.ones(2).pad(((v, 1),)),
    "shrink": lambda v: Tensor.ones(4).shrink(((0, v),)),
    "permute": lambda v: Tensor.ones(2, 2).permute(v, 0),
    "transpose": lambda v: Tensor.ones(2, 2).transpose(v, 0),
    "unsqueeze": lambda v: Tensor.ones(2).unsqueeze(v),
    "roll": lambda v: Tensor.ones(2).roll(v, 0),
    "interpolate": lambda v: Tensor.ones(1, 1, 2, 2).interpolate((v, 3)),
    "max_pool2d": lambda v: Tensor.ones(1, 1, 4, 4).max_pool2d(v),
    "avg_pool2d_stride": lambda v: Tensor.ones(1, 1, 4, 4).avg_pool2d(2, stride=(v, 1)),
    "conv2d_padding": lambda v: Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(1, 1, 3, 3), padding=v),
    "conv2d_groups": lambda v: Tensor.ones(1, 2, 4, 4).conv2d(Tensor.ones(2, 1, 3, 3), groups=v),
}


@pytest.mark.parametrize("name", sorted(SHAPE_FUNCTIONS))
@pytest.mark.parametrize("bad", BAD_INTS, ids=repr)
def test_non_int_size_arguments_raise_type_error(name, bad):
    # torch raises TypeError for every one of these (floats, strings, None and numpy floats where an int belongs)
    with pytest.raises(TypeError):
        SHAPE_FUNCTIONS[name](bad)


def test_numpy_ints_are_ints():
    assert Tensor.zeros(np.int64(2), 3).shape == (2, 3)
    assert Tensor.ones(4).reshape(np.int32(2), 2).shape == (2, 2)
    assert Tensor.ones(4).chunk(np.int64(2))[0].shape == (2,)
    assert Tensor.eye(np.int64(2)).shape == (2, 2)


@pytest.mark.parametrize("bad", ["a", None, [1]], ids=repr)
def test_arange_refuses_non_numbers(bad):
    with pytest.raises(TypeError):
        torch.arange(bad)
    with pytest.raises(TypeError, match=type(bad).__name__):
        Tensor.arange(bad)


@pytest.mark.parametrize("stop", [float("inf"), float("nan")])
def test_arange_refuses_non_finite(stop):
    with pytest.raises(RuntimeError):
        torch.arange(stop)
    with pytest.raises(ValueError, match=str(stop)):
        Tensor.arange(stop)


def test_arange_numpy_float_bound_is_float():
    check(Tensor.arange(np.float32(2.5)), torch.arange(np.float32(2.5)))


def test_bad_dtype_name_is_type_error_and_attribute_error():
    with pytest.raises(TypeError):
        torch.zeros(2, dtype="floaty")
    for make in (
        lambda: Tensor.zeros(2, dtype="floaty"),
        lambda: Tensor([1], dtype="floaty"),
        lambda: Tensor.ones(2).cast("floaty"),
    ):
        with pytest.raises(TypeError, match="floaty"):
            make()
        with pytest.raises(AttributeError, match="floaty"):  # tinygrad's getattr(dtypes, name)
            make()


def test_cat_stack_repeat_errors_like_torch():
    with pytest.raises(RuntimeError):
        torch.cat([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        Tensor.cat(Tensor(1.0), Tensor(2.0))
    check(Tensor.stack(Tensor(1.0), Tensor(2.0)), torch.stack([torch.tensor(1.0), torch.tensor(2.0)]))
    with pytest.raises(RuntimeError):
        torch.ones(2, 3).repeat(2)
    with pytest.raises(RuntimeError, match="fewer dims"):
        Tensor.ones(2, 3).repeat(2)
    check(Tensor([1, 2]).repeat(2, 2), torch.tensor([1, 2], dtype=torch.int32).repeat(2, 2))
    with pytest.raises(ValueError, match="non-empty"):
        Tensor.cat([])


# ---------------------------------------------------------------------------------------------------------------------
# shifts


@pytest.mark.parametrize("op", ["__lshift__", "__rshift__"])
def test_negative_python_shift_raises_before_any_kernel(op):
    with pytest.raises(ValueError):
        getattr(8, op)(-1)  # Python's own rule
    x = Tensor([8, -8], dtype=dtypes.int32).realize()
    before = GlobalCounters.kernel_count
    with pytest.raises(ValueError, match="-1"):
        getattr(x, op)(-1)
    assert GlobalCounters.kernel_count == before


@pytest.mark.parametrize("dt", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_negative_and_wide_tensor_shift_counts_like_torch(dt):
    values, counts = [8, -8, 1, 0, -1, 5], [-1, -1, -100, 100, 64, 2]
    a, ta = Tensor(values, dtype=TORCH2FG[dt]), torch.tensor(values, dtype=dt)
    c, tc = Tensor(counts, dtype=TORCH2FG[dt]), torch.tensor(counts, dtype=dt)
    check(a >> c, ta >> tc)
    check(a << c, ta << tc)
    check(2 << c, 2 << tc)


# ---------------------------------------------------------------------------------------------------------------------
# extreme values of elementwise functions and gradients


def test_sigmoid_family_at_large_values_like_torch():
    big = [-1e30, -1000.0, -100.0, -20.0, 20.0, 100.0, 1000.0, 1e30, float("inf"), -float("inf")]
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        x = [v for v in big if abs(v) < 1e5 or dt != torch.float16]
        t, tt = Tensor(x, dtype=TORCH2FG[dt]), torch.tensor(x, dtype=dt)
        for fn, tfn in [(Tensor.sigmoid, torch.sigmoid), (Tensor.tanh, torch.tanh)]:
            out = fn(t)
            assert not np.isnan(out.cast(dtypes.float32).numpy()).any()
            check(out, tfn(tt), atol=1e-6 if dt == torch.float32 else None)
    x = np.array([-1000.0, -100.0, 100.0, 1000.0], np.float32)
    t, tt = Tensor(x), torch.tensor(x, requires_grad=True)
    t.sigmoid().sum().backward()
    tt.sigmoid().sum().backward()
    check(t.grad, tt.grad, atol=1e-30)


@pytest.mark.parametrize("exponent", [0, 0.0, 1, 2, 3, 0.5, 1.5, -1])
def test_pow_gradient_at_zero_like_torch(exponent):
    x = np.array([0.0, 1.0, -2.0, 2.0], np.float32)
    t, tt = Tensor(x), torch.tensor(x, requires_grad=True)
    with np.errstate(all="ignore"):
        (t**exponent).sum().backward()
        (tt**exponent).sum().backward()
        check(t.grad, tt.grad)


def test_pow_tensor_exponent_gradient_at_zero_like_torch():
    a, b = np.array([0.0, 0.0, 0.0, 2.0], np.float32), np.array([0.0, 1.0, 2.0, 0.0], np.float32)
    ta, tb = Tensor(a), Tensor(b)
    xa, xb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    (ta**tb).sum().backward()
    (xa**xb).sum().backward()
    check(ta.grad, xa.grad)
    check(tb.grad, xb.grad)


@pytest.mark.parametrize("dt", [torch.float32, torch.float16])
def test_acosh_gradient_at_domain_edge_like_torch(dt):
    x = [1.0, 1.001, 2.0, 0.5, 1e4]
    t, tt = Tensor(x, dtype=TORCH2FG[dt]), torch.tensor(x, dtype=dt, requires_grad=True)
    with np.errstate(all="ignore"):
        t.acosh().sum().backward()
        tt.acosh().sum().backward()
        check(t.grad, tt.grad)


# ---------------------------------------------------------------------------------------------------------------------
# huge sizes


@pytest.mark.parametrize(
    "make",
    [
        lambda: Tensor.zeros(1 << 62, 1 << 62),
        lambda: Tensor.empty(1 << 40, 1 << 40),
        lambda: Tensor.ones(1, 1).expand(1 << 62, 1 << 62),
        lambda: Tensor.ones(1).reshape(1, 1, 1).expand(1 << 32, 1 << 32, 1 << 32),
    ],
)
def test_shapes_past_int64_elements_are_refused(make):
    with pytest.raises(RuntimeError, match="more than fusegrad can index"):
        make()


def test_torch_refuses_those_shapes_too():
    with pytest.raises(RuntimeError):
        torch.ones(1, 1).expand(1 << 62, 1 << 62)


@pytest.mark.parametrize(
    "make,nbytes",
    [
        (lambda: Tensor.empty(1 << 62).sum(), 4 << 62),
        (lambda: Tensor.ones(1, dtype=dtypes.int64).expand(1 << 61).contiguous(), 8 << 61),
        (lambda: Tensor.rand(1 << 45), 4 << 45),
    ],
)
def test_realize_larger_than_the_machine_is_memory_error_before_any_kernel(make, nbytes):
    kept = (Tensor([1.0, 2.0]) * 3).realize()
    before = GlobalCounters.kernel_count
    with pytest.raises(MemoryError, match=str(nbytes)):
        make().realize()
    assert GlobalCounters.kernel_count == before
    assert kept.tolist() == [3.0, 6.0]


def test_index_arithmetic_past_int32_is_exact():
    n = 2**31 + 5  # the kernel indexes with int64 here
    assert Tensor.arange(n, dtype=dtypes.int64)[n - 3 :].tolist() == [n - 3, n - 2, n - 1]
    assert Tensor.arange(n, dtype=dtypes.int64).sum().item() == n * (n - 1) // 2


def test_where_of_two_python_scalars_types_them_like_a_list():
    cond = [True, False]
    check(Tensor(cond).where(2**40, 0), torch.where(torch.tensor(cond), 2**40, 0))
    check(Tensor(cond).where(1.5, 0), torch.where(torch.tensor(cond), 1.5, 0.0))
    with pytest.raises(TypeError, match="str"):
        Tensor(cond).where("a", 0)
