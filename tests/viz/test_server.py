"""VIZ's JSON endpoints through a real HTTP client, the saved recording, and `python -m fusegrad.viz`."""

from __future__ import annotations
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import pytest
from fusegrad.viz.server import load_recording, make_server, save_recording
from tests.viz.trace_checks import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def get_json(url: str):
    code, kind, body = get(url)
    assert kind == "application/json"
    return code, json.loads(body)


def test_lists_kernels_and_stages(server_url, recorded):
    code, index = get_json(server_url + "/api/index")
    assert code == 200
    kernels = [k for r in index["realizes"] for k in r["kernels"]]
    assert [k["name"] for k in kernels] == [k["name"] for k in recorded.recorder.kernels]
    code, kernel = get_json(f"{server_url}/api/kernel/{kernels[-1]['id']}")
    assert code == 200 and kernel["name"] in kernel["source"] and kernel["lin"] and kernel["stages"]
    assert kernel["stages"][0]["steps"] > 0


def test_a_step_graph_is_the_recorded_uops(server_url, recorded):
    rw = max(recorded.data["rewrites"], key=lambda r: len(r["steps"]))
    code, meta = get_json(f"{server_url}/api/rewrite/{rw['id']}")
    assert code == 200 and len(meta["steps"]) == len(rw["steps"]) and meta["steps"][0]["rule"]["loc"]
    code, first = get_json(f"{server_url}/api/rewrite/{rw['id']}/step/0")
    root = recorded.uops[rw["root"]]
    assert code == 200 and len(first["nodes"]) == len(root.toposort())
    assert {n["op"] for n in first["nodes"]} == {u.op.name for u in root.toposort()}
    code, last = get_json(f"{server_url}/api/rewrite/{rw['id']}/step/{len(rw['steps'])}")
    assert last["root"] == rw["result"] and len(last["nodes"]) == len(recorded.uops[rw["result"]].toposort())
    code, one = get_json(f"{server_url}/api/rewrite/{rw['id']}/step/1")
    assert one["change"]["matched"] == rw["steps"][0][0] and one["change"]["replacement"] == rw["steps"][0][1]


def test_trace_endpoint_is_a_valid_trace(server_url, recorded):
    code, trace = get_json(server_url + "/api/trace")
    events = validate(trace)
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]
    assert code == 200 and len(kernels) >= 3 * recorded.launches  # the jitted step's replays


def test_peaks_endpoint_serves_the_recordings_roof(server_url, served_peaks):
    code, peaks = get_json(f"{server_url}/api/peaks")
    assert code == 200 and peaks == served_peaks


@pytest.mark.parametrize(
    "path",
    [
        "/api/kernel/999",
        "/api/kernel/x",
        "/api/rewrite/-1",
        "/api/rewrite/0/step/99999",
        "/api/nothing",
        "/static/../server.py",
        "/static/missing.js",
        "/elsewhere",
    ],
)
def test_bad_ids_answer_404_json(server_url, path):
    code, body = get_json(server_url + path)
    assert code == 404 and body["error"]


def test_page_and_assets_are_served(server_url):
    code, kind, body = get(server_url + "/")
    assert code == 200 and kind.startswith("text/html") and b"/static/app.js" in body
    for asset in ("app.js", "style.css", "vendor/d3.min.js", "vendor/dagre.min.js"):
        code, kind, body = get(f"{server_url}/static/{asset}")
        assert code == 200 and len(body) > 1000, asset
    assert b"cdn" not in get(server_url + "/")[2].lower()  # everything comes from the package


def test_saved_recording_round_trips(tmp_path, recorded):
    path = save_recording(recorded.data, recorded.trace, str(tmp_path / "r.json.gz"))
    loaded = load_recording(path)
    assert loaded.index()["realizes"] and loaded.trace == recorded.trace
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a fusegrad VIZ recording"):
        load_recording(str(bad))
    with pytest.raises(FileNotFoundError, match="no VIZ recording"):
        load_recording(str(tmp_path / "missing.json.gz"))


def test_taken_port_moves_to_the_next(recorded):
    from fusegrad.viz.graphs import Recording

    first = make_server(Recording(recorded.data), port=0)
    port = first.server_address[1]
    try:
        second = make_server(Recording(recorded.data), port=port)
        assert second.server_address[1] > port
        second.server_close()
    finally:
        first.server_close()
    with pytest.raises(ValueError, match="not a TCP port"):
        make_server(Recording(recorded.data), port=70000)


@pytest.mark.slow  # a fresh process, about 4 s; CI runs it
def test_viz2_saves_and_main_names_a_bad_file(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO, "VIZ": "2", "XDG_CACHE_HOME": str(tmp_path)}
    code = "from fusegrad import Tensor; (Tensor.ones(7, 3).sum(axis=1) + 2).realize()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    saved = [ln.split(" saved to ")[1] for ln in proc.stderr.splitlines() if "recording saved to" in ln]
    assert saved and os.path.isfile(saved[0]) and load_recording(saved[0]).data["kernels"]
    peaks = load_recording(saved[0]).data["peaks"]  # measured at exit on this machine, kept with the recording
    assert peaks["GFLOPS"] > 0.1 and peaks["GB/s"] > 0.1 and "matmul" in peaks["how"]
    env.pop("VIZ")
    proc = subprocess.run(
        [sys.executable, "-m", "fusegrad.viz", str(tmp_path / "nope.json.gz")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "no VIZ recording at" in proc.stderr


@pytest.mark.slow
def test_digits_demo_recording_stays_small(tmp_path):
    """One epoch of examples/train_digits.py under VIZ=2 and PROFILE=1: the recording stays under 50 MB."""
    import gzip

    env = {**os.environ, "PYTHONPATH": REPO, "VIZ": "2", "PROFILE": "1", "EPOCHS": "1"}
    env.update(PROFILE_PATH=str(tmp_path / "trace.json"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    script = os.path.join(REPO, "examples", "train_digits.py")
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    saved = [ln.split(" saved to ")[1] for ln in proc.stderr.splitlines() if "recording saved to" in ln]
    with gzip.open(saved[0], "rb") as f:
        size = len(f.read())
    recording = load_recording(saved[0])
    assert len(recording.data["kernels"]) > 20 and recording.data["rewrites"]
    assert size < 50e6, f"the digits recording is {size / 1e6:.1f} MB"
    validate(json.loads((tmp_path / "trace.json").read_text()))
