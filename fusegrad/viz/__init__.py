"""PROFILE traces and the VIZ recorder: `fusegrad.profile()` for a block, PROFILE=1 / VIZ=1 for the whole process.

Recording goes through `helpers.Hooks`: while nothing records, each hook in the engine and runtime is one attribute
check. The Chrome trace is written at the end (chrome.py); VIZ's recording is served as a web page (server.py)."""

from __future__ import annotations
import atexit
import contextlib
import os
import sys
import time
from typing import Iterator
from fusegrad.helpers import PROFILE, PROFILE_PATH, VIZ, Hooks, cache_dir
from fusegrad.viz.trace import Session


def default_trace_path() -> str:
    return os.path.join(cache_dir(), "profile", f"trace-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}.json")


def install(session: Session) -> Session | None:
    """Make `session` the recorder of every hook; returns the one it replaces."""
    old = Hooks.trace
    Hooks.trace = session
    Hooks.rewrites = session.recorder
    return old


def uninstall(previous: Session | None) -> None:
    Hooks.trace = previous
    Hooks.rewrites = previous.recorder if previous is not None else None


@contextlib.contextmanager
def profile(path: str | os.PathLike | None = None) -> Iterator[Session]:
    """Record a block of code; at its end the Chrome trace goes to `path` (default: a file under the cache dir),
    named by the yielded session's `path`. A process-wide PROFILE/VIZ session records nothing meanwhile."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"profile(path=...) takes a file path, got {type(path).__name__} {path!r}")
    from fusegrad.viz.chrome import check_trace_path, write_trace

    if path is not None:
        check_trace_path(os.fspath(path))  # before the block runs, not after
    session = Session()
    previous = install(session)
    try:
        yield session
    finally:
        uninstall(previous)
        session.path = write_trace(session, os.fspath(path) if path is not None else default_trace_path())


def start_from_env() -> None:
    """PROFILE=1 and VIZ=1: record from now on; at exit write the trace (PROFILE) and serve the page (VIZ=1; VIZ=2
    saves the recording without serving it)."""
    if PROFILE.value not in (0, 1) or VIZ.value not in (0, 1, 2):
        raise ValueError(f"PROFILE={PROFILE.value!r} VIZ={VIZ.value!r}: PROFILE takes 0 or 1, VIZ 0, 1 or 2")
    if PROFILE.value and PROFILE_PATH.value:
        from fusegrad.viz.chrome import check_trace_path

        check_trace_path(PROFILE_PATH.value)
    recorder = None
    if VIZ.value:
        from fusegrad.viz.recorder import Recorder

        recorder = Recorder()
    session = Session(recorder)
    install(session)
    atexit.register(_at_exit, session)


def _at_exit(session: Session) -> None:
    from fusegrad.viz.chrome import write_trace

    uninstall(None)
    if PROFILE.value:
        path = write_trace(session, PROFILE_PATH.value or default_trace_path())
        print(f"fusegrad: PROFILE trace written to {path} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if VIZ.value and session.recorder is not None:
        from fusegrad.viz.server import save_and_serve

        save_and_serve(session, serve_it=VIZ.value == 1)
