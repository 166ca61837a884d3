"""Fixtures of the AMD tests."""

import pytest

from fusegrad.helpers import AMD_SIM


@pytest.fixture(scope="module")
def simulated_amd(amdgpu_target):
    """DEV=AMD on the simulator (AMD_SIM=1) for a module's tests; amdgpu_target skips where LLVM cannot build them."""
    old, AMD_SIM.value = AMD_SIM.value, 1
    yield
    AMD_SIM.value = old
