"""G19 nn functional ops and losses, compared against torch.nn.functional: values, dtypes, shapes, gradients, errors."""
import numpy as np
import pytest

from fusegrad import Tensor

def test_reduce_feeding_two_reduces_regression():
  """Codegen regression: one fused reduce used by two different reduces must get its own loops in each."""
  for dev in ("CPU", "PYTHON"):
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=dev)
    w = a.sum(-1) * 2
    ref = np.arange(12).reshape(3, 4).sum(-1) * 2
    np.testing.assert_allclose((w.sum() / (w * w).sum()).numpy(), ref.sum() / (ref * ref).sum(), rtol=1e-6)
