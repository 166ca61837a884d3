"""The scheduler is a list of named passes (schedule.PASSES): DEBUG=5 shows the state after each, and under SPEC every
kernel AST it emits is checked against the kernel spec (uop/spec.py), which holds what codegen's lowerer has a rule
for."""

import numpy as np
import pytest
from fusegrad.codegen.lowerer import LOWERING_RULES
from fusegrad.dtype import dtypes
from fusegrad.helpers import Context
from fusegrad.schedule import PASSES, create_schedule
from fusegrad.tensor import Tensor
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.spec import KERNEL_AST_OPS, SpecError, check_kernel_ast

f32 = dtypes.float32
OUT = UOp(Ops.DEFINE_GLOBAL, f32, (), (0, 8))
IN = UOp(Ops.DEFINE_GLOBAL, f32, (), (1, 8))


def test_debug_5_shows_each_pass_in_order(capsys):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = Tensor(a)
    y = (x * 2 + 1).sum(axis=1)
    with Context(DEBUG=5):
        items, results, _ = create_schedule([y.uop], [y.device])
    out = capsys.readouterr().out
    shown = [line.removeprefix("--- schedule after ") for line in out.splitlines() if "--- schedule after" in line]
    assert shown == [p.name for p in PASSES]
    assert "realize point(s)" in out and "kernel 0 on" in out
    np.testing.assert_allclose(y.numpy(), (a * 2 + 1).sum(axis=1), rtol=1e-6)


def test_scheduled_kernels_pass_the_kernel_spec():
    a = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    x = Tensor(a)
    y = (x.exp() - x.max(axis=1, keepdim=True)).permute(1, 0).pad(((1, 0), (0, 2))).contiguous() * 0.5
    items, _, _ = create_schedule([y.uop], [y.device])
    kernels = [it.ast for it in items if it.ast.op is Ops.SINK]
    assert len(kernels) >= 2
    for ast in kernels:
        check_kernel_ast(ast)
    want = np.pad((np.exp(a) - a.max(axis=1, keepdims=True)).T, ((1, 0), (0, 2))) * 0.5
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "ast, op, why",
    [
        (UOp(Ops.SINK, src=(UOp(Ops.STORE, src=(OUT, UOp(Ops.BUFFER, f32, (), 8))),)), Ops.BUFFER, "scheduled kernel"),
        (UOp(Ops.SINK, src=(UOp(Ops.STORE, src=(OUT, IN)), IN)), Ops.SINK, "STOREs and"),
        (UOp(Ops.SINK, src=(UOp(Ops.STORE, src=(UOp(Ops.EXP, f32, (IN,)), IN)),)), Ops.STORE, "writes a DEFINE"),
        (UOp(Ops.SINK, src=(UOp(Ops.STORE, src=(OUT, UOp(Ops.COPY, f32, (IN,), "CPU"))),)), Ops.COPY, "scheduled"),
        (UOp(Ops.SINK, src=()), Ops.SINK, "STOREs and"),
    ],
)
def test_kernel_spec_rejects(ast, op, why):
    with pytest.raises(SpecError, match=rf"after stage 'schedule': {op.name} .*{why}"):
        check_kernel_ast(ast)


def test_kernel_spec_root_must_be_sink():
    with pytest.raises(SpecError, match="after stage 'schedule': STORE .*root is a SINK"):
        check_kernel_ast(UOp(Ops.STORE, src=(OUT, IN)))


def test_the_kernel_spec_is_what_the_lowerer_has_rules_for():
    assert set(LOWERING_RULES) == set(KERNEL_AST_OPS) - {Ops.SINK, Ops.STORE}


def test_a_store_through_a_view_passes():
    view = UOp(Ops.RESHAPE, f32, (OUT,), (2, 4))
    check_kernel_ast(UOp(Ops.SINK, src=(UOp(Ops.STORE, src=(view, UOp(Ops.RESHAPE, f32, (IN,), (2, 4)))),)))
