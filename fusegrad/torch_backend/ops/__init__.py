"""The aten ops the `fuse` device implements directly (table.py), one module per kind; importing the package
registers them all."""

from . import elementwise, factories, linalg, movement, reductions, special, training  # noqa: F401
from .table import INPLACE, OPS, OpCall

__all__ = ["INPLACE", "OPS", "OpCall"]
