"""The creation mixin's constructors are classmethods: called on the class or on a tensor they build the same values,
and the random stream they share lives on Tensor (the engine reads Tensor._rng_calls)."""

import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.dtype import from_numpy


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda on: on.ones(2, 3), np.ones((2, 3), np.float32)),
        (lambda on: on.zeros((2,), dtype=dtypes.int32), np.zeros(2, np.int32)),
        (lambda on: on.full((2, 2), 7), np.full((2, 2), 7, np.int32)),
        (lambda on: on.arange(1, 7, 2), np.arange(1, 7, 2, dtype=np.int32)),
        (lambda on: on.linspace(0, 1, 5), np.linspace(0, 1, 5, dtype=np.float32)),
        (lambda on: on.eye(3, 2), np.eye(3, 2, dtype=np.float32)),
    ],
)
def test_a_constructor_on_the_class_and_on_a_tensor_builds_the_same_values(make, expected):
    for on in (Tensor, Tensor([1.0])):
        out = make(on)
        assert type(out) is Tensor
        assert out.dtype == from_numpy(expected.dtype)
        np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-7)


def test_requires_grad_keyword_still_reaches_the_tensor():
    w = Tensor.ones(3, requires_grad=True)
    (w * 2).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full(3, 2.0, np.float32), rtol=0, atol=0)


def test_a_seed_set_through_a_tensor_resets_the_one_stream_on_tensor():
    Tensor.manual_seed(5)
    first = Tensor.rand(8).numpy()
    Tensor([0.0]).manual_seed(5)
    assert Tensor._rng_calls == 0
    np.testing.assert_array_equal(Tensor([0.0]).rand(8).numpy(), first)
    assert Tensor._rng_calls == 1


def test_unknown_keywords_are_refused_with_their_name():
    with pytest.raises(TypeError, match="ones\\(\\) got an unexpected keyword argument 'bogus'"):
        Tensor.ones(2, bogus=1)
    with pytest.raises(TypeError, match="arange\\(\\) got an unexpected keyword argument 'dtpye'"):
        Tensor([1]).arange(3, dtpye=dtypes.int32)
