"""Graphs 20,000 to 100,000 ops deep (and 10,000 wide): build, schedule, rewrite, differentiate, print, pickle and
free them.

Each case runs in a fresh interpreter at Python's default recursion limit, so any recursive walk fails with a
RecursionError and a C stack overflow (a segfault) fails the test instead of killing pytest."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPTH = 100_000
# chains that run as kernels and UOp-level rewrites: 5 times the recursion limit, so a recursive walk still fails, at a
# twentieth of the time; printing, pickling and freeing (C code that may recurse) keep DEPTH
RUN_DEPTH = 5_000


def run_isolated(body: str, env: dict[str, str] | None = None) -> tuple[object, str]:
    """Run `body` in a new interpreter; it stores its answer in `result`. Returns (result, everything it printed)."""
    script = "import json, sys\nassert sys.getrecursionlimit() == 1000, sys.getrecursionlimit()\n"
    script += textwrap.dedent(body) + "\nprint('RESULT=' + json.dumps(result))\n"
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard, not a timing assertion
    )
    tail = (proc.stdout[-2000:] + proc.stderr[-4000:]).strip()
    assert proc.returncode == 0, f"child exited with {proc.returncode} (negative: killed by that signal):\n{tail}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
    assert lines, f"child printed no result:\n{tail}"
    return json.loads(lines[-1][len("RESULT=") :]), proc.stdout


def test_child_runs_at_default_recursion_limit():
    result, _ = run_isolated("import fusegrad\nresult = sys.getrecursionlimit()")
    assert result == 1000  # importing fusegrad must not raise the limit


def test_add_chain_forward_exact():
    result, _ = run_isolated(f"""
        from fusegrad import Tensor
        from fusegrad.helpers import GlobalCounters
        from fusegrad.schedule import KERNEL_DEPTH_LIMIT
        x = Tensor([1.0, 2.0, -3.5])
        for _ in range({RUN_DEPTH}):
            x = x + 1
        value = x.numpy().tolist()
        result = {{"value": value, "kernels": GlobalCounters.kernel_count, "limit": KERNEL_DEPTH_LIMIT}}
    """)
    assert result["value"] == [RUN_DEPTH + 1.0, RUN_DEPTH + 2.0, RUN_DEPTH - 3.5]
    # the chain is cut into kernels of at most KERNEL_DEPTH_LIMIT ops (each add is one op above the previous cut)
    assert RUN_DEPTH // result["limit"] <= result["kernels"] <= RUN_DEPTH // result["limit"] + 2


def test_int_add_chain_forward_exact():
    result, _ = run_isolated(f"""
        from fusegrad import Tensor, dtypes
        x = Tensor([1, -2], dtype=dtypes.int32)
        for _ in range({RUN_DEPTH}):
            x = x + 3
        result = x.numpy().tolist()
    """)
    assert result == [1 + 3 * RUN_DEPTH, -2 + 3 * RUN_DEPTH]


def mixed_reference(start: list[float], depth: int) -> np.ndarray:
    ref = np.array(start, dtype=np.float32)
    for i in range(depth):
        k = i % 5
        if k == 0:
            ref = ref * np.float32(0.5)
        elif k == 1:
            ref = ref + np.float32(1.0)
        elif k == 2:
            ref = np.maximum(-ref, ref)
        elif k == 3:
            ref = ref - np.float32(0.25)
        else:
            ref = ref / np.float32(2.0)
    return ref


def test_mixed_ops_chain_matches_numpy():
    result, _ = run_isolated(f"""
        from fusegrad import Tensor
        x = Tensor([0.5, 1.5, -7.0])
        for i in range({RUN_DEPTH}):
            k = i % 5
            if k == 0:
                x = x * 0.5
            elif k == 1:
                x = x + 1
            elif k == 2:
                x = (-x).maximum(x)
            elif k == 3:
                x = x - 0.25
            else:
                x = x / 2
        result = x.numpy().tolist()
    """)
    np.testing.assert_array_equal(np.array(result, dtype=np.float32), mixed_reference([0.5, 1.5, -7.0], RUN_DEPTH))


def test_chain_backward_matches_closed_form():
    # x_{k+1} = x_k * c + 0.5 over RUN_DEPTH ops: d sum(x_N) / d x_0 = c ** (RUN_DEPTH / 2); c is exact in float32
    result, _ = run_isolated(f"""
        from fusegrad import Tensor
        c = 1.0 + 2.0 ** -17
        x0 = Tensor([1.0, -2.0], requires_grad=True)
        x = x0
        for _ in range({RUN_DEPTH // 2}):
            x = x * c + 0.5
        x.sum().backward()
        result = {{"grad": x0.grad.numpy().tolist(), "value": x.numpy().tolist()}}
    """)
    c, steps = 1.0 + 2.0**-17, RUN_DEPTH // 2
    np.testing.assert_allclose(result["grad"], [c**steps] * 2, rtol=1e-4)
    # the same recurrence in float32 rounds like the kernels do
    grad = np.float32(1.0)
    for _ in range(steps):
        grad = grad * np.float32(c)
    np.testing.assert_allclose(result["grad"], [grad] * 2, rtol=1e-6)
    closed = [x0 * c**steps + 0.5 * (c**steps - 1) / (c - 1) for x0 in (1.0, -2.0)]
    np.testing.assert_allclose(result["value"], closed, rtol=1e-4)


def test_movement_chain_matches_numpy():
    result, _ = run_isolated(f"""
        import numpy as np
        from fusegrad import Tensor
        x = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
        for i in range({RUN_DEPTH}):
            x = x.permute(1, 0) if i % 3 == 0 else x.reshape(4, 6) if i % 3 == 1 else x.reshape(3, 8)
        result = {{"shape": list(x.shape), "value": x.numpy().tolist()}}
    """)
    ref = np.arange(24, dtype=np.float32).reshape(4, 6)
    for i in range(RUN_DEPTH):
        ref = ref.transpose(1, 0) if i % 3 == 0 else ref.reshape(4, 6) if i % 3 == 1 else ref.reshape(3, 8)
    assert result["shape"] == list(ref.shape)
    np.testing.assert_array_equal(np.array(result["value"], dtype=np.float32), ref)


def test_where_nesting_matches_numpy():
    levels = RUN_DEPTH // 4  # a compare, two adds and a where per level
    result, _ = run_isolated(f"""
        from fusegrad import Tensor
        x = Tensor([1.0, -2.0, 3.0, 0.25])
        for _ in range({levels}):
            x = (x > 0).where(x - 1, x + 0.5)
        result = x.numpy().tolist()
    """)
    ref = np.array([1.0, -2.0, 3.0, 0.25], dtype=np.float32)
    for _ in range(levels):
        ref = np.where(ref > 0, ref - np.float32(1), ref + np.float32(0.5))
    np.testing.assert_array_equal(np.array(result, dtype=np.float32), ref)


def test_wide_sum_of_many_tensors():
    count = 10_000
    result, _ = run_isolated(f"""
        from fusegrad import Tensor
        tensors = [Tensor([float(i % 7), float(-(i % 5))]) for i in range({count})]
        total = tensors[0]
        for t in tensors[1:]:
            total = total + t
        result = total.numpy().tolist()
    """)
    assert result == [float(sum(i % 7 for i in range(count))), -float(sum(i % 5 for i in range(count)))]


def test_print_repr_pickle_and_free_a_deep_chain():
    result, _ = run_isolated(f"""
        import gc, pickle
        from fusegrad import Tensor
        x = Tensor([1.0])
        for _ in range({DEPTH}):
            x = x + 1
        text = repr(x.uop)
        lines = text.splitlines()
        restored = pickle.loads(pickle.dumps(x.uop))
        nodes = len(x.uop.toposort())
        result = {{
            "tensor_repr": repr(x),
            "lines": len(lines),
            "widest": max(len(ln) for ln in lines),
            "defined": sum(1 for ln in lines if ":" in ln),
            "nodes": nodes,
            "same_after_pickle": restored is x.uop,
            "hash_stable": hash(restored) == hash(x.uop),
        }}
        del x, restored, text, lines
        gc.collect()
        result["freed"] = True
    """)
    assert result["tensor_repr"].startswith("<Tensor") and "shape=(1,)" in result["tensor_repr"]
    assert result["defined"] == result["nodes"]  # every node printed once, shared ones referenced
    assert result["widest"] < 200  # indentation stops growing, so the text is linear in the graph
    assert result["same_after_pickle"] and result["hash_stable"] and result["freed"]


def test_debug_output_of_a_deep_chain():
    result, out = run_isolated(
        f"""
        from fusegrad import Tensor
        x = Tensor([1.0, 2.0])
        for _ in range({RUN_DEPTH}):
            x = x + 1
        result = x.numpy().tolist()
    """,
        env={"DEBUG": "4"},
    )
    assert result == [RUN_DEPTH + 1.0, RUN_DEPTH + 2.0]
    assert "SINK" in out and "void" in out  # the kernel ASTs (DEBUG>=3) and their C source (DEBUG>=4) were printed


CHAIN_OF_ADDS = textwrap.dedent(f"""
    from fusegrad.dtype import dtypes
    from fusegrad.uop.ops import Ops, UOp
    from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
    from fusegrad.uop.symbolic import simplify
    i = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 10),), (0, "global"))
    chain = i
    for _ in range({RUN_DEPTH}):
        chain = UOp(Ops.ADD, dtypes.int32, (chain, UOp.const(dtypes.int32, 1)))
""")


def test_uop_level_rewrite_bottom_up():
    result, _ = run_isolated(CHAIN_OF_ADDS + f"result = simplify(chain) is i + {RUN_DEPTH}")
    assert result is True  # the symbolic rules fold the whole chain into one add


def test_uop_level_rewrite_top_down():
    result, _ = run_isolated(
        CHAIN_OF_ADDS
        + """
# every ADD becomes a MAX of the same sources, visiting each node before its sources
to_max = PatternMatcher([(UPat(Ops.ADD, name="a"), lambda a: UOp(Ops.MAX, a.dtype, a.src))])
top_down = graph_rewrite(chain, to_max, bottom_up=False)
result = {"ops": sorted({u.op.name for u in top_down.toposort()}), "nodes": len(top_down.toposort())}
"""
    )
    assert result["ops"] == ["CONST", "MAX", "RANGE"]
    assert result["nodes"] == RUN_DEPTH + 3  # the chain, RANGE, its bound 10 and the shared constant 1


def test_uop_level_value_range_and_gradient():
    result, _ = run_isolated(f"""
        from fusegrad.dtype import dtypes
        from fusegrad.gradient import compute_gradient
        from fusegrad.uop.ops import Ops, UOp
        i = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 10),), (0, "global"))
        chain = i
        for _ in range({RUN_DEPTH}):
            chain = UOp(Ops.ADD, dtypes.int32, (chain, UOp.const(dtypes.int32, 1)))
        bounds = [chain.vmin, chain.vmax]
        two = UOp.const(dtypes.float32, 2.0)
        x = UOp(Ops.BUFFER, dtypes.float32, (), (0, "CPU", 1))
        y = x
        for _ in range({RUN_DEPTH}):
            y = UOp(Ops.MUL, dtypes.float32, (y, two))
        grads = compute_gradient(y, UOp.const(dtypes.float32, 1.0), {{x}})
        muls_by_two = sum(1 for u in grads[x].toposort() if u.op is Ops.MUL and u.src[1] is two)
        result = {{"bounds": bounds, "muls_by_two": muls_by_two}}
    """)
    assert result["bounds"] == [RUN_DEPTH, 9 + RUN_DEPTH]
    assert result["muls_by_two"] == RUN_DEPTH  # d y / d x = 2 ** RUN_DEPTH as one multiply per op of the chain
