"""Loading a file's tensors into a model: keys and shapes checked up front, then realized one by one under a progress
bar (the file stays memory-mapped: each tensor's bytes are read when it is realized)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fusegrad import Tensor
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


def embedding_rows(table: np.ndarray, ids: np.ndarray) -> Tensor:
    """Rows `ids` of a host-side table as a Tensor: a gather is a memcpy on the host, whereas on the device it is a
    one-hot reduce over the whole vocabulary."""
    return Tensor(np.ascontiguousarray(table[ids]))
