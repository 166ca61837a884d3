"""The one IR: UOp nodes, rewrite rules and symbolic integers. Importing the package installs the symbolic helpers
that UOp's methods use (uop/ops.py's SymbolicHooks)."""

from fusegrad.uop import sint, symbolic  # noqa: F401
