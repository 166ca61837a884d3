"""The suite checks every kernel it compiles against the codegen spec (fusegrad/uop/spec.py) after each stage;
SPEC=0 in the environment turns the checks off. Subprocesses (examples, cache tests) inherit the setting."""

import os

os.environ.setdefault("SPEC", "1")

from fusegrad.helpers import SPEC  # noqa: E402

SPEC.value = int(os.environ["SPEC"])

import pytest  # noqa: E402

from tests.slow_cases import SAMPLE_EVERY, SAMPLED, SLOW_CASES, UNMATCHED  # noqa: E402

# .ci/run installs every toolchain the suite uses (PoCL, LLVM 19 + lld, llvmlite, nvcc is on the machine) and sets
# FUSEGRAD_CI_NO_SKIPS=1: there a skip means a missing piece, so it fails, except skips that mean "more is installed"
SKIPS_ALLOWED_IN_CI = ("the NVIDIA driver is installed", "the device has half")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("FUSEGRAD_CI_NO_SKIPS") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not any(allowed in reason for allowed in SKIPS_ALLOWED_IN_CI):
            report.outcome, report.longrepr = "failed", f"skipped in CI, where nothing may be missing: {reason}"


@pytest.fixture(scope="session")
def amdgpu_target():
    """The AMD GPU LLVM builds code objects for (gfx950, or gfx942 where LLVM lacks it); skips without LLVM."""
    from fusegrad.runtime.support.amd.codeobj import ToolchainError, check_toolchain, pick_target

    try:
        check_toolchain()
    except ToolchainError as e:
        pytest.skip(str(e))
    return pick_target("gfx950")


@pytest.fixture
def avx512_target(monkeypatch):
    """A C renderer for an AVX-512 CPU (64-byte vectors, 32 registers) whatever this machine has, to pass to
    lower_to_linear and render with: for tests that pin the choices made for one register budget. It is the CPU
    device's renderer meanwhile, so the panel layout and the kernels realized plan for it too."""
    from fusegrad.renderer.c import CRenderer
    from fusegrad.runtime.device import Device

    renderer = CRenderer(CRenderer.capabilities.replace(vector_bytes=64, vector_registers=32))
    monkeypatch.setattr(Device["CPU"], "renderer", renderer)
    return renderer


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a long test (multi-process, conformance suites); CI or FUSEGRAD_SLOW=1")


_SAMPLED_TESTS = frozenset(k for k in SAMPLED if "[" not in k)
_SAMPLED_PREFIXES = tuple(k for k in SAMPLED if "[" in k)


def _sample_key(nodeid: str) -> str | None:
    """The SAMPLED key a case belongs to: a prefix of its case id, else its test's node id."""
    if "[" not in nodeid:
        return None
    if nodeid.startswith(_SAMPLED_PREFIXES):
        return next(k for k in _SAMPLED_PREFIXES if nodeid.startswith(k))
    test = nodeid.split("[")[0]
    return test if test in _SAMPLED_TESTS else None


def _whole_suite(config) -> bool:
    args = [os.path.realpath(os.path.join(config.invocation_params.dir, a)) for a in config.args]
    # -k, -m and --deselect narrow the items after this hook (pytest's own hooks run after a conftest's)
    return args == [os.path.dirname(os.path.realpath(__file__))]


def pytest_collection_modifyitems(config, items):
    seen: dict[str, int] = {}  # cases of each SAMPLED key met so far, in collection order
    named: set[str] = set()  # SLOW_CASES entries met
    for item in items:  # the cases slow_cases.py moves to the slow part
        nodeid = item.nodeid
        if nodeid in SLOW_CASES or (test := nodeid.split("[")[0]) in SLOW_CASES:
            named.add(nodeid if nodeid in SLOW_CASES else test)
            item.add_marker(pytest.mark.slow)
        elif (key := _sample_key(nodeid)) is not None:
            seen[key] = (n := seen.get(key, 0)) + 1
            if n % SAMPLE_EVERY:
                item.add_marker(pytest.mark.slow)
    if _whole_suite(config):
        config.stash[UNMATCHED] = sorted((SLOW_CASES - named) | (set(SAMPLED) - set(seen)))
    # slow tests are deselected (counted, never skipped) outside CI so a clone's test line stays within its budget
    if os.environ.get("CI") == "true" or os.environ.get("FUSEGRAD_SLOW") == "1":
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)
