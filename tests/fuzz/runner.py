"""Runs a fuzz program on fusegrad (a device, an opt mode) and on torch in float64, compares outputs and gradients, and
shrinks a failing program to the fewest steps that still fail."""

from __future__ import annotations
import contextlib
import traceback
from dataclasses import dataclass

import numpy as np
import torch

from fuzz.programs import Program

MODES = ("default", "noopt", "random")
TOLERANCE = 3e-4  # relative to the larger of 1 and the reference's largest magnitude
HALF_TOLERANCE = 5e-3  # a float16 round trip may round a float32 value one half-ulp away from the float64 one


@dataclass
class Failure:
    program: Program
    device: str
    mode: str
    grad: bool
    message: str


def make_inputs(program: Program, grad: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(program.seed + 1)
    arrays = [
        rng.integers(0, i.high, i.shape).astype(np.int32) if i.high else rng.standard_normal(i.shape).astype(np.float32)
        for i in program.inputs()
    ]
    for a, (where, values) in zip(arrays, special_values(program, arrays, grad)):
        a.reshape(-1)[where] = values
    return arrays


SPECIALS = (np.nan, np.inf, -np.inf)


def special_values(program: Program, arrays: list[np.ndarray], grad: bool) -> list[tuple[list[int], list[float]]]:
    """Per input, the flat positions that get NaN, +inf and -inf: in a quarter of the seeds, when the program runs
    without backward (a NaN's gradient conventions differ between libraries), one of each in every float input."""
    if grad or program.seed % 4 != 1:
        return [([], [])] * len(arrays)
    rng = np.random.default_rng(program.seed + 3)
    out = []
    for a in arrays:
        n = min(len(SPECIALS), a.size) if a.dtype.kind == "f" else 0
        out.append(([int(i) for i in rng.choice(a.size, n, replace=False)] if n else [], list(SPECIALS[:n])))
    return out


def output_gradient(program: Program, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(program.seed + 2).standard_normal(shape).astype(np.float32)


def _compile(program: Program, lib: str, namespace: dict):
    exec(program.source(lib), namespace)
    return namespace["program"]


def run_reference(program: Program, arrays: list[np.ndarray], grad: bool):
    xs = [
        torch.tensor(a, dtype=torch.float64, requires_grad=grad) if a.dtype.kind == "f" else torch.tensor(a).long()
        for a in arrays
    ]
    out = _compile(program, "torch", {"torch": torch})(*xs)
    grads = []
    if grad:
        (out * torch.tensor(output_gradient(program, tuple(out.shape)), dtype=torch.float64)).sum().backward()
        grads = [x.grad.numpy() if x.grad is not None else np.zeros(x.shape) for x in xs if x.dtype.is_floating_point]
    return out.detach().numpy(), grads


def run_fusegrad(program: Program, arrays: list[np.ndarray], device: str, grad: bool):
    from fusegrad import Tensor, dtypes

    arrays = [a.astype(np.float64) if program.float64 and a.dtype.kind == "f" else a for a in arrays]
    xs = [Tensor(a, device=device, requires_grad=grad if a.dtype.kind == "f" else None) for a in arrays]
    out = _compile(program, "fg", {"dtypes": dtypes})(*xs)
    grads = []
    if grad:
        (out * Tensor(output_gradient(program, out.shape), device=device)).sum().backward()
        grads = [x.grad.numpy() if x.grad is not None else np.zeros(x.shape) for x in xs if dtypes.is_float(x.dtype)]
    return out.numpy(), grads


@contextlib.contextmanager
def opt_mode(mode: str, seed: int):
    """default: the heuristics' opts; noopt: NOOPT=1; random: a random list of opts the checker accepts, per kernel."""
    from fusegrad import Context

    if mode == "default":
        yield
    elif mode == "noopt":
        with Context(NOOPT=1):
            yield
    elif mode == "random":
        import fusegrad.codegen as codegen
        import fusegrad.engine.realize as realize
        from fusegrad.schedule.cache import clear_schedule_cache

        original, rng = codegen.lower_to_linear, np.random.default_rng(seed)

        def lower(ast, renderer, opts=None):  # renderer: the device's, what its target can do
            def check(a, opts):
                return original(a, renderer, opts=opts)

            chosen = random_opts(ast, rng, check, renderer.capabilities) if opts is None else opts
            return original(ast, renderer, opts=chosen)

        codegen.lower_to_linear = lower  # realize imports it from codegen with each kernel it compiles
        realize._runners.clear()  # kernels built with the heuristics' opts are not reused, nor these later
        clear_schedule_cache()
        try:
            yield
        finally:
            codegen.lower_to_linear = original
            realize._runners.clear()
            clear_schedule_cache()
    else:
        raise ValueError(f"unknown mode {mode!r}: expected one of {MODES}")


@contextlib.contextmanager
def half_support(program: Program, device: str):
    """A device without float16 (PoCL) runs a program's float16 round trip through EMULATED_DTYPES."""
    from fusegrad import Context, dtypes
    from fusegrad.runtime.device import Device

    unsupported = getattr(Device[device].renderer, "unsupported_dtypes", lambda: ())()
    if program.uses_half() and dtypes.float16 in unsupported:
        with Context(EMULATED_DTYPES="half"):
            yield
    else:
        yield


def random_opts(ast, rng: np.random.Generator, lower, caps) -> tuple:
    """Up to 4 opts drawn from BEAM's actions, each kept only when the checker accepts the list so far."""
    from fusegrad.codegen.opt import OptError
    from fusegrad.codegen.opt.beam import actions, fits_registers

    opts, moves = (), actions(ast, caps)
    for _ in range(int(rng.integers(1, 5))):
        for k in rng.permutation(len(moves))[:8]:
            trial = opts + (moves[int(k)],)
            if not fits_registers(ast, trial, caps):
                continue
            try:
                lower(ast, opts=trial)
            except OptError:
                continue
            opts = trial
            break
    return opts


def compare(program: Program, got, want) -> str | None:
    tol = HALF_TOLERANCE if program.uses_half() else TOLERANCE
    (out, grads), (ref, ref_grads) = got, want
    for name, a, b in [("output", out, ref)] + [
        (f"gradient of x{i}", g, r) for i, (g, r) in enumerate(zip(grads, ref_grads))
    ]:
        if a.shape != b.shape:
            return f"{name}: shape {a.shape} != torch's {b.shape}"
        scale = max(1.0, float(np.max(np.abs(b[np.isfinite(b)]), initial=0.0)))
        with np.errstate(invalid="ignore"):  # inf - inf where both are infinite
            err = np.abs(a.astype(np.float64) - b)
        # NaN where torch has NaN, and an infinity of torch's sign, are right
        bad = ~((err <= tol * scale + tol * np.abs(b)) | (np.isnan(a) & np.isnan(b)) | (a == b))
        if bad.any():
            i = np.unravel_index(int(np.argmax(np.where(np.isnan(err), np.inf, err))), a.shape)
            return f"{name}: {int(bad.sum())} of {a.size} elements differ, at {i}: {a[i]!r} vs torch {b[i]!r}"
    return None


def check(program: Program, device: str, mode: str, grad: bool) -> Failure | None:
    arrays = make_inputs(program, grad)
    try:
        want = run_reference(program, arrays, grad)
    except RuntimeError:
        return None  # not a valid program for torch either (e.g. no gradient reaches an input)
    try:
        with opt_mode(mode, program.seed), half_support(program, device):
            got = run_fusegrad(program, arrays, device, grad)
    except Exception as e:  # a compile error or a crash in the compiler is a failure too
        return Failure(program, device, mode, grad, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
    message = compare(program, got, want)
    return Failure(program, device, mode, grad, message) if message else None


def shrink(failure: Failure) -> Failure:
    """The shortest program found (prefixes, then single steps removed) that still fails the same way."""
    best = failure
    while True:
        steps = best.program.steps
        candidates = [steps[:k] for k in range(1, len(steps))] + [steps[:i] + steps[i + 1 :] for i in range(len(steps))]
        for candidate in candidates:
            program = Program(best.program.seed, best.program.first, list(candidate), best.program.float64)
            if not candidate or program.shapes() is None:
                continue
            if (f := check(program, best.device, best.mode, best.grad)) is not None:
                best = f
                break
        else:
            return best


def as_test(failure: Failure) -> str:
    """A standalone pytest function that reproduces the failure, and the entry of tests/fuzz/test_fuzz.py's FOUND that
    replays it as the fuzzer ran it (the only replay of random opts, which the standalone test does not apply)."""
    p = failure.program
    arrays = make_inputs(p, failure.grad)
    shapes = [(a.shape, a.dtype.kind == "f", i.high) for a, i in zip(arrays, p.inputs())]
    mode = {"default": "", "noopt": "  # under NOOPT=1", "random": "  # under the fuzzer's random opts"}[failure.mode]
    lines = [
        f"def test_fuzz_seed_{p.seed}_{failure.device.lower()}():{mode}",
        f"    # {failure.message.splitlines()[0]}",
        f"    rng = np.random.default_rng({p.seed + 1})",
        "    xs = [",
        *[
            f"        rng.standard_normal({s}).astype(np.float32){'.astype(np.float64)' if p.float64 else ''},"
            if f
            else f"        rng.integers(0, {h}, {s}).astype(np.int32),"
            for s, f, h in shapes
        ],
        "    ]",
        *[
            f"    xs[{i}].reshape(-1)[{where}] = {[float(v) for v in values]}"
            for i, (where, values) in enumerate(special_values(p, arrays, failure.grad))
            if where
        ],
        *["    " + line.replace("def program", "def fg_program") for line in p.source("fg").splitlines()],
        *["    " + line.replace("def program", "def torch_program") for line in p.source("torch").splitlines()],
        f"    fts = [Tensor(x, device={failure.device!r}, requires_grad={failure.grad} if x.dtype.kind == 'f'"
        " else None) for x in xs]",
        f"    tts = [torch.tensor(x, dtype=torch.float64, requires_grad={failure.grad}) if x.dtype.kind == 'f'"
        " else torch.tensor(x).long() for x in xs]",
        "    out, ref = fg_program(*fts), torch_program(*tts)",
        f"    tol = {HALF_TOLERANCE if p.uses_half() else TOLERANCE}",
        "    scale = max(1.0, float(ref.detach().abs().nan_to_num(0, 0, 0).max()))",
        "    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=tol * scale, rtol=tol)",
    ]
    if failure.grad:
        lines += [
            f"    g = np.random.default_rng({p.seed + 2}).standard_normal(tuple(ref.shape)).astype(np.float32)",
            f"    (out * Tensor(g, device={failure.device!r})).sum().backward()",
            "    (ref * torch.tensor(g, dtype=torch.float64)).sum().backward()",
            "    for ft, tt in zip(fts, tts):",
            "        if tt.dtype.is_floating_point:",
            "            scale = max(1.0, float(tt.grad.abs().max()))",
            "            np.testing.assert_allclose(ft.grad.numpy(), tt.grad.numpy(), atol=tol * scale, rtol=tol)",
        ]
    lines.append(f"# FOUND entry: ({p!r}, {failure.device!r}, {failure.mode!r}, {failure.grad})")
    return "\n".join(lines)
