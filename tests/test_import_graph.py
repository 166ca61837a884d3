"""fusegrad's own import graph, imports inside functions included (TYPE_CHECKING-only ones are not imports): it has
no cycles, codegen imports no device, and tensor_ops never imports the Tensor class."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fusegrad"


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(("fusegrad", *p.relative_to(ROOT).with_suffix("").parts))
        mods[name.removesuffix(".__init__")] = p
    return mods


def _imports(name: str, path: pathlib.Path, mods: dict[str, pathlib.Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for stmt in node.body
        for n in ast.walk(stmt)
    }

    def module_of(name: str) -> str:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.startswith("fusegrad"):
                out |= {module_of(f"{base}.{a.name}") for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {module_of(a.name) for a in node.names if a.name.startswith("fusegrad")}
    return out


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one module, iteratively (the graph is deeper than it is wide)."""
    index, low, stack, on_stack, comps, counter = {}, {}, [], set(), [], 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    return comps


def test_the_import_graph_has_no_cycles():
    mods = _modules()
    graph = {name: _imports(name, path, mods) - {name} for name, path in mods.items()}
    assert [sorted(c) for c in strongly_connected(graph)] == []


def test_tensor_ops_never_imports_the_tensor_class():
    # the mixins build tensors of their own class (type(self), cls, a tensor argument): tensor.py imports them, never
    # the other way round, even inside a function
    mods = _modules()
    importers = sorted(
        n for n, p in mods.items() if n.startswith("fusegrad.tensor_ops") and "fusegrad.tensor" in _imports(n, p, mods)
    )
    assert importers == []


def test_the_cycle_finder_finds_a_cycle():
    comps = strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert comps == [{"a", "b", "c"}]


def test_test_module_basenames_are_unique():
    # the test folders are not packages, so pytest imports every test file under its bare name: two alike collide
    tests = pathlib.Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for p in tests.rglob("test_*.py"):
        if not (p.parent / "__init__.py").exists():
            seen.setdefault(p.name, []).append(str(p.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_codegen_imports_no_runtime_module():
    # codegen receives the device's renderer (what the target can do) and, for BEAM, a SearchTarget from the engine
    mods = _modules()
    codegen = [name for name in mods if name == "fusegrad.codegen" or name.startswith("fusegrad.codegen.")]
    assert len(codegen) > 10, codegen
    imports = {
        name: sorted(m for m in _imports(name, mods[name], mods) if m.startswith("fusegrad.runtime"))
        for name in codegen
    }
    assert {name: below for name, below in imports.items() if below} == {}
