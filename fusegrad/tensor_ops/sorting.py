"""Sorting, selection and miscellaneous (API.md G20)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING: pass

Scalar = int | float | bool

class SortingMixin:
  pass
