"""NN functional ops and losses (API.md G19)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING: pass

Scalar = int | float | bool

class NNMixin:
  pass
