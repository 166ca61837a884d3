"""Runs torch's OpInfo sample inputs on `fuse` against torch's CPU results (values, and gradients through autograd)."""

from __future__ import annotations

import dataclasses
import pathlib

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo
from torch.utils._pytree import tree_flatten, tree_map

import fusegrad.torch_backend  # noqa: F401  (registers the device)

EXCLUSIONS = pathlib.Path(__file__).with_name("opinfo_exclusions.txt")


def excluded() -> dict[str, str]:
    """op name -> why it is left out, from the one exclusion list."""
    out = {}
    for line in EXCLUSIONS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(":")
            out[name.strip()] = reason.strip()
    return out


def opinfos() -> list:
    skip = excluded()
    seen, ops = set(), []
    for op in (o for o in op_db if isinstance(o, (UnaryUfuncInfo, BinaryUfuncInfo, ReductionOpInfo))):
        key = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
        if key in seen or key in skip or op.name in skip or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        seen.add(key)
        ops.append((key, op))
    return ops


@dataclasses.dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    failures: list = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return self.passed + self.failed

    def add(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(what)


def _to_fuse(x):
    return x.detach().to("fuse").requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


def _to_cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) and x.device.type == "fuse" else x


def _close(actual, expected) -> bool:
    a, e = tree_flatten(actual)[0], tree_flatten(expected)[0]
    if len(a) != len(e):
        return False
    try:
        for x, y in zip(a, e):
            if isinstance(y, torch.Tensor):
                torch.testing.assert_close(x, y, equal_nan=True, check_device=False)
            elif x != y and not (x != x and y != y):
                return False
    except (AssertionError, TypeError, ValueError, RuntimeError):
        return False
    return True


def _call(op, sample, convert):
    args = tree_map(convert, (sample.input, *sample.args))
    return op(*args, **tree_map(convert, sample.kwargs)), args


def check_values(op, sample) -> bool | None:
    """None when torch's CPU itself rejects the sample (it has no reference value)."""
    try:
        expected, _ = _call(op, sample, lambda x: x)
    except Exception:
        return None
    try:
        actual, _ = _call(op, sample, _to_fuse)
        return _close(tree_map(_to_cpu, actual), expected)
    except (NotImplementedError, RuntimeError, TypeError, ValueError, AssertionError, IndexError):
        return False


def _grads(op, sample, convert) -> list:
    out, args = _call(op, sample, convert)
    leaves = [x for x in tree_flatten(args)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
    outs = [
        o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
    ]
    if not outs or not leaves:
        return []
    total = sum(o.sum() for o in outs)
    return [tree_map(_to_cpu, g) for g in torch.autograd.grad(total, leaves, allow_unused=True)]


def check_grads(op, sample) -> bool | None:
    """None when the sample has nothing to differentiate."""
    try:
        expected = _grads(op, sample, lambda x: x)
    except Exception:
        return None
    if not expected:
        return None
    try:
        return _close(_grads(op, sample, _to_fuse), expected)
    except (NotImplementedError, RuntimeError, TypeError, ValueError, AssertionError, IndexError):
        return False


def run(ops, grads: bool, max_samples: int | None = None) -> tuple[Tally, Tally]:
    values, gradients = Tally(), Tally()
    for key, op in ops:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=grads and op.supports_autograd))
        for i, sample in enumerate(samples[:max_samples]):
            ok = check_values(op, sample)
            if ok is not None:
                values.add(ok, f"{key}[{i}]")
            if grads and op.supports_autograd:
                ok = check_grads(op, sample)
                if ok is not None:
                    gradients.add(ok, f"{key}[{i}]")
    return values, gradients
