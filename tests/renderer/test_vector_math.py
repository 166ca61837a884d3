"""exp and reciprocal of upcast float lanes run as vectors in the C renderer (its expf has no vector form: a
polynomial in vector arithmetic) and equal numpy's, special values included."""

import numpy as np

from fusegrad import Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.renderer.cstyle import CRenderer
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops

SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 88.72, 88.73, 89.5, 1e30, -87.3, -95.0, -103.9, -104.5, -1e30]


def c_source(t: Tensor) -> str:
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    info = lower_to_linear([i.ast for i in items if i.ast.op is Ops.SINK][-1])
    return CRenderer().render("k", info.lin)


def whole_vectors(values: list) -> np.ndarray:
    """float32 values padded with ones to a multiple of 64 (the column sum's upcast fills whole vectors)."""
    return np.concatenate([values, np.ones(-len(values) % 64)]).astype(np.float32)


def column_sums(values: np.ndarray) -> Tensor:
    """A column sum (its output axis upcast into vector accumulators) whose sums are the values."""
    rows = np.zeros((8, values.size), np.float32)
    rows[3] = values
    return Tensor(rows).sum(0)


def test_exp_of_vector_lanes_equals_numpy():
    rng = np.random.default_rng(0)
    values = whole_vectors(
        [*SPECIAL, *np.linspace(-110, 95, 2000), *rng.standard_normal(1000) * 10, *rng.uniform(-1e-3, 1e-3, 80)]
    )
    sums = column_sums(values)
    assert "fg_exp_" in c_source(sums.exp()), "the exp runs on vectors"
    with np.errstate(over="ignore"):
        got, want = sums.exp().numpy(), np.exp(values)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    normal = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)
    np.testing.assert_allclose(got[normal], want[normal], rtol=2.5e-7)  # within 2 ulp
    tiny = np.isfinite(want) & ~normal  # subnormal and zero results: within one subnormal step or two
    np.testing.assert_allclose(got[tiny], want[tiny], rtol=0, atol=3e-45)


def test_reciprocal_of_vector_lanes_equals_numpy():
    values = whole_vectors([*SPECIAL, *np.linspace(-5, 5, 1000)])
    out = column_sums(values).reciprocal()
    assert "(1.0f/vec" in c_source(out), "the reciprocal runs on vectors"
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(out.numpy(), np.float32(1) / (values + np.float32(0)))  # the sum makes -0 +0
