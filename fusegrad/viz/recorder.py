"""VIZ's recorder: every graph_rewrite that changed something (its stage, each rule that fired, where the rule is
defined), grouped by realize and kernel, and each kernel's opts, source, assembly (CPU, LLVM) and linear UOps.

Nodes go into one table shared by every rewrite (UOps are hash-consed, so a node is stored once), each as
[op, dtype, source ids, arg, shape]. A rewrite keeps its input, its result and its steps (matched node, replacement,
rule); the graph after any step is rebuilt from them on demand (graphs.py), so no step stores a whole graph."""

from __future__ import annotations
import linecache
import os
import sys
import threading
from typing import Any

# longest arg text kept per node: a big constant table or source string shows its start
MAX_ARG_CHARS = 160
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Call:
    """One graph_rewrite being recorded: its matcher, wrapped to note which rule fired on which node."""

    __slots__ = ("recorder", "root", "pm", "steps", "name", "loc")

    def __init__(self, recorder: Recorder, root: Any, pm: Any, name: str, loc: str):
        self.recorder, self.root, self.pm, self.name, self.loc = recorder, root, pm, name, loc
        self.steps: list[tuple[Any, Any, Any]] = []

    def rewrite(self, u: Any, ctx: Any = None) -> Any:
        # the matcher's own loop (PatternMatcher.rewrite), with the rule that fired kept
        by_op = self.pm.by_op
        for pat, fn, wants_ctx in by_op.get(u.op, by_op.get(None, [])):
            for store in pat.match(u, {}):
                ret = fn(**store, ctx=ctx) if wants_ctx else fn(**store)
                if ret is not None and ret is not u:
                    self.steps.append((u, ret, fn))
                    return ret
        return None


class Recorder:
    def __init__(self):
        self.nodes: dict[Any, int] = {}
        self.table: list[list[Any]] = []
        self.rules: dict[Any, int] = {}
        self.rule_table: list[dict[str, Any]] = []
        self.rewrites: list[dict[str, Any]] = []
        self.realizes: list[dict[str, Any]] = []
        self.kernels: list[dict[str, Any]] = []
        self.loose: list[int] = []  # rewrites outside any realize (building tensors, gradients)
        self.unchanged = 0  # graph_rewrites that matched nothing (counted, not kept)
        self._realize: dict[str, Any] | None = None
        self._kernel: dict[str, Any] | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ graph_rewrite's hook (helpers.Hooks.rewrites)
    def begin(self, root: Any, pm: Any) -> Any:
        caller = sys._getframe(2)  # 0: here, 1: graph_rewrite, 2: its caller
        code = caller.f_code
        name = next((k for k, v in caller.f_globals.items() if v is pm and k.startswith("pm")), None)
        stage = f"{code.co_name}: {name}" if name else code.co_name
        return _Call(self, root, pm, stage, f"{_short(code.co_filename)}:{caller.f_lineno}").rewrite

    def end(self, rewrite: Any, result: Any) -> None:
        call: _Call = rewrite.__self__
        if not call.steps:
            self.unchanged += 1
            return
        with self._lock:
            steps = [[self._node(u), self._node(r), self._rule(fn)] for u, r, fn in call.steps]
            entry = {
                "id": len(self.rewrites),
                "name": call.name,
                "loc": call.loc,
                "root": self._node(call.root),
                "result": self._node(result),
                "steps": steps,
                "kernel": None if self._kernel is None else self._kernel["id"],
                "realize": None if self._realize is None else self._realize["id"],
            }
            self.rewrites.append(entry)
            owner = self._kernel or self._realize
            (owner["rewrites"] if owner is not None else self.loose).append(entry["id"])

    def _node(self, u: Any) -> int:
        """u's id in the table, adding it and every source not there yet (iteratively: graphs can be deep)."""
        nodes = self.nodes
        if (i := nodes.get(u)) is not None:
            return i
        stack = [u]
        while stack:
            x = stack[-1]
            if x in nodes:
                stack.pop()
                continue
            missing = [s for s in x.src if s not in nodes]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            nodes[x] = len(self.table)
            self.table.append([x.op.name, str(x.dtype), [nodes[s] for s in x.src], _arg_text(x.arg), _shape_text(x)])
        return nodes[u]

    def _rule(self, fn: Any) -> int:
        if (i := self.rules.get(fn)) is not None:
            return i
        code = getattr(fn, "__code__", None)
        if code is None:
            entry = {"loc": repr(fn), "code": ""}
        else:
            line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
            entry = {"loc": f"{_short(code.co_filename)}:{code.co_firstlineno}", "code": line}
        self.rules[fn] = len(self.rule_table)
        self.rule_table.append(entry)
        return self.rules[fn]

    # ------------------------------------------------------------------ the engine's context (through trace.Session)
    def realize_begin(self, sid: int) -> None:
        self._realize = {"id": len(self.realizes), "kernels": [], "rewrites": []}
        self.realizes.append(self._realize)

    def realize_end(self) -> None:
        self._realize = None

    def kernel_begin(self, device: str, ast: Any) -> None:
        self._kernel = {
            "id": len(self.kernels),
            "name": "?",
            "device": device,
            "realize": None if self._realize is None else self._realize["id"],
            "ast": self._node(ast),
            "rewrites": [],
            "opts": [],
            "source": "",
            "asm": "",
            "lin": [],
        }
        self.kernels.append(self._kernel)
        if self._realize is not None:
            self._realize["kernels"].append(self._kernel["id"])

    def kernel_end(self, runner: Any, dev: Any) -> None:
        kernel, self._kernel = self._kernel, None
        if kernel is None:
            return
        info = runner.info
        kernel["name"], kernel["opts"] = info.name, [str(o) for o in info.opts]
        kernel["ops"], kernel["outer_size"] = info.ops_estimate, info.outer_size
        try:
            kernel["source"] = dev.render(info)
        except Exception as e:  # a device without a text renderer still shows its UOps
            kernel["source"] = f"(no source: {type(e).__name__}: {e})"
        if (assembly := getattr(dev, "assembly", None)) is not None:  # devices that compile to host machine code
            try:
                kernel["asm"] = assembly(info)
            except Exception as e:  # the kernel ran; its listing is only extra information
                kernel["asm"] = f"(no assembly: {type(e).__name__}: {e})"
        lin = list(info.lin)
        index = {u: i for i, u in enumerate(lin)}
        kernel["lin"] = [
            [i, u.op.name, str(u.dtype), [index.get(s, -1) for s in u.src], _arg_text(u.arg)] for i, u in enumerate(lin)
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "nodes": self.table,
            "rules": self.rule_table,
            "rewrites": self.rewrites,
            "realizes": self.realizes,
            "kernels": self.kernels,
            "loose": self.loose,
            "unchanged": self.unchanged,
        }


def _short(path: str) -> str:
    """A path relative to the directory holding the package (the repository, in a checkout)."""
    path, top = os.path.abspath(path), os.path.dirname(PACKAGE_DIR)
    return os.path.relpath(path, top) if path.startswith(top + os.sep) else path


def _arg_text(arg: Any) -> str:
    if arg is None:
        return ""
    text = repr(arg)
    return text if len(text) <= MAX_ARG_CHARS else text[: MAX_ARG_CHARS - 3] + "..."


def _shape_text(u: Any) -> str:
    try:
        return str(tuple(u._shape))
    except Exception:  # kernel-level nodes have no shape; none is computed here just to show one
        return ""
