"""Fixtures of the AMD tests."""

import pytest

from fusegrad.helpers import AMD_SIM
from fusegrad.runtime.support.amd.codeobj import ToolchainError, find_llvm


@pytest.fixture(scope="module")
def simulated_amd():
    """DEV=AMD on the simulator (AMD_SIM=1) for a module's tests; skips where LLVM cannot build the code objects."""
    try:
        find_llvm()
    except ToolchainError as e:
        pytest.skip(str(e))
    old, AMD_SIM.value = AMD_SIM.value, 1
    yield
    AMD_SIM.value = old
