"""numpy, imported on first attribute use, so `import fusegrad` does not pay numpy's import (about as long as ours)."""

from __future__ import annotations

import importlib
import types
from typing import Any


class _LazyModule(types.ModuleType):
    """Stands in for a module until an attribute is read, then holds the real module's names (plain lookups after)."""

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)
        return getattr(module, attr)


np: Any = _LazyModule("numpy")
