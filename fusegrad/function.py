"""`from fusegrad.function import function`, the spelling tinygrad documents; the decorator lives in the engine."""

from fusegrad.engine.function import Function, function

__all__ = ["function", "Function"]
