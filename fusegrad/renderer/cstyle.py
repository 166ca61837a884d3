"""Renders a linear kernel as readable C: one statement per value, loops as for-statements."""

from __future__ import annotations
import math
from collections import Counter
from fusegrad.dtype import FP8_FORMATS, DType, dtypes, float_to_fp8
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.codegen.opt.packs import Pack, find_packs
from fusegrad.codegen.opt.target import vector_bytes

C_TYPES = {dtypes.bool: "_Bool", dtypes.float16: "_Float16", dtypes.bfloat16: "unsigned short"} | {
    dt: "unsigned char" for dt in dtypes.fp8s
}


def ctype(dt: DType) -> str:
    return C_TYPES.get(dt, dt.name)


PRELUDE = """#include <math.h>
#include <string.h>
static inline float fg_bf16_to_f32(unsigned short b) { unsigned int u = (unsigned int)b << 16; \
float f; memcpy(&f, &u, 4); return f; }
static inline unsigned short fg_f32_to_bf16(float f) {
  unsigned int u; memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  return (unsigned short)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
static inline float fg_fp8_to_f32(unsigned char b, int mbits, int bias, int has_inf, int fnuz, int nan_bits) {
  int top = (1 << (7 - mbits)) - 1, e = (b & 0x7F) >> mbits, m = b & ((1 << mbits) - 1);
  float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (fnuz ? b == 0x80 : (b & 0x7F) == nan_bits || (has_inf && e == top && m)) return copysignf(NAN, sign);
  if (has_inf && e == top) return sign * INFINITY;
  return sign * (e ? ldexpf((float)(m | (1 << mbits)), e - bias - mbits) : ldexpf((float)m, 1 - bias - mbits));
}
/* round to nearest even from the double; overflow saturates to max_bits or becomes inf (0x7C) */
static inline unsigned char fg_f64_to_fp8(double x, int mbits, int bias, int has_inf, int fnuz, int nan_bits,
                                          int max_bits, double max_value) {
  unsigned char sign = signbit(x) ? 0x80 : 0;
  double a = fabs(x);
  if (a != a) return fnuz ? 0x80 : (sign | nan_bits);
  if (isinf(a)) return has_inf ? (sign | 0x7C) : fnuz ? 0x80 : (sign | nan_bits);
  int e, min_e = 1 - bias;
  frexp(a, &e);
  e = (a == 0.0 || e - 1 < min_e) ? min_e : e - 1;
  double q = ldexp(1.0, e - mbits), r = nearbyint(a / q) * q;
  if (r > max_value) return sign | (has_inf ? 0x7C : max_bits);
  int bits;
  if (r < ldexp(1.0, min_e)) {
    bits = (int)(r / ldexp(1.0, min_e - mbits));
  } else {
    frexp(r, &e);
    bits = ((e - 2 + bias) << mbits) + (int)(r / ldexp(1.0, e - 1 - mbits));
  }
  return (fnuz && bits == 0) ? 0 : (sign | bits);
}
"""


def _fp8_args(dt: DType) -> str:
    f = FP8_FORMATS[dt]
    return f"{f.mantissa_bits}, {f.bias}, {int(f.has_inf)}, {int(f.fnuz)}, {f.nan_bits}"


def _fp8_from(x: str, dt: DType) -> str:
    f = FP8_FORMATS[dt]
    return f"fg_f64_to_fp8({x}, {_fp8_args(dt)}, {f.max_bits}, {f.max_value!r})"


def render_const(value: object, dt: DType) -> str:
    if dt is dtypes.bool:
        return "1" if value else "0"
    if dt in FP8_FORMATS:
        return f"((unsigned char){float_to_fp8(value, dt):#04x})"
    if dtypes.is_float(dt):
        v = float(value)  # type: ignore[arg-type]
        if math.isnan(v):
            s = "NAN"
        elif math.isinf(v):
            s = "INFINITY" if v > 0 else "(-INFINITY)"
        else:
            s = repr(v) + ("f" if dt is not dtypes.float64 else "")
        if dt is dtypes.float64 and s in ("NAN", "INFINITY", "(-INFINITY)"):
            return f"((double){s})"
        if dt is dtypes.float16:
            return f"((_Float16){s})"
        if dt is dtypes.bfloat16:
            return f"fg_f32_to_bf16({s})"
        return s
    v = int(value)  # type: ignore[call-overload]
    if dt is dtypes.int64:
        return f"{v}LL" if v != -(2**63) else "(-9223372036854775807LL-1)"
    if dt is dtypes.uint64:
        return f"{v}ULL"
    if dt is dtypes.uint32:
        return f"{v}u"
    if dt is dtypes.int32 and v == -(2**31):
        return "(-2147483647-1)"
    return str(v) if v >= 0 else f"({v})"


_MATH = {
    Ops.SQRT: "sqrt",
    Ops.EXP: "exp",
    Ops.LOG: "log",
    Ops.EXP2: "exp2",
    Ops.LOG2: "log2",
    Ops.SIN: "sin",
    Ops.COS: "cos",
    Ops.TRUNC: "trunc",
    Ops.POW: "pow",
}
_INFIX = {
    Ops.ADD: "+",
    Ops.MUL: "*",
    Ops.FDIV: "/",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.CMPEQ: "==",
    Ops.AND: "&",
    Ops.OR: "|",
    Ops.XOR: "^",
    Ops.SHL: "<<",
    Ops.SHR: ">>",
}


_UNSIGNED = {dtypes.int32: "unsigned int", dtypes.int64: "unsigned long long"}
# the lanes of a comparison of float vectors
_MASK_INT = {dtypes.float32: dtypes.int32, dtypes.float64: dtypes.int64}


def render_wrapping(op: Ops, dt: DType, args: list[str]) -> str:
    """Signed data arithmetic that wraps like torch: computed in the unsigned type, converted back (modulo in gcc)."""
    u, t = _UNSIGNED[dt], ctype(dt)
    if op is Ops.NEG:
        return f"(({t})(0-({u})({args[0]})))"
    if op is Ops.SHL:
        return f"(({t})(({u})({args[0]})<<({args[1]})))"
    return f"(({t})(({u})({args[0]}){_INFIX[op]}({u})({args[1]})))"


def render_alu(op: Ops, dt: DType, args: list[str], srcs: tuple[UOp, ...], wrap: bool = False) -> str:
    sdt = srcs[0].dtype
    if wrap and dt in _UNSIGNED and op in (Ops.ADD, Ops.MUL, Ops.NEG, Ops.SHL):
        return render_wrapping(op, dt, args)
    if op in _MATH:
        fn = _MATH[op] + ("f" if sdt is dtypes.float32 else "")
        expr = f"{fn}({', '.join(args)})"
    elif op is Ops.NEG:
        expr = f"(!{args[0]})" if dt is dtypes.bool else f"(-{args[0]})"
    elif op is Ops.RECIPROCAL:
        expr = f"(1/{args[0]})" if dt is dtypes.float64 else f"(1.0f/{args[0]})"
    elif op is Ops.MAX:
        a, b = args
        expr = f"(({a}>{b}||{a}!={a})?{a}:{b})" if dtypes.is_float(dt) else f"(({a}>{b})?{a}:{b})"
    elif op in (Ops.IDIV, Ops.MOD):
        sym = "/" if op is Ops.IDIV else "%"
        # C traps on integer division by zero; the result is defined as 0 instead (matches the PYTHON backend)
        if srcs[1].op is Ops.CONST and srcs[1].arg > 0:
            expr = f"({args[0]}{sym}{args[1]})"
        elif dtypes.is_unsigned(dt):
            expr = f"(({args[1]})==0?0:({args[0]}{sym}{args[1]}))"
        # signed MIN / -1 traps too; x / -1 is -x (wrapping) and x % -1 is 0
        else:
            neg = render_wrapping(Ops.NEG, dt, args[:1]) if dt in _UNSIGNED else f"(-({args[0]}))"
            expr = f"(({args[1]})==0?0:({args[1]})==-1?{neg if op is Ops.IDIV else '0'}:({args[0]}{sym}{args[1]}))"
    elif op is Ops.WHERE:
        expr = f"({args[0]}?{args[1]}:{args[2]})"
    elif op is Ops.ADD and dt is dtypes.bool:
        expr = f"({args[0]}|{args[1]})"
    elif op is Ops.MUL and dt is dtypes.bool:
        expr = f"({args[0]}&{args[1]})"
    else:
        expr = f"({args[0]}{_INFIX[op]}{args[1]})"
    # C computes narrow integers as int: cast back so wrap-around matches the dtype
    if dtypes.is_int(dt) and dt.itemsize < 4 and op not in GroupOp.Comparison:
        expr = f"(({ctype(dt)}){expr})"
    return expr


def render_cast(x: str, src: DType, dst: DType) -> str:
    if src in FP8_FORMATS:
        return f"fg_fp8_to_f32({x}, {_fp8_args(src)})"
    if dst in FP8_FORMATS:
        return _fp8_from(x, dst)
    if src is dtypes.bfloat16:
        return f"fg_bf16_to_f32({x})"
    if dst is dtypes.bfloat16:
        return f"fg_f32_to_bf16({x})"
    return f"(({ctype(dst)})({x}))"


class CStyleRenderer:
    """C99 with GNU extensions; the outermost global loop runs [core_start, core_end) so threads can split it."""

    def render(self, name: str, lin: tuple[UOp, ...], vectorize: bool = True) -> str:
        uses = Counter(s for u in lin for s in u.src)
        packs = find_packs(lin, vector_bytes()) if vectorize else {}
        vec_names: dict[Pack, str] = {}
        vec_types: dict[str, str] = {}
        names: dict[UOp, str] = {}
        counters: Counter[str] = Counter()
        lines: list[str] = []
        depth = 1
        first_global = True

        def fresh(prefix: str) -> str:
            counters[prefix] += 1
            return f"{prefix}{counters[prefix] - 1}"

        def ref(u: UOp) -> str:
            if u.op is Ops.CONST:
                return render_const(u.arg, u.dtype)
            return names[u]

        def line(s: str) -> None:
            lines.append("  " * depth + s)

        params = [u for u in lin if u.op is Ops.DEFINE_GLOBAL]
        stored = {u.src[0] for u in lin if u.op is Ops.STORE}
        # integer math on loaded data wraps like torch; index math over loops cannot overflow, so it stays plain signed
        # arithmetic the compiler may assume affine (and vectorize)
        reads_data: dict[UOp, bool] = {}
        for u in lin:
            reads_data[u] = u.op in (Ops.LOAD, Ops.DEFINE_ACC, Ops.ACC_UPDATE) or any(
                reads_data.get(x, False) for x in u.src
            )

        def vtype(pack: Pack) -> str:
            dt, n = (_MASK_INT[pack.mask_of] if pack.mask_of is not None else pack.dtype), len(pack.lanes)
            tname = f"fg_{dt.name}x{n}"
            vec_types[tname] = f"typedef {ctype(dt)} {tname} __attribute__((vector_size({n * dt.itemsize})));"
            return tname

        def vref(s: UOp) -> str:
            # a pack operand is its vector; a scalar one is broadcast by GCC's vector-scalar arithmetic
            return vec_names[packs[s][0]] if s in packs else ref(s)

        def emit_vector(u: UOp, pack: Pack) -> None:
            op = u.op
            if op is Ops.STORE:
                value = vec_names[pack] = vec_names[packs[u.src[2]][0]]
                address = f"{ref(u.src[0])} + ({ref(pack.base)}+{pack.offset})"
                line(f"__builtin_memcpy({address}, &{value}, sizeof({value}));")
                return
            if op is Ops.ACC_UPDATE:
                acc = vec_names[packs[u.src[0]][0]]
                vec_names[pack] = acc
                line(f"{acc} = {acc} + {vref(u.src[1])};")
                return
            vname = vec_names[pack] = fresh("vec")
            if op is Ops.LOAD:
                address = f"{ref(u.src[0])} + ({ref(pack.base)}+{pack.offset})"
                if len(u.src) == 3:  # gated: zeros, and memory is read only where the gate holds
                    line(f"{vtype(pack)} {vname} = {{}};")
                    line(f"if ({ref(u.src[2])}) __builtin_memcpy(&{vname}, {address}, sizeof({vname}));")
                else:
                    line(f"{vtype(pack)} {vname};")
                    line(f"__builtin_memcpy(&{vname}, {address}, sizeof({vname}));")
            elif op is Ops.DEFINE_ACC:
                line(f"{vtype(pack)} {vname} = ({vtype(pack)}){{}} + {ref(u.src[0])};")
            elif op is Ops.NEG:
                line(f"{vtype(pack)} {vname} = -{vref(u.src[0])};")
            elif op is Ops.WHERE:
                # C's conditional needs both arms of the vector type: a scalar arm is broadcast explicitly
                arms = [vref(s) if s in packs else f"(({vtype(pack)}){{}} + {ref(s)})" for s in u.src[1:]]
                if u.src[0] in packs:  # a mask: bitwise select of the arms' bits (C has no lane-wise ?:)
                    mask = packs[u.src[0]][0]
                    m, it = vec_names[mask], vtype(mask)
                    select = f"((({it}){arms[0]} & {m}) | (({it}){arms[1]} & ~{m}))"
                    line(f"{vtype(pack)} {vname} = ({vtype(pack)}){select};")
                else:
                    line(f"{vtype(pack)} {vname} = ({ref(u.src[0])} ? {arms[0]} : {arms[1]});")
            elif pack.mask_of is not None and op in (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE):
                # a comparison of float vectors gives all-ones integer lanes where it holds
                ft = vtype(packs[next(s for s in u.src if s in packs)][0])
                sides = [vref(s) if s in packs else f"(({ft}){{}} + {ref(s)})" for s in u.src]
                line(f"{vtype(pack)} {vname} = ({sides[0]}{_INFIX[op]}{sides[1]});")
            else:
                line(f"{vtype(pack)} {vname} = ({vref(u.src[0])}{_INFIX[op]}{vref(u.src[1])});")

        for u in lin:
            op = u.op
            if u in packs:
                pack, lane = packs[u]
                if pack not in vec_names:
                    emit_vector(u, pack)
                if op is not Ops.STORE:
                    # a mask lane is all ones where true: a scalar user gets it as 0/1
                    names[u] = (
                        f"({vec_names[pack]}[{lane}]!=0)" if pack.mask_of is not None else f"{vec_names[pack]}[{lane}]"
                    )
                continue
            if op is Ops.DEFINE_GLOBAL:
                names[u] = f"data{u.arg[0]}"
            elif op is Ops.CONST:
                continue
            elif op is Ops.RANGE:
                names[u] = fresh("gidx" if u.arg[1] == "global" else "ridx")
                end = ref(u.src[0])
                if u.arg[1] == "global" and first_global:
                    first_global = False
                    line(f"for ({ctype(u.dtype)} {names[u]} = core_start; {names[u]} < core_end; {names[u]}++) {{")
                else:
                    acc = self._simd_reduction(u, lin, names)
                    if acc:
                        line(acc)
                    line(f"for ({ctype(u.dtype)} {names[u]} = 0; {names[u]} < {end}; {names[u]}++) {{")
                depth += 1
            elif op is Ops.ENDRANGE:
                depth -= 1
                line("}")
            elif op is Ops.DEFINE_ACC:
                names[u] = fresh("acc")
                line(f"{ctype(u.dtype)} {names[u]} = {ref(u.src[0])};")
            elif op is Ops.ACC_UPDATE:
                acc = names[u.src[0]]
                line(f"{acc} = {render_alu(u.arg, u.dtype, [acc, ref(u.src[1])], (u.src[0], u.src[1]), wrap=True)};")
                names[u] = acc
            elif op is Ops.LOAD:
                names[u] = fresh("val")
                load = f"{ref(u.src[0])}[{ref(u.src[1])}]"
                if len(u.src) == 3:
                    load = f"({ref(u.src[2])}?{load}:{render_const(0, u.dtype)})"
                line(f"{ctype(u.dtype)} {names[u]} = {load};")
            elif op is Ops.STORE:
                line(f"{ref(u.src[0])}[{ref(u.src[1])}] = {ref(u.src[2])};")
            elif op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST):
                if op is Ops.CAST:
                    expr = render_cast(ref(u.src[0]), u.src[0].dtype, u.dtype)
                elif op is Ops.BITCAST:
                    expr = (
                        f"({{ {ctype(u.dtype)} bc_; {ctype(u.src[0].dtype)} in_ = {ref(u.src[0])};"
                        " memcpy(&bc_, &in_, sizeof(bc_)); bc_; })"
                    )
                else:
                    expr = render_alu(op, u.dtype, [ref(s) for s in u.src], u.src, wrap=reads_data[u])
                # single-use integer index math is inlined so the indexing reads like the formula it is
                if uses[u] == 1 and dtypes.is_int(u.dtype) and op in GroupOp.ALU:
                    names[u] = expr
                else:
                    names[u] = fresh("alu" if op in GroupOp.ALU else "cast")
                    line(f"{ctype(u.dtype)} {names[u]} = {expr};")
            else:
                raise NotImplementedError(f"C renderer has no rule for {op}")
        args = [f"{'const ' if p not in stored else ''}{ctype(p.dtype)}* data{p.arg[0]}" for p in params] + [
            "long long core_start",
            "long long core_end",
        ]
        typedefs = "".join(t + "\n" for t in vec_types.values())
        return PRELUDE + typedefs + f"void {name}({', '.join(args)}) {{\n" + "\n".join(lines) + "\n}\n"

    @staticmethod
    def _simd_reduction(r: UOp, lin: tuple[UOp, ...], names: dict[UOp, str]) -> str | None:
        """An innermost sum loop may be vectorized: the pragma allows reassociating only this accumulator."""
        start = lin.index(r)
        body = []
        for u in lin[start + 1 :]:
            if u.op is Ops.ENDRANGE and u.src[0] is r:
                break
            if u.op is Ops.RANGE:
                return None
            body.append(u)
        updates = [u for u in body if u.op is Ops.ACC_UPDATE and r in u.src[2:]]
        # several accumulators are better vectorized across each other (SLP) than along the loop
        if len(updates) != 1 or any(
            u.arg is not Ops.ADD or u.dtype not in (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64)
            for u in updates
        ):
            return None
        accs = ", ".join(names[u.src[0]] for u in updates)
        return f"#pragma omp simd reduction(+:{accs})"
