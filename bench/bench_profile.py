"""What recording costs: `python bench/bench_profile.py`.

The digits convnet's jitted Adam step (examples/train_digits.py, batch 128) and a small eager step (a few tensor ops
realized one by one), each with nothing recording (PROFILE=0, VIZ=0), under PROFILE (fusegrad.profile()) and, for
the eager step, under VIZ's recorder too. The cases take turns call by call (CALLS=300 each); prints median steps/s
and the recording's slowdown. With nothing recording a hook is one attribute check: the last line prices the checks
one eager step makes against that step's time."""

from __future__ import annotations
import os
import statistics
import sys
import time
import timeit
from pathlib import Path
import numpy as np
from fusegrad import Context, Tensor, TinyJit
from fusegrad.helpers import Hooks
from fusegrad.nn.optim import Adam
from fusegrad.nn.state import get_parameters
from fusegrad.viz import install, uninstall
from fusegrad.viz.recorder import Recorder
from fusegrad.viz.trace import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_digits import ConvNet  # noqa: E402


def jitted_step():
    model = ConvNet()
    opt = Adam(get_parameters(model), lr=1e-3)
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((128, 1, 8, 8), dtype=np.float32)).realize()
    y = Tensor(rng.integers(0, 10, 128).astype(np.int32)).realize()

    @TinyJit
    def train(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss.realize()

    return lambda: train(x, y)


def eager_step():
    a, b = Tensor(np.random.rand(64, 64).astype(np.float32)).realize(), Tensor.ones(64).realize()

    def step() -> None:
        h = (a @ a).realize()
        h = (h + b).relu().realize()
        (h.sum(axis=1) * 2).realize()

    return step


class Hook:
    """A case that records into its own session, installed around each call; its events are dropped now and then so
    that a long run does not pile them up."""

    def __init__(self, step, recorder: bool):
        self.step, self.session = step, Session(Recorder() if recorder else None)

    def __call__(self) -> None:
        previous = install(self.session)
        try:
            self.step()
        finally:
            uninstall(previous)
        if len(self.session.events) > 100_000:
            self.session.events.clear()


def median_seconds(cases: dict, calls: int) -> dict:
    """Each case's median time per call; the cases take turns call by call, so load from elsewhere hits them alike."""
    for case in cases.values():
        for _ in range(3):  # warm-up and, for TinyJit, the capture
            case()
    times: dict[str, list[float]] = {name: [] for name in cases}
    clock = time.perf_counter
    for _ in range(calls):
        for name, case in cases.items():
            st = clock()
            case()
            times[name].append(clock() - st)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    calls = int(os.environ.get("CALLS", 300))
    jit = jitted_step()
    res = median_seconds({"off": jit, "PROFILE": Hook(jit, False)}, calls)
    print(
        f"jitted digits step: off {1 / res['off']:7.1f} steps/s, PROFILE {1 / res['PROFILE']:7.1f} steps/s "
        f"-> PROFILE slows it {res['PROFILE'] / res['off'] - 1:+.1%}"
    )
    eager = eager_step()
    res = median_seconds({"off": eager, "PROFILE": Hook(eager, False), "VIZ": Hook(eager, True)}, calls)
    print(
        f"eager 3-realize step: off {1 / res['off']:7.1f} steps/s, PROFILE {res['PROFILE'] / res['off'] - 1:+.1%},"
        f" VIZ {res['VIZ'] / res['off'] - 1:+.1%}"
    )
    # the off cost: how many hooks one eager step passes (counted by a session that only counts), each one check
    counting = Session()
    counting.events = _Counter()
    previous = install(counting)
    eager()
    uninstall(previous)
    check = min(timeit.repeat("Hooks.trace is not None", globals={"Hooks": Hooks}, number=100_000, repeat=5)) / 1e5
    hooks = counting.events.n + 3 * 2  # events appended, plus each realize's open and schedule hooks
    print(
        f"off: {hooks} hook checks per eager step x {check * 1e9:.0f} ns = {hooks * check * 1e6:.2f} us, "
        f"{hooks * check / res['off']:.3%} of the step"
    )


class _Counter(list):
    n = 0

    def append(self, item) -> None:
        self.n += 1


if __name__ == "__main__":
    main()
