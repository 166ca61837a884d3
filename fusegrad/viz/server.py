"""VIZ's local web server (standard library http.server): the page's assets and JSON endpoints over a Recording.

  GET /                                  the page
  GET /static/<file>                     its scripts, styles and vendored libraries
  GET /api/index                         realizes -> kernels -> stages
  GET /api/kernel/<id>                   a kernel's opts, source, linear UOps and stages
  GET /api/rewrite/<id>                  a stage: where it ran and each step's rule
  GET /api/rewrite/<id>/step/<k>         the graph after step k, with what changed
  GET /api/trace                         the Chrome trace (the timeline)
  GET /api/peaks                         the host's measured GFLOPS and GB/s (the roofline's roof)
Anything else, or an id the recording lacks, answers 404 with {"error": ...}."""

from __future__ import annotations
import gzip
import json
import mimetypes
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from fusegrad.helpers import VIZ_PORT, cache_dir
from fusegrad.viz.graphs import NotFound, Recording

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
# ports tried from VIZ_PORT up when it is taken
PORT_TRIES = 50


def _handler(recording: Recording) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()  # graph rebuilding extends the recording's node table: one request at a time does it

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # the terminal shows the URL, not every request

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path in ("/", "/index.html"):
                    return self._file("index.html")
                if path.startswith("/static/"):
                    return self._file(path[len("/static/") :])
                if path.startswith("/api/"):
                    with lock:
                        body = self._api(path[len("/api/") :].strip("/").split("/"))
                    return self._send(200, "application/json", json.dumps(body).encode())
                raise NotFound(f"no page {path!r}")
            except NotFound as e:
                self._send(404, "application/json", json.dumps({"error": e.args[0]}).encode())
            except Exception as e:  # a bug shows in the page as an error, not as a dropped connection
                self._send(500, "application/json", json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())

        def _api(self, parts: list[str]) -> Any:
            match parts:
                case ["index"]:
                    return recording.index()
                case ["trace"]:
                    return recording.trace
                case ["peaks"]:
                    return recording.data.get("peaks") or {}
                case ["kernel", kid]:
                    return recording.kernel(_int(kid))
                case ["rewrite", rid]:
                    return recording.rewrite(_int(rid))
                case ["rewrite", rid, "step", k]:
                    return recording.step_graph(_int(rid), _int(k))
            raise NotFound(f"no endpoint /api/{'/'.join(parts)}")

        def _file(self, rel: str) -> None:
            full = os.path.realpath(os.path.join(STATIC_DIR, rel))
            if not full.startswith(STATIC_DIR + os.sep) or not os.path.isfile(full):
                raise NotFound(f"no file {rel!r}")
            with open(full, "rb") as f:
                data = f.read()
            kind = mimetypes.guess_type(full)[0] or "application/octet-stream"
            text = kind.startswith(("text/", "application/javascript"))
            self._send(200, kind + ("; charset=utf-8" if text else ""), data)

        def _send(self, code: int, kind: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise NotFound(f"{text!r} is not an id") from None


def make_server(recording: Recording, port: int | None = None) -> ThreadingHTTPServer:
    """A server on 127.0.0.1 from `port` (default VIZ_PORT; 0: any free port), trying the next ones when taken."""
    first = int(VIZ_PORT.value) if port is None else port
    if not 0 <= first <= 65535:
        raise ValueError(f"VIZ_PORT={first} is not a TCP port (0..65535)")
    handler = _handler(recording)
    last_error: OSError | None = None
    for p in [0] if first == 0 else range(first, min(first + PORT_TRIES, 65536)):
        try:
            return ThreadingHTTPServer(("127.0.0.1", p), handler)
        except OSError as e:  # taken: the next one
            last_error = e
    raise OSError(f"no free port for the VIZ page in {first}..{first + PORT_TRIES - 1}: {last_error}")


def serve(recording: Recording, port: int | None = None) -> None:
    server = make_server(recording, port)
    print(f"fusegrad VIZ: http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def save_recording(data: dict[str, Any], trace: dict[str, Any], path: str) -> str:
    """The recording and its trace as one gzipped JSON file, written atomically."""
    if os.path.exists(path) and not os.path.isfile(path):  # a directory or a device (/dev/null) is never replaced
        raise ValueError(f"cannot write to {path!r}: it exists and is not a regular file")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".viz-")
    try:
        with os.fdopen(fd, "wb") as raw, gzip.open(raw, "wt") as f:
            json.dump({"recording": data, "trace": trace}, f, separators=(",", ":"))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_recording(path: str) -> Recording:
    """A recording saved by save_recording; a missing or foreign file raises naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no VIZ recording at {path!r}")
    try:
        with gzip.open(path, "rt") as f:
            saved = json.load(f)
        return Recording(saved["recording"], saved["trace"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path!r} is not a fusegrad VIZ recording: {type(e).__name__}: {e}") from None


def save_and_serve(session: Any, serve_it: bool = True) -> str:
    """At exit under VIZ: save the recording (for `python -m fusegrad.viz FILE` later) and serve it (VIZ=1; VIZ=2
    only saves)."""
    from fusegrad.viz.chrome import trace_events

    from fusegrad.viz.peaks import machine_peaks

    data = {**session.recorder.to_json(), "peaks": machine_peaks()}  # the roofline's roof, kept with the recording
    trace = {"traceEvents": trace_events(session)}
    path = os.path.join(cache_dir(), "viz", f"viz-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}.json.gz")
    save_recording(data, trace, path)
    print(f"fusegrad VIZ: recording saved to {path}", file=sys.stderr)
    if serve_it:
        serve(Recording(data, trace))
    return path
