"""The codegen spec (fusegrad/uop/spec.py): each rule rejects a hand-built bad graph with a SpecError naming the stage,
the op and why; lower_to_linear runs the named stages in order and DEBUG=5 shows each one."""

import numpy as np
import pytest
from fusegrad.codegen import STAGES, lower_to_linear
from fusegrad.codegen.linearize import linearize
from fusegrad.dtype import dtypes
from fusegrad.helpers import Context
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.tensor import Tensor
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.spec import SpecError, check_graph, check_linear

i32, f32, f16 = dtypes.int32, dtypes.float32, dtypes.float16
OUT = UOp(Ops.DEFINE_GLOBAL, f32, (), (0, 8))
IN = UOp(Ops.DEFINE_GLOBAL, f32, (), (1, 8))
RG = UOp(Ops.RANGE, i32, (UOp.const(i32, 8),), (0, "global"))
RR = UOp(Ops.RANGE, i32, (UOp.const(i32, 8),), (1, "reduce"))


def kernel(value: UOp, index: UOp = RG, out: UOp = OUT) -> UOp:
    return UOp(Ops.SINK, src=(UOp(Ops.STORE, src=(out, index, value)),))


def load(index: UOp = RG, buf: UOp = IN) -> UOp:
    return UOp(Ops.LOAD, buf.dtype, (buf, index))


def rejects(graph: UOp, spec: str, op: Ops, why: str) -> None:
    with pytest.raises(SpecError, match=rf"after stage 'st': {op.name} .*{why}"):
        check_graph(graph, spec, "st")


def test_valid_kernel_passes_both_graph_specs():
    good = kernel(UOp(Ops.REDUCE, f32, (load(RG * 8 + RR) * 2.0, RR), Ops.ADD))
    check_graph(good, "lowered", "st")
    check_graph(good, "decomposed", "st")
    check_linear(linearize(good))


@pytest.mark.parametrize(
    "graph, op, why",
    [
        (kernel(UOp(Ops.RESHAPE, f32, (load(),), (8,))), Ops.RESHAPE, "not an op of a lowered kernel"),
        (kernel(UOp(Ops.REDUCE_AXIS, f32, (load(),), (Ops.ADD, (0,)))), Ops.REDUCE_AXIS, "not an op of a lowered"),
        (kernel(UOp(Ops.BUFFER, f32, (), 8)), Ops.BUFFER, "not an op of a lowered kernel"),
        (kernel(load(buf=UOp(Ops.CONST, f32, (), 1.0))), Ops.LOAD, "indexes a DEFINE_GLOBAL"),
        (kernel(load(index=UOp.const(f32, 1.0))), Ops.LOAD, "index is an integer"),
        (kernel(load(), index=RG.cast(f32)), Ops.STORE, "index is an integer"),
        (kernel(load().cast(f16)), Ops.STORE, "with the buffer's dtype"),
        (kernel(UOp(Ops.LOAD, f16, (IN, RG))), Ops.LOAD, "reads the buffer's dtype"),
        (kernel(UOp(Ops.ADD, f32, (load(), UOp.const(f16, 1.0)))), Ops.ADD, "sources share one dtype"),
        (kernel(UOp(Ops.CMPLT, f32, (load(), load()))), Ops.CMPLT, "the result is dtypes.bool"),
        (kernel(UOp(Ops.EXP2, f32, (load().cast(f16),))), Ops.EXP2, "keeps its source's dtype"),
        (kernel(UOp(Ops.WHERE, f32, (RG, load(), load()))), Ops.WHERE, r"is \(bool, x, x\)"),
        (kernel(UOp(Ops.REDUCE, f32, (load(), RG), Ops.ADD)), Ops.REDUCE, "over reduce RANGEs"),
        (kernel(UOp(Ops.REDUCE, f32, (load(RR), RR), Ops.CMPLT)), Ops.REDUCE, "ADD, MUL or MAX"),
        (kernel(load(UOp(Ops.RANGE, i32, (UOp.const(i32, -1),), (0, "global")))), Ops.RANGE, "non-negative constant"),
        (kernel(load(UOp(Ops.RANGE, i32, (UOp.const(i32, 8),), (0, "upcast")))), Ops.RANGE, "'global' | 'reduce'"),
        (UOp(Ops.SINK, src=(load(),)), Ops.SINK, "a SINK holds STOREs"),
    ],
)
def test_lowered_rule_rejects(graph, op, why):
    rejects(graph, "lowered", op, why)


def test_root_must_be_sink():
    with pytest.raises(SpecError, match="after stage 'lower': LOAD .*root is a SINK"):
        check_graph(load(), "lowered", "lower")


HALF_IN = UOp(Ops.DEFINE_GLOBAL, f16, (), (1, 8))
HALF_OUT = UOp(Ops.DEFINE_GLOBAL, f16, (), (0, 8))


@pytest.mark.parametrize(
    "graph, op, why",
    [
        (kernel(load(buf=HALF_IN) * load(buf=HALF_IN), out=HALF_OUT), Ops.MUL, "computed in float32"),
        (kernel(load(buf=HALF_IN).alu(Ops.CMPLT, load(buf=HALF_IN)).cast(f32)), Ops.CMPLT, "computed in float32"),
        (kernel(UOp(Ops.REDUCE, f16, (load(RR, HALF_IN), RR), Ops.ADD), out=HALF_OUT), Ops.REDUCE, "in float32"),
        (kernel(load(buf=HALF_IN).cast(dtypes.bfloat16).cast(f32)), Ops.CAST, "convert through float32"),
        (kernel(load().cast(dtypes.fp8e4m3).cast(dtypes.float64).cast(f32)), Ops.CAST, "fp8 converts to float32"),
    ],
)
def test_decomposed_rule_rejects(graph, op, why):
    check_graph(graph, "lowered", "decompose")  # each is a fine lowered kernel; only decompose's spec refuses it
    rejects(graph, "decomposed", op, why)


def test_decomposed_allows_fp8_from_float64():
    check_graph(kernel(load().cast(dtypes.float64).cast(dtypes.fp8e4m3).cast(f32)), "decomposed", "st")


def _linear() -> list[UOp]:
    return linearize(kernel(UOp(Ops.REDUCE, f32, (load(RG * 8 + RR), RR), Ops.ADD)))


def test_linear_valid():
    lin = _linear()
    assert [u.op for u in lin].count(Ops.ENDRANGE) == 2
    check_linear(lin)


def _without(lin: list[UOp], op: Ops) -> list[UOp]:
    return [u for u in lin if u.op is not op]


def _swap(lin: list[UOp], a: Ops, b: Ops) -> list[UOp]:
    lin = list(lin)
    i, j = next(k for k, u in enumerate(lin) if u.op is a), next(k for k, u in enumerate(lin) if u.op is b)
    lin[i], lin[j] = lin[j], lin[i]
    return lin


@pytest.mark.parametrize(
    "mutate, op, why",
    [
        (lambda lin: lin[:-1], Ops.RANGE, "never closed"),
        (
            lambda lin: [u for u in lin if u.op is not Ops.ENDRANGE or u.src[0] is not RR] + [lin[-1]],
            Ops.ENDRANGE,
            "innermost open is",
        ),
        (lambda lin: _swap(lin, Ops.DEFINE_ACC, Ops.ACC_UPDATE), Ops.ACC_UPDATE, "used at .* before it is defined"),
        (lambda lin: _without(lin, Ops.DEFINE_GLOBAL), Ops.LOAD, "before it is defined"),
        (lambda lin: lin + [lin[-1]], Ops.ENDRANGE, "innermost open is None"),
        (lambda lin: lin[:-1] + [load(RR)] + lin[-1:], Ops.LOAD, r"uses RANGE \(1, 'reduce'\) outside its loop"),
        (lambda lin: lin + [UOp(Ops.SINK)], Ops.SINK, "not an op of a linear kernel"),
        (lambda lin: [UOp(Ops.ENDRANGE, src=(IN,))] + lin, Ops.ENDRANGE, "closes one RANGE"),
    ],
)
def test_linear_rule_rejects(mutate, op, why):
    with pytest.raises(SpecError, match=rf"after stage 'linearize': {op.name} .*{why}"):
        check_linear(mutate(_linear()))


def test_linear_rejects_accumulator_defined_inside_its_loop():
    lin = _linear()
    acc = next(i for i, u in enumerate(lin) if u.op is Ops.DEFINE_ACC)
    rng = next(i for i, u in enumerate(lin) if u is RR)
    lin[acc], lin[rng] = lin[rng], lin[acc]
    with pytest.raises(SpecError, match="ACC_UPDATE .*DEFINE_ACC comes after the loops"):
        check_linear(lin)


def test_linear_rejects_value_used_after_its_loop_closed():
    lin = _linear()
    inner = next(u for u in lin if u.op is Ops.LOAD)
    end = next(i for i, u in enumerate(lin) if u.op is Ops.ENDRANGE and u.src[0] is RR)
    lin.insert(end + 1, UOp(Ops.NEG, f32, (inner,)))
    with pytest.raises(SpecError, match="NEG .*after the loop it is defined in closed"):
        check_linear(lin)


def _ast():
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
    out = (a.half() * 2).sum(1)
    items, _, _ = create_schedule([out.uop], [Device["CPU"]])
    return out, items[-1].ast


def test_stage_list_is_what_lower_to_linear_runs(monkeypatch):
    names = [s.name for s in STAGES]
    assert names == [
        "lower",
        "choose_opts",
        "lower_with_opts",
        "decompose",
        "block_long_sums",
        "emulate_dtypes",
        "linearize",
        "pack_vectors",
    ]
    ran = []
    import fusegrad.codegen as codegen

    wrapped = tuple(type(s)(s.name, lambda st, s=s: (ran.append(s.name), s.run(st))[1], s.spec) for s in STAGES)
    monkeypatch.setattr(codegen, "STAGES", wrapped)
    _, ast = _ast()
    info = lower_to_linear(ast, Device["CPU"].renderer, opts=())
    assert ran == names and info.opts == ()


def test_debug5_names_each_stage_and_spec_passes(capsys):
    out, ast = _ast()
    with Context(DEBUG=5, SPEC=1):
        lower_to_linear(ast, Device["CPU"].renderer)
    text = capsys.readouterr().out
    positions = [text.index(f"after {s.name}\n") for s in STAGES]
    assert positions == sorted(positions)
    np.testing.assert_allclose(out.numpy(), (np.arange(12).reshape(3, 4) * 2).sum(1))


def test_spec_error_names_stage_from_lower_to_linear(monkeypatch):
    import fusegrad.codegen as codegen

    bad = codegen.Stage("decompose", lambda st: setattr(st, "kernel", kernel(load(buf=HALF_IN) * 1.0)), "decomposed")
    monkeypatch.setattr(codegen, "STAGES", (*STAGES[:3], bad, *STAGES[4:]))
    _, ast = _ast()
    with Context(SPEC=1), pytest.raises(SpecError, match="after stage 'decompose': MUL .*computed in float32"):
        lower_to_linear(ast, Device["CPU"].renderer)
    with Context(SPEC=0):  # without the checks the bad stage goes through to the next stages
        lower_to_linear(ast, Device["CPU"].renderer)
