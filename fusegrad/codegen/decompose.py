"""Rewrites a lowered kernel into what a backend computes directly: narrow floats are computed in float32, and the
math a target lacks (Capabilities.float64_math, sin_reduction) is written out in plain arithmetic (float_math.py)."""

from __future__ import annotations
from fusegrad.dtype import NARROW_FLOATS, dtypes
from fusegrad.codegen.float_math import decompose_math
from fusegrad.renderer import Capabilities
from fusegrad.uop.alu import cast_value
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite


def _alu_in_float32(alu: UOp) -> UOp | None:
    """A half/bfloat16/fp8 op computes in float32 and rounds once, like torch's CPU kernels."""
    if not any(s.dtype in NARROW_FLOATS for s in alu.src):
        return None
    srcs = tuple(s.cast(dtypes.float32) if s.dtype in NARROW_FLOATS else s for s in alu.src)
    if alu.op is Ops.WHERE:
        srcs = (alu.src[0],) + srcs[1:]
    out_dtype = dtypes.float32 if alu.dtype in NARROW_FLOATS else alu.dtype
    return UOp(alu.op, out_dtype, srcs, alu.arg).cast(alu.dtype)


_VIA_FLOAT32 = (dtypes.bfloat16,) + dtypes.fp8s


def _cast_via_float32(c: UOp, x: UOp) -> UOp | None:
    """bfloat16 and fp8 convert only to float32, and from float32 (or, for fp8, float64) in the renderers."""
    if x.dtype in _VIA_FLOAT32 and c.dtype is not dtypes.float32:
        return x.cast(dtypes.float32).cast(c.dtype)
    # float64 -> fp8 rounds once, straight from the double: through float32 a near-tie could round twice
    if c.dtype in dtypes.fp8s and x.dtype is dtypes.float64:
        return None
    if c.dtype in _VIA_FLOAT32 and x.dtype is not dtypes.float32:
        return x.cast(dtypes.float32).cast(c.dtype)
    return None


def _acc_in_float32(r: UOp) -> UOp | None:
    if r.dtype not in NARROW_FLOATS:
        return None
    return UOp(Ops.REDUCE, dtypes.float32, (r.src[0].cast(dtypes.float32), *r.src[1:]), r.arg).cast(r.dtype)


pm_narrow_floats = PatternMatcher(
    [
        (UPat(GroupOp.ALU, name="alu"), _alu_in_float32),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), _cast_via_float32),
        # the widened constants of the rules above are constants again, not conversions run in the kernel
        (
            UPat(Ops.CAST, name="c", src=(UPat(Ops.CONST, name="k"),)),
            lambda c, k: UOp.const(c.dtype, cast_value(k.arg, c.dtype)),
        ),
        (UPat(Ops.REDUCE, name="r"), _acc_in_float32),
        # a float32 value cast to half and straight back is the rounded value, which must be kept
    ]
)


def decompose_for_device(kernel: UOp, capabilities: Capabilities = Capabilities()) -> UOp:
    # narrow floats first: a half sin is a float32 sin by then, which the math rewrite may write out
    kernel = graph_rewrite(kernel, pm_narrow_floats)
    return decompose_math(kernel, capabilities.float64_math, capabilities.sin_reduction)
