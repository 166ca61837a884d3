"""Checks of Chrome's Trace Event Format shared by the profile tests: what each phase must carry, and that each
thread's slices nest or follow each other, never partly overlap."""

from __future__ import annotations
from collections import defaultdict

REQUIRED = {
    "X": ("name", "ph", "ts", "dur", "pid", "tid"),
    "M": ("name", "ph", "pid", "args"),
    "C": ("name", "ph", "ts", "pid", "args"),
    "s": ("name", "ph", "ts", "pid", "tid", "id"),
    "f": ("name", "ph", "ts", "pid", "tid", "id"),
}


def validate(trace: dict) -> list[dict]:
    """Raises AssertionError naming the first event that breaks the format; returns the events."""
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list), "no traceEvents list"
    events = trace["traceEvents"]
    named = {e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    by_track: dict[tuple, list[dict]] = defaultdict(list)
    flows: dict[int, list[str]] = defaultdict(list)
    for e in events:
        assert e.get("ph") in REQUIRED, f"unknown phase in {e}"
        missing = [k for k in REQUIRED[e["ph"]] if k not in e]
        assert not missing, f"{e} lacks {missing}"
        if "ts" in e:
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] != "M":
            assert e["pid"] in named, f"process {e['pid']} has no process_name: {e}"
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            by_track[(e["pid"], e["tid"])].append(e)
        elif e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif e["ph"] in "sf":
            flows[e["id"]].append(e["ph"])
    for fid, phases in flows.items():
        assert sorted(phases) == ["f", "s"], f"flow {fid} has phases {phases}"
    eps = 0.002  # timestamps are rounded to nanoseconds in microseconds
    for track, slices in by_track.items():
        starts = [s["ts"] for s in slices]
        assert starts == sorted(starts), f"track {track}: slices out of time order"
        open_ends: list[float] = []
        for s in slices:
            while open_ends and open_ends[-1] <= s["ts"] + eps:
                open_ends.pop()
            end = s["ts"] + s["dur"]
            assert not open_ends or end <= open_ends[-1] + eps, f"track {track}: {s} overlaps its enclosing slice"
            open_ends.append(end)
    return events
