"""PanelLinear (a linear layer whose weight is stored in panels of columns) equals numpy's x @ W + b."""

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.models.weights import PanelLinear, panel_matmul, panel_width, to_panels


@pytest.mark.parametrize("rows, d_in, d_out", [(1, 1, 1), (7, 13, 5), (32, 64, 96), (33, 31, 97), (5, 48, 64)])
def test_panel_linear_equals_numpy(rows, d_in, d_out):
    rng = np.random.default_rng(rows * 1000 + d_out)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((rows, d_in), (d_in, d_out), (d_out,)))
    layer = PanelLinear(d_in, d_out)
    layer.weight.assign(to_panels(Tensor(w))).realize()
    layer.bias.assign(Tensor(b)).realize()
    assert layer.weight.shape == (-(-d_out // panel_width()), d_in, panel_width())
    np.testing.assert_allclose(layer(Tensor(x)).numpy(), x @ w + b, rtol=1e-5, atol=1e-5)


def test_panels_keep_leading_dims_and_pad_with_zero_columns():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 10)).astype(np.float32), rng.standard_normal((10, 7)).astype(np.float32)
    panels = to_panels(Tensor(w), panel=4)
    assert panels.shape == (2, 10, 4)
    np.testing.assert_array_equal(panels.numpy()[1, :, 3], 0)  # the eighth column pads
    np.testing.assert_allclose(panel_matmul(Tensor(x), panels, 7).numpy(), x @ w, rtol=1e-5, atol=1e-5)
