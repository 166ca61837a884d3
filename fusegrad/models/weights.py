"""Loading a file's tensors into a model: keys and shapes checked up front, then realized one by one under a progress
bar (the file stays memory-mapped: each tensor's bytes are read when it is realized)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


from fusegrad import Device, Tensor
from fusegrad.helpers import _Progress, prod
from fusegrad.nn.state import load_state_dict


def load_into(model: Any, state: dict[str, Tensor], desc: str, strict: bool = True) -> None:
    """state's tensors into the model's tensors of the same names, with a progress bar on stderr."""
    targets = load_state_dict(model, state, strict=strict, verbose=False, realize=False)
    bar = _Progress(sum(t.nbytes() for t in targets), desc)
    for t in targets:
        t.realize()
        bar.update(t.nbytes())
    bar.close()


class PanelLinear:
    """y = x @ W + b with W (in, out) stored in panels of `panel` columns, each contiguous over in
    ([out/panel][in][panel], zero columns padding the last): a register tile then walks one panel's rows one after
    another, where rows of a plain (in, out) weight lie out * 4 bytes apart (for a few hundred rows of x each load
    misses, and strides of 4 KiB alias in L1). Packed once when the model loads (see to_panels), not on every call
    as the scheduler does for a plain large matmul (schedule/panels.py)."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        self.d_out, self.panel = d_out, panel_width()
        self.weight = Tensor.zeros(-(-d_out // self.panel), d_in, self.panel).contiguous()
        self.bias = Tensor.zeros(d_out).contiguous() if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        out = panel_matmul(x, self.weight, self.d_out)
        return out if self.bias is None else out + self.bias


def panel_width() -> int:
    """Columns per panel: two of the host CPU's vectors of float32 (the register tile's width). A stored layout, so
    it is the host's, whichever device the model later runs on."""
    from fusegrad.engine.realize import panel_columns

    return panel_columns("CPU") or 1


def to_panels(w: Tensor, panel: int | None = None) -> Tensor:
    """An (in, out) weight as (ceil(out / panel), in, panel) panels (a lazy view: realized when loaded)."""
    panel = panel or panel_width()
    k, n = w.shape
    if pad := -n % panel:
        w = w.pad(((0, 0), (0, pad)))
    return w.reshape(k, (n + pad) // panel, panel).permute(1, 0, 2)


def panel_matmul(x: Tensor, panels: Tensor, n: int) -> Tensor:
    """x @ W for W stored as panels (to_panels), the first n columns."""
    count, k, panel = panels.shape
    out = (x.reshape(*x.shape[:-1], 1, 1, k) * panels.permute(0, 2, 1)).sum(-1)
    # one row (a decode step): the sums realized as (panels, panel columns), whose columns a vector of accumulators
    # walks down each panel; merged into n columns by an epilogue, each output would read its panel column alone
    # padded panels: the sum is realized whole first (a kernel storing only n columns loses the panel tile)
    if prod(x.shape[:-1]) == 1 or count * panel != n:
        out = out.contiguous()
    return out.reshape(*x.shape[:-1], count * panel)[..., :n]


def transposed_linears(state: dict[str, Tensor], is_linear: Callable[[str], bool]) -> dict[str, Tensor]:
    """state with each 2-D linear weight (chosen by name) turned to (in, out); the transpose is realized on the
    default device when the model loads it."""
    return {k: v.to(Device.DEFAULT).T if v.ndim == 2 and is_linear(k) else v for k, v in state.items()}
