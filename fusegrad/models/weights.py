"""Loading a file's tensors into a model: keys and shapes checked up front, then realized one by one under a progress
bar (the file stays memory-mapped: each tensor's bytes are read when it is realized)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


from fusegrad import Device, Tensor
from fusegrad.helpers import _Progress
from fusegrad.nn.state import load_state_dict


def load_into(model: Any, state: dict[str, Tensor], desc: str, strict: bool = True) -> None:
    """state's tensors into the model's tensors of the same names, with a progress bar on stderr."""
    targets = load_state_dict(model, state, strict=strict, verbose=False, realize=False)
    bar = _Progress(sum(t.nbytes() for t in targets), desc)
    for t in targets:
        t.realize()
        bar.update(t.nbytes())
    bar.close()


class InOutLinear:
    """y = x @ weight + bias with the weight stored (in, out). A file's torch-layout (out, in) weight is transposed
    once when loaded (see transposed_linears): the C backend runs x @ W on a row-major (in, out) W several times
    faster than x @ W.T."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        self.weight = Tensor.zeros(d_in, d_out).contiguous()
        self.bias = Tensor.zeros(d_out).contiguous() if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.linear(self.weight, self.bias)


def transposed_linears(state: dict[str, Tensor], is_linear: Callable[[str], bool]) -> dict[str, Tensor]:
    """state with each 2-D linear weight (chosen by name) turned to (in, out); the transpose is realized on the
    default device when the model loads it."""
    return {k: v.to(Device.DEFAULT).T if v.ndim == 2 and is_linear(k) else v for k, v in state.items()}
