"""torch's own OpInfo samples (unary ufuncs, binary ufuncs, reductions; float32) on `fuse` against torch's CPU."""

import pytest

from opinfo_runner import opinfos, run

# a fast cross-section: elementwise math, comparison, promotion, and reductions with dims and keepdim
FAST = ("exp", "sqrt", "add", "mul", "eq", "sum", "amax", "argmax")


def test_opinfo_fast_subset():
    ops = [(k, op) for k, op in opinfos() if k in FAST]
    assert len(ops) == len(FAST)
    values, grads = run(ops, grads=True)
    assert values.passed >= 0.9 * values.total, values.failures
    assert grads.passed >= 0.8 * grads.total, grads.failures


@pytest.mark.slow
def test_opinfo_all_samples():
    values, grads = run(opinfos(), grads=True)
    print(f"\nOpInfo on fuse: values {values.passed}/{values.total}, gradients {grads.passed}/{grads.total}")
    assert values.passed >= 0.9 * values.total, (values.passed, values.total, values.failures)
    assert grads.passed >= 0.8 * grads.total, (grads.passed, grads.total, grads.failures)
