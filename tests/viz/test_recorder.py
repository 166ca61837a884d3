"""VIZ's recorder: each graph_rewrite's steps with their rules, and the graph after any step rebuilt from them."""

from __future__ import annotations
import inspect
import re
from fusegrad import Variable
from fusegrad.helpers import Hooks
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from fusegrad.viz import install, uninstall
from fusegrad.viz.graphs import NotFound, Recording
from fusegrad.viz.recorder import Recorder
from fusegrad.viz.trace import Session
import pytest

pm_identities = PatternMatcher(
    [
        (UPat.var("x") * 1, lambda x: x),
        (UPat.var("x") + 0, lambda x: x),
    ]
)
RULE_LINES = [inspect.getsourcelines(pm_identities.patterns[i][1])[1] for i in range(2)]


def record(fn) -> Recorder:
    session = Session(Recorder())
    previous = install(session)
    try:
        fn()
    finally:
        uninstall(previous)
    return session.recorder


def test_steps_rules_and_graphs():
    v = Variable("a", 0, 10)
    expr = ((v * 1 + 0) * 1) + 5
    results = []
    rec = record(lambda: results.append(graph_rewrite(expr, pm_identities)))
    assert results[0] is v + 5
    (rw,) = rec.rewrites
    assert rw["name"] == "<lambda>: pm_identities" and rw["loc"].startswith("tests/viz/test_recorder.py:")
    assert len(rw["steps"]) == 3  # bottom up: v*1, then +0, then the outer *1
    rules = [rec.rule_table[r] for _, _, r in rw["steps"]]
    assert [r["loc"] for r in rules] == [f"tests/viz/test_recorder.py:{RULE_LINES[i]}" for i in (0, 1, 0)]
    assert "lambda x: x" in rules[0]["code"]
    recording = Recording(rec.to_json())
    sizes = [len(recording.reachable(recording.root_after(0, k))) for k in range(4)]
    # v, 1, 0, 5 and four ops; v*1 gone (7); then +0 gone, and the outer *1, rebuilt on v, is the very node v*1 that
    # step 1 replaced (hash-consing), so the view shows it replaced from there on
    assert len(expr.toposort()) == 8 and sizes == [8, 7, 3, 3] and len((v + 5).toposort()) == 3
    assert recording.root_after(0, 3) == rw["result"] == rec.nodes[v + 5]
    g = recording.step_graph(0, 1)
    assert g["change"]["rule"]["loc"].endswith(str(RULE_LINES[0]))
    assert len(g["nodes"]) == sizes[1] and len(g["edges"]) == sum(len(n["src"]) for n in g["nodes"])
    assert g["removed"] and g["added"]
    assert recording.step_graph(0, 0)["change"] is None


def test_unchanged_rewrites_are_counted_not_kept():
    v = Variable("b", 0, 3)
    rec = record(lambda: graph_rewrite(v + 2, pm_identities))
    assert rec.rewrites == [] and rec.unchanged == 1


def test_off_nothing_is_seen():
    assert Hooks.rewrites is None
    rec = Recorder()  # not installed
    graph_rewrite(Variable("c", 0, 3) * 1, pm_identities)
    assert rec.rewrites == [] and rec.unchanged == 0


def test_bad_ids_raise_not_found():
    recording = Recording(record(lambda: graph_rewrite(Variable("d", 0, 3) * 1, pm_identities)).to_json())
    for call in (
        lambda: recording.step_graph(1, 0),
        lambda: recording.step_graph(0, 2),
        lambda: recording.step_graph(0, -1),
        lambda: recording.kernel(0),
        lambda: recording.rewrite("0"),
    ):
        with pytest.raises(NotFound):
            call()
    with pytest.raises(ValueError, match="not a fusegrad VIZ recording"):
        Recording({"version": 7})


def test_realizes_group_kernels_and_their_stages(recorded):
    rec = recorded.recorder
    kernels = rec.kernels
    assert len(kernels) >= 2  # the eager exp/sum kernel and the jitted matmul
    for k in kernels:
        assert k["name"] != "?" and k["name"] in k["source"] and k["lin"] and k["device"] == "CPU"
        assert re.search(rf"^{k['name']}:", k["asm"], re.M) and re.search(r"^\s+ret", k["asm"], re.M), k["asm"][:300]
        assert k["rewrites"], f"kernel {k['name']} recorded no codegen stage"
        for rid in k["rewrites"]:
            assert rec.rewrites[rid]["kernel"] == k["id"]
        assert k["id"] in rec.realizes[k["realize"]]["kernels"]
    recording = Recording(recorded.data)
    for rw in recorded.data["rewrites"]:  # every rewrite's last step rebuilds to what graph_rewrite returned
        assert recording.root_after(rw["id"], len(rw["steps"])) == rw["result"]


def test_an_llvm_kernel_records_its_host_assembly():
    import numpy as np

    from fusegrad import Tensor

    x = np.linspace(-3, 4, 37, dtype=np.float32)  # a length no other test compiles: the kernel is lowered here
    session = Session(Recorder())
    previous = install(session)
    try:
        got = (Tensor(x, device="LLVM") * 2.1875 - 0.375).numpy()  # constants no other test compiles
    finally:
        uninstall(previous)
    np.testing.assert_allclose(got, x * np.float32(2.1875) - np.float32(0.375), rtol=1e-6)
    (k,) = [k for k in session.recorder.kernels if k["device"] == "LLVM"]
    assert re.search(rf"^{k['name']}:", k["asm"], re.M) and re.search(r"^\s+ret", k["asm"], re.M), k["asm"][:300]
