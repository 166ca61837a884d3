"""`import fusegrad` leaves the heavy modules unloaded until they are used, and the lazy numpy acts like numpy."""

import subprocess
import sys

import numpy

from fusegrad.lazy_numpy import np

LAZY_AT_IMPORT = ["numpy", "fusegrad.codegen"]


def loaded_after(code: str) -> set[str]:
    script = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_import_does_not_load_heavy_modules() -> None:
    loaded = loaded_after("import fusegrad")
    assert "fusegrad.tensor" in loaded  # the probe itself works
    assert [m for m in LAZY_AT_IMPORT if m in loaded] == []


def test_numpy_loads_on_first_use() -> None:
    loaded = loaded_after("from fusegrad import Tensor\nassert Tensor([1, 2]).numpy().tolist() == [1, 2]")
    assert "numpy" in loaded


def test_lazy_numpy_matches_numpy() -> None:
    assert np.float32 is numpy.float32
    assert np.ndarray is numpy.ndarray
    numpy.testing.assert_array_equal(np.arange(4) * 2, numpy.array([0, 2, 4, 6]))
