"""Out-of-range tensor indices (docs/api.md, CHECK_OOB): by default they read 0 / write nowhere; with CHECK_OOB=1
a kernel reduces each index tensor to its extremes, and the realize raises IndexError naming the op, the bad index and
the bound before any other kernel runs. Values and errors are compared against torch."""

import re

import numpy as np
import pytest
import torch

from fusegrad import Context, GlobalCounters, Tensor
from fusegrad.engine.checks import index_checks
from reference import check_values

DEVS = ("CPU", "CPU:1")
X = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
MESSAGE = re.compile(r"index (-?\d+) is out of bounds for dim(?:ension)? (\d+) with size (\d+)")


def torch_error(fn) -> tuple[int, int, int]:
    """(bad index, dim, size) from the error torch raises for fn()."""
    with pytest.raises((IndexError, RuntimeError)) as info:
        fn()
    found = MESSAGE.search(str(info.value))
    assert found, str(info.value)
    return tuple(int(g) for g in found.groups())


def our_error(op: str, fn) -> tuple[int, int, int]:
    """(bad index, dim, size) from the IndexError fusegrad raises at realize under CHECK_OOB=1."""
    with Context(CHECK_OOB=1):
        result = fn()  # building the graph never raises: the check runs in the realize
        with pytest.raises(IndexError, match=f"^{op}: ") as info:
            result.numpy()
    found = MESSAGE.search(str(info.value))
    assert found, str(info.value)
    return tuple(int(g) for g in found.groups())


# (op name, fusegrad fn, torch fn, numpy reference of the default fast path)
def gather_ref(idx):
    return np.where((idx >= 0) & (idx < 4), np.take_along_axis(X, np.clip(idx, 0, 3), 1), 0)


GATHER_IDX = np.array([[0, 3], [4, 1], [2, 2]])
GATHER_NEG = np.array([[0, 3], [1, 1], [-1, 2]])
SCATTER_IDX = np.array([[1, 5, 0]])
GETITEM_IDX = np.array([2, -3, 3, 0])
CASES = {
    "gather": (
        lambda T: T(X).gather(1, T(GATHER_IDX)),
        lambda: torch.tensor(X).gather(1, torch.tensor(GATHER_IDX)),
        gather_ref(GATHER_IDX),
    ),
    "gather_negative": (
        lambda T: T(X).gather(1, T(GATHER_NEG)),
        lambda: torch.tensor(X).gather(1, torch.tensor(GATHER_NEG)),
        gather_ref(GATHER_NEG),
    ),
    "scatter": (
        lambda T: T(X).scatter(1, T(SCATTER_IDX), T(np.full((1, 3), -1, np.float32))),
        lambda: torch.tensor(X).scatter(1, torch.tensor(SCATTER_IDX), torch.full((1, 3), -1.0)),
        np.where(np.isin(np.arange(12).reshape(3, 4), [0, 1]), -1, X).astype(np.float32),
    ),
    "scatter_reduce": (
        lambda T: T(X).scatter_reduce(1, T(SCATTER_IDX), T(np.ones((1, 3), np.float32)), "sum"),
        lambda: torch.tensor(X).scatter_reduce(1, torch.tensor(SCATTER_IDX), torch.ones(1, 3), "sum"),
        X + np.isin(np.arange(12).reshape(3, 4), [0, 1]),
    ),
    "getitem": (
        lambda T: T(X)[T(GETITEM_IDX)],
        lambda: torch.tensor(X)[torch.tensor(GETITEM_IDX)],
        np.stack([X[2], X[0], np.zeros(4, np.float32), X[0]]),
    ),
    "getitem_two_indices": (
        lambda T: T(X)[T(np.array([[0], [2]])), T(np.array([1, -5]))],
        lambda: torch.tensor(X)[torch.tensor([[0], [2]]), torch.tensor([1, -5])],
        np.array([[X[0, 1], 0], [X[2, 1], 0]], np.float32),
    ),
}


def fg_tensor(a):
    return Tensor(a.astype(np.int32) if a.dtype.kind == "i" else a)


@pytest.mark.parametrize("case", CASES)
def test_default_reads_zero_and_check_raises_like_torch(case):
    fn, torch_fn, fast_path = CASES[case]
    check_values(fn(fg_tensor), fast_path)  # the default stays the unchecked fast path
    op = case.removesuffix("_negative").removesuffix("_two_indices")
    assert our_error(op, lambda: fn(fg_tensor)) == torch_error(torch_fn)


@pytest.mark.parametrize("case", CASES)
def test_checked_in_range_values_match_torch(case):
    fn, _, _ = CASES[case]
    low = -3 if case.startswith("getitem") else 0  # torch refuses negative gather/scatter indices

    def in_range(make):
        return lambda a: make(np.clip(a, low, 2) if a.dtype.kind == "i" else a)

    with Context(CHECK_OOB=1):
        check_values(fn(in_range(fg_tensor)), fn(in_range(torch.tensor)))


def test_negative_index_rules_follow_torch():
    x = Tensor(X)
    with Context(CHECK_OOB=1):
        check_values(x[Tensor([-3, -1])], torch.tensor(X)[torch.tensor([-3, -1])])  # indexing wraps -n..-1
        assert our_error("getitem", lambda: x[Tensor([-4])]) == torch_error(lambda: torch.tensor(X)[torch.tensor([-4])])
        # gather and scatter take no negative indices at all
        assert our_error("gather", lambda: x.gather(0, Tensor([[-1, 0, 0, 0]]))) == torch_error(
            lambda: torch.tensor(X).gather(0, torch.tensor([[-1, 0, 0, 0]]))
        )
        assert our_error("scatter", lambda: x.scatter(0, Tensor([[0, -3, 0, 0]]), 0.0)) == torch_error(
            lambda: torch.tensor(X).scatter(0, torch.tensor([[0, -3, 0, 0]]), 0.0)
        )


def test_mixed_int_and_tensor_index_names_the_tensors_dim():
    # torch counts dims after the int index; the message here names the indexed tensor's own dim
    assert our_error("getitem", lambda: Tensor(X)[1, Tensor([0, 4])]) == (4, 1, 4)
    assert our_error("getitem", lambda: Tensor(X)[:, None, Tensor([[7]])]) == (7, 1, 4)


def test_lazy_index_downstream_and_gradient_only():
    x = Tensor(X, requires_grad=True)
    with Context(CHECK_OOB=1):
        idx = (Tensor([[1], [0], [1]]) * Tensor([[1], [1], [4]])).contiguous()  # computed, not realized: 4 is bad
        picked = x.gather(1, idx)
        with pytest.raises(IndexError, match="gather: index 4 is out of bounds for dim 1 with size 4"):
            (picked * 2 + 1).sum().item()  # anything computed from the result checks
        picked.sum().backward()
        with pytest.raises(IndexError, match="gather: index 4"):
            x.grad.numpy()  # a gradient realized without its forward value checks too
        idx_ok = Tensor([[3], [0], [2]]) - Tensor([[0], [0], [0]])
        check_values(x.gather(1, idx_ok), torch.tensor(X).gather(1, torch.tensor([[3], [0], [2]])))


def test_several_bad_indices_report_one_of_them():
    with Context(CHECK_OOB=1):
        with pytest.raises(IndexError) as info:
            Tensor(X)[Tensor([5, 0, -9])].numpy()
    assert MESSAGE.search(str(info.value)).group(1) in ("5", "-9")


def test_empty_index_and_zero_size_pass():
    with Context(CHECK_OOB=1):
        check_values(Tensor(X)[Tensor(np.zeros(0, np.int32))], torch.tensor(X)[torch.zeros(0, dtype=torch.long)])
        empty = np.zeros((3, 0), np.int64)
        check_values(Tensor(X).gather(1, Tensor(empty)), torch.tensor(X).gather(1, torch.tensor(empty)))


def test_failed_check_writes_nothing_and_leaves_tensors_valid():
    target = Tensor(X.copy()).contiguous().realize()
    src = Tensor(X * 10)
    idx = Tensor([0, 3])
    with Context(CHECK_OOB=1):
        with pytest.raises(IndexError, match="setitem: index 3 is out of bounds for dim 0 with size 3"):
            target[idx] = src[:2]
        with pytest.raises(IndexError, match="scatter: index 3"):
            target.assign(target.scatter(0, idx.reshape(2, 1).expand(2, 4), src)).realize()
        check_values(target, X)  # neither the setitem nor the assign ran
        check_values(idx, np.array([0, 3], np.int32))
        check_values(target + 1, X + 1)
        target[Tensor([0, -1])] = src[:2]  # the next valid write works
    expect = X.copy()
    expect[[0, -1]] = X[:2] * 10
    check_values(target, expect)


def test_check_runs_in_a_kernel_only_when_asked():
    x, idx = Tensor(X).realize(), Tensor([[0, 3], [1, 2], [2, 1]]).realize()
    registered = len(index_checks)
    GlobalCounters.reset()
    x.gather(1, idx).realize()
    unchecked = GlobalCounters.kernel_count
    assert len(index_checks) <= registered  # the default registers no check
    with Context(CHECK_OOB=1):
        GlobalCounters.reset()
        x.gather(1, idx).realize()
        assert GlobalCounters.kernel_count == unchecked + 1  # one reduce over the index


def test_one_hot_known_values_raise_value_error_like_torch():
    for values, words in (([0, 5], "smaller than num_classes"), ([0, -1], "non-negative")):
        with pytest.raises(RuntimeError, match=words):
            torch.nn.functional.one_hot(torch.tensor(values), 3)
        for check in (0, 1):
            with Context(CHECK_OOB=check), pytest.raises(ValueError, match=f"{words}.*{values[1]}"):
                Tensor(values).one_hot(3)  # realized data: raises at the call, in both modes
    with pytest.raises(ValueError, match="non-negative"):
        Tensor([-2]).one_hot()


def test_one_hot_lazy_values():
    lazy = Tensor([1, 2]) * Tensor([1, 2])  # 1, 4: not known until realized
    np.testing.assert_array_equal(lazy.one_hot(3).numpy(), [[0, 1, 0], [0, 0, 0]])  # out of range: a zero row
    with Context(CHECK_OOB=1):
        with pytest.raises(IndexError, match="one_hot: index 4 is out of bounds for num_classes with size 3"):
            lazy.one_hot(3).numpy()
        check_values(lazy.one_hot(5), torch.nn.functional.one_hot(torch.tensor([1, 4]), 5).int())


def test_multi_device_index_checks():
    xs = Tensor(np.arange(8, dtype=np.float32).reshape(4, 2)).shard(DEVS, 0)
    good, bad = np.array([[1, 0], [0, 1], [1, 1], [0, 0]]), np.array([[1, 0], [0, 2], [1, 1], [0, 0]])
    ref = torch.arange(8.0).reshape(4, 2)
    with Context(CHECK_OOB=1):
        check_values(xs.gather(1, Tensor(good).shard(DEVS, 0)), ref.gather(1, torch.tensor(good)).numpy())
        assert our_error("gather", lambda: xs.gather(1, Tensor(bad).shard(DEVS, 0))) == torch_error(
            lambda: ref.gather(1, torch.tensor(bad))
        )
        check_values(xs[Tensor([3, -4])], ref[torch.tensor([3, -4])].numpy())
        assert our_error("getitem", lambda: xs[Tensor([0, 4])]) == torch_error(lambda: ref[torch.tensor([0, 4])])


@pytest.mark.parametrize(
    "index",
    [
        (np.array([2, 3]),),  # one advanced index: 3 is out of range for dim 0
        (np.array([0, 2]), np.array([1, -5])),  # two: -5 is out of range for dim 1
    ],
)
def test_setitem_default_skips_and_check_raises_like_torch(index):
    value = np.full(2, -1, np.float32) if len(index) == 2 else np.full((2, 4), -1, np.float32)
    target = Tensor(X.copy()).contiguous().realize()
    target[tuple(Tensor(i.astype(np.int32)) for i in index)] = Tensor(value)  # out-of-range writes go nowhere
    expect = X.copy()
    valid = np.all([(i >= -n) & (i < n) for i, n in zip(index, X.shape)], axis=0)
    expect[tuple(i[valid] for i in index)] = value[valid]
    check_values(target, expect)

    def torch_setitem():
        torch.tensor(X)[tuple(torch.tensor(i) for i in index)] = torch.tensor(value)

    checked = Tensor(X.copy()).contiguous().realize()
    with Context(CHECK_OOB=1):
        with pytest.raises(IndexError, match="^setitem: ") as info:
            checked[tuple(Tensor(i.astype(np.int32)) for i in index)] = Tensor(value)
    assert tuple(int(g) for g in MESSAGE.search(str(info.value)).groups()) == torch_error(torch_setitem)
    check_values(checked, X)


# ops that pick by class label or token id build their own index comparisons: they are checked the same way
LABEL_OPS = [
    ("Embedding", lambda idx: _embedding(idx), lambda idx: torch.nn.functional.embedding(idx, torch.ones(4, 2)), 4),
    (
        "sparse_categorical_crossentropy",
        lambda idx: Tensor.ones(3, 4).sparse_categorical_crossentropy(idx),
        lambda idx: torch.nn.functional.cross_entropy(torch.ones(3, 4), idx),
        4,
    ),
    (
        "cross_entropy",
        lambda idx: Tensor.ones(3, 4).cross_entropy(idx),
        lambda idx: torch.nn.functional.cross_entropy(torch.ones(3, 4), idx),
        4,
    ),
    (
        "nll_loss",
        lambda idx: Tensor.ones(3, 4).nll_loss(idx),
        lambda idx: torch.nn.functional.nll_loss(torch.ones(3, 4), idx),
        4,
    ),
]


def _embedding(idx: Tensor) -> Tensor:
    from fusegrad import nn

    emb = nn.Embedding(4, 2)
    emb.weight = Tensor.ones(4, 2)
    return emb(idx)


@pytest.mark.parametrize("op,ours,theirs,size", LABEL_OPS, ids=[c[0] for c in LABEL_OPS])
@pytest.mark.parametrize("bad", [4, 7, -2])
def test_label_and_token_ops_are_checked(op, ours, theirs, size, bad):
    labels = [0, bad, 1]
    with pytest.raises((IndexError, RuntimeError)):  # torch refuses the same labels
        theirs(torch.tensor(labels))
    with Context(CHECK_OOB=1):
        result = ours(Tensor(labels))
        with pytest.raises(IndexError, match=f"^{op}: index {bad} is out of bounds for .* with size {size}"):
            result.numpy()
        # in-range labels pass the check and give torch's value
        good = ours(Tensor([0, 3, 1]))
        check_values(good, theirs(torch.tensor([0, 3, 1])).numpy(), atol=1e-6, rtol=1e-6)


def test_ignored_label_is_not_out_of_range():
    with Context(CHECK_OOB=1):
        loss = Tensor.ones(3, 4).sparse_categorical_crossentropy(Tensor([0, 9, 1]), ignore_index=9)
        ref = torch.nn.functional.cross_entropy(torch.ones(3, 4), torch.tensor([0, 9, 1]), ignore_index=9)
        check_values(loss, ref, atol=1e-6, rtol=1e-6)
        loss = Tensor.ones(3, 4).nll_loss(Tensor([0, 9, 1]), ignore_index=9)
        ref = torch.nn.functional.nll_loss(torch.ones(3, 4), torch.tensor([0, 9, 1]), ignore_index=9)
        check_values(loss, ref, atol=1e-6, rtol=1e-6)


def test_max_unpool_indices_are_checked():
    x = Tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    with Context(CHECK_OOB=1):
        out = x.max_unpool2d(Tensor([[[[0, 5, 16, 15]]]]).reshape(1, 1, 2, 2), kernel_size=2)
        with pytest.raises(IndexError, match=r"^max_unpool: index 16 is out of bounds for .* with size 16"):
            out.numpy()
