"""Chrome's Trace Event Format from a Session's raw events: `X` slices per host thread and per device (and per runner
thread of a device's split kernels), `C` counters of live memory, `M` names for processes and threads, and `s`/`f`
flow arrows from a host slice to the launches in it."""

from __future__ import annotations
import json
import os
import tempfile
from typing import Any
from fusegrad.viz.trace import LAUNCH, MEMORY, SLICE, THREAD_SLICE, Session

HOST_PID = 1


def trace_events(session: Session) -> list[dict[str, Any]]:
    """The session's events as trace events, metadata first, then each track's in time order."""
    origin = session.start

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    threads: dict[int, int] = {}  # host thread ident -> tid
    devices: dict[str, int] = {}  # device name -> pid
    device_threads: dict[int, set[int]] = {}  # device pid -> the runner's participants seen in split kernels

    def tid_of(ident: int) -> int:
        return threads.setdefault(ident, len(threads) + 1)

    def pid_of(device: str) -> int:
        return devices.setdefault(device, HOST_PID + 1 + len(devices))

    body: list[dict[str, Any]] = []
    flow = 0
    for ev in list(session.events):
        kind = ev[0]
        if kind is SLICE:
            _, name, cat, t0, t1, ident, args, _sid = ev
            body.append(_x(name, cat, us(t0), us(t1), HOST_PID, tid_of(ident), args))
        elif kind is LAUNCH:
            _, name, device, t0, t1, ident, args, parent = ev
            pid, ts = pid_of(device), us(t0)
            cat = "copy" if name.startswith("copy ") else "kernel"
            secs = max(t1 - t0, 1e-9)
            rates = {"GB/s": round(args.get("bytes", 0) / secs / 1e9, 3)}
            if "ops" in args:
                rates["GFLOPS"] = round(args["ops"] / secs / 1e9, 3)
            body.append(_x(name, cat, ts, us(t1), pid, 0, {**args, **rates}))
            if parent:
                flow += 1
                common = {"name": "launch", "cat": "flow", "id": flow, "ts": ts}
                body.append({**common, "ph": "s", "pid": HOST_PID, "tid": tid_of(ident)})
                body.append({**common, "ph": "f", "bp": "e", "pid": pid, "tid": 0})
        elif kind is THREAD_SLICE:
            _, name, device, t0, t1, participant = ev
            pid = pid_of(device)
            device_threads.setdefault(pid, set()).add(participant)
            body.append(_x(name, "kernel thread", us(t0), us(t1), pid, 1 + participant, {"thread": participant}))
        elif kind is MEMORY:
            _, device, t, live = ev
            body.append({"name": "memory", "ph": "C", "ts": us(t), "pid": pid_of(device), "args": {"bytes": live}})
    # per track: by start, the longer (enclosing) slice first, so nested slices follow their parent
    body.sort(key=lambda e: (e["pid"], e.get("tid", -1), e["ts"], -e.get("dur", 0)))
    meta = [_meta("process_name", HOST_PID, 0, "host"), _meta("process_sort_index", HOST_PID, 0, 0)]
    meta += [_meta("thread_name", HOST_PID, tid, f"thread {tid}" if tid > 1 else "main") for tid in threads.values()]
    for device, pid in devices.items():
        meta += [_meta("process_name", pid, 0, device), _meta("thread_name", pid, 0, "launches")]
        for p in sorted(device_threads.get(pid, ())):
            meta.append(_meta("thread_name", pid, 1 + p, "caller's chunks" if p == 0 else f"worker {p - 1}'s chunks"))
    return meta + body


def _x(name: str, cat: str, ts: float, end: float, pid: int, tid: int, args: dict) -> dict[str, Any]:
    dur = round(max(end - ts, 0.0), 3)
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _meta(kind: str, pid: int, tid: int, value: Any) -> dict[str, Any]:
    key = "sort_index" if kind.endswith("sort_index") else "name"
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def check_trace_path(path: str) -> None:
    """A directory or a device (/dev/null) in the way is refused: the trace replaces only a regular file."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"cannot write a trace to {path!r}: it exists and is not a regular file")


def write_trace(session: Session, path: str) -> str:
    """Write {"traceEvents": [...]} to path atomically (a partial file never takes its place); returns path."""
    check_trace_path(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    events = trace_events(session)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".trace-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f, separators=(",", ":"))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
