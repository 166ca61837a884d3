"""State dicts: the tensors of a model by attribute path, and loading them back in place."""

from __future__ import annotations

import time
import types
from typing import Any

from fusegrad.nn.placement import placed_like
from fusegrad.tensor import Tensor


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every tensor reachable through attributes, lists, tuples, dicts and namedtuples, keyed by its dotted path."""
    out: dict[str, Tensor] = {}

    def walk(x: Any, key: str, path: frozenset[int]) -> None:
        if isinstance(x, tensor_type):
            out[key.strip(".")] = x
            return
        if id(x) in path:
            return  # a reference cycle (e.g. a child that points to its parent)
        path = path | {id(x)}
        if hasattr(x, "_asdict") and isinstance(x, tuple):
            x = x._asdict()
        if isinstance(x, dict):
            items = x.items()
        elif isinstance(x, (list, tuple)):
            items = enumerate(x)
        elif hasattr(x, "__dict__") and not isinstance(x, (type, types.ModuleType, types.FunctionType)):
            items = vars(x).items()
        else:
            return
        for k, v in items:
            walk(v, f"{key}{k}.", path)

    walk(obj, prefix, frozenset())
    return out


def get_parameters(obj: Any) -> list[Tensor]:
    return list(get_state_dict(obj).values())


def load_state_dict(
    model: Any,
    state_dict: dict[str, Tensor],
    strict: bool = True,
    verbose: bool = True,
    consume: bool = False,
    realize: bool = True,
) -> list[Tensor]:
    """Copy state_dict[k] into the model's tensor k (same device and dtype as the model's). All values are built in new
    buffers first; the model's tensors are swapped to them only once every one of them loaded."""
    st = time.perf_counter()
    model_sd = get_state_dict(model)
    missing = [k for k in model_sd if k not in state_dict]
    unexpected = [k for k in state_dict if k not in model_sd]
    if strict and missing:
        raise KeyError(
            f"load_state_dict: the state dict lacks {len(missing)} of the model's keys: {missing}"
            + (f"; it has keys the model does not: {unexpected}" if unexpected else "")
        )
    if verbose and (missing or unexpected):
        print(f"load_state_dict: not loading {missing}, unused in the state dict: {unexpected}")
    pairs = [(k, v, state_dict[k]) for k, v in model_sd.items() if k in state_dict]
    for k, _, s in pairs:
        if not isinstance(s, Tensor):
            raise TypeError(f"load_state_dict: state dict value for key {k!r} is a {type(s).__name__}, not a Tensor")
    mismatched = [
        f"{k}: model {v.shape}, state dict {s.shape}"
        for k, v, s in pairs
        if v.shape != s.shape and {v.shape, s.shape} != {(), (1,)}
    ]
    if mismatched:
        raise ValueError(f"load_state_dict: shape mismatch for {len(mismatched)} key(s): {'; '.join(mismatched)}")
    new = [_loaded_like(s, v) for _, v, s in pairs]
    if realize and new:
        Tensor.realize(*new)
    for (k, v, _), x in zip(pairs, new):
        v.replace(x)
        if consume:
            del state_dict[k]
    if verbose:
        nbytes = sum(v.nbytes() for _, v, _ in pairs)
        print(
            f"load_state_dict: loaded {len(pairs)} tensors, {nbytes / 1e6:.2f} MB"
            f" in {(time.perf_counter() - st) * 1e3:.1f} ms"
        )
    return [v for _, v, _ in pairs]


def _loaded_like(s: Tensor, v: Tensor) -> Tensor:
    """s with v's shape and dtype on v's device, or split over v's devices along v's sharded axis whatever the
    placement of s (a state dict may come from a model sharded differently, or from none)."""
    x = s.reshape(v.shape).cast(v.dtype)
    moved = placed_like(x, v, match_axis=True)
    # a value already placed like the model's gets its own buffer, so the model never aliases the dict
    return moved.contiguous() if moved is x and s.dtype == v.dtype else moved
