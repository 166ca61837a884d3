"""Seeded random tensor programs for the differential fuzzer: a chain of steps over awkward shapes, each step one op
of OPS applied to the value so far (and to fresh inputs it draws). A program renders to two Python sources, one for
fusegrad and one for torch, from the same templates, so the program the fuzzer runs is the test it prints."""

from __future__ import annotations
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# sizes that stress tiles, vectors and tails: 1, primes, 2^k +- 1
AWKWARD = (1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1025, 1100)
MAX_ELEMENTS = 1 << 16  # per tensor: programs stay fast on 2 cores
MAX_MATMUL_WORK = 1 << 22


@dataclass(frozen=True)
class Input:
    shape: tuple[int, ...]
    high: int = 0  # an index input: integers in [0, high); 0: a float input (differentiated)


@dataclass(frozen=True)
class Step:
    op: str
    params: tuple
    inputs: tuple[Input, ...] = ()  # the fresh inputs it reads


@dataclass
class Program:
    seed: int
    first: Input
    steps: list[Step] = field(default_factory=list)
    float64: bool = False  # fusegrad computes in float64 (else float32); the reference always does

    def inputs(self) -> list[Input]:
        return [self.first] + [i for s in self.steps for i in s.inputs]

    def shapes(self) -> list[tuple[int, ...]] | None:
        """The value's shape after each step, or None when a step does not fit the shape it now gets."""
        shape, out = self.first.shape, []
        for step in self.steps:
            if (shape := OPS[step.op].shape(shape, step)) is None:
                return None
            out.append(shape)
        return out

    def source(self, lib: str) -> str:
        """def program(x0, x1, ...) in fusegrad's (lib="fg") or torch's (lib="torch") spelling."""
        names = [f"x{i}" for i in range(len(self.inputs()))]
        lines, value, k = [f"def program({', '.join(names)}):"], "x0", 1
        for i, step in enumerate(self.steps):
            args = names[k : k + len(step.inputs)]
            k += len(step.inputs)
            expr = OPS[step.op].render[lib](value, args, *step.params)
            lines.append(f"    v{i} = {expr}")
            value = f"v{i}"
        lines.append(f"    return {value}")
        return "\n".join(lines)

    def uses_half(self) -> bool:
        return any(s.op == "half_round_trip" for s in self.steps)


@dataclass(frozen=True)
class OpDef:
    # (rng, shape) -> a Step for this shape, or None when the op does not apply
    draw: Callable[[np.random.Generator, tuple[int, ...]], Step | None]
    # (shape, step) -> the output shape, or None when step does not fit shape
    shape: Callable[[tuple[int, ...], Step], tuple[int, ...] | None]
    render: dict[str, Callable[..., str]]


def _size(shape) -> int:
    return math.prod(shape)


def draw_dim(rng: np.random.Generator, limit: int = 1100) -> int:
    # small sizes more often: most kernels of a real program are small, and long programs stay fast
    choices = [d for d in AWKWARD if d <= limit] or [1]
    weights = np.array([1.0 / (1 + math.log2(d + 1)) ** 2 for d in choices])
    return int(rng.choice(choices, p=weights / weights.sum()))


def draw_shape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    while True:
        shape = tuple(draw_dim(rng) for _ in range(rank))
        if _size(shape) <= MAX_ELEMENTS:
            return shape


def same(f: str, t: str | None = None) -> dict[str, Callable[..., str]]:
    """Templates over {x} (the value), {a0}.. (fresh inputs) and {p0}.. (params), the same in both libraries unless
    torch's spelling t differs."""

    def fill(tmpl):
        return lambda x, args, *p: tmpl.format(
            x=x, **{f"a{i}": a for i, a in enumerate(args)}, **{f"p{i}": v for i, v in enumerate(p)}
        )

    return {"fg": fill(f), "torch": fill(t if t is not None else f)}


def _unary(f: str, t: str | None = None) -> OpDef:
    return OpDef(lambda rng, s: Step("", ()), lambda s, st: s, same(f, t))


def _broadcast_shape(rng, s):
    b = tuple(1 if rng.random() < 0.4 else d for d in s)
    return b[int(rng.integers(0, len(b))) :] if len(b) > 1 and rng.random() < 0.3 else b


def _binary(f: str, t: str | None = None) -> OpDef:
    def shape(s, st):
        b = st.inputs[0].shape
        return s if len(b) <= len(s) and all(x in (1, y) for x, y in zip(b[::-1], s[::-1])) else None

    return OpDef(lambda rng, s: Step("", (), (Input(_broadcast_shape(rng, s)),)), shape, same(f, t))


def _reshape_draw(rng, s):
    if len(s) >= 2 and rng.random() < 0.5:
        i = int(rng.integers(0, len(s) - 1))
        return Step("", (s[:i] + (s[i] * s[i + 1],) + s[i + 2 :],))
    i = int(rng.integers(0, len(s)))
    divisors = [d for d in range(2, s[i]) if s[i] % d == 0]
    if not divisors:
        return Step("", (s[:i] + (1, s[i]) + s[i + 1 :],))
    d = int(rng.choice(divisors))
    return Step("", (s[:i] + (d, s[i] // d) + s[i + 1 :],))


def _permute_draw(rng, s):
    return Step("", (tuple(int(a) for a in rng.permutation(len(s))),)) if len(s) >= 2 else None


def _pad_draw(rng, s):
    pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in s)
    padded = tuple(d + a + b for d, (a, b) in zip(s, pads))
    return Step("", (pads,)) if _size(padded) <= MAX_ELEMENTS else None


def _torch_pad(x, args, pads):
    flat = [v for pair in reversed(pads) for v in pair]
    return f"torch.nn.functional.pad({x}, {flat})"


def _shrink_draw(rng, s):
    bounds = []
    for d in s:
        lo = int(rng.integers(0, max(d // 3, 1)))
        hi = int(rng.integers(lo + 1, d + 1))
        bounds.append((lo, hi))
    return Step("", (tuple(bounds),))


def _slices(x, args, bounds):
    return f"{x}[{', '.join(f'{lo}:{hi}' for lo, hi in bounds)}]"


def _expand_draw(rng, s):
    i, n = int(rng.integers(0, len(s) + 1)), draw_dim(rng, 9)
    return Step("", (i, n)) if _size(s) * n <= MAX_ELEMENTS else None


def _cat_draw(rng, s):
    a = int(rng.integers(0, len(s)))
    other = s[:a] + (draw_dim(rng, 65),) + s[a + 1 :]
    return Step("", (a,), (Input(other),)) if _size(other) <= MAX_ELEMENTS else None


def _matmul_draw(rng, s):
    k = s[-1]
    n = draw_dim(rng)
    if _size(s) * n > MAX_MATMUL_WORK:
        return None
    if len(s) >= 3 and rng.random() < 0.3:
        b = s[-3] if rng.random() < 0.5 else 1
        return Step("", (), (Input((b, k, n)),))
    return Step("", (), (Input((k, n)),))


def _matmul_shape(s, st):
    w = st.inputs[0].shape
    if s[-1] != w[-2] or (len(w) == 3 and (len(s) < 3 or w[0] not in (1, s[-3]))):
        return None
    return s[:-1] + (w[-1],)


def _tmatmul_draw(rng, s):
    if len(s) < 2 or _size(s) * 64 > MAX_MATMUL_WORK:
        return None
    n = draw_dim(rng, 257)
    return Step("", (), (Input((s[-2], n)),)) if _size(s) * n <= MAX_MATMUL_WORK else None


def _tmatmul_shape(s, st):
    w = st.inputs[0].shape
    return s[:-2] + (s[-1], w[-1]) if len(s) >= 2 and s[-2] == w[0] else None


def _linear_draw(rng, s):
    n = draw_dim(rng, 257)
    return Step("", (), (Input((s[-1], n)), Input((n,)))) if _size(s) * n <= MAX_MATMUL_WORK else None


def _linear_shape(s, st):
    return s[:-1] + (st.inputs[0].shape[1],) if s[-1] == st.inputs[0].shape[0] else None


def _conv_draw(rng, s):
    if len(s) != 4 or s[2] < 3 or s[3] < 3:
        return None
    co, kh, kw = draw_dim(rng, 17), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    stride, pad = int(rng.integers(1, 3)), int(rng.integers(0, 2))
    if _size(s) * co * kh * kw > MAX_MATMUL_WORK:
        return None
    return Step("", (stride, pad), (Input((co, s[1], kh, kw)),))


def _conv_shape(s, st):
    co, ci, kh, kw = st.inputs[0].shape
    stride, pad = st.params
    if len(s) != 4 or s[1] != ci:
        return None
    h, w = (s[2] + 2 * pad - kh) // stride + 1, (s[3] + 2 * pad - kw) // stride + 1
    return (s[0], co, h, w) if h >= 1 and w >= 1 else None


def _iadd_draw(rng, s):
    if len(s) < 2:
        return None
    k = draw_dim(rng, 33)
    return Step("", (), (Input((s[-2], k)), Input((k, s[-1])))) if _size(s) * k <= MAX_MATMUL_WORK else None


def _iadd_shape(s, st):
    a, b = st.inputs[0].shape, st.inputs[1].shape
    return s if len(s) >= 2 and a[0] == s[-2] and b[1] == s[-1] and a[1] == b[0] else None


def _iadd_fg(x, args):
    return (
        f"(lambda t, v, g: t + v if g else t.contiguous().realize().__iadd__(v))({x}, {args[0]} @ {args[1]}, "
        f"{args[0]}.requires_grad)"
    )


def _gather_draw(rng, s):
    a = int(rng.integers(0, len(s)))
    idx = s[:a] + (draw_dim(rng, 33),) + s[a + 1 :]
    return Step("", (a,), (Input(idx, high=s[a]),)) if _size(idx) <= MAX_ELEMENTS else None


def _gather_shape(s, st):
    a, idx = st.params[0], st.inputs[0]
    ok = a < len(s) and len(idx.shape) == len(s) and idx.high == s[a]
    return idx.shape if ok and all(i == d for j, (i, d) in enumerate(zip(idx.shape, s)) if j != a) else None


def _reduce_shape(s, st):
    a, keep = st.params
    if a >= len(s):
        return None
    out = s[:a] + (1,) + s[a + 1 :] if keep else s[:a] + s[a + 1 :]
    return out or ()


def _axis_draw(rng, s):
    return Step("", (int(rng.integers(0, len(s))), bool(rng.random() < 0.5)))


def _same_axis_draw(rng, s):
    return Step("", (int(rng.integers(0, len(s))),))


def _same_axis_shape(s, st):
    return s if st.params[0] < len(s) else None


OPS: dict[str, OpDef] = {
    "exp": _unary("{x}.clip(-8, 8).exp()"),
    "log": _unary("({x}.abs() + 0.5).log()"),
    "relu": _unary("{x}.relu()"),
    "sigmoid": _unary("{x}.sigmoid()"),
    "tanh": _unary("{x}.tanh()"),
    "neg": _unary("(-{x})"),
    "sqrt": _unary("({x}.abs() + 0.25).sqrt()"),
    "square": _unary("({x} * {x})"),
    "reciprocal": _unary("(1 / ({x}.abs() + 1))"),
    "gelu": _unary("{x}.gelu()", 'torch.nn.functional.gelu({x}, approximate="tanh")'),
    "half_round_trip": _unary("{x}.cast(dtypes.float16).cast(dtypes.float32)", "{x}.half().double()"),
    "add": _binary("({x} + {a0})"),
    "sub": _binary("({x} - {a0})"),
    "mul": _binary("({x} * {a0})"),
    "div": _binary("({x} / ({a0}.abs() + 1))"),
    "maximum": _binary("{x}.maximum({a0})", "torch.maximum({x}, {a0})"),
    "where": _binary("({a0} > 0).where({x}, 0.5)", "torch.where({a0} > 0, {x}, 0.5)"),
    "reshape": OpDef(
        _reshape_draw,
        lambda s, st: st.params[0] if _size(st.params[0]) == _size(s) else None,
        same("{x}.reshape({p0})"),
    ),
    "permute": OpDef(
        _permute_draw,
        lambda s, st: tuple(s[a] for a in st.params[0]) if len(st.params[0]) == len(s) else None,
        same("{x}.permute({p0})"),
    ),
    "pad": OpDef(
        _pad_draw,
        lambda s, st: tuple(d + a + b for d, (a, b) in zip(s, st.params[0])) if len(st.params[0]) == len(s) else None,
        {"fg": lambda x, args, pads: f"{x}.pad({pads})", "torch": _torch_pad},
    ),
    "shrink": OpDef(
        _shrink_draw,
        lambda s, st: (
            tuple(hi - lo for lo, hi in st.params[0])
            if len(st.params[0]) == len(s) and all(hi <= d for (_, hi), d in zip(st.params[0], s))
            else None
        ),
        {"fg": _slices, "torch": _slices},
    ),
    "flip": OpDef(
        lambda rng, s: Step("", (tuple(sorted({int(a) for a in rng.integers(0, len(s), 2)})),)),
        lambda s, st: s if all(a < len(s) for a in st.params[0]) else None,
        same("{x}.flip({p0})"),
    ),
    "expand": OpDef(
        _expand_draw,
        lambda s, st: s[: st.params[0]] + (st.params[1],) + s[st.params[0] :] if st.params[0] <= len(s) else None,
        {
            "fg": lambda x, args, i, n: f"{x}.unsqueeze({i}).expand({x}.shape[:{i}] + ({n},) + {x}.shape[{i}:])",
            "torch": lambda x, args, i, n: f"{x}.unsqueeze({i}).expand(*{x}.shape[:{i}], {n}, *{x}.shape[{i}:])",
        },
    ),
    "cat": OpDef(
        _cat_draw,
        lambda s, st: (
            s[: st.params[0]] + (s[st.params[0]] + st.inputs[0].shape[st.params[0]],) + s[st.params[0] + 1 :]
            if len(st.inputs[0].shape) == len(s)
            and all(a == b for j, (a, b) in enumerate(zip(s, st.inputs[0].shape)) if j != st.params[0])
            else None
        ),
        same("{x}.cat({a0}, dim={p0})", "torch.cat([{x}, {a0}], dim={p0})"),
    ),
    "stack": OpDef(
        lambda rng, s: (
            Step("", (int(rng.integers(0, len(s) + 1)),), (Input(s),)) if _size(s) * 2 <= MAX_ELEMENTS else None
        ),
        lambda s, st: s[: st.params[0]] + (2,) + s[st.params[0] :] if st.inputs[0].shape == s else None,
        same("{x}.stack({a0}, dim={p0})", "torch.stack([{x}, {a0}], dim={p0})"),
    ),
    "sum": OpDef(
        _axis_draw, _reduce_shape, same("{x}.sum(axis={p0}, keepdim={p1})", "{x}.sum(dim={p0}, keepdim={p1})")
    ),
    "max": OpDef(
        _axis_draw, _reduce_shape, same("{x}.max(axis={p0}, keepdim={p1})", "{x}.amax(dim={p0}, keepdim={p1})")
    ),
    # a reduce over two axes: several loops around one accumulator (a NaN found by an earlier row's loop must stay)
    "max2": OpDef(
        lambda rng, s: Step("", (bool(rng.random() < 0.5),)) if len(s) >= 2 else None,
        lambda s, st: s[:-2] + ((1, 1) if st.params[0] else ()) if len(s) >= 2 else None,
        same("{x}.max(axis=(-2, -1), keepdim={p0})", "{x}.amax(dim=(-2, -1), keepdim={p0})"),
    ),
    "mean": OpDef(
        _axis_draw, _reduce_shape, same("{x}.mean(axis={p0}, keepdim={p1})", "{x}.mean(dim={p0}, keepdim={p1})")
    ),
    "softmax": OpDef(_same_axis_draw, _same_axis_shape, same("{x}.softmax({p0})")),
    "log_softmax": OpDef(_same_axis_draw, _same_axis_shape, same("{x}.log_softmax({p0})")),
    "cumsum": OpDef(_same_axis_draw, _same_axis_shape, same("{x}.cumsum({p0})")),
    "matmul": OpDef(_matmul_draw, _matmul_shape, same("({x} @ {a0})")),
    "t_matmul": OpDef(_tmatmul_draw, _tmatmul_shape, same("({x}.transpose(-1, -2) @ {a0})")),
    "linear": OpDef(_linear_draw, _linear_shape, same("{x}.linear({a0}, {a1})", "({x} @ {a0} + {a1})")),
    "conv2d": OpDef(
        _conv_draw,
        _conv_shape,
        same(
            "{x}.conv2d({a0}, stride={p0}, padding={p1})",
            "torch.nn.functional.conv2d({x}, {a0}, stride={p0}, padding={p1})",
        ),
    ),
    "gather": OpDef(_gather_draw, _gather_shape, same("{x}.gather({p0}, {a0})")),
    # an in-place add of a matmul of fresh inputs into the value, stored (`t += a @ b`: the kernel reads the storage it
    # writes) when the program runs without gradients, a plain add with them (an assign is not differentiated)
    "iadd_matmul": OpDef(
        _iadd_draw, _iadd_shape, {"fg": _iadd_fg, "torch": lambda x, args: f"({x} + {args[0]} @ {args[1]})"}
    ),
    # one value on both sides of a product (a Gram matrix): both operands are lanes of the same packs
    "gram": OpDef(
        lambda rng, s: Step("", ()) if len(s) >= 2 and _size(s) * s[-2] <= MAX_MATMUL_WORK else None,
        lambda s, st: s[:-1] + (s[-2],) if len(s) >= 2 else None,
        same("({x} @ {x}.transpose(-1, -2))"),
    ),
}
# how often each op is drawn: elementwise and matmul-like ops most, since the opts act on them
WEIGHTS = {
    "matmul": 4,
    "t_matmul": 3,
    "linear": 2,
    "conv2d": 2,
    "sum": 2,
    "mul": 2,
    "add": 2,
    "exp": 2,
    "iadd_matmul": 2,
}


def draw_program(seed: int, max_steps: int = 5) -> Program:
    rng = np.random.default_rng(seed)
    rank = int(rng.choice([1, 2, 2, 3, 4]))
    program = Program(seed, Input(draw_shape(rng, rank)), float64=bool(rng.random() < 0.2))
    names = list(OPS)
    p = np.array([WEIGHTS.get(n, 1) for n in names], dtype=float)
    shape = program.first.shape
    for _ in range(int(rng.integers(1, max_steps + 1))):
        for _attempt in range(10):
            name = str(rng.choice(names, p=p / p.sum()))
            step = OPS[name].draw(rng, shape) if shape else None
            if step is None:
                continue
            step = Step(name, step.params, step.inputs)
            if (out := OPS[name].shape(shape, step)) is not None and 0 < _size(out) <= MAX_ELEMENTS and out:
                program.steps.append(step)
                shape = out
                break
    return program
