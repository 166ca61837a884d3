"""A kernel variable is read from its parameter buffer clamped to the variable's bounds, so index arithmetic over a
symbolic size is proven not to overflow and is written as plain signed C (a loop the C compiler can vectorize)."""

import numpy as np

from fusegrad import Tensor, Variable
from fusegrad.codegen import lower_to_linear
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule


def exp_of_rows(n: int) -> Tensor:
    rows = Tensor(np.arange(640 * 48, dtype=np.float32).reshape(640, 48) / 1e4).realize()
    return rows.shrink(((0, Variable("n", 0, 512).bind(n) + 128), None)).exp()


def test_index_over_a_symbolic_size_is_plain_signed_arithmetic():
    out = exp_of_rows(100).contiguous()
    items, _, _ = create_schedule([out.uop], [Device["CPU"]])
    renderer = Device["CPU"].renderer
    info = lower_to_linear(items[-1].ast, renderer)
    source = renderer.render(info.name, info.lin, info.packs)
    assert "unsigned" not in source.split(info.name, 1)[1], source  # was: every index product wrapped in unsigned


def test_rows_over_a_bound_variable_equal_numpy_at_its_bounds():
    want = np.exp(np.arange(640 * 48, dtype=np.float32).reshape(640, 48) / 1e4)
    for n in (0, 300, 512):
        got = exp_of_rows(n).contiguous().realize().shrink(((0, n + 128), None)).numpy()
        np.testing.assert_allclose(got, want[: n + 128], rtol=1e-6)
