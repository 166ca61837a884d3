"""A VIZ recording of a small eager program and a jitted step, made once for the recorder, server and page tests."""

from __future__ import annotations
import json
import threading
import numpy as np
import pytest
from fusegrad import Tensor, TinyJit
from fusegrad.viz import install, uninstall
from fusegrad.viz.graphs import Recording
from fusegrad.viz.recorder import Recorder
from fusegrad.viz.server import make_server
from fusegrad.viz.trace import Session
from fusegrad.viz.chrome import trace_events


class Recorded:
    def __init__(self, session: Session, outputs: list[np.ndarray], launches: int):
        self.session, self.recorder, self.outputs, self.launches = session, session.recorder, outputs, launches
        self.data = json.loads(json.dumps(session.recorder.to_json()))  # as saved: plain JSON
        self.trace = {"traceEvents": trace_events(session)}
        self.uops = {i: u for u, i in session.recorder.nodes.items()}  # the recorded UOps themselves, by id


@pytest.fixture(scope="session")
def recorded() -> Recorded:
    rng = np.random.default_rng(0)
    # shapes no other test compiles: every kernel is lowered (and so recorded) here
    a_np, w_np = rng.random((23, 19), dtype=np.float32), rng.random((19, 11), dtype=np.float32)
    a, w = Tensor(a_np), Tensor(w_np)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x @ w).relu() * 2).sum(axis=1).realize()

    session = Session(Recorder())
    previous = install(session)
    try:
        eager = ((a.exp() + 1).sum(axis=0) * 3).numpy()
        outs = [step(a).numpy() for _ in range(4)]
    finally:
        uninstall(previous)
    np.testing.assert_allclose(eager, (np.exp(a_np) + 1).sum(axis=0) * 3, rtol=1e-5)
    np.testing.assert_allclose(outs[-1], (np.maximum(a_np @ w_np, 0) * 2).sum(axis=1), rtol=1e-5)
    return Recorded(session, [eager, *outs], len(step.captured.launches))


@pytest.fixture(scope="session")
def served_peaks() -> dict:
    """A roof for the served recording, fixed so the roofline's geometry is known (what save_and_serve measures)."""
    return {"GFLOPS": 400.0, "GB/s": 20.0, "how": "fixed for the tests"}


@pytest.fixture(scope="session")
def server_url(recorded, served_peaks):
    data = {**json.loads(json.dumps(recorded.data)), "peaks": served_peaks}
    server = make_server(Recording(data, recorded.trace), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
