"""PROFILE: the Chrome trace of eager work and of a jitted step, checked against the format and the runner's times."""

from __future__ import annotations
import gc
import json
import os
import subprocess
import sys
import numpy as np
import pytest
import fusegrad
from fusegrad import GlobalCounters, Tensor, TinyJit
from fusegrad.helpers import Hooks
from fusegrad.viz.trace import Session
from tests.viz.trace_checks import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kernels_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]


def load(path) -> list[dict]:
    with open(path) as f:
        return validate(json.load(f))


def test_eager_trace_is_valid_and_matches_the_runner(tmp_path):
    a_np, b_np = np.random.rand(96, 80).astype(np.float32), np.random.rand(80, 64).astype(np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    with fusegrad.profile(tmp_path / "t.json") as session:
        before = GlobalCounters.time_sum_s
        out = ((a @ b).relu() * 3 + 1).numpy()
        measured = GlobalCounters.time_sum_s - before
    np.testing.assert_allclose(out, np.maximum(a_np @ b_np, 0) * 3 + 1, rtol=1e-5)
    assert session.path == str(tmp_path / "t.json") and Hooks.trace is None
    events = load(session.path)
    kernels = kernels_of(events)
    assert kernels and all(k["args"]["ops"] > 0 and k["args"]["bytes"] > 0 for k in kernels)
    total = sum(k["dur"] for k in kernels) * 1e-6
    assert abs(total - measured) <= 0.05 * measured, (total, measured)
    cats = {e.get("cat") for e in events}
    assert {"realize", "schedule", "kernel"} <= cats
    # each kernel has a flow arrow from the realize that launched it, ending on the kernel's device track
    ends = {(e["pid"], e["ts"]) for e in events if e["ph"] == "f"}
    assert all((k["pid"], k["ts"]) in ends for k in kernels)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"host", "CPU"} <= names


def test_jitted_step_kernels_sum_to_the_replay(tmp_path):
    """Inside a TinyJit batch each kernel is timed by the C runner; their sum fills the replay's slice to 5 %."""
    n = 256
    w = [Tensor(np.random.rand(n, n).astype(np.float32) / n).realize() for _ in range(4)]

    @TinyJit
    def step(x: Tensor) -> Tensor:
        for m in w:
            x = (x @ m).relu() + 0.5
        return x.realize()

    x_np = np.random.rand(n, n).astype(np.float32)
    x = Tensor(x_np).realize()
    for _ in range(2):
        step(x)
    with fusegrad.profile(tmp_path / "jit.json") as session:
        for _ in range(3):
            out = step(x).numpy()
    ref = x_np
    for m in w:
        ref = np.maximum(ref @ m.numpy(), 0) + 0.5
    np.testing.assert_allclose(out, ref, rtol=1e-4)
    events = load(session.path)
    replays = [e for e in events if e["ph"] == "X" and e["name"].startswith("jit replay")]
    assert len(replays) == 3
    kernels = kernels_of(events)
    assert len(kernels) == 3 * len(step.captured.launches) and all(k["args"]["batched"] for k in kernels)
    for r in replays:
        inside = [k for k in kernels if r["ts"] <= k["ts"] and k["ts"] + k["dur"] <= r["ts"] + r["dur"] + 0.01]
        assert len(inside) == len(step.captured.launches)
    # the runner's measured time: each batch's one C call, timed around it; its kernels fill it but for the call
    batches = [e for e in events if e["ph"] == "X" and e["name"] == "batch"]
    assert len(batches) == 3 * step.captured.batches
    for b in batches:
        inside = [k for k in kernels if b["ts"] <= k["ts"] and k["ts"] + k["dur"] <= b["ts"] + b["dur"] + 0.01]
        assert len(inside) == b["args"]["launches"]
        assert 0.95 * b["dur"] <= sum(k["dur"] for k in inside) <= b["dur"] + 0.01, (inside, b)


def test_a_split_kernel_in_a_batch_shows_each_threads_share(tmp_path):
    """NUM_CPU_THREADS=2: a batched kernel split over the runner's threads gets one slice per thread that ran chunks
    of it, on its own track of the device, inside the kernel's slice."""
    from fusegrad import Context

    a_np = np.random.rand(1536, 1024).astype(np.float32)
    with Context(NUM_CPU_THREADS=2):
        a = Tensor(a_np).realize()

        @TinyJit
        def step(x: Tensor) -> Tensor:
            return ((x * 1.75).exp().sum(axis=1) + (x - 0.25).max(axis=1)).realize()

        for _ in range(2):
            step(a)
        with fusegrad.profile(tmp_path / "threads.json") as session:
            out = step(a).numpy()
    np.testing.assert_allclose(out, np.exp(a_np * 1.75).sum(axis=1) + (a_np - 0.25).max(axis=1), rtol=1e-4)
    events = load(session.path)
    shares = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel thread"]
    # the caller's chunks (track 1) and worker 0's (track 2); on a busy machine one thread may take every chunk
    assert shares and {s["tid"] for s in shares} <= {1, 2}, shares
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for s in shares:
        (kernel,) = [k for k in kernels_of(events) if k["name"] == s["name"] and k["pid"] == s["pid"]]
        assert kernel["ts"] - 0.01 <= s["ts"] and s["ts"] + s["dur"] <= kernel["ts"] + kernel["dur"] + 0.01
        assert names[(s["pid"], s["tid"])] == ("caller's chunks" if s["tid"] == 1 else "worker 0's chunks")


def test_capture_compile_and_memory_are_recorded(tmp_path):
    n = 37  # a shape no other test compiles: its kernels are built inside the profile

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return (x * 2 + 1).sum(axis=0).realize()

    gc.collect()  # an earlier test's garbage freed by a collection during the check would move the counter
    with fusegrad.profile(tmp_path / "c.json") as session:
        x = Tensor(np.ones((n, 3), np.float32)).realize()
        for _ in range(3):
            step(x)
        kept = Tensor.empty(1000, 13).realize()
    in_use = GlobalCounters.mem_used_per_device["CPU"]
    events = load(session.path)
    names = [e["name"] for e in events if e["ph"] == "X"]
    assert any(s.startswith("jit capture") for s in names) and any(s.startswith("jit replay") for s in names)
    compiles = [e for e in events if e["ph"] == "X" and e["cat"] == "compile"]
    assert compiles and all(c["args"]["cache"] in ("hit", "miss") and c["args"]["seconds"] >= 0 for c in compiles)
    memory = [e for e in events if e["ph"] == "C"]
    assert memory and memory[-1]["args"]["bytes"] == in_use
    assert kept.shape == (1000, 13)


def test_copies_between_devices_carry_bytes(tmp_path):
    with fusegrad.profile(tmp_path / "copy.json") as session:
        out = Tensor(np.arange(6, dtype=np.float32)).to("PYTHON").realize().numpy()
    np.testing.assert_equal(out, np.arange(6, dtype=np.float32))
    copies = [e for e in load(session.path) if e["ph"] == "X" and e["cat"] == "copy"]
    assert copies and copies[0]["args"]["bytes"] == 24


def test_nothing_is_recorded_when_off(tmp_path):
    session = Session()  # made, never installed: the hooks do not see it
    assert Hooks.trace is None and Hooks.rewrites is None
    (Tensor.rand(8, 8) @ Tensor.rand(8, 8)).realize()
    assert session.events == []
    with fusegrad.profile(tmp_path / "inner.json") as inner:
        Tensor.rand(4).realize()
    count = len(inner.events)
    Tensor.rand(4).realize()
    assert count and len(inner.events) == count and Hooks.trace is None


def test_bad_path_raises(tmp_path):
    with pytest.raises(TypeError, match="file path"):
        with fusegrad.profile(123):  # type: ignore[arg-type]
            pass
    # a directory (or a device such as /dev/null) is refused, never replaced by the trace
    ran = []
    with pytest.raises(ValueError, match="not a regular file"):
        with fusegrad.profile(tmp_path):
            ran.append(1)
    assert tmp_path.is_dir() and ran == [] and Hooks.trace is None


def run_script(code: str, env: dict) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": REPO, **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_profile_env_writes_the_trace_at_exit(tmp_path):
    path = tmp_path / "env.json"
    code = "from fusegrad import Tensor; (Tensor.ones(5) + 2).realize()"
    proc = run_script(code, {"PROFILE": "1", "PROFILE_PATH": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert f"PROFILE trace written to {path}" in proc.stderr
    assert kernels_of(load(path))
    off = run_script(code, {"PROFILE": "0", "PROFILE_PATH": str(tmp_path / "off.json")})
    assert off.returncode == 0 and not (tmp_path / "off.json").exists() and "PROFILE" not in off.stderr
    bad = run_script(code, {"PROFILE": "1", "PROFILE_PATH": str(tmp_path)})
    assert bad.returncode != 0 and "is not a regular file" in bad.stderr and tmp_path.is_dir()
    bad = run_script(code, {"PROFILE": "3"})
    assert bad.returncode != 0 and "PROFILE takes 0 or 1" in bad.stderr


class TinyLM:
    """A CausalLM of one table: the logits of token t are row t, whose largest entry is t + 1."""

    max_context = 64

    def __init__(self):
        table = np.zeros((8, 8), np.float32)
        table[np.arange(8), (np.arange(8) + 1) % 8] = 1.0
        self.table = Tensor(table).realize()

    def forward(self, ids: np.ndarray, pos: int) -> Tensor:
        return self.table[Tensor(ids)]


def test_llm_prefill_and_each_decoded_token(tmp_path):
    from fusegrad.models.generate import Sampling, generate

    with fusegrad.profile(tmp_path / "llm.json") as session:
        tokens = list(generate(TinyLM(), [1, 2, 3], 4, Sampling(temperature=0.0)))
    assert tokens == [4, 5, 6, 7]
    llm = [e for e in load(session.path) if e.get("cat") == "llm"]
    assert [e["name"] for e in llm] == ["prefill", "decode", "decode", "decode"]
    assert llm[0]["args"]["tokens"] == 3 and [e["args"]["position"] for e in llm[1:]] == [3, 4, 5]
