"""The driver layer stands alone: stdlib and its own modules only, never fusegrad's tensor layers."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from fusegrad.runtime.support import amd

PACKAGE = Path(amd.__file__).parent


OPTIONAL = {"inproc.py": {"llvmlite"}}  # the in-process compiler, imported on first use only


def test_only_stdlib_and_relative_imports():
    for path in sorted(PACKAGE.glob("*.py")):
        allowed = sys.stdlib_module_names | OPTIONAL.get(path.name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 1 or node.module.split(".")[0] in sys.stdlib_module_names, (path.name, node.module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in allowed, (path.name, alias.name)


def test_the_emulator_needs_numpy_and_nothing_of_fusegrad():
    for path in sorted((PACKAGE / "emu").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names | {"numpy"}, (path.name, name)
