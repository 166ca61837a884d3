"""A recording as the page asks for it: lists of realizes, kernels and stages, and the graph after any step of a
rewrite, rebuilt from the rewrite's input and the replacements made up to that step."""

from __future__ import annotations
from typing import Any

# the most nodes one graph view sends (beyond it the page would not lay it out in useful time)
MAX_GRAPH_NODES = 3000


class NotFound(KeyError):
    """An id the recording does not have (the server answers 404)."""


class Recording:
    def __init__(self, data: dict[str, Any], trace: dict[str, Any] | None = None):
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ValueError("not a fusegrad VIZ recording (expected a JSON object with version 1)")
        self.data, self.trace = data, trace or {"traceEvents": []}
        self.nodes: list[list[Any]] = data["nodes"]
        self._keys: dict[tuple, int] = {}
        for i, (op, dtype, src, arg, _shape) in enumerate(self.nodes):
            self._keys.setdefault((op, dtype, tuple(src), arg), i)
        self._steps_cache: dict[int, list[int]] = {}

    def _get(self, table: str, i: Any) -> dict[str, Any]:
        items = self.data[table]
        if not isinstance(i, int) or not 0 <= i < len(items):
            raise NotFound(f"no {table[:-1]} {i!r} (the recording has {len(items)})")
        return items[i]

    # ------------------------------------------------------------------ lists
    def index(self) -> dict[str, Any]:
        def stages(ids: list[int]) -> list[dict[str, Any]]:
            rws = self.data["rewrites"]
            return [{"id": i, "name": rws[i]["name"], "steps": len(rws[i]["steps"])} for i in ids]

        kernels = self.data["kernels"]
        return {
            "realizes": [
                {
                    "id": r["id"],
                    "kernels": [
                        {"id": k, "name": kernels[k]["name"], "device": kernels[k]["device"]} for k in r["kernels"]
                    ],
                    "rewrites": stages(r["rewrites"]),
                }
                for r in self.data["realizes"]
            ],
            "loose": stages(self.data["loose"]),
            "unchanged": self.data["unchanged"],
        }

    def kernel(self, i: Any) -> dict[str, Any]:
        k = self._get("kernels", i)
        rws = self.data["rewrites"]
        stages = [{"id": r, "name": rws[r]["name"], "steps": len(rws[r]["steps"])} for r in k["rewrites"]]
        return {**k, "stages": stages}

    def rewrite(self, i: Any) -> dict[str, Any]:
        rw = self._get("rewrites", i)
        rules = self.data["rules"]
        steps = [
            {"matched": u, "replacement": r, "op": self.nodes[u][0], "rule": rules[rule]} for u, r, rule in rw["steps"]
        ]
        return {k: rw[k] for k in ("id", "name", "loc", "root", "result", "kernel", "realize")} | {"steps": steps}

    # ------------------------------------------------------------------ graphs
    def _intern(self, x: int, src: tuple[int, ...]) -> int:
        op, dtype, _src, arg, shape = self.nodes[x]
        key = (op, dtype, src, arg)
        if (i := self._keys.get(key)) is None:  # a rebuilt node no rule matched: it was never recorded itself
            i = self._keys[key] = len(self.nodes)
            self.nodes.append([op, dtype, list(src), arg, shape])
        return i

    def root_after(self, i: int, k: int) -> int:
        """The rewrite's graph after its first k steps: the input with each of those replacements made, bottom up (a
        node the steps replace as it is, before its sources: what a top-down rewrite does).
        A node replaced at step j is replaced wherever it appears from step j on, also where the walk meets it again
        later (a rebuilt node equal to one already replaced is that node): the view can run a step or two ahead."""
        rw = self.data["rewrites"][i]
        subst = {u: r for u, r, _ in rw["steps"][:k]}
        memo: dict[int, int] = {}
        stack = [rw["root"]]
        budget = 50 * (len(self.nodes) + len(subst)) + 1000  # far more than a settling rewrite takes
        while stack:
            budget -= 1
            if budget < 0:
                raise RuntimeError(f"rebuilding rewrite {i} at step {k} does not settle")
            x = stack[-1]
            if x in memo:
                stack.pop()
                continue
            # a top-down rewrite (the scheduler's kernel AST) replaces a node before its sources: that node as it is
            if (t := subst.get(x)) is not None and t != x:
                if t not in memo:
                    stack.append(t)
                    continue
                memo[x] = memo[t]
                stack.pop()
                continue
            src = self.nodes[x][2]
            missing = [s for s in src if s not in memo]
            if missing:
                stack.extend(missing)
                continue
            new_src = tuple(memo[s] for s in src)
            y = x if new_src == tuple(src) else self._intern(x, new_src)
            if (t := subst.get(y)) is not None and t != y:
                if t not in memo:
                    stack.append(t)
                    continue
                y = memo[t]
            memo[x] = y
            stack.pop()
        return memo[rw["root"]]

    def reachable(self, root: int) -> list[int]:
        seen, order, stack = {root}, [], [root]
        while stack:
            x = stack.pop()
            order.append(x)
            for s in self.nodes[x][2]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return order

    def step_graph(self, i: Any, k: Any) -> dict[str, Any]:
        """The graph after step k (0: the input) with what changed from step k-1: nodes added, removed, and the
        matched node with its replacement."""
        rw = self._get("rewrites", i)
        if not isinstance(k, int) or not 0 <= k <= len(rw["steps"]):
            raise NotFound(f"rewrite {i} has steps 0..{len(rw['steps'])}, not {k!r}")
        root = self.root_after(i, k)
        ids = self.reachable(root)
        before = set(self.reachable(self.root_after(i, k - 1))) if k else set(ids)
        now = set(ids)
        truncated = len(ids) > MAX_GRAPH_NODES
        shown = ids[:MAX_GRAPH_NODES]
        shown_set = set(shown)
        nodes = [dict(zip(("op", "dtype", "src", "arg", "shape"), self.nodes[x]), id=x) for x in shown]
        edges = [[s, x] for x in shown for s in self.nodes[x][2] if s in shown_set]
        step = None
        if k:
            u, r, rule = rw["steps"][k - 1]
            step = {"matched": u, "replacement": r, "rule": self.data["rules"][rule]}
        return {
            "rewrite": i,
            "step": k,
            "steps": len(rw["steps"]),
            "root": root,
            "nodes": nodes,
            "edges": edges,
            "added": sorted(now - before),
            "removed": sorted(before - now),
            "truncated": truncated,
            "change": step,
        }
